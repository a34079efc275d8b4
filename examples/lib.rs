//! The examples of the messaging framework, one program each (the library
//! itself is empty; cargo needs a target besides the examples):
//!
//! | example | what it shows |
//! |---|---|
//! | `orders` | the README's service: a FIFO queue with a DLQ, a versioned message upcast from v1, an idempotent handler, a concurrent queue |
//! | `sqs_orders` | the same app on Amazon SQS, chosen by configuration (`--features sqs`) |
//! | `telemetry` | consumer spans with the producer's trace, enrichment, metrics and health over HTTP |
//! | `shutdown` | graceful shutdown of slow handlers, and the second Ctrl-C that stops at once |
//! | `embedded` | the publisher and workers inside an existing axum service, without `#[messaging::main]` |
//! | `chain` | an exactly-once chain: side effect, claim and follow-up in one transaction, on PostgreSQL or on SQS through the outbox (`--features postgres`) |
//!
//! ```text
//! cargo run --example orders
//! ```
