//! The outbox's storage as the publisher and the relay see it: the rows
//! written and claimed, what becomes of them, and the trait the SQL store
//! (`sql::outbox`) implements. Apart from the [`Outbox`](super::Outbox)
//! handle, which opens that store, so that the store depends on this and
//! the handle on both, with no circle.

use std::any::Any;
use std::sync::Arc;
use std::time::Duration;

use super::{MessageId, Outgoing};
use crate::boxed::BoxFuture;
use crate::error::TransportError;

/// One message to write into the outbox.
#[derive(Debug, Clone)]
#[cfg_attr(not(any(feature = "sqlite", feature = "postgres")), allow(dead_code))]
pub(crate) struct OutboxWrite {
    /// The destination queue.
    pub(crate) queue: &'static str,
    /// Whether the queue is FIFO (its group's rows then leave in order).
    pub(crate) fifo: bool,
    /// The message as it will be sent.
    pub(crate) outgoing: Outgoing,
}

/// A row a relay claimed, with the message to send.
#[derive(Debug, Clone)]
pub(crate) struct Claimed {
    /// The row's id (its place in the outbox).
    pub(crate) id: i64,
    /// The id the publish returned.
    pub(crate) message_id: MessageId,
    /// Whether the queue is FIFO.
    pub(crate) fifo: bool,
    /// The message.
    pub(crate) outgoing: Outgoing,
    /// How many times a relay has claimed it, this time included.
    pub(crate) attempts: u32,
}

/// What became of a claimed row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Settle {
    /// The transport accepted it: the row is deleted.
    Sent,
    /// A failure that may pass (the broker unreachable): try again at `at_ms`.
    Retry {
        /// When, in milliseconds since the Unix epoch (the outbox's clock).
        at_ms: i64,
        /// What went wrong.
        error: String,
    },
    /// The transport refused it for good (too large, say): the row is kept
    /// as `failed`, out of the way, for an operator.
    Failed {
        /// Why.
        error: String,
    },
    /// Not sent this time (an earlier row of its FIFO group failed): given
    /// back without counting the claim.
    Untried,
}

/// The rows of one queue in the outbox, as [`Outbox::stats`](crate::transport::Outbox::stats) reports them.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct OutboxQueue {
    /// The destination queue.
    pub queue: String,
    /// Rows waiting to be sent (or being sent).
    pub pending: u64,
    /// Rows the transport refused for good (`app outbox retry` sends them again).
    pub failed: u64,
    /// The age of the oldest pending row, in milliseconds.
    pub oldest_pending_ms: Option<u64>,
}

/// A row the transport refused for good, as [`Outbox::failed`](crate::transport::Outbox::failed) lists it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct FailedOutboxRow {
    /// The destination queue.
    pub queue: String,
    /// The id its publish returned.
    pub message_id: String,
    /// How many times a relay tried it.
    pub attempts: u32,
    /// Why the transport refused it.
    pub error: Option<String>,
    /// When it was written, in milliseconds since the Unix epoch.
    pub created_at_ms: i64,
}

/// The storage of an outbox: the SQL store, on PostgreSQL or SQLite.
pub(crate) trait OutboxStore: Send + Sync + 'static {
    /// The database's `messaging.system` name.
    fn system(&self) -> &'static str;

    /// Writes `rows` on the caller's open transaction `conn`; the ids of the
    /// messages, in order.
    fn write<'a>(
        &'a self,
        conn: &'a mut (dyn Any + Send),
        rows: Vec<OutboxWrite>,
    ) -> BoxFuture<'a, Result<Vec<MessageId>, TransportError>>;

    /// Claims up to `max` rows of `queue` that may leave now, for `lease`.
    /// Returns the claim's token and the rows in id order.
    fn claim<'a>(
        &'a self,
        queue: &'a str,
        max: usize,
        lease: Duration,
    ) -> BoxFuture<'a, Result<(i64, Vec<Claimed>), TransportError>>;

    /// Settles rows of the claim `token`: (row id, outcome). A row whose
    /// claim expired and was taken by another relay is left to that one.
    fn settle(&self, token: i64, outcomes: Vec<(i64, Settle)>) -> BoxFuture<'_, Result<(), TransportError>>;

    /// The rows per queue.
    fn stats(&self) -> BoxFuture<'_, Result<Vec<OutboxQueue>, TransportError>>;

    /// Up to `max` failed rows, oldest first.
    fn failed(&self, max: usize) -> BoxFuture<'_, Result<Vec<FailedOutboxRow>, TransportError>>;

    /// Makes failed rows (of `queue`, or all) pending again; how many.
    fn retry_failed<'a>(&'a self, queue: Option<&'a str>) -> BoxFuture<'a, Result<u64, TransportError>>;

    /// Milliseconds since the Unix epoch by the database's clock.
    fn now(&self) -> i64;

    /// Signals that another process wrote rows (PostgreSQL `NOTIFY`), where
    /// the database has them.
    fn changes(&self) -> Option<tokio::sync::broadcast::Receiver<String>>;

    /// Creates or upgrades the framework's tables in the outbox's database.
    fn migrate(&self) -> BoxFuture<'_, Result<(), TransportError>>;

    /// The schedules' ledger in the outbox's database: a tick's message is
    /// written into the outbox in the transaction that records the tick.
    fn schedule_ledger(&self) -> Arc<dyn super::schedules::ScheduleLedger>;
}

/// The attribute in which a relayed message carries its id (the one its
/// publish returned); the SQS transport reads it back as the delivery's
/// `message_id`, so that a message a relay sent twice has one id.
pub(crate) const MESSAGE_ID_ATTRIBUTE: &str = "messaging.message_id";

/// The payload of the wake-up an outbox write sends (PostgreSQL `NOTIFY`,
/// on the channel enqueues use): not a queue name, which never holds `:`.
pub(crate) const WAKE: &str = ":outbox";
