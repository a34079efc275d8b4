use messaging::prelude::*;

#[messaging::message(name = "orders.placed", v = 1, upcast = OrderPlacedV2)]
#[derive(Serialize, Deserialize)]
pub struct OrderPlacedV1 {
    pub order_id: String,
}

fn main() {}
