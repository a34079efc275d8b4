use messaging::prelude::*;

#[messaging::queue("emails", concurrency = 0)]
pub struct Emails;

#[messaging::message(name = "emails.welcome", v = 1)]
#[derive(Serialize, Deserialize)]
pub struct Welcome {
    pub to: String,
}

// Only the option is reported: `Emails` is still a queue for the rest of the code.
#[messaging::handler(queue = Emails)]
async fn welcome(mail: Welcome) {
    let _ = mail.to;
}

fn main() {}
