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

/// Every column of `messaging_messages`, in the order [`row_of`] reads them.
const COLUMNS: &str = "id, queue, identity, group_id, message_id, payload, attributes, priority, process_at, status, \
    attempts, seq, lease_token, lease_expires, deferred_message_id, deferred_payload, deferred_attributes, \
    deferred_priority, deferred_process_at, deferred_status, deferred_seq, deferred_sent_at, sent_at, processed_at, error";

/// The columns [`leased_of`] reads.
const LEASED_COLUMNS: &str = "id, lease_token, message_id, payload, attempts, group_id, attributes, sent_at";

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
        Ok(SqliteStore { pool, writer: Default::default() })
    }

    /// The connection pool.
    pub fn pool(&self) -> &SqlitePool {
        &self.pool
    }

    /// Begins a write transaction: `BEGIN IMMEDIATE` takes the write lock now.
    /// End it with [`finish`]; if the future is dropped before, the
    /// transaction's drop queues a `ROLLBACK` that runs before the connection
    /// is used again.
    /// Takes this process's write turn (see `writer`).
    async fn write_turn(&self) -> tokio::sync::OwnedMutexGuard<()> {
        self.writer.clone().lock_owned().await
    }

    async fn begin(&self) -> Result<Tx, TransportError> {
        self.pool.begin_with("BEGIN IMMEDIATE").await.map_err(|e| backend("begin", e))
    }

    /// Enqueues a batch in one transaction, in input order: messages without
    /// identity in multi-row inserts, the others one by one (each may meet
    /// an existing row, or one made earlier in the batch).
    async fn enqueue_in(
        conn: &mut SqliteConnection,
        queue: &str,
        now: i64,
        items: Vec<Enqueue>,
        idempotent: bool,
    ) -> Result<Vec<Enqueued>, TransportError> {
        let first = reserve(conn, items.len()).await?;
        let mut out: Vec<Option<Enqueued>> = (0..items.len()).map(|_| None).collect();
        let mut plain = Vec::new();
        for (i, (seq, e)) in (first..).zip(items).enumerate() {
            let Some(identity) = &e.identity else {
                plain.push((i, Row::new(0, seq, now, e)));
                continue;
            };
            let Some(mut row) = load_identity(conn, queue, identity).await? else {
                let message_id = e.message_id.clone();
                let id = insert(conn, queue, e, seq, now).await?;
                out[i] = Some(Enqueued { outcome: EnqueueOutcome::Inserted(id), message_id });
                continue;
            };
            let outcome = row.enqueue(now, seq, e, idempotent);
            if !matches!(outcome, EnqueueOutcome::Discarded(_)) {
                store_row(conn, &row).await?;
            }
            let message_id = match (&row.status, &row.deferred) {
                (Status::AwaitingRelease, Some(d)) => d.message_id.clone(),
                _ => row.message_id.clone(),
            };
            out[i] = Some(Enqueued { outcome, message_id });
        }
        let ids = insert_many(conn, queue, plain.iter().map(|(_, row)| row), now).await?;
        for (i, row) in plain {
            let id = ids.get(&row.seq).copied().ok_or_else(|| {
                TransportError::Backend(format!("sqlite: the insert returned no row for sequence {}", row.seq))
            })?;
            out[i] = Some(Enqueued { outcome: EnqueueOutcome::Inserted(id), message_id: row.message_id });
        }
        Ok(out.into_iter().flatten().collect())
    }

    /// Standard queues: the first pending rows by priority, then enqueue order.
    async fn lease_standard(
        conn: &mut SqliteConnection,
        queue: &str,
        now: i64,
        n: usize,
        lease_ms: i64,
    ) -> Result<Vec<LeasedRow>, TransportError> {
        let ids: Vec<i64> = sqlx::query_scalar(
            "SELECT id FROM messaging_messages WHERE queue = ?1 AND status = 'pending' \
             ORDER BY priority DESC, seq LIMIT ?2",
        )
        .bind(queue)
        .bind(int(n))
        .fetch_all(&mut *conn)
        .await
        .map_err(|e| backend("lease", e))?;
        lease_ids(conn, &ids, now, lease_ms).await
    }

    /// FIFO: the head of each group with nothing leased, one per group, in
    /// enqueue order. The head of a group (rows without a group form one) is
    /// its earliest pending or sleeping row; a sleeping head holds the group back.
    async fn lease_fifo(
        conn: &mut SqliteConnection,
        queue: &str,
        now: i64,
        n: usize,
        lease_ms: i64,
    ) -> Result<Vec<LeasedRow>, TransportError> {
        // With min(), SQLite takes the bare columns from the row holding the minimum.
        let ids: Vec<i64> = sqlx::query_scalar(
            "SELECT id FROM ( \
                SELECT id, group_id, status, min(seq) AS seq FROM messaging_messages \
                WHERE queue = ?1 AND status IN ('pending', 'sleeping') GROUP BY group_id) heads \
             WHERE status = 'pending' AND NOT EXISTS ( \
                SELECT 1 FROM messaging_messages l WHERE l.queue = ?1 AND l.group_id IS heads.group_id \
                AND l.status IN ('processing', 'awaiting_release')) \
             ORDER BY seq LIMIT ?2",
        )
        .bind(queue)
        .bind(int(n))
        .fetch_all(&mut *conn)
        .await
        .map_err(|e| backend("lease", e))?;
        lease_ids(conn, &ids, now, lease_ms).await
    }

    /// Completes a batch in one transaction: plain rows with two statements
    /// for the whole batch (find those whose lease matches, then delete or
    /// mark them), the others (identity rows, deferred versions, lost leases)
    /// through [`Row::complete`]. The outer error fails the whole batch.
    async fn complete_in(
        conn: &mut SqliteConnection,
        queue: &str,
        now: i64,
        items: &[(RowId, u64)],
        retention_ms: i64,
    ) -> Result<Vec<Result<(), TransportError>>, TransportError> {
        let held: Vec<(i64, i64)> = sqlx::query_as(
            "SELECT id, lease_token FROM messaging_messages WHERE id IN (SELECT value FROM json_each(?1)) \
             AND queue = ?2 AND status = 'processing' AND identity IS NULL AND lease_expires > ?3",
        )
        .bind(json_ids(items.iter().map(|&(id, _)| id as i64)))
        .bind(queue)
        .bind(now)
        .fetch_all(&mut *conn)
        .await
        .map_err(|e| backend("completing messages", e))?;
        let mut held: std::collections::HashMap<i64, i64> = held.into_iter().collect();
        let plain: Vec<i64> = items
            .iter()
            .filter(|&&(id, token)| held.get(&(id as i64)) == Some(&(token as i64)))
            .map(|&(id, _)| id as i64)
            .collect();
        if !plain.is_empty() {
            let fast = if retention_ms <= 0 {
                "DELETE FROM messaging_messages WHERE id IN (SELECT value FROM json_each(?1))"
            } else {
                "UPDATE messaging_messages SET status = 'processed', processed_at = ?2, lease_token = NULL, \
                 lease_expires = NULL WHERE id IN (SELECT value FROM json_each(?1))"
            };
            sqlx::query(fast)
                .bind(json_ids(plain.iter().copied()))
                .bind(now)
                .execute(&mut *conn)
                .await
                .map_err(|e| backend("completing messages", e))?;
        }
        let mut results = Vec::with_capacity(items.len());
        for &(id, token) in items {
            if held.get(&(id as i64)) == Some(&(token as i64)) {
                // Once: the same receipt twice in a batch finds the row gone.
                held.remove(&(id as i64));
                results.push(Ok(()));
                continue;
            }
            let mut previous = None;
            let outcome = transition(conn, queue, id, |row| {
                let done = row.complete(now, token, retention_ms).map_err(|_| TransportError::StaleReceipt)?;
                previous = done.previous;
                Ok(((), done.delete))
            })
            .await;
            match outcome {
                Ok(()) => {
                    if let Some((identity, message_id, payload)) = previous {
                        record_previous(conn, queue, &identity, &message_id, &payload, now).await?;
                    }
                    results.push(Ok(()));
                }
                Err(TransportError::StaleReceipt) => results.push(Err(TransportError::StaleReceipt)),
                Err(e) => return Err(e),
            }
        }
        Ok(results)
    }

    /// Abandons the expired leases of `queue`.
    async fn abandon_in(
        conn: &mut SqliteConnection,
        queue: &str,
        now: i64,
        rules: &QueueRules,
    ) -> Result<(), TransportError> {
        let select = format!(
            "SELECT {COLUMNS} FROM messaging_messages WHERE queue = ?1 \
             AND status IN ('processing', 'awaiting_release') AND lease_expires <= ?2"
        );
        let expired = sqlx::query(&select)
            .bind(queue)
            .bind(now)
            .fetch_all(&mut *conn)
            .await
            .map_err(|e| backend("finding expired leases", e))?;
        for found in &expired {
            let mut row = row_of(found)?;
            if row.is_abandoned(now) {
                row.abandon(now, rules);
                store_row(conn, &row).await?;
            }
        }
        Ok(())
    }

    /// Error → Pending with attempts reset, at the back of the queue, in the order given.
    async fn redrive_in(conn: &mut SqliteConnection, queue: &str, ids: &[RowId]) -> Result<usize, TransportError> {
        let first = reserve(conn, ids.len()).await?;
        let mut moved = 0;
        for (seq, &id) in (first..).zip(ids) {
            let done = sqlx::query(
                "UPDATE messaging_messages SET status = 'pending', attempts = 0, process_at = NULL, seq = ?1 \
                 WHERE id = ?2 AND queue = ?3 AND status = 'error'",
            )
            .bind(seq as i64)
            .bind(id as i64)
            .bind(queue)
            .execute(&mut *conn)
            .await
            .map_err(|e| backend("redrive", e))?;
            moved += done.rows_affected() as usize;
        }
        Ok(moved)
    }
}

