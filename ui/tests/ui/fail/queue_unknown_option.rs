use messaging::prelude::*;

#[messaging::queue("orders.fifo", fifo, dql = "orders-dlq.fifo")]
pub struct Orders;

#[messaging::message(name = "orders.placed", v = 1)]
#[derive(Serialize, Deserialize)]
pub struct OrderPlaced {
    pub order_id: String,
}

// Only the option is reported: `Orders` is still a FIFO queue.
async fn publish(p: Publisher, placed: OrderPlaced) {
    let _ = p.send::<Orders, _>(&placed).group("g").await;
}

fn main() {}
