use messaging::prelude::*;

#[messaging::message(name = "orders.created", v = 2)]
#[derive(Serialize, Deserialize)]
pub struct OrderCreated {
    pub order_id: String,
}

#[messaging::message(name = "orders.placed", v = 1, upcast = OrderCreated)]
#[derive(Serialize, Deserialize)]
pub struct OrderPlacedV1 {
    pub order_id: String,
}

impl From<OrderPlacedV1> for OrderCreated {
    fn from(v1: OrderPlacedV1) -> Self {
        OrderCreated { order_id: v1.order_id }
    }
}

fn main() {}
