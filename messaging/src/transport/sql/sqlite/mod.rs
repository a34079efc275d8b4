//! `sqlite://FILE`: queues in a SQLite database file, the embedded default.
//! Several processes on one machine can share the file.
//!
//! SQLite has one writer at a time, so the store needs no row locks: every
//! transaction that writes starts with `BEGIN IMMEDIATE`, which takes the
//! database's write lock at once (waiting up to the busy timeout). Rows read
//! inside such a transaction cannot change before it commits, which is what
//! `FOR UPDATE` (and `SKIP LOCKED`) give on PostgreSQL. A deferred `BEGIN`
//! would take the lock only at the first write, and two readers upgrading at
//! the same time get `SQLITE_BUSY` without waiting. Single statements run in
//! autocommit mode, which takes the write lock when the statement starts.
//!
//! There are no sequences: the row `('seq', value)` of `messaging_counters`
//! gives the enqueue order and the lease tokens. There is no cross-process
//! signal either ([`RowStore::changes`] is `None`): receivers in the same
//! process are woken by [`SqlTransport`], others poll.

use std::path::Path;
use std::str::FromStr;
use std::time::Duration;

use sqlx::sqlite::{
    SqliteConnectOptions, SqliteConnection, SqliteJournalMode, SqlitePool, SqlitePoolOptions, SqliteRow,
    SqliteSynchronous,
};
use sqlx::{Row as _, Sqlite, Transaction};

use super::store::{Enqueued, LeasedRow, RowOp, RowStore};
use super::{SqlOptions, SqlTransport};
use crate::error::{Error, TransportError};
use crate::identity::{Deferred, Enqueue, EnqueueOutcome, QueueRules, Row, RowId, Status};
use crate::transport::BoxFuture;

mod checkpoint;
mod rows;
mod statements;
#[cfg(test)]
mod tests;
mod txn;

use rows::*;
use statements::*;

/// How many connections a file database gets (readers run in parallel; writers take turns).
const MAX_CONNECTIONS: u32 = 8;

/// How long a writer waits for the database's write lock.
const BUSY_TIMEOUT: Duration = Duration::from_secs(5);

/// The SQLite transport.
pub type SqliteTransport = SqlTransport<SqliteStore>;

/// Rows in a SQLite database.
#[derive(Debug, Clone)]
pub struct SqliteStore {
    pool: SqlitePool,
    /// Queues this process's writes in order. Without it, writers of one
    /// process compete through SQLite's busy handler (sleeps of up to 100 ms,
    /// unfair: an ack could starve into "database is locked"); other processes
    /// still wait through the busy timeout.
    writer: std::sync::Arc<tokio::sync::Mutex<()>>,
    /// Checkpoints the WAL in the background (file databases only).
    _checkpointer: Option<std::sync::Arc<checkpoint::Checkpointer>>,
}

/// A write transaction (begun with `BEGIN IMMEDIATE`).
type Tx = Transaction<'static, Sqlite>;

/// Connects to `url` (with the framework's options taken out), and runs the
/// migrations when the URL asks for them (`?migrate=true`).
pub async fn connect(url: &str) -> Result<SqliteTransport, Error> {
    let (options, url) = SqlOptions::parse(url)?;
    let store = SqliteStore::connect(&url).await?;
    if options.migrate {
        store.migrate().await?;
    }
    Ok(SqlTransport::new(store, options))
}

fn backend(what: &str, e: sqlx::Error) -> TransportError {
    TransportError::Backend(format!("sqlite: {what} failed: {e}"))
}

/// The same failure for each of `n` items (a batch fails as a whole).
fn each<T>(n: usize, e: &TransportError) -> Vec<Result<T, TransportError>> {
    (0..n)
        .map(|_| {
            Err(match e {
                TransportError::StaleReceipt => TransportError::StaleReceipt,
                TransportError::Closed => TransportError::Closed,
                TransportError::QueueNotFound(q) => TransportError::QueueNotFound(q.clone()),
                TransportError::Rejected(r) => TransportError::Rejected(r.clone()),
                other => TransportError::Backend(other.to_string()),
            })
        })
        .collect()
}

/// A count or limit as SQLite's signed integer.
fn int(n: usize) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

/// Whether the options name an in-memory database (`sqlite::memory:`, `?mode=memory`).
fn in_memory(url: &str, path: &Path) -> bool {
    url.contains(":memory:")
        || url.contains("mode=memory")
        || path.to_str().is_some_and(|p| p.starts_with("file:sqlx-in-memory-"))
}

