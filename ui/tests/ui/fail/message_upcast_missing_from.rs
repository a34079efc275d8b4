use messaging::prelude::*;

#[messaging::message(name = "orders.placed", v = 2)]
#[derive(Serialize, Deserialize)]
pub struct OrderPlaced {
    pub order_id: String,
    pub coupon: Option<String>,
}

#[messaging::message(name = "orders.placed", v = 1, upcast = OrderPlaced)]
#[derive(Serialize, Deserialize)]
pub struct OrderPlacedV1 {
    pub order_id: String,
}

fn main() {}
