#[messaging::queue("emails", default_group = "emails")]
pub struct Emails;

fn main() {}
