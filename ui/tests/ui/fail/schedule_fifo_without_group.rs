use messaging::prelude::*;

#[messaging::queue("ledger.fifo", fifo)]
pub struct Ledger;

#[messaging::message(name = "ledger.close", v = 1)]
#[derive(Serialize, Deserialize)]
pub struct CloseBooks {}

#[messaging::schedule("0 0 * * *", queue = Ledger)]
fn close_books() -> CloseBooks {
    CloseBooks {}
}

fn main() {}
