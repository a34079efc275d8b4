#[messaging::queue("orders.fifo", fifo, dlq = "orders-dlq")]
pub struct Orders;

fn main() {}
