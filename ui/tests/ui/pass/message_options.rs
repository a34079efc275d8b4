// `#[messaging::message]` with a name and version, `id = field`,
// `group = field`, without a name (bare JSON body), and on an enum.
use messaging::prelude::*;

#[messaging::message(name = "orders.placed", v = 2, id = order_id, group = customer_id)]
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct OrderPlaced {
    pub order_id: String,
    pub customer_id: String,
    pub coupon: Option<String>,
}

// The name may also come first, without `name =`; integer and optional
// fields are identities too.
#[messaging::message("invoices.issued", v = 1, id = number, group = account)]
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct InvoiceIssued {
    pub number: u64,
    pub account: Option<String>,
}

// No name: travels as a bare JSON body, version 1.
#[messaging::message]
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct LegacyPing {
    pub at: u64,
}

#[messaging::message(name = "accounts.event", v = 3)]
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "kind")]
pub enum AccountEvent {
    Opened { id: String },
    Closed { id: String, reason: Option<String> },
}

fn main() {
    assert_eq!(OrderPlaced::NAME, Some("orders.placed"));
    assert_eq!(OrderPlaced::VERSION, 2);
    let placed = OrderPlaced { order_id: "A1".into(), customer_id: "ada".into(), coupon: None };
    assert_eq!(placed.message_id().as_deref(), Some("A1"));
    assert_eq!(placed.group_id().as_deref(), Some("ada"));

    let invoice = InvoiceIssued { number: 42, account: None };
    assert_eq!(InvoiceIssued::NAME, Some("invoices.issued"));
    assert_eq!(invoice.message_id().as_deref(), Some("42"));
    assert_eq!(invoice.group_id(), None);

    assert_eq!(LegacyPing::NAME, None);
    assert_eq!(LegacyPing::VERSION, 1);
    assert_eq!(LegacyPing { at: 1 }.group_id(), None);

    assert_eq!(AccountEvent::NAME, Some("accounts.event"));
    assert_eq!(AccountEvent::VERSION, 3);
    let closed = AccountEvent::Closed { id: "c1".into(), reason: None };
    assert_eq!(closed.message_id(), None);
}
