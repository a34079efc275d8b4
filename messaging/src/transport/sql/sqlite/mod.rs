//! `sqlite://FILE`: queues in a SQLite database file, the embedded default.
//! Several processes on one machine can share the file.
//!
//! SQLite has one writer at a time, so the store needs no row locks: every
//! transaction that writes starts with `BEGIN IMMEDIATE`, which takes the
//! database's write lock at once (waiting up to the busy timeout). Rows read
//! inside such a transaction cannot change before it commits, which is what
//! `FOR UPDATE` (and `SKIP LOCKED`) give on PostgreSQL. A deferred `BEGIN`
//! would take the lock only at the first write, and two readers upgrading at
//! the same time get `SQLITE_BUSY` without waiting.
//!
//! There are no sequences: the row `('seq', value)` of `messaging_counters`
//! gives the enqueue order and the lease tokens. There is no cross-process
//! signal either (`Dialect::changes` is `None`): receivers in the same
//! process are woken by [`super::SqlTransport`], others poll. One machine, one
//! clock: times are the machine's.

use std::collections::HashSet;
use std::path::Path;
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use sqlx::sqlite::{SqliteConnectOptions, SqliteConnection, SqliteJournalMode, SqlitePoolOptions, SqliteSynchronous};
use sqlx::{Pool, Sqlite};
use tokio::sync::Mutex;

use super::dialect::{fail, full_disk_hint, in_input_order, Dialect, SkipLocked, SqlStore, StopOnDrop};
use super::record::{Held, LeasedRow};
use super::statements::{self as sql, FifoSearch, StoreForm, Tables};
use crate::error::TransportError;
use crate::transport::sql::machine::{Enqueue, Row, RowId, Take, Written};

mod append;
mod checkpoint;
mod one_call;
#[cfg(test)]
mod tests;
mod writer;

use writer::{Turn, Writer};

/// How long a writer waits for the database's write lock.
const BUSY_TIMEOUT: Duration = Duration::from_secs(5);

/// Rows per multi-row insert of identity rows: 12 values each, well under
/// SQLite's 32,766 bound parameters (plain rows: `append::INSERT_ROWS`).
const IDENTITY_ROWS: usize = 500;

/// Rows in a SQLite database.
#[cfg(test)]
pub(crate) type SqliteStore = SqlStore<Sqlite>;

/// What a SQLite store keeps beside its pool.
#[derive(Debug, Clone)]
pub struct LiteState {
    /// This process's write turn ([`Turn`]), with the connection its
    /// one-call transactions run on.
    writer: Arc<Mutex<Writer>>,
    /// Checkpoints the WAL in the background (file databases only).
    _checkpointer: Option<StopOnDrop>,
}

/// Whether the options name an in-memory database (`sqlite::memory:`, `?mode=memory`).
fn in_memory(url: &str, path: &Path) -> bool {
    url.contains(":memory:")
        || url.contains("mode=memory")
        || path.to_str().is_some_and(|p| p.starts_with("file:sqlx-in-memory-"))
}

/// The database file a `sqlite://` URL (without the framework's options)
/// names, when it names a file that does not exist: what a command that only
/// reads refuses to create.
pub(crate) fn missing_file(url: &str) -> Option<std::path::PathBuf> {
    let options = SqliteConnectOptions::from_str(url).ok()?;
    let path = options.get_filename();
    (!in_memory(url, path) && !path.exists()).then(|| path.to_path_buf())
}

/// What keeps database file `path` from being created, if anything: SQLite
/// creates the file but not its directory, which does not exist or is not a
/// directory (`` `DIR` does not exist ``).
pub(crate) fn directory_problem(path: &std::path::Path) -> Option<String> {
    let dir = path.parent().filter(|d| !d.as_os_str().is_empty() && !d.is_dir())?;
    let problem = if dir.exists() { "is not a directory" } else { "does not exist" };
    Some(format!("`{}` {problem}", dir.display()))
}

/// A count or limit as SQLite's signed integer.
fn int(n: usize) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

/// Row ids as a JSON array, for `IN (SELECT value FROM json_each(?))`: one
/// statement for a whole batch.
fn json_ids(ids: impl Iterator<Item = i64>) -> String {
    let list: Vec<String> = ids.map(|id| id.to_string()).collect();
    format!("[{}]", list.join(","))
}

