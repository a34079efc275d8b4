use messaging::prelude::*;

#[messaging::message(name = "orders.placed", v = 1, id = id)]
#[derive(Serialize, Deserialize)]
pub struct OrderPlaced {
    pub order_id: String,
    pub customer_id: String,
}

fn main() {}