impl SqliteStore {
    /// Opens (creating it if missing) the database file of `url`
    /// (`sqlite://FILE`, with sqlx's SQLite parameters) in WAL mode.
    pub async fn connect(url: &str) -> Result<Self, TransportError> {
        let options = SqliteConnectOptions::from_str(url)
            .map_err(|e| TransportError::Backend(format!("sqlite: invalid database URL `{url}`: {e}")))?
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            .busy_timeout(BUSY_TIMEOUT)
            .synchronous(SqliteSynchronous::Normal)
            .pragma("wal_autocheckpoint", checkpoint::AUTOCHECKPOINT_PAGES)
            .foreign_keys(false);
        let path = options.get_filename().to_path_buf();
        let memory = in_memory(url, &path);
        if !memory {
            if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
                if !dir.is_dir() {
                    let problem = if dir.exists() { "is not a directory" } else { "does not exist" };
                    return Err(TransportError::Backend(format!(
                        "sqlite: cannot open the database file `{}`: `{}` {problem}",
                        path.display(),
                        dir.display()
                    )));
                }
            }
        }
        // An in-memory database lives as long as one of its connections: keep
        // exactly one, forever.
        let pool = if memory {
            SqlitePoolOptions::new().max_connections(1).min_connections(1).idle_timeout(None).max_lifetime(None)
        } else {
            SqlitePoolOptions::new().max_connections(MAX_CONNECTIONS)
        };
        let pool = pool.acquire_timeout(Duration::from_secs(10)).connect_with(options).await.map_err(|e| {
            TransportError::Backend(format!("sqlite: cannot open the database file `{}`: {e}", path.display()))
        })?;
        let checkpointer = if memory { None } else { checkpoint::start(pool.clone()) };
        Ok(SqliteStore { pool, writer: Default::default(), _checkpointer: checkpointer })
    }

    /// The connection pool.
    pub fn pool(&self) -> &SqlitePool {
        &self.pool
    }

    /// Takes this process's write turn (see `writer`).
    async fn write_turn(&self) -> tokio::sync::OwnedMutexGuard<()> {
        self.writer.clone().lock_owned().await
    }

    /// Begins a write transaction: `BEGIN IMMEDIATE` takes the write lock now.
    /// End it with [`finish`](statements::finish); if the future is dropped
    /// before, the transaction's drop queues a `ROLLBACK` that runs before the
    /// connection is used again.
    async fn begin(&self) -> Result<Tx, TransportError> {
        self.pool.begin_with("BEGIN IMMEDIATE").await.map_err(|e| backend("begin", e))
    }
}

