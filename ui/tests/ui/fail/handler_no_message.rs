#[messaging::queue("emails")]
pub struct Emails;

#[messaging::handler(queue = Emails)]
async fn welcome() {}

fn main() {}
