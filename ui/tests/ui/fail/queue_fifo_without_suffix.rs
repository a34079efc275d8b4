#[messaging::queue("orders", fifo)]
pub struct Orders;

fn main() {}
