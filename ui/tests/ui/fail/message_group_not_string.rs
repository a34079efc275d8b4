use messaging::prelude::*;

#[messaging::message(name = "orders.placed", v = 1, group = customer)]
#[derive(Serialize, Deserialize)]
pub struct OrderPlaced {
    pub order_id: String,
    pub customer: Vec<u8>,
}

fn main() {}
