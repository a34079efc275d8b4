use messaging::prelude::*;

#[messaging::queue(fifo, default_group = "orders")]
pub struct OrderEvents;

#[messaging::message(name = "orders.placed", v = 1)]
#[derive(Serialize, Deserialize)]
pub struct OrderPlaced {
    pub order_id: String,
}

// Only the name is reported: `OrderEvents` is still a FIFO queue with a default group.
async fn publish(p: Publisher, placed: OrderPlaced) {
    let _ = p.send::<OrderEvents, _>(&placed).await;
}

fn main() {}