/// Commits `tx` when `result` is a success, rolls it back otherwise.
async fn finish<R>(tx: Tx, result: Result<R, TransportError>) -> Result<R, TransportError> {
    match result {
        Ok(value) => {
            tx.commit().await.map_err(|e| backend("commit", e))?;
            Ok(value)
        }
        Err(e) => {
            if let Err(rollback) = tx.rollback().await {
                tracing::debug!("sqlite: rollback failed: {rollback}");
            }
            Err(e)
        }
    }
}

/// Reserves `n` consecutive values of the counter; returns the first.
async fn reserve(conn: &mut SqliteConnection, n: usize) -> Result<u64, TransportError> {
    if n == 0 {
        return Ok(0);
    }
    let last: Option<i64> =
        sqlx::query_scalar("UPDATE messaging_counters SET value = value + ?1 WHERE name = 'seq' RETURNING value")
            .bind(int(n))
            .fetch_optional(&mut *conn)
            .await
            .map_err(|e| backend("advancing the counter", e))?;
    match last {
        Some(last) => Ok((last - int(n) + 1) as u64),
        None => Err(TransportError::Backend(
            "sqlite: the counter `seq` is missing from table `messaging_counters`; run the `migrate` command".into(),
        )),
    }
}

/// Leases the rows `ids` in one statement, with one new token for the lease
/// (fencing compares the pair (row, token), and a later lease of any of these
/// rows draws a newer token); returns them in the order of `ids`.
async fn lease_ids(
    conn: &mut SqliteConnection,
    ids: &[i64],
    now: i64,
    lease_ms: i64,
) -> Result<Vec<LeasedRow>, TransportError> {
    if ids.is_empty() {
        return Ok(Vec::new());
    }
    let token = reserve(conn, 1).await?;
    let update = format!(
        "UPDATE messaging_messages SET status = 'processing', lease_token = ?1, lease_expires = ?2, \
         attempts = attempts + 1 WHERE id IN (SELECT value FROM json_each(?3)) RETURNING {LEASED_COLUMNS}"
    );
    let rows = sqlx::query(&update)
        .bind(token as i64)
        .bind(now + lease_ms)
        .bind(json_ids(ids.iter().copied()))
        .fetch_all(&mut *conn)
        .await
        .map_err(|e| backend("lease", e))?;
    let position: std::collections::HashMap<i64, usize> = ids.iter().enumerate().map(|(i, &id)| (id, i)).collect();
    let mut leased = rows.iter().map(leased_of).collect::<Result<Vec<_>, _>>()?;
    leased.sort_by_key(|l| position.get(&(l.id as i64)).copied().unwrap_or(usize::MAX));
    Ok(leased)
}

/// Row ids as a JSON array, for `IN (SELECT value FROM json_each(?))`: one
/// statement for a whole batch.
fn json_ids(ids: impl Iterator<Item = i64>) -> String {
    let mut json = String::from("[");
    for (i, id) in ids.enumerate() {
        if i > 0 {
            json.push(',');
        }
        json.push_str(&id.to_string());
    }
    json.push(']');
    json
}

