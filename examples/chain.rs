//! An exactly-once chain: an order is placed, charged and its customer
//! notified, each exactly once, whatever crashes, with the queues on
//! PostgreSQL or on Amazon SQS (through the outbox).
//!
//! 1. At startup (`CHAIN_PLACE=N`) orders 1..=N are placed: each new order's
//!    row and its `OrderPlaced` are written in one transaction (an order
//!    placed before is skipped, so a restart places nothing twice).
//! 2. `charge` (queue `chain-orders`) records the charge, completes its
//!    idempotency claim and publishes `Charged`, all in one transaction.
//! 3. `notify` (FIFO queue `chain-charged.fifo`, a group per customer)
//!    records the notification and completes its claim in one transaction.
//!
//! The application's database (`CHAIN_DATABASE_URL`) holds the orders, the
//! charges, the notifications, the idempotency claims and the outbox. On a
//! PostgreSQL transport on that database the messages are its rows; on SQS
//! they go through the outbox and its relay.
//!
//! ```text
//! # everything in PostgreSQL:
//! CHAIN_DATABASE_URL=postgres://postgres@127.0.0.1/test CHAIN_PLACE=20 cargo run --example chain \
//!   --features postgres -- --transport 'postgres://postgres@127.0.0.1/test?migrate=true' run --drain
//! # the queues on SQS, the outbox in PostgreSQL:
//! CHAIN_DATABASE_URL=postgres://postgres@127.0.0.1/test CHAIN_PLACE=20 cargo run --example chain \
//!   --features postgres,sqs -- --transport sqs://us-east-1 run --drain
//! ```

use messaging::idempotency::PostgresIdempotencyStore;
use messaging::prelude::*;
use messaging::sqlx::{self, PgPool};
use messaging::transport::Outbox;

/// Orders to charge.
#[messaging::queue("chain-orders")]
pub struct Orders;

/// Charged orders, one FIFO group per customer.
#[messaging::queue("chain-charged.fifo", fifo)]
pub struct ChargedOrders;

/// An order was placed.
#[messaging::message(name = "chain.order_placed", v = 1)]
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct OrderPlaced {
    /// The order.
    pub order_id: i64,
    /// Who placed it.
    pub customer: String,
}

/// An order was charged.
#[messaging::message(name = "chain.charged", v = 1, group = customer)]
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Charged {
    /// The order.
    pub order_id: i64,
    /// Who is notified (the FIFO group).
    pub customer: String,
}

/// Charges an order once: the charge, the claim and the follow-up commit
/// together. Stopped after 30 s (`timeout`): its own statements, on a
/// database gone from the network, would otherwise wait for good, and hold
/// the message and the lane with them.
#[messaging::handler(queue = Orders, idempotent = "charge", timeout = "30s")]
async fn charge(
    order: OrderPlaced,
    claim: IdempotencyClaim,
    db: State<PgPool>,
    publisher: Publisher,
) -> Result<(), HandlerError> {
    let mut tx = db.begin().await?;
    sqlx::query("INSERT INTO chain_charges (order_id) VALUES ($1)").bind(order.order_id).execute(&mut *tx).await?;
    claim.complete_in(&mut tx).await?;
    let charged = Charged { order_id: order.order_id, customer: order.customer.clone() };
    publisher.send::<ChargedOrders, _>(&charged).in_transaction(&mut tx).await?;
    tx.commit().await?;
    println!("charged order {}", order.order_id);
    Ok(())
}

/// Notifies the customer once.
#[messaging::handler(queue = ChargedOrders, idempotent = "notify")]
async fn notify(charged: Charged, claim: IdempotencyClaim, db: State<PgPool>) -> Result<(), HandlerError> {
    let mut tx = db.begin().await?;
    sqlx::query("INSERT INTO chain_notifications (order_id, customer) VALUES ($1, $2)")
        .bind(charged.order_id)
        .bind(&charged.customer)
        .execute(&mut *tx)
        .await?;
    claim.complete_in(&mut tx).await?;
    tx.commit().await?;
    println!("notified {} of order {}", charged.customer, charged.order_id);
    Ok(())
}

/// The application's tables.
const TABLES: &str = "CREATE TABLE IF NOT EXISTS chain_orders (id BIGINT PRIMARY KEY, customer TEXT NOT NULL); \
    CREATE TABLE IF NOT EXISTS chain_charges (order_id BIGINT NOT NULL); \
    CREATE TABLE IF NOT EXISTS chain_notifications (order_id BIGINT NOT NULL, customer TEXT NOT NULL)";

/// Places orders 1..=n that are not placed yet: each order's row and its
/// event in one transaction.
async fn place(pool: &PgPool, publisher: &Publisher, n: i64) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    for id in 1..=n {
        let customer = format!("customer-{}", id % 3);
        let mut tx = pool.begin().await?;
        let inserted = sqlx::query("INSERT INTO chain_orders (id, customer) VALUES ($1, $2) ON CONFLICT DO NOTHING")
            .bind(id)
            .bind(&customer)
            .execute(&mut *tx)
            .await?;
        if inserted.rows_affected() == 1 {
            publisher.send::<Orders, _>(&OrderPlaced { order_id: id, customer }).in_transaction(&mut tx).await?;
        }
        tx.commit().await?;
    }
    Ok(())
}

#[messaging::main]
async fn main(setup: &mut Setup) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    let url = std::env::var("CHAIN_DATABASE_URL")
        .map_err(|_| "set CHAIN_DATABASE_URL to the application's PostgreSQL database")?;
    let pool = PgPool::connect(&url).await?;
    sqlx::raw_sql(TABLES).execute(&pool).await?;
    // The claims and the outbox live in the application's database, so that
    // the handlers' transactions hold them.
    let outbox = Outbox::on_pool(pool.clone());
    outbox.migrate().await?;
    setup.outbox(outbox);
    setup.idempotency_store(PostgresIdempotencyStore::new(pool.clone()));
    if let Ok(n) = std::env::var("CHAIN_PLACE") {
        let n: i64 = n.parse().map_err(|_| "CHAIN_PLACE is a number of orders")?;
        let (pool, publisher) = (pool.clone(), setup.publisher());
        setup.spawn(async move {
            if let Err(e) = place(&pool, &publisher, n).await {
                eprintln!("placing the orders failed: {e}");
            }
        });
    }
    setup.provide(pool);
    Ok(())
}
