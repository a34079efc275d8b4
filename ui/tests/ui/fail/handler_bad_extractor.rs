use messaging::prelude::*;

#[messaging::queue("emails")]
pub struct Emails;

#[messaging::message(name = "emails.welcome", v = 1)]
#[derive(Serialize, Deserialize)]
pub struct Welcome {
    pub to: String,
}

#[messaging::handler(queue = Emails)]
async fn welcome(mail: Welcome, ctx: MessageContext, sender: String) {
    let _ = (mail.to, ctx, sender);
}

fn main() {}
