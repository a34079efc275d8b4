//! [`RowStore`]: what a database must do for the SQL transport, with time
//! passed in. Each operation runs the row transitions of
//! [`crate::transport::sql::machine::Row`], so every backend has the same semantics as the
//! in-memory model, which the model-based tests check step by step.

use crate::boxed::BoxFuture;
use crate::error::TransportError;
use crate::transport::sql::machine::{Enqueue, EnqueueOutcome, QueueRules, Row, RowId};

/// A row leased by [`RowStore::lease`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeasedRow {
    /// The row.
    pub id: RowId,
    /// The lease token every later call must present.
    pub token: u64,
    /// The version's id.
    pub message_id: String,
    /// The payload.
    pub payload: Vec<u8>,
    /// Attempts including this one.
    pub attempts: u32,
    /// FIFO group.
    pub group: Option<String>,
    /// Attributes as JSON text ('' for none).
    pub attributes: String,
    /// When this version was enqueued (ms).
    pub sent_at: i64,
}

/// What an enqueue stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Enqueued {
    /// What happened.
    pub outcome: EnqueueOutcome,
    /// The id of the newest stored version (the existing one when discarded).
    pub message_id: String,
}

/// A transition of one leased row, checked against its token.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum RowOp {
    /// A failed attempt: Sleeping until `retry_at` while attempts remain, else Error.
    Fail {
        /// When to try again (ms).
        retry_at: i64,
        /// Why it failed.
        error: String,
        /// The queue's attempt limit.
        max_attempts: u32,
    },
    /// Give the lease back without charging the attempt.
    Release,
    /// A permanent failure: Error at once.
    DeadLetter {
        /// Why.
        error: String,
    },
    /// Push the lease's expiry out.
    Extend {
        /// New lease length (ms from now).
        lease_ms: i64,
    },
}

impl RowOp {
    /// Applies the transition to a loaded row.
    pub(crate) fn apply(
        &self,
        row: &mut Row,
        now: i64,
        token: u64,
    ) -> Result<(), crate::transport::sql::machine::LeaseLost> {
        match self {
            RowOp::Fail { retry_at, error, max_attempts } => row.fail(now, token, *retry_at, error, *max_attempts),
            RowOp::Release => row.release(now, token),
            RowOp::DeadLetter { error } => row.dead_letter(now, token, error),
            RowOp::Extend { lease_ms } => row.extend(now, token, *lease_ms),
        }
    }
}

