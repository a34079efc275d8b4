#[messaging::queue("orders.fifo", fifo, dlq = "orders-dlq.fifo", dlq = "other-dlq.fifo")]
pub struct Orders;

fn main() {}
