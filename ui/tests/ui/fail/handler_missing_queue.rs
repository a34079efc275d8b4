use messaging::prelude::*;

#[messaging::message(name = "emails.welcome", v = 1)]
#[derive(Serialize, Deserialize)]
pub struct Welcome {
    pub to: String,
}

#[messaging::handler(idempotent = "welcome")]
async fn welcome(mail: Welcome) {
    let _ = mail.to;
}

fn main() {}