/// A database holding queues of rows. Every method takes the time (ms since
/// the Unix epoch) so that tests can drive the clock.
pub(crate) trait RowStore: Send + Sync + 'static {
    /// The `messaging.system` name (`postgresql`, `sqlite`).
    fn system(&self) -> &'static str;

    /// Milliseconds since the Unix epoch by the clock every process of the
    /// database agrees on (PostgreSQL's; the machine's for SQLite).
    fn now(&self) -> i64 {
        super::clock::local_ms()
    }

    /// Creates or upgrades the tables (the `migrate` command).
    fn migrate(&self) -> BoxFuture<'_, Result<(), TransportError>>;

    /// Checks that the tables exist with the expected columns.
    #[cfg(test)]
    fn check_schema(&self) -> BoxFuture<'_, Result<(), TransportError>>;

    /// Records the queue with its kind; fails if it exists with the other kind.
    fn declare<'a>(&'a self, queue: &'a str, fifo: bool, now: i64) -> BoxFuture<'a, Result<(), TransportError>>;

    /// Enqueues messages; one result per input, in order.
    fn enqueue<'a>(
        &'a self,
        queue: &'a str,
        now: i64,
        items: Vec<Enqueue>,
        idempotent: bool,
    ) -> BoxFuture<'a, Vec<Result<Enqueued, TransportError>>>;

    /// Leases up to `n` pending rows (see [`crate::transport::sql::machine::IdentityQueue::lease`]).
    fn lease<'a>(
        &'a self,
        queue: &'a str,
        now: i64,
        n: usize,
        lease_ms: i64,
        fifo: bool,
    ) -> BoxFuture<'a, Result<Vec<LeasedRow>, TransportError>>;

    /// How many leases of one standard queue may run at once, each in its
    /// own partition ([`RowStore::lease_partition`]), without contending.
    fn concurrent_leases(&self) -> u32 {
        1
    }

    /// Leases from one partition of a standard queue: the rows whose id is
    /// `part` modulo `of`, in priority then enqueue order. A store that does
    /// not partition leases from the whole queue.
    fn lease_partition<'a>(
        &'a self,
        queue: &'a str,
        now: i64,
        n: usize,
        lease_ms: i64,
        part: u32,
        of: u32,
    ) -> BoxFuture<'a, Result<Vec<LeasedRow>, TransportError>> {
        let _ = (part, of);
        self.lease(queue, now, n, lease_ms, false)
    }

    /// Completes leased rows; one result per item (`StaleReceipt` for a lost lease).
    fn complete<'a>(
        &'a self,
        queue: &'a str,
        now: i64,
        items: Vec<(RowId, u64)>,
        retention_ms: i64,
    ) -> BoxFuture<'a, Vec<Result<(), TransportError>>>;

    /// Applies a transition to one leased row.
    fn apply<'a>(
        &'a self,
        queue: &'a str,
        now: i64,
        id: RowId,
        token: u64,
        op: RowOp,
    ) -> BoxFuture<'a, Result<(), TransportError>>;

    /// Housekeeping: wakes due sleepers, abandons expired leases, purges
    /// processed rows past retention.
    fn maintain<'a>(&'a self, queue: &'a str, now: i64, rules: QueueRules)
        -> BoxFuture<'a, Result<(), TransportError>>;

    /// The earliest time something becomes due (a sleeper or a lease expiry).
    fn next_due<'a>(&'a self, queue: &'a str) -> BoxFuture<'a, Result<Option<i64>, TransportError>>;

    /// Rows waiting or in progress (not Error, not Processed).
    fn depth<'a>(&'a self, queue: &'a str) -> BoxFuture<'a, Result<u64, TransportError>>;

    /// Up to `max` Error rows, oldest first.
    fn dead_letters<'a>(&'a self, queue: &'a str, max: usize) -> BoxFuture<'a, Result<Vec<Row>, TransportError>>;

    /// Error → Pending with attempts reset; returns how many moved.
    fn redrive<'a>(&'a self, queue: &'a str, ids: Vec<RowId>) -> BoxFuture<'a, Result<usize, TransportError>>;

    /// Number of Error rows.
    fn error_depth<'a>(&'a self, queue: &'a str) -> BoxFuture<'a, Result<u64, TransportError>>;

    /// Every row of the queue.
    #[cfg(test)]
    fn rows<'a>(&'a self, queue: &'a str) -> BoxFuture<'a, Result<Vec<Row>, TransportError>>;

    /// The last processed payload of an identity.
    #[cfg(test)]
    fn previous<'a>(
        &'a self,
        queue: &'a str,
        identity: &'a str,
    ) -> BoxFuture<'a, Result<Option<Vec<u8>>, TransportError>>;

    /// Deletes completed idempotency claims completed before `before` (ms).
    fn purge_claims(&self, before: i64) -> BoxFuture<'_, Result<u64, TransportError>>;

    /// An idempotency store on the same database, so that claims live beside
    /// the messages.
    fn idempotency_store(&self) -> Option<std::sync::Arc<dyn crate::claims::IdempotencyStore>> {
        None
    }

    /// Resolves when another process may have enqueued to `queue`
    /// (PostgreSQL NOTIFY); `None` when the store has no such signal.
    fn changes(&self) -> Option<tokio::sync::broadcast::Receiver<String>> {
        None
    }
}
