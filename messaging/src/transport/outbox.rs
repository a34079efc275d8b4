//! [`Outbox`]: messages published inside the application's database
//! transaction for queues on another transport (Amazon SQS, `memory://`, or
//! a database queue elsewhere). The publish writes a row into the table
//! `messaging_outbox` of the transaction's database, so the message exists
//! exactly when the transaction commits; a relay (started by `run` in every
//! process) sends the rows and deletes them once the transport accepted them.
//!
//! The store behind the handle is the SQL one (`sql::outbox`), seen
//! through `outbox_store`; this module holds the handle.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Notify;

use super::outbox_store::{FailedOutboxRow, OutboxQueue, OutboxStore};
use crate::error::TransportError;

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
                    super::sql::outbox::connect::<sqlx::Sqlite>(url)
                        .await
                        .map(|(store, poll)| Outbox::of(store).poll(poll))
                }
                #[cfg(not(feature = "sqlite"))]
                {
                    Err(unavailable("sqlite"))
                }
            }
            "postgres" | "postgresql" => {
                #[cfg(feature = "postgres")]
                {
                    super::sql::outbox::connect::<sqlx::Postgres>(url)
                        .await
                        .map(|(store, poll)| Outbox::of(store).poll(poll))
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
        Outbox::of(super::sql::outbox::on_pool(pool))
    }

    #[cfg(any(feature = "sqlite", feature = "postgres"))]
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
