use messaging::prelude::*;

#[messaging::queue("emails")]
pub struct Emails;

#[derive(Serialize, Deserialize)]
pub struct Welcome {
    pub to: String,
}

#[messaging::handler(queue = Emails)]
async fn welcome(mail: Welcome) {
    let _ = mail.to;
}

fn main() {}