/// Reserves `n` consecutive values of the counter; returns the first.
async fn reserve(conn: &mut SqliteConnection, tables: &Tables, n: usize) -> Result<u64, TransportError> {
    let sql = tables.sql(&["UPDATE messaging_counters SET value = value + $1 WHERE name = 'seq' RETURNING value"]);
    let last: Option<i64> = sqlx::query_scalar(&sql)
        .bind(int(n))
        .fetch_optional(conn)
        .await
        .map_err(fail::<Sqlite>("advancing the counter"))?;
    let last = last.ok_or_else(missing_counter)?;
    Ok((last - int(n) + 1) as u64)
}

/// Error → Pending, attempts reset, for the dead letters of queue `$2` whose
/// ids are in `$3` (a JSON array), each at the back of the queue in the
/// array's order: its first place in the array after `$1`. One statement for a
/// page of letters (it was one per letter, a hop to the connection's thread
/// each: 25,000 letters a second). The unary `+` keeps the queue's and the
/// status's indexes out of the plan: with them SQLite walked every dead
/// letter of the queue and, for each, the whole array; without, it looks each
/// id up by key (`tests::a_redrive_looks_each_letter_up_by_key_in_the_order_given`).
pub(super) const REDRIVE: &str = "UPDATE messaging_messages AS m \
    SET status = 'pending', attempts = 0, process_at = NULL, seq = $1 + given.key \
    FROM (SELECT CAST(value AS INTEGER) AS id, min(key) AS key FROM json_each($3) GROUP BY value) AS given \
    WHERE m.id = given.id AND +m.queue = $2 AND +m.status = 'error'";

/// A multi-row insert of `rows` into `queue`, the sequence values `seqs`.
fn insert_values<'a>(
    tables: &Tables,
    queue: &'a str,
    now: i64,
    rows: impl Iterator<Item = Written<'a>>,
    seqs: impl Iterator<Item = i64>,
) -> sqlx::QueryBuilder<'a, Sqlite> {
    let head = tables.sql(&["INSERT INTO messaging_messages (queue, identity, group_id, message_id, payload, \
         attributes, priority, process_at, status, attempts, seq, sent_at) "]);
    let mut insert = sqlx::QueryBuilder::<Sqlite>::new(head.as_ref());
    insert.push_values(rows.zip(seqs), |mut values, (row, seq)| {
        values
            .push_bind(queue)
            .push_bind(row.identity)
            .push_bind(row.group)
            .push_bind(row.message_id)
            .push_bind(row.payload)
            .push_bind(row.attributes)
            .push_bind(row.priority)
            .push_bind(row.process_at)
            .push_bind(row.status.as_str())
            .push_bind(0_i64)
            .push_bind(seq)
            .push_bind(now);
    });
    insert
}

/// The error when the counter enqueues and leases draw from is gone.
fn missing_counter() -> TransportError {
    TransportError::Backend(
        "sqlite: the counter `seq` is missing from table `messaging_counters`; run the `migrate` command".into(),
    )
}

impl SqlStore<Sqlite> {
    /// Opens (creating it if missing) the database file of `url`
    /// (`sqlite://FILE`, with sqlx's SQLite parameters) in WAL mode, with
    /// a pool of at most `max_connections` (readers run in parallel; writers
    /// take turns); an in-memory database keeps one.
    async fn open(url: &str, max_connections: u32) -> Result<(Pool<Sqlite>, LiteState), TransportError> {
        let options = SqliteConnectOptions::from_str(url)
            .map_err(|e| TransportError::Backend(format!("sqlite: invalid database URL `{url}`: {e}")))?
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            .busy_timeout(BUSY_TIMEOUT)
            .synchronous(SqliteSynchronous::Normal)
            .pragma("wal_autocheckpoint", checkpoint::AUTOCHECKPOINT_PAGES)
            .pragma("journal_size_limit", checkpoint::WAL_KEPT_BYTES)
            .foreign_keys(false)
            // Rows come from the connection's thread through a channel of
            // this many; with sqlx's 50 the thread stopped and was woken
            // again five times for a lease of 300 (futex calls in the
            // profile). Larger than any lease (`max_batch`), so a lease's
            // rows never wait for the task to take them.
            .row_buffer_size(1024)
            // The journals that undo a statement or a savepoint (every
            // completion runs under one, every multi-row UPDATE with a
            // constraint keeps one) in memory: past 64 KiB SQLite spilled
            // them to a temporary file, opened, written, truncated and
            // closed in the writer's transaction (3 % of a drain's profile
            // in `open`, `close` and page-cache calls). They only undo within
            // a transaction; the WAL is what survives a crash.
            .pragma("temp_store", "memory");
        let path = options.get_filename().to_path_buf();
        let memory = in_memory(url, &path);
        if let Some(problem) = directory_problem(&path).filter(|_| !memory) {
            return Err(TransportError::Backend(format!(
                "sqlite: cannot open the database file `{}`: {problem}",
                path.display()
            )));
        }
        // An in-memory database lives as long as one of its connections: keep
        // exactly one, forever.
        let pool = if memory {
            SqlitePoolOptions::new().max_connections(1).min_connections(1).idle_timeout(None).max_lifetime(None)
        } else {
            SqlitePoolOptions::new().max_connections(max_connections)
        };
        // No ping before each use: on SQLite it is a round trip to the
        // connection's thread per statement (2.4 % of a profile of the SQL
        // benchmark), for a connection that cannot drop like a socket.
        let pool = pool.test_before_acquire(false);
        let pool = pool.acquire_timeout(Duration::from_secs(10)).connect_with(options).await.map_err(|e| {
            TransportError::Backend(format!("sqlite: cannot open the database file `{}`: {e}", path.display()))
        })?;
        let checkpointer = if memory { None } else { checkpoint::start(pool.clone()) };
        Ok((pool, LiteState { writer: Writer::shared(!memory), _checkpointer: checkpointer }))
    }
}

