use std::time::Duration;

use messaging::prelude::*;

#[messaging::queue("orders.fifo", fifo)]
pub struct Orders;

#[messaging::message(name = "orders.placed", v = 1)]
#[derive(Serialize, Deserialize)]
pub struct OrderPlaced {
    pub order_id: String,
}

async fn publish(p: Publisher, placed: Vec<OrderPlaced>) {
    let _ = p.send_batch::<Orders, _>(&placed).group("g").delay(Duration::from_secs(30)).await;
}

fn main() {}
