use messaging::prelude::*;

#[messaging::message(name = "orders.placed", version = 2)]
#[derive(Serialize, Deserialize)]
pub struct OrderPlaced {
    pub order_id: String,
}

// Only the option is reported: `OrderPlaced` is still a message.
#[messaging::queue("orders")]
pub struct Orders;

#[messaging::handler(queue = Orders)]
async fn place(order: OrderPlaced) {
    let _ = order.order_id;
}

fn main() {}