// The dialect's items are the framework's own (the trait is sealed).
#[allow(private_interfaces)]
impl Dialect for Sqlite {
    const SYSTEM: &'static str = "sqlite";
    const LOCK: &'static str = "";
    const LOCK_SKIP: &'static str = "";
    const CONCURRENT_LEASES: u32 = 1;
    const SCHEMAS: bool = false;
    const SEQUENCE_STEP: Option<(&'static str, i64)> = None;
    const SCHEMA_COLUMNS: &'static str = "SELECT m.name, p.name FROM sqlite_master m JOIN pragma_table_info(m.name) p \
        WHERE m.type = 'table' AND m.name LIKE 'messaging\\_%' ESCAPE '\\'";
    const AUTOCOMMIT: bool = false;
    // A file: no server to lose. Statements wait for the write lock by
    // the busy timeout.
    const ANSWER_WITHIN: Option<Duration> = None;
    const MIGRATION_LOCK: &'static str = "SELECT 1";
    const MISSING_TABLE: &'static str = "no such table";
    const HINTS: &'static [(&'static [&'static str], &'static str)] = &[
        // SQLITE_BUSY and SQLITE_LOCKED, with their extended codes for
        // recovery and a stale snapshot.
        (
            &["5", "6", "261", "517"],
            ": another connection held the database's write lock for longer than the busy timeout (5 s), such \
             as a long write transaction on this file by the application or another process; the operation can \
             be tried again once it ends",
        ),
        // SQLITE_FULL. Seen from outside: a disk filled by publishing left
        // every consumer's lease failing with "database or disk is full".
        (&["13"], full_disk_hint!("the disk holding the database file", " (or the file reached its page limit)")),
    ];
    const OUTBOX_LOCK: &'static str = "SELECT $1";
    const DATABASE: Option<&'static str> = None;

    type State = LiteState;

    const MAX_CONNECTIONS: u32 = 8;

    async fn connect(url: &str, max_connections: u32) -> Result<(Pool<Self>, LiteState), TransportError> {
        SqlStore::<Sqlite>::open(url, max_connections).await
    }

    fn adopt(_: &Pool<Self>) -> LiteState {
        LiteState { writer: Writer::shared(false), _checkpointer: None }
    }

