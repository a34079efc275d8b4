use messaging::prelude::*;

#[messaging::queue("orders.fifo", fifo)]
pub struct Orders;

#[messaging::message(name = "orders.placed", v = 1)]
#[derive(Serialize, Deserialize)]
pub struct OrderPlaced {
    pub order_id: String,
}

async fn publish(p: Publisher, placed: Vec<OrderPlaced>) {
    let _ = p.send_batch::<Orders, _>(&placed).attribute("k", "v").await;
}

fn main() {}
