// The handler macro's own items do not take the user's names: a message
// type called `Entry` or `Handler`, a state called `This`, and handler
// functions called `queue`, `make` and `requirements` all compile.
use messaging::prelude::*;

#[messaging::queue("ledger")]
pub struct Ledger;

#[messaging::message(name = "ledger.entry", v = 1)]
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Entry {
    pub n: u32,
}

#[messaging::message(name = "ledger.handler", v = 1)]
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Handler {
    pub name: String,
}

#[messaging::message(name = "ledger.erased", v = 1)]
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Erased {
    pub n: u32,
}

pub struct This;

#[messaging::handler(queue = Ledger)]
async fn queue(entry: Entry, this: State<This>) {
    let _ = (entry.n, &*this);
}

#[messaging::handler(queue = Ledger)]
async fn make(handler: Handler) {
    let _ = handler.name;
}

#[messaging::handler(queue = Ledger)]
async fn requirements(erased: Erased) {
    let _ = erased.n;
}

fn main() {
    let _ = (queue, make, requirements);
}
