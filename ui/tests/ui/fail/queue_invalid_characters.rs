#[messaging::queue("orders/eu west")]
pub struct Orders;

fn main() {}
