#[messaging::main]
fn main() {}
