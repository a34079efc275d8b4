use messaging::prelude::*;

#[messaging::queue("orders.fifo", fifo)]
pub struct Orders;

#[messaging::message(name = "orders.placed", v = 1, group = customer)]
#[derive(Serialize, Deserialize)]
pub struct OrderPlaced {
    pub order_id: String,
    pub customer_id: String,
}

// Only the misspelt field is reported: the type is still a message, and still
// counts as carrying its group.
async fn publish(p: Publisher, placed: OrderPlaced) {
    let _ = p.send::<Orders, _>(&placed).await;
}

fn main() {}
