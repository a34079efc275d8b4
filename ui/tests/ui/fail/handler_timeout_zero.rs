use messaging::prelude::*;

#[messaging::queue("emails")]
pub struct Emails;

#[messaging::message(name = "emails.welcome", v = 1)]
#[derive(Serialize, Deserialize)]
pub struct Welcome {
    pub to: String,
}

#[messaging::handler(queue = Emails, timeout = "0s")]
async fn welcome(mail: Welcome) {
    let _ = mail.to;
}

#[messaging::handler(queue = Emails, timeout = "soon")]
async fn welcome_again(mail: Welcome) {
    let _ = mail.to;
}

fn main() {}