    fn migrations() -> &'static sqlx::migrate::Migrator {
        static MIGRATIONS: sqlx::migrate::Migrator = sqlx::migrate!("./migrations/sqlite");
        &MIGRATIONS
    }

    fn now(_: &LiteState) -> i64 {
        super::clock::local_ms()
    }

    type Turn = Turn;

    async fn turn(state: &LiteState) -> Option<Turn> {
        Some(Turn::take(&state.writer).await)
    }

    async fn release(state: &LiteState) {
        Turn::take(&state.writer).await.release();
    }

    /// `BEGIN IMMEDIATE` takes the write lock now. If the write is cut
    /// short, its connection is closed, which rolls back.
    const BEGIN: &'static str = "BEGIN IMMEDIATE";

    async fn next_seqs(conn: &mut SqliteConnection, tables: &Tables, n: usize) -> Result<Vec<u64>, TransportError> {
        let first = reserve(conn, tables, n).await?;
        Ok((first..first + n as u64).collect())
    }

    // SQLite looks each value of an `IN (SELECT …)` up in the index; the
    // write lock makes the order of the rows irrelevant.
    const BY_IDENTITIES: &'static str = concat!(
        "SELECT ",
        sql::columns!(),
        " FROM messaging_messages WHERE queue = $1 AND identity IN (SELECT value FROM json_each($2))"
    );
    const SKIP_LOCKED: Option<SkipLocked> = None;
    const BY_IDS: &'static str = concat!(
        "SELECT ",
        sql::columns!(),
        " FROM messaging_messages WHERE queue = $1 AND id IN (SELECT value FROM json_each($2))"
    );
    const BY_IDS_WITHOUT_BODIES: &'static str = concat!(
        "SELECT ",
        sql::columns_without_bodies!(),
        " FROM messaging_messages WHERE queue = $1 AND id IN (SELECT value FROM json_each($2))"
    );
    // Not `UPDATE … FROM (VALUES …)`: SQLite runs it in time quadratic in
    // the rows (1,000 rows of our table: 2.7 s; 10: 1.4 ms; a plain UPDATE
    // per row: 14 µs). One call for many plain UPDATEs saves the hop to the
    // connection's thread per row.
    const STORE_ROWS: (usize, StoreForm) = (256, StoreForm::Joined);
    const PREVIOUS_OF: &'static str = "SELECT identity, message_id, payload FROM messaging_previous \
        WHERE queue = $1 AND identity IN (SELECT value FROM json_each($2))";

    async fn append<'a>(
        conn: &'a mut SqliteConnection,
        tables: &'a Tables,
        queue: &'a str,
        now: i64,
        items: &'a mut [Enqueue],
    ) -> Result<(), TransportError> {
        if items.is_empty() {
            return Ok(());
        }
        one_call::enqueue_plain_in(conn, tables, queue, now, items).await
    }

    async fn insert<'a>(
        conn: &'a mut SqliteConnection,
        tables: &'a Tables,
        queue: &'a str,
        now: i64,
        rows: &'a [Row],
    ) -> Result<Vec<Option<RowId>>, TransportError> {
        let mut inserted = Vec::with_capacity(rows.len());
        for chunk in rows.chunks(IDENTITY_ROWS) {
            let seqs = chunk.iter().map(|r| r.seq as i64);
            let mut insert = insert_values(tables, queue, now, chunk.iter().map(Row::written), seqs);
            insert.push(" ON CONFLICT (queue, identity) WHERE identity IS NOT NULL DO NOTHING RETURNING id, seq");
            let found: Vec<(i64, i64)> =
                insert.build_query_as().fetch_all(&mut *conn).await.map_err(fail::<Self>("enqueue"))?;
            inserted.extend(found);
        }
        Ok(in_input_order(rows, inserted))
    }

    async fn lease<'a>(
        store: &'a SqlStore<Self>,
        queue: &'a str,
        now: i64,
        take: Take,
        lease_ms: i64,
        fifo: Option<FifoSearch>,
        _partition: Option<(u32, u32)>,
    ) -> Result<Vec<LeasedRow>, TransportError> {
        one_call::lease(store, queue, take, now + lease_ms, fifo).await
    }

    async fn enqueue_plain<'a>(
        store: &'a SqlStore<Self>,
        queue: &'a str,
        now: i64,
        items: &'a mut [Enqueue],
    ) -> Result<(), TransportError> {
        one_call::enqueue_plain(store, queue, now, items).await
    }

    async fn complete_plain<'a>(
        store: &'a SqlStore<Self>,
        queue: &'a str,
        now: i64,
        items: &'a [Held],
        retention_ms: i64,
    ) -> Result<HashSet<(RowId, u64)>, TransportError> {
        one_call::complete_plain(store, queue, now, items, retention_ms).await
    }

    async fn redrive<'a>(
        conn: &'a mut SqliteConnection,
        tables: &'a Tables,
        queue: &'a str,
        ids: &'a [RowId],
    ) -> Result<usize, TransportError> {
        let first = reserve(conn, tables, ids.len()).await?;
        let list = serde_json::to_string(ids).unwrap_or_else(|_| "[]".to_owned());
        let sql = tables.sql(&[REDRIVE]);
        let done = sqlx::query(&sql).bind(first as i64).bind(queue).bind(list).execute(&mut *conn).await;
        Ok(done.map_err(fail::<Self>("redrive"))?.rows_affected() as usize)
    }

    async fn notify<'a>(_: &'a Pool<Self>, _: &'a str) {}

    async fn notify_in<'a>(_: &'a mut SqliteConnection, _: &'a str) {}

    fn changes(_: &LiteState) -> Option<tokio::sync::broadcast::Receiver<String>> {
        None
    }
}
