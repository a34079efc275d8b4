use messaging::prelude::*;

#[messaging::queue("emails")]
pub struct Emails;

#[messaging::message(name = "emails.welcome", v = 1)]
#[derive(Serialize, Deserialize)]
pub struct Welcome {
    pub to: String,
}

#[messaging::handler(queue = Emails, lease = "60s")]
async fn welcome(mail: Welcome) {
    let _ = mail.to;
}

fn main() {}