/// The row of an identity.
async fn load_identity(
    conn: &mut SqliteConnection,
    queue: &str,
    identity: &str,
) -> Result<Option<Row>, TransportError> {
    let select = format!("SELECT {COLUMNS} FROM messaging_messages WHERE queue = ?1 AND identity = ?2");
    let found = sqlx::query(&select)
        .bind(queue)
        .bind(identity)
        .fetch_optional(&mut *conn)
        .await
        .map_err(|e| backend("enqueue", e))?;
    found.as_ref().map(row_of).transpose()
}

/// Loads a row of `queue`, applies `f`, stores the row (or deletes it).
/// A row that is not there is a lost lease.
async fn transition<R>(
    conn: &mut SqliteConnection,
    queue: &str,
    id: RowId,
    f: impl FnOnce(&mut Row) -> Result<(R, bool), TransportError>,
) -> Result<R, TransportError> {
    let select = format!("SELECT {COLUMNS} FROM messaging_messages WHERE id = ?1 AND queue = ?2");
    let found = sqlx::query(&select)
        .bind(id as i64)
        .bind(queue)
        .fetch_optional(&mut *conn)
        .await
        .map_err(|e| backend("loading a message", e))?
        .ok_or(TransportError::StaleReceipt)?;
    let mut row = row_of(&found)?;
    let (result, delete) = f(&mut row)?;
    if delete {
        sqlx::query("DELETE FROM messaging_messages WHERE id = ?1")
            .bind(id as i64)
            .execute(&mut *conn)
            .await
            .map_err(|e| backend("deleting a message", e))?;
    } else {
        store_row(conn, &row).await?;
    }
    Ok(result)
}

/// Records the processed version of an identity.
async fn record_previous(
    conn: &mut SqliteConnection,
    queue: &str,
    identity: &str,
    message_id: &str,
    payload: &[u8],
    now: i64,
) -> Result<(), TransportError> {
    sqlx::query(
        "INSERT INTO messaging_previous (queue, identity, message_id, payload, processed_at) VALUES (?1, ?2, ?3, ?4, ?5) \
         ON CONFLICT (queue, identity) DO UPDATE SET message_id = excluded.message_id, payload = excluded.payload, \
         processed_at = excluded.processed_at",
    )
    .bind(queue)
    .bind(identity)
    .bind(message_id)
    .bind(payload)
    .bind(now)
    .execute(&mut *conn)
    .await
    .map_err(|e| backend("recording the previous message", e))?;
    Ok(())
}

/// Stores every column of `row` (which exists).
async fn store_row(conn: &mut SqliteConnection, row: &Row) -> Result<(), TransportError> {
    let d = row.deferred.as_ref();
    sqlx::query(
        "UPDATE messaging_messages SET identity = ?2, group_id = ?3, message_id = ?4, payload = ?5, attributes = ?6, \
         priority = ?7, process_at = ?8, status = ?9, attempts = ?10, seq = ?11, lease_token = ?12, lease_expires = ?13, \
         deferred_message_id = ?14, deferred_payload = ?15, deferred_attributes = ?16, deferred_priority = ?17, \
         deferred_process_at = ?18, deferred_status = ?19, deferred_seq = ?20, deferred_sent_at = ?21, sent_at = ?22, \
         processed_at = ?23, error = ?24 WHERE id = ?1",
    )
    .bind(row.id as i64)
    .bind(&row.identity)
    .bind(&row.group)
    .bind(&row.message_id)
    .bind(&row.payload)
    .bind(&row.attributes)
    .bind(row.priority)
    .bind(row.process_at)
    .bind(row.status.as_str())
    .bind(i64::from(row.attempts))
    .bind(row.seq as i64)
    .bind(row.lease_token.map(|t| t as i64))
    .bind(row.lease_expires)
    .bind(d.map(|d| d.message_id.as_str()))
    .bind(d.map(|d| d.payload.as_slice()))
    .bind(d.map(|d| d.attributes.as_str()))
    .bind(d.map(|d| d.priority))
    .bind(d.and_then(|d| d.process_at))
    .bind(d.and_then(|d| d.status_after_release).map(Status::as_str))
    .bind(d.map(|d| d.seq as i64))
    .bind(d.map(|d| d.sent_at))
    .bind(row.sent_at)
    .bind(row.processed_at)
    .bind(&row.error)
    .execute(&mut *conn)
    .await
    .map_err(|e| backend("storing a message", e))?;
    Ok(())
}

/// Inserts a new row for `e` (whose identity, if any, has no row yet).
async fn insert(
    conn: &mut SqliteConnection,
    queue: &str,
    e: Enqueue,
    seq: u64,
    now: i64,
) -> Result<RowId, TransportError> {
    // Row::new computes the landing status: Pending, Sleeping when delayed, or the custom one.
    let row = Row::new(0, seq, now, e);
    let id: i64 = sqlx::query_scalar(
        "INSERT INTO messaging_messages (queue, identity, group_id, message_id, payload, attributes, priority, \
         process_at, status, attempts, seq, sent_at) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, 0, ?10, ?11) \
         RETURNING id",
    )
    .bind(queue)
    .bind(&row.identity)
    .bind(&row.group)
    .bind(&row.message_id)
    .bind(&row.payload)
    .bind(&row.attributes)
    .bind(row.priority)
    .bind(row.process_at)
    .bind(row.status.as_str())
    .bind(seq as i64)
    .bind(now)
    .fetch_one(&mut *conn)
    .await
    .map_err(|e| backend("enqueue", e))?;
    Ok(id as RowId)
}

/// Rows per multi-row insert: 12 values each, well under SQLite's 32,766
/// bound parameters.
const INSERT_ROWS: usize = 500;

/// Inserts new rows without identity, [`INSERT_ROWS`] per statement; returns
/// each row's id by its sequence number.
async fn insert_many<'r>(
    conn: &mut SqliteConnection,
    queue: &str,
    rows: impl Iterator<Item = &'r Row>,
    now: i64,
) -> Result<std::collections::HashMap<u64, RowId>, TransportError> {
    let rows: Vec<&Row> = rows.collect();
    let mut ids = std::collections::HashMap::with_capacity(rows.len());
    for chunk in rows.chunks(INSERT_ROWS) {
        let mut insert = sqlx::QueryBuilder::<Sqlite>::new(
            "INSERT INTO messaging_messages (queue, identity, group_id, message_id, payload, attributes, priority, \
             process_at, status, attempts, seq, sent_at) ",
        );
        insert.push_values(chunk, |mut values, row| {
            values
                .push_bind(queue)
                .push_bind(&row.identity)
                .push_bind(&row.group)
                .push_bind(&row.message_id)
                .push_bind(&row.payload)
                .push_bind(&row.attributes)
                .push_bind(row.priority)
                .push_bind(row.process_at)
                .push_bind(row.status.as_str())
                .push_bind(0_i64)
                .push_bind(row.seq as i64)
                .push_bind(now);
        });
        insert.push(" RETURNING id, seq");
        let inserted: Vec<(i64, i64)> =
            insert.build_query_as().fetch_all(&mut *conn).await.map_err(|e| backend("enqueue", e))?;
        ids.extend(inserted.into_iter().map(|(id, seq)| (seq as u64, id as RowId)));
    }
    Ok(ids)
}

