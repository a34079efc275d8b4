//! The operator's console over a small shop: payments fail for some
//! customers and land in the dead letters, shipments wait on a delay, and
//! the console shows every queue and message and acts on them.
//!
//! ```text
//! cargo run --example console --features console -- run --http 9090
//! # then open http://127.0.0.1:9090/ (the JSON API is under /api/v1)
//! cargo run --example console --features console -- console --http 9091   # the console alone, not consuming
//! ```
//!
//! Payments of customers whose name starts with `x` always fail: after two
//! attempts they are dead letters. Redrive them from the queue's `dead` tab
//! once the "bug" is fixed (here: never), or delete them.

use std::time::Duration;

use messaging::prelude::*;

/// Payments to take, in order per customer.
#[messaging::queue("shop-payments.fifo", fifo, dlq = "shop-payments-dlq.fifo", max_receives = 2)]
pub struct Payments;

/// Shipments to book, some of them later.
#[messaging::queue("shop-shipments", dlq = "shop-shipments-dlq", concurrency = 4)]
pub struct Shipments;

/// A payment to take.
#[messaging::message(name = "shop.payment", v = 1, group = customer, id = order)]
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Payment {
    /// The order paid for.
    pub order: String,
    /// Who pays (the FIFO group).
    pub customer: String,
    /// How much, in cents.
    pub cents: u64,
}

/// A shipment to book.
#[messaging::message(name = "shop.shipment", v = 1)]
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Shipment {
    /// The order shipped.
    pub order: String,
}

#[messaging::handler(queue = Payments, retry(base = "200ms", max = "1s"))]
async fn pay(payment: Payment) -> Result<(), HandlerError> {
    if payment.customer.starts_with('x') {
        return Err(HandlerError::transient(format!("card of {} declined", payment.customer)));
    }
    println!("paid order {} ({} cents)", payment.order, payment.cents);
    Ok(())
}

#[messaging::handler(queue = Shipments)]
async fn ship(shipment: Shipment) -> Result<(), HandlerError> {
    println!("booked the shipment of order {}", shipment.order);
    Ok(())
}

#[messaging::main]
async fn main(setup: &mut Setup) -> Result<(), PublishError> {
    let publisher = setup.publisher();
    setup.spawn(async move {
        for (n, customer) in ["ada", "xavier", "grace", "xena", "linus"].iter().enumerate() {
            let payment = Payment { order: format!("P{n}"), customer: customer.to_string(), cents: 1_000 + n as u64 };
            if let Err(e) = publisher.send::<Payments, _>(&payment).await {
                eprintln!("could not publish payment {n}: {e}");
            }
        }
        for n in 0..3 {
            let shipment = Shipment { order: format!("P{n}") };
            if let Err(e) = publisher.send::<Shipments, _>(&shipment).delay(Duration::from_secs(600)).await {
                eprintln!("could not publish shipment {n}: {e}");
            }
        }
        println!("published 5 payments (2 will fail) and 3 shipments due in 10 minutes");
    });
    Ok(())
}
