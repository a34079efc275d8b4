// Every option of `#[messaging::queue]`, on standard and FIFO queues, with the
// name given positionally and as `name = ..`.
use std::time::Duration;

use messaging::prelude::*;

#[messaging::queue(
    "orders.fifo",
    fifo,
    dlq = "orders-dlq.fifo",
    default_group = "orders",
    concurrency = 4,
    visibility = "45s",
    max_receives = 7
)]
pub struct Orders;

#[messaging::queue(name = "emails", dlq = "emails-dlq", concurrency = 8, visibility = "2m", max_receives = 3)]
pub struct Emails;

#[messaging::queue(name = "audit_log-v2.fifo", fifo)]
pub struct Audit;

#[messaging::queue("plain")]
struct Plain;

fn main() {
    let orders = Orders::SPEC;
    assert_eq!(orders.name, "orders.fifo");
    assert!(orders.fifo);
    assert_eq!(orders.dlq, Some("orders-dlq.fifo"));
    assert_eq!(orders.default_group, Some("orders"));
    assert_eq!(orders.concurrency, 4);
    assert_eq!(orders.visibility, Duration::from_secs(45));
    assert_eq!(orders.max_receives, 7);

    let emails = Emails::SPEC;
    assert_eq!(emails.name, "emails");
    assert!(!emails.fifo);
    assert_eq!(emails.dlq, Some("emails-dlq"));
    assert_eq!(emails.default_group, None);
    assert_eq!(emails.concurrency, 8);
    assert_eq!(emails.visibility, Duration::from_secs(120));
    assert_eq!(emails.max_receives, 3);

    let audit = Audit::SPEC;
    assert_eq!(audit.name, "audit_log-v2.fifo");
    assert!(audit.fifo);
    assert_eq!(audit.dlq, None);

    // Defaults: strictly sequential, 30 s visibility, 5 receives.
    let plain = <Plain as Queue>::SPEC;
    assert_eq!(plain.name, "plain");
    assert!(!plain.fifo);
    assert_eq!(plain.concurrency, 1);
    assert_eq!(plain.visibility, Duration::from_secs(30));
    assert_eq!(plain.max_receives, 5);
}