/// A leased row (columns as in [`LEASED_COLUMNS`]).
fn leased_of(r: &SqliteRow) -> Result<LeasedRow, TransportError> {
    let get = |e: sqlx::Error| backend("reading a leased row", e);
    Ok(LeasedRow {
        id: r.try_get::<i64, _>("id").map_err(get)? as RowId,
        token: r.try_get::<i64, _>("lease_token").map_err(get)? as u64,
        message_id: r.try_get("message_id").map_err(get)?,
        payload: r.try_get("payload").map_err(get)?,
        attempts: r.try_get::<i64, _>("attempts").map_err(get)? as u32,
        group: r.try_get("group_id").map_err(get)?,
        attributes: r.try_get("attributes").map_err(get)?,
        sent_at: r.try_get("sent_at").map_err(get)?,
    })
}

/// Reads a whole row (columns as in [`COLUMNS`]).
fn row_of(r: &SqliteRow) -> Result<Row, TransportError> {
    let get = |e: sqlx::Error| backend("reading a message", e);
    let status = |text: Option<String>| -> Result<Option<Status>, TransportError> {
        match text {
            None => Ok(None),
            Some(t) => Status::parse(&t)
                .map(Some)
                .ok_or_else(|| TransportError::Backend(format!("sqlite: unknown status `{t}` in messaging_messages"))),
        }
    };
    let deferred_payload: Option<Vec<u8>> = r.try_get("deferred_payload").map_err(get)?;
    let deferred = match deferred_payload {
        None => None,
        Some(payload) => Some(Deferred {
            message_id: r.try_get::<Option<String>, _>("deferred_message_id").map_err(get)?.unwrap_or_default(),
            payload,
            priority: r.try_get::<Option<i32>, _>("deferred_priority").map_err(get)?.unwrap_or_default(),
            process_at: r.try_get("deferred_process_at").map_err(get)?,
            status_after_release: status(r.try_get("deferred_status").map_err(get)?)?,
            seq: r.try_get::<Option<i64>, _>("deferred_seq").map_err(get)?.unwrap_or_default() as u64,
            attributes: r.try_get::<Option<String>, _>("deferred_attributes").map_err(get)?.unwrap_or_default(),
            sent_at: r.try_get::<Option<i64>, _>("deferred_sent_at").map_err(get)?.unwrap_or_default(),
        }),
    };
    Ok(Row {
        id: r.try_get::<i64, _>("id").map_err(get)? as RowId,
        identity: r.try_get("identity").map_err(get)?,
        group: r.try_get("group_id").map_err(get)?,
        message_id: r.try_get("message_id").map_err(get)?,
        payload: r.try_get("payload").map_err(get)?,
        priority: r.try_get("priority").map_err(get)?,
        process_at: r.try_get("process_at").map_err(get)?,
        status: status(Some(r.try_get("status").map_err(get)?))?.unwrap_or(Status::Pending),
        attempts: r.try_get::<i64, _>("attempts").map_err(get)? as u32,
        seq: r.try_get::<i64, _>("seq").map_err(get)? as u64,
        lease_token: r.try_get::<Option<i64>, _>("lease_token").map_err(get)?.map(|t| t as u64),
        lease_expires: r.try_get("lease_expires").map_err(get)?,
        deferred,
        processed_at: r.try_get("processed_at").map_err(get)?,
        error: r.try_get("error").map_err(get)?,
        attributes: r.try_get("attributes").map_err(get)?,
        sent_at: r.try_get("sent_at").map_err(get)?,
    })
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
            let result = if fifo {
                Self::lease_fifo(&mut tx, queue, now, n, lease_ms).await
            } else {
                Self::lease_standard(&mut tx, queue, now, n, lease_ms).await
            };
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
            let _turn = self.write_turn().await;
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
            // Look first without the write lock: usually no lease has expired.
            let expired: Option<i64> = sqlx::query_scalar(
                "SELECT id FROM messaging_messages WHERE queue = ?1 AND status IN ('processing', 'awaiting_release') \
                 AND lease_expires <= ?2 LIMIT 1",
            )
            .bind(queue)
            .bind(now)
            .fetch_optional(&self.pool)
            .await
            .map_err(|e| backend("finding expired leases", e))?;
            if expired.is_some() {
                let mut tx = self.begin().await?;
                let result = Self::abandon_in(&mut tx, queue, now, &rules).await;
                finish(tx, result).await?;
            }
            if rules.retention_ms > 0 {
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

#[cfg(test)]
mod tests {
    use std::collections::HashSet;
    use std::path::PathBuf;

    use super::*;

    const NOW: i64 = 1_800_000_000_000;
    const LEASE: i64 = 1_000;

    /// A database file in the temp directory, removed on drop.
    struct TempDb {
        path: PathBuf,
    }

    impl TempDb {
        fn new() -> TempDb {
            let name = format!("messaging-sqlite-{}-{:016x}.db", std::process::id(), fastrand::u64(..));
            TempDb { path: std::env::temp_dir().join(name) }
        }

        fn url(&self) -> String {
            format!("sqlite://{}", self.path.display())
        }
    }

    impl Drop for TempDb {
        fn drop(&mut self) {
            for suffix in ["", "-wal", "-shm"] {
                let _ = std::fs::remove_file(format!("{}{suffix}", self.path.display()));
            }
        }
    }

    /// A migrated store on a fresh file.
    async fn store() -> (SqliteStore, TempDb) {
        let db = TempDb::new();
        let store = SqliteStore::connect(&db.url()).await.expect("connect");
        store.migrate().await.expect("migrate");
        (store, db)
    }

    async fn close(store: SqliteStore, db: TempDb) {
        store.pool.close().await;
        drop(db);
    }

    fn msg(identity: Option<&str>, payload: &str) -> Enqueue {
        Enqueue {
            identity: identity.map(str::to_owned),
            message_id: format!("m-{payload}"),
            payload: payload.as_bytes().to_vec(),
            priority: 0,
            process_at: None,
            status: None,
            group: None,
            attributes: String::new(),
        }
    }

    fn grouped(group: Option<&str>, payload: &str) -> Enqueue {
        Enqueue { group: group.map(str::to_owned), ..msg(None, payload) }
    }

    async fn enqueue(store: &SqliteStore, queue: &str, now: i64, e: Enqueue) -> Enqueued {
        store.enqueue(queue, now, vec![e], false).await.remove(0).expect("enqueue")
    }

    async fn row(store: &SqliteStore, queue: &str, id: RowId) -> Row {
        store.rows(queue).await.expect("rows").into_iter().find(|r| r.id == id).expect("row exists")
    }

    fn payloads(leased: &[LeasedRow]) -> Vec<String> {
        leased.iter().map(|l| String::from_utf8_lossy(&l.payload).into_owned()).collect()
    }

    #[tokio::test]
    async fn migrates_checks_and_declares_queues() {
        let (store, db) = store().await;
        assert_eq!(store.system(), "sqlite");
        store.check_schema().await.expect("schema ok");
        // Migrating again is a no-op.
        store.migrate().await.expect("migrate twice");
        store.declare("jobs", false, NOW).await.expect("declare standard");
        store.declare("jobs", false, NOW).await.expect("re-declare standard");
        store.declare("ordered", true, NOW).await.expect("declare FIFO");
        store.declare("ordered", true, NOW).await.expect("re-declare FIFO");
        let err = store.declare("jobs", true, NOW).await.expect_err("kind changed");
        assert!(matches!(&err, TransportError::Rejected(m) if m.contains("exists as a standard queue")), "{err}");
        let err = store.declare("ordered", false, NOW).await.expect_err("kind changed");
        assert!(matches!(&err, TransportError::Rejected(m) if m.contains("exists as a FIFO queue")), "{err}");
        close(store, db).await;
    }

    #[tokio::test]
    async fn connect_runs_the_migrations_when_asked() {
        let db = TempDb::new();
        let transport = connect(&format!("{}?migrate=true&poll=50ms", db.url())).await.expect("connect");
        transport.store().check_schema().await.expect("migrated");
        transport.store().pool().close().await;
    }

    #[tokio::test]
    async fn a_missing_schema_asks_for_the_migrate_command() {
        let db = TempDb::new();
        let store = SqliteStore::connect(&db.url()).await.expect("connect creates the file");
        for err in [
            store.check_schema().await.expect_err("no tables"),
            store.declare("jobs", false, NOW).await.expect_err("no tables"),
        ] {
            let text = err.to_string();
            assert!(text.contains("run the `migrate` command"), "{text}");
            assert!(text.contains("messaging_messages"), "{text}");
        }
        close(store, db).await;
    }

    #[tokio::test]
    async fn a_missing_directory_is_named() {
        let dir = std::env::temp_dir().join(format!("messaging-missing-{:016x}", fastrand::u64(..)));
        let url = format!("sqlite://{}/app.db", dir.display());
        let err = SqliteStore::connect(&url).await.expect_err("no directory");
        let text = err.to_string();
        assert!(matches!(err, TransportError::Backend(_)));
        assert!(text.contains(&dir.display().to_string()) && text.contains("does not exist"), "{text}");
    }

    #[tokio::test]
    async fn enqueue_lease_complete() {
        let (store, db) = store().await;
        store.declare("jobs", false, NOW).await.expect("declare");
        let plain = enqueue(&store, "jobs", NOW, msg(None, "plain")).await;
        let keyed = enqueue(&store, "jobs", NOW, msg(Some("k"), "keyed")).await;
        assert!(matches!(plain.outcome, EnqueueOutcome::Inserted(_)));
        assert!(matches!(keyed.outcome, EnqueueOutcome::Inserted(_)));
        assert_eq!(keyed.message_id, "m-keyed");
        assert_eq!(store.depth("jobs").await.expect("depth"), 2);

        let leased = store.lease("jobs", NOW, 10, LEASE, false).await.expect("lease");
        assert_eq!(payloads(&leased), ["plain", "keyed"]);
        assert!(leased.iter().all(|l| l.attempts == 1 && l.sent_at == NOW));
        assert_eq!(leased[0].token, leased[1].token, "one token per lease");
        assert!(store.lease("jobs", NOW, 10, LEASE, false).await.expect("lease").is_empty());
        let r = row(&store, "jobs", leased[0].id).await;
        assert_eq!((r.status, r.lease_expires), (Status::Processing, Some(NOW + LEASE)));

        let items = leased.iter().map(|l| (l.id, l.token)).collect::<Vec<_>>();
        let mut stale = items.clone();
        stale.push((leased[0].id, leased[0].token));
        let results = store.complete("jobs", NOW + 1, stale, 0).await;
        assert!(results[0].is_ok() && results[1].is_ok(), "{results:?}");
        assert!(matches!(results[2], Err(TransportError::StaleReceipt)), "{results:?}");
        assert!(store.rows("jobs").await.expect("rows").is_empty());
        assert_eq!(store.previous("jobs", "k").await.expect("previous").as_deref(), Some(&b"keyed"[..]));
        assert_eq!(store.depth("jobs").await.expect("depth"), 0);
        close(store, db).await;
    }

    #[tokio::test]
    async fn priority_then_enqueue_order_and_batches_in_input_order() {
        let (store, db) = store().await;
        let items = vec![
            msg(None, "a"),
            Enqueue { priority: 5, ..msg(Some("k"), "b") },
            msg(None, "c"),
            Enqueue { priority: 5, ..msg(None, "d") },
            Enqueue { process_at: Some(NOW + 10), ..msg(None, "later") },
        ];
        let results = store.enqueue("jobs", NOW, items, false).await;
        let ids: Vec<RowId> = results.into_iter().map(|r| r.expect("enqueued").outcome.row()).collect();
        let rows = store.rows("jobs").await.expect("rows");
        let seqs: Vec<u64> = ids.iter().map(|id| rows.iter().find(|r| r.id == *id).expect("row").seq).collect();
        assert!(seqs.windows(2).all(|w| w[0] < w[1]), "seqs in input order: {seqs:?}");
        assert_eq!(rows.iter().find(|r| r.id == ids[4]).expect("row").status, Status::Sleeping);
        let leased = store.lease("jobs", NOW, 2, LEASE, false).await.expect("lease");
        assert_eq!(payloads(&leased), ["b", "d"]);
        let first_token = leased[0].token;
        let leased = store.lease("jobs", NOW, 10, LEASE, false).await.expect("lease");
        assert_eq!(payloads(&leased), ["a", "c"]);
        assert!(leased[0].token > first_token, "a later lease draws a newer token");
        close(store, db).await;
    }

    #[tokio::test]
    async fn identity_enqueue_while_leased_waits_for_the_release() {
        let (store, db) = store().await;
        enqueue(&store, "jobs", NOW, msg(Some("k"), "v1")).await;
        let leased = store.lease("jobs", NOW, 1, LEASE, false).await.expect("lease").remove(0);
        let newer = enqueue(&store, "jobs", NOW + 1, Enqueue { priority: 3, ..msg(Some("k"), "v2") }).await;
        assert_eq!(newer.outcome, EnqueueOutcome::Deferred(leased.id));
        assert_eq!(newer.message_id, "m-v2");
        // A later enqueue replaces the deferred version.
        let newest = enqueue(&store, "jobs", NOW + 2, Enqueue { priority: 4, ..msg(Some("k"), "v3") }).await;
        assert_eq!(newest.outcome, EnqueueOutcome::Deferred(leased.id));
        let r = row(&store, "jobs", leased.id).await;
        assert_eq!(r.status, Status::AwaitingRelease);
        assert_eq!(r.payload, b"v1");
        let d = r.deferred.expect("deferred version");
        assert_eq!(
            (d.payload.as_slice(), d.priority, d.message_id.as_str(), d.sent_at),
            (&b"v3"[..], 4, "m-v3", NOW + 2)
        );
        // Nobody else can lease the newer version meanwhile.
        assert!(store.lease("jobs", NOW + 3, 10, LEASE, false).await.expect("lease").is_empty());
        // The lease holder keeps its lease: completing applies the deferred version.
        store.complete("jobs", NOW + 4, vec![(leased.id, leased.token)], 0).await.remove(0).expect("complete");
        let r = row(&store, "jobs", leased.id).await;
        assert_eq!((r.status, r.payload.as_slice(), r.priority, r.attempts), (Status::Pending, &b"v3"[..], 4, 0));
        assert!(r.deferred.is_none() && r.lease_token.is_none());
        assert_eq!(store.previous("jobs", "k").await.expect("previous").as_deref(), Some(&b"v1"[..]));
        let again = store.lease("jobs", NOW + 5, 10, LEASE, false).await.expect("lease");
        assert_eq!(payloads(&again), ["v3"]);
        assert_eq!(again[0].message_id, "m-v3");
        // An identity enqueue of an unleased row updates it in place.
        store.complete("jobs", NOW + 6, vec![(again[0].id, again[0].token)], 60_000).await.remove(0).expect("complete");
        assert_eq!(row(&store, "jobs", again[0].id).await.status, Status::Processed);
        let updated = enqueue(&store, "jobs", NOW + 7, msg(Some("k"), "v4")).await;
        assert_eq!(updated.outcome, EnqueueOutcome::Updated(again[0].id));
        assert_eq!(store.previous("jobs", "k").await.expect("previous").as_deref(), Some(&b"v3"[..]));
        // Idempotent queues discard an equal payload.
        let same = store.enqueue("jobs", NOW + 8, vec![msg(Some("k"), "v4")], true).await.remove(0).expect("enqueue");
        assert_eq!(same.outcome, EnqueueOutcome::Discarded(again[0].id));
        assert_eq!(store.rows("jobs").await.expect("rows").len(), 1);
        close(store, db).await;
    }

    #[tokio::test]
    async fn failure_sleeps_until_the_retry_time() {
        let (store, db) = store().await;
        let rules = QueueRules { max_attempts: 2, ..QueueRules::default() };
        enqueue(&store, "jobs", NOW, msg(None, "x")).await;
        let l = store.lease("jobs", NOW, 1, LEASE, false).await.expect("lease").remove(0);
        let fail = |retry_at| RowOp::Fail { retry_at, error: "boom".into(), max_attempts: rules.max_attempts };
        store.apply("jobs", NOW + 10, l.id, l.token, fail(NOW + 500)).await.expect("fail");
        // The stale token is rejected afterwards.
        let stale = store.apply("jobs", NOW + 11, l.id, l.token, RowOp::Release).await;
        assert!(matches!(stale, Err(TransportError::StaleReceipt)), "{stale:?}");
        let r = row(&store, "jobs", l.id).await;
        assert_eq!((r.status, r.process_at, r.error.as_deref()), (Status::Sleeping, Some(NOW + 500), Some("boom")));
        assert_eq!(store.next_due("jobs").await.expect("next due"), Some(NOW + 500));
        store.maintain("jobs", NOW + 499, rules).await.expect("maintain");
        assert!(store.lease("jobs", NOW + 499, 1, LEASE, false).await.expect("lease").is_empty());
        store.maintain("jobs", NOW + 500, rules).await.expect("maintain");
        assert_eq!(row(&store, "jobs", l.id).await.status, Status::Pending);
        let l = store.lease("jobs", NOW + 500, 1, LEASE, false).await.expect("lease").remove(0);
        assert_eq!(l.attempts, 2);
        assert_eq!(store.next_due("jobs").await.expect("next due"), Some(NOW + 500 + LEASE));
        // Out of attempts: Error.
        store.apply("jobs", NOW + 600, l.id, l.token, fail(NOW + 900)).await.expect("fail");
        assert_eq!(row(&store, "jobs", l.id).await.status, Status::Error);
        assert_eq!(store.next_due("jobs").await.expect("next due"), None);
        close(store, db).await;
    }

    #[tokio::test]
    async fn release_extend_and_dead_letter() {
        let (store, db) = store().await;
        enqueue(&store, "jobs", NOW, msg(None, "x")).await;
        let l = store.lease("jobs", NOW, 1, LEASE, false).await.expect("lease").remove(0);
        store.apply("jobs", NOW + 900, l.id, l.token, RowOp::Extend { lease_ms: LEASE }).await.expect("extend");
        assert_eq!(row(&store, "jobs", l.id).await.lease_expires, Some(NOW + 900 + LEASE));
        store.apply("jobs", NOW + 1_500, l.id, l.token, RowOp::Release).await.expect("release within the extension");
        let r = row(&store, "jobs", l.id).await;
        assert_eq!((r.status, r.attempts, r.lease_token), (Status::Pending, 0, None));
        let l = store.lease("jobs", NOW + 1_600, 1, LEASE, false).await.expect("lease").remove(0);
        let dead = RowOp::DeadLetter { error: "bad input".into() };
        store.apply("jobs", NOW + 1_700, l.id, l.token, dead).await.expect("dead letter");
        let r = row(&store, "jobs", l.id).await;
        assert_eq!((r.status, r.error.as_deref()), (Status::Error, Some("bad input")));
        // A row of another queue is not reachable through this one.
        let other = store.apply("other", NOW, l.id, l.token, RowOp::Release).await;
        assert!(matches!(other, Err(TransportError::StaleReceipt)));
        close(store, db).await;
    }

    #[tokio::test]
    async fn an_expired_lease_is_abandoned() {
        let (store, db) = store().await;
        let retry = QueueRules::default();
        let give_up = QueueRules { retry_abandoned: false, ..QueueRules::default() };
        enqueue(&store, "jobs", NOW, msg(None, "retried")).await;
        enqueue(&store, "lost", NOW, msg(None, "dead")).await;
        enqueue(&store, "jobs", NOW, msg(Some("k"), "v1")).await;
        let leased = store.lease("jobs", NOW, 10, LEASE, false).await.expect("lease");
        let lost = store.lease("lost", NOW, 10, LEASE, false).await.expect("lease").remove(0);
        enqueue(&store, "jobs", NOW + 1, msg(Some("k"), "v2")).await;

        store.maintain("jobs", NOW + LEASE - 1, retry).await.expect("maintain");
        assert_eq!(row(&store, "jobs", leased[0].id).await.status, Status::Processing);
        store.maintain("jobs", NOW + LEASE, retry).await.expect("maintain");
        store.maintain("lost", NOW + LEASE, give_up).await.expect("maintain");
        let r = row(&store, "jobs", leased[0].id).await;
        assert_eq!((r.status, r.lease_token, r.attempts), (Status::Pending, None, 1));
        assert!(r.error.as_deref().is_some_and(|e| e.contains("lease expired")));
        // The deferred version applies on abandonment.
        let r = row(&store, "jobs", leased[1].id).await;
        assert_eq!((r.status, r.payload.as_slice(), r.attempts), (Status::Pending, &b"v2"[..], 0));
        assert_eq!(row(&store, "lost", lost.id).await.status, Status::Error);
        // The late lease holder is fenced off.
        let late = store.complete("jobs", NOW + LEASE + 1, vec![(leased[0].id, leased[0].token)], 0).await;
        assert!(matches!(late[0], Err(TransportError::StaleReceipt)));
        let again = store.lease("jobs", NOW + LEASE + 2, 10, LEASE, false).await.expect("lease");
        assert_eq!(payloads(&again), ["retried", "v2"]);
        assert_eq!(again[0].attempts, 2);
        close(store, db).await;
    }

    #[tokio::test]
    async fn a_large_mixed_batch_keeps_input_order_and_identities() {
        let (store, db) = store().await;
        // More rows than one multi-row insert takes, every tenth with an
        // identity, and one identity twice (its second version replaces the
        // first, which is still pending).
        let mut items: Vec<Enqueue> =
            (0..1_200)
                .map(|i| {
                    if i % 10 == 0 {
                        msg(Some(&format!("k{i}")), &format!("p{i}"))
                    } else {
                        msg(None, &format!("p{i}"))
                    }
                })
                .collect();
        items.push(msg(Some("k0"), "p0-v2"));
        let results = store.enqueue("jobs", NOW, items, false).await;
        let results: Vec<Enqueued> = results.into_iter().map(|r| r.expect("enqueued")).collect();
        assert_eq!(results.len(), 1_201);
        assert_eq!(results[1_200].message_id, "m-p0-v2");
        let first = match results[0].outcome {
            EnqueueOutcome::Inserted(id) => id,
            ref other => panic!("{other:?}"),
        };
        assert!(
            matches!(results[1_200].outcome, EnqueueOutcome::Updated(id) if id == first),
            "{:?}",
            results[1_200].outcome
        );
        let ids: HashSet<RowId> = results[..1_200]
            .iter()
            .map(|r| match r.outcome {
                EnqueueOutcome::Inserted(id) => id,
                ref other => panic!("{other:?}"),
            })
            .collect();
        assert_eq!(ids.len(), 1_200, "distinct rows");
        // Input order; the new version of k0 took its place at the back.
        let leased = store.lease("jobs", NOW, 2_000, LEASE, false).await.expect("lease");
        let mut expected: Vec<String> = (1..1_200).map(|i| format!("p{i}")).collect();
        expected.push("p0-v2".into());
        assert_eq!(payloads(&leased), expected);
        let message_ids: Vec<&str> = leased.iter().map(|l| l.message_id.as_str()).collect();
        assert_eq!(message_ids[0], "m-p1");
        assert_eq!(message_ids[1_199], "m-p0-v2");
        close(store, db).await;
    }

    #[tokio::test]
    async fn a_completion_batch_fences_each_receipt() {
        let (store, db) = store().await;
        for p in ["a", "b", "c"] {
            enqueue(&store, "jobs", NOW, msg(None, p)).await;
        }
        let first = store.lease("jobs", NOW, 10, LEASE, false).await.expect("lease");
        store.maintain("jobs", NOW + LEASE, QueueRules::default()).await.expect("maintain");
        let second = store.lease("jobs", NOW + LEASE + 1, 10, LEASE, false).await.expect("lease");
        assert_eq!(payloads(&second), ["a", "b", "c"]);
        // One batch: a stale receipt of "a", the current one of "a" twice,
        // the current one of "b"; "c" stays leased.
        let batch = vec![
            (first[0].id, first[0].token),
            (second[0].id, second[0].token),
            (second[0].id, second[0].token),
            (second[1].id, second[1].token),
        ];
        let done = store.complete("jobs", NOW + LEASE + 2, batch, 0).await;
        assert!(matches!(done[0], Err(TransportError::StaleReceipt)), "{:?}", done[0]);
        assert!(done[1].is_ok() && done[3].is_ok(), "{done:?}");
        assert!(matches!(done[2], Err(TransportError::StaleReceipt)), "the same receipt twice: {:?}", done[2]);
        assert_eq!(store.depth("jobs").await.expect("depth"), 1);
        assert_eq!(row(&store, "jobs", second[2].id).await.status, Status::Processing);
        close(store, db).await;
    }

    #[tokio::test]
    async fn retention_keeps_processed_rows_then_purges_them() {
        let (store, db) = store().await;
        let rules = QueueRules { retention_ms: 1_000, ..QueueRules::default() };
        enqueue(&store, "jobs", NOW, msg(None, "x")).await;
        let l = store.lease("jobs", NOW, 1, LEASE, false).await.expect("lease").remove(0);
        store.complete("jobs", NOW + 10, vec![(l.id, l.token)], rules.retention_ms).await.remove(0).expect("complete");
        let r = row(&store, "jobs", l.id).await;
        assert_eq!((r.status, r.processed_at, r.lease_token), (Status::Processed, Some(NOW + 10), None));
        assert_eq!(store.depth("jobs").await.expect("depth"), 0);
        store.maintain("jobs", NOW + 1_009, rules).await.expect("maintain");
        assert_eq!(store.rows("jobs").await.expect("rows").len(), 1);
        store.maintain("jobs", NOW + 1_010, rules).await.expect("maintain");
        assert!(store.rows("jobs").await.expect("rows").is_empty());
        close(store, db).await;
    }

    #[tokio::test]
    async fn fifo_leases_group_heads_in_enqueue_order() {
        let (store, db) = store().await;
        store.declare("ordered", true, NOW).await.expect("declare");
        for e in [
            grouped(Some("g1"), "a1"),
            grouped(Some("g1"), "a2"),
            grouped(Some("g2"), "b1"),
            grouped(None, "n1"),
            grouped(None, "n2"),
            Enqueue { process_at: Some(NOW + 100), ..grouped(Some("g3"), "c1") },
            grouped(Some("g3"), "c2"),
        ] {
            enqueue(&store, "ordered", NOW, e).await;
        }
        // One per group; the sleeping head of g3 holds its group back.
        let first = store.lease("ordered", NOW, 10, LEASE, true).await.expect("lease");
        assert_eq!(payloads(&first), ["a1", "b1", "n1"]);
        assert!(store.lease("ordered", NOW, 10, LEASE, true).await.expect("lease").is_empty());
        // Completing a1 unlocks g1; n limits the batch.
        store.complete("ordered", NOW + 1, vec![(first[0].id, first[0].token)], 0).await.remove(0).expect("complete");
        store.complete("ordered", NOW + 1, vec![(first[2].id, first[2].token)], 0).await.remove(0).expect("complete");
        let next = store.lease("ordered", NOW + 1, 1, LEASE, true).await.expect("lease");
        assert_eq!(payloads(&next), ["a2"]);
        let next = store.lease("ordered", NOW + 1, 10, LEASE, true).await.expect("lease");
        assert_eq!(payloads(&next), ["n2"]);
        store
            .maintain("ordered", NOW + 100, QueueRules { fifo: true, ..QueueRules::default() })
            .await
            .expect("maintain");
        let next = store.lease("ordered", NOW + 100, 10, LEASE, true).await.expect("lease");
        assert_eq!(payloads(&next), ["c1"]);
        close(store, db).await;
    }

    #[tokio::test]
    async fn dead_letters_are_listed_counted_and_redriven() {
        let (store, db) = store().await;
        for p in ["a", "b", "c"] {
            enqueue(&store, "jobs", NOW, msg(None, p)).await;
        }
        let leased = store.lease("jobs", NOW, 10, LEASE, false).await.expect("lease");
        for l in &leased[..2] {
            let op = RowOp::DeadLetter { error: format!("bad {}", l.id) };
            store.apply("jobs", NOW + 1, l.id, l.token, op).await.expect("dead letter");
        }
        assert_eq!(store.error_depth("jobs").await.expect("error depth"), 2);
        assert_eq!(store.depth("jobs").await.expect("depth"), 1);
        let errors = store.errors("jobs", 10).await.expect("errors");
        assert_eq!(errors.iter().map(|r| r.payload.clone()).collect::<Vec<_>>(), [b"a".to_vec(), b"b".to_vec()]);
        assert_eq!(errors[0].error, Some(format!("bad {}", leased[0].id)));
        assert_eq!(store.errors("jobs", 1).await.expect("errors").len(), 1);
        assert_eq!(store.errors("other", usize::MAX).await.expect("errors").len(), 0);

        let moved = store.redrive("jobs", vec![leased[1].id, leased[2].id, 999_999]).await.expect("redrive");
        assert_eq!(moved, 1, "only Error rows move");
        assert_eq!(store.redrive("other", vec![leased[0].id]).await.expect("redrive"), 0);
        assert_eq!(store.error_depth("jobs").await.expect("error depth"), 1);
        let r = row(&store, "jobs", leased[1].id).await;
        let max_seq = store.rows("jobs").await.expect("rows").iter().map(|r| r.seq).max();
        assert_eq!((r.status, r.attempts, r.process_at, Some(r.seq)), (Status::Pending, 0, None, max_seq));
        let again = store.lease("jobs", NOW + 2, 10, LEASE, false).await.expect("lease");
        assert_eq!(payloads(&again), ["b"]);
        assert_eq!(again[0].attempts, 1);
        close(store, db).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn concurrent_leases_never_share_a_row() {
        let (store, db) = store().await;
        let items: Vec<Enqueue> = (0..200).map(|i| msg(None, &format!("p{i}"))).collect();
        for chunk in items.chunks(50) {
            for r in store.enqueue("jobs", NOW, chunk.to_vec(), false).await {
                r.expect("enqueued");
            }
        }
        let mut tasks = Vec::new();
        for _ in 0..4 {
            let store = store.clone();
            tasks.push(tokio::spawn(async move {
                let mut got = Vec::new();
                loop {
                    let leased = store.lease("jobs", NOW, 10, 60_000, false).await.expect("lease");
                    if leased.is_empty() {
                        return got;
                    }
                    got.extend(leased.into_iter().map(|l| (l.id, l.token)));
                    tokio::task::yield_now().await;
                }
            }));
        }
        let mut all = Vec::new();
        for task in tasks {
            all.extend(task.await.expect("task"));
        }
        let ids: HashSet<RowId> = all.iter().map(|(id, _)| *id).collect();
        let tokens: HashSet<u64> = all.iter().map(|(_, t)| *t).collect();
        assert_eq!(all.len(), 200, "every row leased exactly once");
        // One token per lease of up to 10 rows.
        assert_eq!(ids.len(), 200);
        assert!((20..=200).contains(&tokens.len()), "{} leases", tokens.len());
        assert!(store
            .rows("jobs")
            .await
            .expect("rows")
            .iter()
            .all(|r| r.status == Status::Processing && r.attempts == 1));
        close(store, db).await;
    }

    #[tokio::test]
    async fn an_in_memory_database_keeps_its_data() {
        let store = SqliteStore::connect("sqlite::memory:").await.expect("connect");
        store.migrate().await.expect("migrate");
        enqueue(&store, "jobs", NOW, msg(None, "x")).await;
        assert_eq!(store.lease("jobs", NOW, 1, LEASE, false).await.expect("lease").len(), 1);
    }
}
