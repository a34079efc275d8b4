//! The orders service of the README: a FIFO queue of orders with a
//! dead-letter queue, a versioned message with an older v1 still on the wire,
//! an idempotent handler with shared state, and an email queue handled with
//! concurrency 8.
//!
//! ```text
//! cargo run --example orders             # publishes the demo orders, handles them, exits
//! cargo run --example orders -- run --serve   # keeps serving after the demo
//! cargo run --example orders -- queues   # lists the declared queues
//! cargo run --example orders --features postgres -- --transport postgres://postgres@127.0.0.1/test?migrate=true
//! ```

#[path = "shared/orders_app.rs"]
mod orders_app;

use messaging::prelude::*;
use orders_app::{Db, OrderPlaced, OrderPlacedV1, Orders};

#[messaging::main]
async fn main(setup: &mut Setup) -> Result<(), PublishError> {
    setup.provide(Db::default());
    // The demo publishes a few orders and exits once everything is handled;
    // `run --serve` keeps consuming afterwards.
    setup.run_mode(RunMode::Drain);
    // Published from `main` itself, as the README's quick start does. `main`
    // also runs for `validate`, `console`, `outbox` and `schedules`, which
    // check and count these sends but make none (only `run` sends).
    let publisher = setup.publisher();
    let orders = [
        OrderPlaced { order_id: "A1".into(), customer_id: "ada".into(), coupon: Some("WELCOME".into()) },
        OrderPlaced { order_id: "A2".into(), customer_id: "grace".into(), coupon: None },
    ];
    for order in &orders {
        publisher.send::<Orders, _>(order).await?;
    }
    // An old producer still sends v1; the handler receives it as v2.
    let old = OrderPlacedV1 { order_id: "A3".into(), customer_id: "linus".into() };
    publisher.send::<Orders, _>(&old).group("linus").await?;
    Ok(())
}
