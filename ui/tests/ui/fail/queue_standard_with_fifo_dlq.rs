#[messaging::queue("emails", dlq = "emails-dlq.fifo")]
pub struct Emails;

fn main() {}
