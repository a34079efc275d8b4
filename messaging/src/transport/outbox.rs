//! [`Outbox`]: messages published inside the application's database
//! transaction for queues on another transport (Amazon SQS, `memory://`, or
//! a database queue elsewhere). The publish writes a row into the table
//! `messaging_outbox` of the transaction's database, so the message exists
//! exactly when the transaction commits; a relay (started by `run` in every
//! process) sends the rows and deletes them once the transport accepted them.
//!
//! The store behind the handle is the SQL one (`sql::outbox`); this module
//! holds what the publisher and the relay see of it.

use std::any::Any;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Notify;

use super::{MessageId, Outgoing};
use crate::boxed::BoxFuture;
use crate::error::TransportError;

/// One message to write into the outbox.
#[derive(Debug, Clone)]
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

/// The rows of one queue in the outbox, as [`Outbox::stats`] reports them.
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

/// A row the transport refused for good, as [`Outbox::failed`] lists it.
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

/// The oldest pending row after which `/health` reports the outbox
/// unhealthy, by default: past Amazon SQS's five-minute deduplication
/// window, a FIFO message resent after a relay's crash is no longer
/// recognised as a repeat.
pub const DEFAULT_MAX_AGE: Duration = Duration::from_secs(5 * 60);

/// An outbox in the application's database (PostgreSQL or SQLite): where
/// [`SendBuilder::in_transaction`](crate::publish::SendBuilder::in_transaction)
/// writes messages for queues whose transport is not that database, and
/// where the relay started by `run` takes them from. Configure one with
/// `--outbox URL` / `MESSAGING_OUTBOX_URL`, or with
/// [`Setup::outbox`](crate::Setup::outbox) on the application's own pool.
/// Cheap to clone.
#[derive(Clone)]
pub struct Outbox {
    pub(crate) store: Arc<dyn OutboxStore>,
    /// Wakes this process's relay (a write committed through
    /// [`Publisher::commit`](crate::Publisher::commit)).
    pub(crate) local: Arc<Notify>,
    pub(crate) max_age: Duration,
    pub(crate) poll: Duration,
}

impl std::fmt::Debug for Outbox {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Outbox")
            .field("database", &self.store.system())
            .field("max_age", &self.max_age)
            .field("poll", &self.poll)
            .finish()
    }
}

impl Outbox {
    /// Opens the outbox in the database `url` names: `postgres://USER@HOST/DB`
    /// or `sqlite://FILE`, the database of the transactions you publish in.
    /// Takes the framework's `migrate=true` (create the table), `schema=NAME`
    /// (PostgreSQL) and `poll=` options. Fails with a sentence when the
    /// database is unreachable or its table is missing.
    ///
    /// ```rust,no_run
    /// # async fn f() -> Result<(), messaging::Error> {
    /// let outbox = messaging::transport::Outbox::connect("postgres://app@db/shop?migrate=true").await?;
    /// # let _ = outbox; Ok(()) }
    /// ```
    pub async fn connect(url: &str) -> Result<Outbox, crate::error::Error> {
        let scheme = url.split_once(':').map_or(url, |(s, _)| s);
        #[allow(unused_variables)] // used only when a database feature is disabled
        let unavailable = |feature: &str| crate::error::Error::Config {
            url: url.to_owned(),
            reason: format!("this build has no `{scheme}` database; enable the `{feature}` feature of `messaging`"),
        };
        match scheme {
            "sqlite" => {
                #[cfg(feature = "sqlite")]
                {
                    super::sql::outbox::connect::<sqlx::Sqlite>(url).await
                }
                #[cfg(not(feature = "sqlite"))]
                {
                    Err(unavailable("sqlite"))
                }
            }
            "postgres" | "postgresql" => {
                #[cfg(feature = "postgres")]
                {
                    super::sql::outbox::connect::<sqlx::Postgres>(url).await
                }
                #[cfg(not(feature = "postgres"))]
                {
                    Err(unavailable("postgres"))
                }
            }
            _ => Err(crate::error::Error::Config {
                url: url.to_owned(),
                reason: "an outbox lives in a database: postgres://USER@HOST/DB or sqlite://FILE".into(),
            }),
        }
    }

    /// An outbox on a pool the application opened (a `PgPool` or a
    /// `SqlitePool`): the table `messaging_outbox` in the connection's
    /// schema, created by the `migrate` command or [`Outbox::migrate`].
    #[cfg(any(feature = "postgres", feature = "sqlite"))]
    pub fn on_pool<D: super::sql::Dialect>(pool: sqlx::Pool<D>) -> Outbox {
        super::sql::outbox::on_pool(pool)
    }

    pub(crate) fn of(store: Arc<dyn OutboxStore>) -> Outbox {
        Outbox { store, local: Arc::new(Notify::new()), max_age: DEFAULT_MAX_AGE, poll: Duration::from_secs(1) }
    }

    /// Reports the outbox unhealthy on `/health` and in `app health` once
    /// its oldest pending row is older than `age` (default
    /// [`DEFAULT_MAX_AGE`], five minutes).
    pub fn max_age(mut self, age: Duration) -> Self {
        self.max_age = age;
        self
    }

    /// How often an idle relay looks for rows that no signal announced
    /// (default 1 s). On PostgreSQL a commit wakes the relays at once
    /// (`NOTIFY`); on SQLite only [`Publisher::commit`](crate::Publisher::commit)
    /// wakes this process's relay.
    pub fn poll(mut self, every: Duration) -> Self {
        self.poll = every.max(Duration::from_millis(10));
        self
    }

    /// The database's `messaging.system` name (`postgresql`, `sqlite`).
    pub fn system(&self) -> &'static str {
        self.store.system()
    }

    /// The rows of each queue that has any.
    pub async fn stats(&self) -> Result<Vec<OutboxQueue>, TransportError> {
        self.store.stats().await
    }

    /// Up to `max` rows the transport refused for good, oldest first.
    pub async fn failed(&self, max: usize) -> Result<Vec<FailedOutboxRow>, TransportError> {
        self.store.failed(max).await
    }

    /// Makes the failed rows of `queue` (or of every queue) pending again,
    /// for the relay to send; how many.
    pub async fn retry_failed(&self, queue: Option<&str>) -> Result<u64, TransportError> {
        let n = self.store.retry_failed(queue).await?;
        self.local.notify_waiters();
        Ok(n)
    }

    /// Creates or upgrades the framework's tables in the outbox's database
    /// (the `migrate` command does it).
    pub async fn migrate(&self) -> Result<(), TransportError> {
        self.store.migrate().await
    }

    /// The schedules' ledger in the outbox's database.
    pub(crate) fn schedule_ledger(&self) -> Arc<dyn super::schedules::ScheduleLedger> {
        self.store.schedule_ledger()
    }

    /// Wakes this process's relay.
    pub(crate) fn wake(&self) {
        self.local.notify_waiters();
    }
}
