//! The orders app shared by the `orders` and `sqs_orders` examples: queues,
//! messages (with an older version still on the wire) and handlers.

// In a service these would live in a library crate, where `pub` is reachable.
#![allow(unreachable_pub, dead_code)]

use std::sync::atomic::{AtomicUsize, Ordering};

use messaging::prelude::*;

/// Orders, in order per customer.
#[messaging::queue("orders.fifo", fifo, dlq = "orders-dlq.fifo", default_group = "orders")]
pub struct Orders;

/// Outgoing emails, sent eight at a time.
#[messaging::queue("emails", dlq = "emails-dlq", concurrency = 8)]
pub struct Emails;

/// An order was placed (current version).
#[messaging::message(name = "orders.placed", v = 2, group = customer_id)]
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct OrderPlaced {
    /// The order's id.
    pub order_id: String,
    /// Who placed it (also the FIFO group: one customer's orders stay in order).
    pub customer_id: String,
    /// A coupon code, new in v2.
    pub coupon: Option<String>,
}

/// The first version of `orders.placed`, still published by an old producer.
#[messaging::message(name = "orders.placed", v = 1, upcast = OrderPlaced)]
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct OrderPlacedV1 {
    /// The order's id.
    pub order_id: String,
    /// Who placed it.
    pub customer_id: String,
}

impl From<OrderPlacedV1> for OrderPlaced {
    fn from(v1: OrderPlacedV1) -> Self {
        OrderPlaced { order_id: v1.order_id, customer_id: v1.customer_id, coupon: None }
    }
}

/// A confirmation email to send.
#[messaging::message(name = "emails.confirmation", v = 1)]
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ConfirmationEmail {
    /// The order confirmed.
    pub order_id: String,
    /// The recipient.
    pub to: String,
}

/// Stands in for the service's database.
#[derive(Default)]
pub struct Db {
    /// Orders finalized so far.
    pub finalized: AtomicUsize,
}

#[messaging::handler(queue = Orders, idempotent = "order-finalize", lease = "20s")]
pub async fn finalize(
    order: OrderPlaced,
    ctx: MessageContext,
    db: State<Db>,
    publisher: Publisher,
) -> Result<(), HandlerError> {
    let how = match ctx.wire_version() {
        Some(1) => "arrived as v1, upcast to v2",
        Some(_) => "v2",
        None => "bare body",
    };
    db.finalized.fetch_add(1, Ordering::SeqCst);
    println!(
        "handled order {} for {} (coupon: {}; {how})",
        order.order_id,
        order.customer_id,
        order.coupon.as_deref().unwrap_or("none")
    );
    let email =
        ConfirmationEmail { order_id: order.order_id.clone(), to: format!("{}@example.com", order.customer_id) };
    publisher.send::<Emails, _>(&email).await?;
    Ok(())
}

#[messaging::handler(queue = Emails)]
pub async fn send_confirmation(email: ConfirmationEmail) {
    println!("sent confirmation of order {} to {}", email.order_id, email.to);
}
