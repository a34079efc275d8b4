use std::time::Duration;

use messaging::prelude::*;

#[messaging::queue("orders.fifo", fifo, default_group = "orders")]
pub struct Orders;

#[messaging::message(name = "orders.placed", v = 1)]
#[derive(Serialize, Deserialize)]
pub struct OrderPlaced {
    pub order_id: String,
}

async fn publish(p: Publisher, placed: OrderPlaced) {
    let _ = p.send::<Orders, _>(&placed).delay(Duration::from_secs(30)).await;
}

fn main() {}