impl RowStore for SqliteStore {
    fn system(&self) -> &'static str {
        "sqlite"
    }

    fn migrate(&self) -> BoxFuture<'_, Result<(), TransportError>> {
        Box::pin(async move {
            sqlx::migrate!("./migrations/sqlite")
                .run(&self.pool)
                .await
                .map_err(|e| TransportError::Backend(format!("sqlite: migration failed: {e}")))
        })
    }

    fn check_schema(&self) -> BoxFuture<'_, Result<(), TransportError>> {
        Box::pin(super::schema::check_sqlite(&self.pool))
    }

    fn declare<'a>(&'a self, queue: &'a str, fifo: bool, now: i64) -> BoxFuture<'a, Result<(), TransportError>> {
        Box::pin(async move {
            self.check_schema().await?;
            let turn = self.write_turn().await;
            sqlx::query("INSERT INTO messaging_queues (name, fifo, created_at) VALUES (?1, ?2, ?3) ON CONFLICT (name) DO NOTHING")
                .bind(queue)
                .bind(fifo)
                .bind(now)
                .execute(&self.pool)
                .await
                .map_err(|e| backend("declaring a queue", e))?;
            drop(turn);
            let stored: bool = sqlx::query_scalar("SELECT fifo FROM messaging_queues WHERE name = ?1")
                .bind(queue)
                .fetch_one(&self.pool)
                .await
                .map_err(|e| backend("declaring a queue", e))?;
            super::schema::check_kind(queue, fifo, stored)
        })
    }

    fn enqueue<'a>(
        &'a self,
        queue: &'a str,
        now: i64,
        items: Vec<Enqueue>,
        idempotent: bool,
    ) -> BoxFuture<'a, Vec<Result<Enqueued, TransportError>>> {
        Box::pin(async move {
            if items.is_empty() {
                return Vec::new();
            }
            let n = items.len();
            let _turn = self.write_turn().await;
            let stored = match self.begin().await {
                Ok(mut tx) => {
                    let result = Self::enqueue_in(&mut tx, queue, now, items, idempotent).await;
                    finish(tx, result).await
                }
                Err(e) => Err(e),
            };
            match stored {
                Ok(stored) => stored.into_iter().map(Ok).collect(),
                Err(e) => each(n, &e),
            }
        })
    }

    fn lease<'a>(
        &'a self,
        queue: &'a str,
        now: i64,
        n: usize,
        lease_ms: i64,
        fifo: bool,
    ) -> BoxFuture<'a, Result<Vec<LeasedRow>, TransportError>> {
        Box::pin(async move {
            if n == 0 {
                return Ok(Vec::new());
            }
            // Most idle polls find nothing: look before taking the write lock.
            let waiting: bool = sqlx::query_scalar(
                "SELECT EXISTS (SELECT 1 FROM messaging_messages WHERE queue = ?1 AND status = 'pending')",
            )
            .bind(queue)
            .fetch_one(&self.pool)
            .await
            .map_err(|e| backend("lease", e))?;
            if !waiting {
                return Ok(Vec::new());
            }
            let _turn = self.write_turn().await;
            let mut tx = self.begin().await?;
            let pick = if fifo { txn::PICK_FIFO } else { txn::PICK_STANDARD };
            let result = Self::lease_in(&mut tx, pick, queue, now, n, lease_ms).await;
            finish(tx, result).await
        })
    }

    fn complete<'a>(
        &'a self,
        queue: &'a str,
        now: i64,
        items: Vec<(RowId, u64)>,
        retention_ms: i64,
    ) -> BoxFuture<'a, Vec<Result<(), TransportError>>> {
        Box::pin(async move {
            if items.is_empty() {
                return Vec::new();
            }
            let _turn = self.write_turn().await;
            let done = match self.begin().await {
                Ok(mut tx) => {
                    let result = Self::complete_in(&mut tx, queue, now, &items, retention_ms).await;
                    finish(tx, result).await
                }
                Err(e) => Err(e),
            };
            done.unwrap_or_else(|e| each(items.len(), &e))
        })
    }

    fn apply<'a>(
        &'a self,
        queue: &'a str,
        now: i64,
        id: RowId,
        token: u64,
        op: RowOp,
    ) -> BoxFuture<'a, Result<(), TransportError>> {
        Box::pin(async move {
            let _turn = self.write_turn().await;
            let mut tx = self.begin().await?;
            let result = transition(&mut tx, queue, id, |row| {
                op.apply(row, now, token).map_err(|_| TransportError::StaleReceipt)?;
                Ok(((), false))
            })
            .await;
            finish(tx, result).await
        })
    }

    fn maintain<'a>(
        &'a self,
        queue: &'a str,
        now: i64,
        rules: QueueRules,
    ) -> BoxFuture<'a, Result<(), TransportError>> {
        Box::pin(async move {
            // Look first, without the write lock: usually there is nothing to
            // do, and taking the lock every 100 ms would hold up publishers.
            let (sleepers, expired, purgeable): (bool, bool, bool) = sqlx::query_as(
                "SELECT \
                   EXISTS (SELECT 1 FROM messaging_messages WHERE queue = ?1 AND status = 'sleeping' \
                           AND (process_at IS NULL OR process_at <= ?2)), \
                   EXISTS (SELECT 1 FROM messaging_messages WHERE queue = ?1 \
                           AND status IN ('processing', 'awaiting_release') AND lease_expires <= ?2), \
                   ?3 AND EXISTS (SELECT 1 FROM messaging_messages WHERE queue = ?1 AND status = 'processed' \
                           AND processed_at <= ?4)",
            )
            .bind(queue)
            .bind(now)
            .bind(rules.retention_ms > 0)
            .bind(now - rules.retention_ms)
            .fetch_one(&self.pool)
            .await
            .map_err(|e| backend("housekeeping", e))?;
            if !(sleepers || expired || purgeable) {
                return Ok(());
            }
            let _turn = self.write_turn().await;
            if sleepers {
                // A sleeper without a process-at time is due (as in Row::is_eligible).
                sqlx::query(
                    "UPDATE messaging_messages SET status = 'pending' WHERE queue = ?1 AND status = 'sleeping' \
                     AND (process_at IS NULL OR process_at <= ?2)",
                )
                .bind(queue)
                .bind(now)
                .execute(&self.pool)
                .await
                .map_err(|e| backend("waking sleeping messages", e))?;
            }
            if expired {
                let mut tx = self.begin().await?;
                let result = Self::abandon_in(&mut tx, queue, now, &rules).await;
                finish(tx, result).await?;
            }
            if purgeable {
                sqlx::query(
                    "DELETE FROM messaging_messages WHERE queue = ?1 AND status = 'processed' AND processed_at <= ?2",
                )
                .bind(queue)
                .bind(now - rules.retention_ms)
                .execute(&self.pool)
                .await
                .map_err(|e| backend("purging processed messages", e))?;
            }
            Ok(())
        })
    }

    fn next_due<'a>(&'a self, queue: &'a str) -> BoxFuture<'a, Result<Option<i64>, TransportError>> {
        Box::pin(async move {
            // (SQLite's two-argument min() is NULL when either side is.)
            let (sleeping, leased): (Option<i64>, Option<i64>) = sqlx::query_as(
                "SELECT (SELECT min(process_at) FROM messaging_messages WHERE queue = ?1 AND status = 'sleeping'), \
                    (SELECT min(lease_expires) FROM messaging_messages WHERE queue = ?1 \
                        AND status IN ('processing', 'awaiting_release'))",
            )
            .bind(queue)
            .fetch_one(&self.pool)
            .await
            .map_err(|e| backend("next due time", e))?;
            Ok(match (sleeping, leased) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            })
        })
    }

    fn depth<'a>(&'a self, queue: &'a str) -> BoxFuture<'a, Result<u64, TransportError>> {
        Box::pin(async move {
            let n: i64 = sqlx::query_scalar(
                "SELECT count(*) FROM messaging_messages WHERE queue = ?1 \
                 AND status IN ('pending', 'sleeping', 'processing', 'awaiting_release')",
            )
            .bind(queue)
            .fetch_one(&self.pool)
            .await
            .map_err(|e| backend("depth", e))?;
            Ok(n as u64)
        })
    }

    fn errors<'a>(&'a self, queue: &'a str, max: usize) -> BoxFuture<'a, Result<Vec<Row>, TransportError>> {
        Box::pin(async move {
            let sql = format!(
                "SELECT {COLUMNS} FROM messaging_messages WHERE queue = ?1 AND status = 'error' ORDER BY seq LIMIT ?2"
            );
            let rows = sqlx::query(&sql)
                .bind(queue)
                .bind(int(max))
                .fetch_all(&self.pool)
                .await
                .map_err(|e| backend("reading dead letters", e))?;
            rows.iter().map(row_of).collect()
        })
    }

    fn redrive<'a>(&'a self, queue: &'a str, ids: Vec<RowId>) -> BoxFuture<'a, Result<usize, TransportError>> {
        Box::pin(async move {
            if ids.is_empty() {
                return Ok(0);
            }
            let _turn = self.write_turn().await;
            let mut tx = self.begin().await?;
            let result = Self::redrive_in(&mut tx, queue, &ids).await;
            finish(tx, result).await
        })
    }

    fn error_depth<'a>(&'a self, queue: &'a str) -> BoxFuture<'a, Result<u64, TransportError>> {
        Box::pin(async move {
            let n: i64 =
                sqlx::query_scalar("SELECT count(*) FROM messaging_messages WHERE queue = ?1 AND status = 'error'")
                    .bind(queue)
                    .fetch_one(&self.pool)
                    .await
                    .map_err(|e| backend("dead-letter depth", e))?;
            Ok(n as u64)
        })
    }

    fn rows<'a>(&'a self, queue: &'a str) -> BoxFuture<'a, Result<Vec<Row>, TransportError>> {
        Box::pin(async move {
            let sql = format!("SELECT {COLUMNS} FROM messaging_messages WHERE queue = ?1 ORDER BY id");
            let rows = sqlx::query(&sql)
                .bind(queue)
                .fetch_all(&self.pool)
                .await
                .map_err(|e| backend("reading messages", e))?;
            rows.iter().map(row_of).collect()
        })
    }

    fn previous<'a>(
        &'a self,
        queue: &'a str,
        identity: &'a str,
    ) -> BoxFuture<'a, Result<Option<Vec<u8>>, TransportError>> {
        Box::pin(async move {
            sqlx::query_scalar("SELECT payload FROM messaging_previous WHERE queue = ?1 AND identity = ?2")
                .bind(queue)
                .bind(identity)
                .fetch_optional(&self.pool)
                .await
                .map_err(|e| backend("reading the previous message", e))
        })
    }

    fn purge_claims(&self, before: i64) -> BoxFuture<'_, Result<u64, TransportError>> {
        Box::pin(async move {
            let _turn = self.write_turn().await;
            let done = sqlx::query("DELETE FROM messaging_idempotency WHERE completed = 1 AND completed_at < ?1")
                .bind(before)
                .execute(&self.pool)
                .await
                .map_err(|e| backend("purging idempotency claims", e))?;
            Ok(done.rows_affected())
        })
    }

    fn idempotency_store(&self) -> Option<std::sync::Arc<dyn crate::idempotency::IdempotencyStore>> {
        Some(std::sync::Arc::new(crate::idempotency::SqliteIdempotencyStore::new(self.pool.clone())))
    }

    fn changes(&self) -> Option<tokio::sync::broadcast::Receiver<String>> {
        None
    }
}
