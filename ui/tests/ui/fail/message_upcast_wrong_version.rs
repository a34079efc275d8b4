use messaging::prelude::*;

#[messaging::message(name = "orders.placed", v = 3)]
#[derive(Serialize, Deserialize)]
pub struct OrderPlaced {
    pub order_id: String,
}

#[messaging::message(name = "orders.placed", v = 1, upcast = OrderPlaced)]
#[derive(Serialize, Deserialize)]
pub struct OrderPlacedV1 {
    pub order_id: String,
}

impl From<OrderPlacedV1> for OrderPlaced {
    fn from(v1: OrderPlacedV1) -> Self {
        OrderPlaced { order_id: v1.order_id }
    }
}

fn main() {}
