use messaging::prelude::*;

#[messaging::message(name = "orders.placed", v = 0)]
#[derive(Serialize, Deserialize)]
pub struct OrderPlaced {
    pub order_id: String,
}

fn main() {}
