//! [`Dialect`]: only what really differs between PostgreSQL and SQLite. Every
//! statement the two share is written once, in [`super::statements`], and
//! run by the one store ([`SqlStore`]).
//!
//! | | PostgreSQL | SQLite |
//! |---|---|---|
//! | write transactions | many at once; rows locked `FOR UPDATE` | one at a time: `BEGIN IMMEDIATE` after this process's write turn |
//! | leasing | `FOR UPDATE SKIP LOCKED`, partitions; FIFO heads under an advisory lock | pick then update, under the write lock |
//! | batches | `UNNEST` arrays | `json_each` |
//! | sequence | `messaging_seq` | the row `seq` of `messaging_counters` |
//! | wake-ups | `NOTIFY` | in-process only |
//! | clock | the database's ([`super::clock`]) | the machine's |

use std::collections::HashSet;
use std::fmt::Debug;
use std::future::Future;

use sqlx::pool::PoolConnection;
use sqlx::Pool;

use super::driver::{Driver, Value};
use super::machine::Take;
use super::record::{Held, LeasedRow};
use super::stalls::Stalls;
use super::statements::{FifoSearch, StoreForm};
use super::Tables;
use crate::error::TransportError;

/// A [`Dialect::HINTS`] text for a full disk: which disk (`$disk`, with an
/// `$aside`), then what it means for the messages, the same on every
/// database (a macro, so that the hints stay `&'static str`).
macro_rules! full_disk_hint {
    ($disk:literal $(, $aside:literal)?) => {
        concat!(
            ": ",
            $disk,
            " is full",
            $($aside,)?
            ", and nothing can be written, not even an acknowledgement; what is stored is kept, and the \
             operation can be tried again once there is room (a message whose handler ran but whose \
             acknowledgement failed is received again)"
        )
    };
}
use crate::transport::sql::machine::{Enqueue, Row, RowId};
pub(crate) use full_disk_hint;

mod sealed {
    pub trait Sealed {}
    #[cfg(feature = "postgres")]
    impl Sealed for sqlx::Postgres {}
    #[cfg(feature = "sqlite")]
    impl Sealed for sqlx::Sqlite {}
}

/// A database the SQL transport and idempotency store run on:
/// [`sqlx::Postgres`] or [`sqlx::Sqlite`]. Sealed: the framework implements
/// it, and its items are the framework's own.
#[allow(private_bounds, private_interfaces)]
pub trait Dialect: Driver + sealed::Sealed + Sized {
    /// The `messaging.system` name.
    const SYSTEM: &'static str;
    /// Appended to a SELECT that reads rows to change them: ` FOR UPDATE` on
    /// PostgreSQL; nothing on SQLite, whose write lock covers the transaction.
    const LOCK: &'static str;
    /// Like [`Dialect::LOCK`], skipping rows another transaction holds.
    const LOCK_SKIP: &'static str;
    /// How many leases of one standard queue may run at once, each in its own
    /// partition of the rows.
    const CONCURRENT_LEASES: u32;
    /// Lists (table, column) of the framework's tables.
    const SCHEMA_COLUMNS: &'static str;
    /// Reads the increment of the sequence `messaging_seq` (no row: there is
    /// none), and the least increment this version needs: PostgreSQL numbers
    /// up to that many rows of an append from one draw. `None` where the
    /// database has no such sequence (SQLite).
    const SEQUENCE_STEP: Option<(&'static str, i64)>;
    /// Whether the tables can live in a named schema (`schema=`): PostgreSQL.
    /// The columns statement above then reads that schema for
    /// `current_schema()`, and the migrations run with it as `search_path`.
    const SCHEMAS: bool;
    /// Whether a single statement may run outside a transaction.
    const AUTOCOMMIT: bool;
    /// How long the framework's own statements on the hot path wait for
    /// the server's answer ([`within`]); `None` where the database is a
    /// file.
    const ANSWER_WITHIN: Option<std::time::Duration>;
    /// Makes concurrent migrators take turns, inside the migration's
    /// transaction (SQLite's `BEGIN IMMEDIATE` does already).
    const MIGRATION_LOCK: &'static str;
    /// What a failure's text holds when a table is missing.
    const MISSING_TABLE: &'static str;
    /// Error codes an operator can act on, and what to tell them: a lock
    /// waited for in vain (SQLite; PostgreSQL's statements wait for locks
    /// without a timeout unless the operator sets one), a full disk.
    const HINTS: &'static [(&'static [&'static str], &'static str)];
    /// Makes the outbox claims of one queue (`$1`: a key naming it) take
    /// turns, inside the claim's transaction (SQLite's `BEGIN IMMEDIATE`
    /// does already).
    const OUTBOX_LOCK: &'static str;
    /// One text naming the database a connection is on (server and
    /// database on PostgreSQL): a caller's transaction must be on the
    /// store's. `None` on SQLite: the statement would start a read
    /// transaction before the write, and a deferred transaction that reads
    /// first fails with `SQLITE_BUSY` when another writer commits
    /// meanwhile (seen in the suite), so the file is not compared.
    const DATABASE: Option<&'static str>;

    /// What a store keeps beside its pool.
    type State: Clone + Debug + Send + Sync + 'static;

    /// Sees every error a statement of a store returns, before it becomes
    /// a transport error (PostgreSQL drops its connections to a server
    /// that turned read-only).
    fn noticed(_e: &sqlx::Error) {}

    /// Whether `e` says that the statement's connection is gone (the
    /// server ended the session, or the socket failed): a statement that
    /// may run twice runs once more on another ([`SqlStore::again_if_lost`]).
    /// Never on SQLite, whose connections are files.
    fn lost(_e: &sqlx::Error) -> bool {
        false
    }

    /// How many connections a store's pool opens unless the URL says
    /// (`max_connections=`).
    const MAX_CONNECTIONS: u32;

    /// Opens a pool of at most `max_connections` on `url` (the framework's
    /// options taken out).
    fn connect(
        url: &str,
        max_connections: u32,
    ) -> impl Future<Output = Result<(Pool<Self>, Self::State), TransportError>> + Send;

    /// The state of a store on a pool the application opened (no background
    /// work that `connect` would start beyond what correctness needs).
    fn adopt(pool: &Pool<Self>) -> Self::State;

    /// The framework's migrations (run by `super::migrate`).
    fn migrations() -> &'static sqlx::migrate::Migrator;

    /// Milliseconds since the Unix epoch by the clock every process of the
    /// database agrees on.
    fn now(state: &Self::State) -> i64;

    /// This process's write turn, held for the length of a write.
    type Turn: Send + 'static;

    /// Takes this process's write turn, where the database needs one.
    fn turn(state: &Self::State) -> impl Future<Output = Option<Self::Turn>> + Send;

    /// Gives back to the pool the connection the write turn keeps, if any
    /// (before the pool is closed, which waits for every connection).
    fn release(state: &Self::State) -> impl Future<Output = ()> + Send;

    /// The statement that begins a write transaction ([`Write::begin`]).
    const BEGIN: &'static str;

    /// `n` new values of the sequence (enqueue order and lease tokens), in
    /// increasing order.
    fn next_seqs(
        conn: &mut Self::Connection,
        tables: &Tables,
        n: usize,
    ) -> impl Future<Output = Result<Vec<u64>, TransportError>> + Send;

    /// The rows (every column, locked, in identity order) of queue `$1` whose
    /// identity is in `$2`, a JSON array of texts: one statement for a list
    /// of any length. Each database's own form, so that its planner looks
    /// each identity up in the unique index whatever its statistics say.
    const BY_IDENTITIES: &'static str;
    /// The rows (every column, locked, in id order) of queue `$1` whose id
    /// is in `$2`, a JSON array of integers: the rows a batch of receipts
    /// names, looked up by primary key in one statement.
    const BY_IDS: &'static str;
    /// [`Dialect::BY_IDS`] with the bodies read as empty
    /// (`statements::columns_without_bodies!`), for a transition that
    /// changes neither.
    const BY_IDS_WITHOUT_BODIES: &'static str;
    /// [`Dialect::BY_IDS`] skipping rows another transaction holds, and the
    /// statement that bounds how long a transaction waits for a row lock
    /// (PostgreSQL); `None` where a transaction holds the whole database
    /// (SQLite). The heartbeat's extensions take what they can at once and
    /// wait a moment only for the rest (`SqlStore::apply_all`).
    const SKIP_LOCKED: Option<SkipLocked>;
    /// The most rows (a power of two) one call that stores whole rows
    /// writes, and how (`statements::store_rows`).
    const STORE_ROWS: (usize, StoreForm);
    /// The last processed versions (identity, message id, payload) of the
    /// identities of queue `$1` in `$2`, written as [`Dialect::BY_IDENTITIES`].
    const PREVIOUS_OF: &'static str;

    /// Inserts `items` (no identity) as new rows in one statement per
    /// chunk, the sequence assigned in input order, without reading their
    /// ids back. The payloads and message ids may be taken (bound without
    /// a copy): the caller has read the ids before. Other processes are
    /// told of `queue` when the rows commit, as by [`Dialect::notify_in`]
    /// (PostgreSQL, in the insert's own statement).
    fn append<'a>(
        conn: &'a mut Self::Connection,
        tables: &'a Tables,
        queue: &'a str,
        now: i64,
        items: &'a mut [Enqueue],
    ) -> impl Future<Output = Result<(), TransportError>> + Send + 'a;

    /// Inserts `rows` (each with its identity and its own sequence) in one
    /// statement per chunk. A row whose identity exists already is skipped
    /// (`None`); the others' ids, in input order. Other processes are told
    /// as by [`Dialect::append`].
    fn insert<'a>(
        conn: &'a mut Self::Connection,
        tables: &'a Tables,
        queue: &'a str,
        now: i64,
        rows: &'a [Row],
    ) -> impl Future<Output = Result<Vec<Option<RowId>>, TransportError>> + Send + 'a;

    /// Leases as many rows as `take` says (a standard queue's `partition`
    /// when given; a FIFO queue's heads, by `take.rows` alone, when `fifo`
    /// says how far to look for them).
    fn lease<'a>(
        store: &'a SqlStore<Self>,
        queue: &'a str,
        now: i64,
        take: Take,
        lease_ms: i64,
        fifo: Option<FifoSearch>,
        partition: Option<(u32, u32)>,
    ) -> impl Future<Output = Result<Vec<LeasedRow>, TransportError>> + Send + 'a;

    /// [`Dialect::append`] as one transaction of its own.
    fn enqueue_plain<'a>(
        store: &'a SqlStore<Self>,
        queue: &'a str,
        now: i64,
        items: &'a mut [Enqueue],
    ) -> impl Future<Output = Result<(), TransportError>> + Send + 'a;

    /// Completes, as one transaction of its own, rows without identity whose
    /// lease the items hold (deleted, or kept as processed); returns the
    /// items completed. Items left out are the caller's to settle one by one
    /// (a lost lease, an identity row).
    fn complete_plain<'a>(
        store: &'a SqlStore<Self>,
        queue: &'a str,
        now: i64,
        items: &'a [Held],
        retention_ms: i64,
    ) -> impl Future<Output = Result<HashSet<(RowId, u64)>, TransportError>> + Send + 'a;

    /// Error → Pending with attempts reset, at the back of the queue, in order.
    fn redrive<'a>(
        conn: &'a mut Self::Connection,
        tables: &'a Tables,
        queue: &'a str,
        ids: &'a [RowId],
    ) -> impl Future<Output = Result<usize, TransportError>> + Send + 'a;

    /// Tells other processes that `queue` has new messages.
    fn notify<'a>(pool: &'a Pool<Self>, queue: &'a str) -> impl Future<Output = ()> + Send + 'a;

    /// The same from inside the caller's transaction, delivered when it
    /// commits (PostgreSQL folds a transaction's identical notifications into
    /// one); nothing on SQLite, which has no such signal.
    fn notify_in<'a>(conn: &'a mut Self::Connection, queue: &'a str) -> impl Future<Output = ()> + Send + 'a;

    /// Signals from other processes: the names of queues another process enqueued to.
    fn changes(state: &Self::State) -> Option<tokio::sync::broadcast::Receiver<String>>;
}

/// How long [`SqlStore::failure`] waits for a connection of its own.
const PROBE: std::time::Duration = std::time::Duration::from_secs(2);

/// A failed statement, named, with the database's error code when it gave
/// one (operators search for SQLSTATEs; `Dialect::MISSING_TABLE` names one).
pub(crate) fn backend<D: Dialect>(what: &str, e: sqlx::Error) -> TransportError {
    D::noticed(&e);
    let text = format!("{}: {what} failed: {}", D::SYSTEM, described::<D>(&e));
    let held = D::SKIP_LOCKED.is_some_and(
        |skip| matches!(&e, sqlx::Error::Database(db) if db.code().is_some_and(|code| code == skip.held_code)),
    );
    if held {
        TransportError::Held(text)
    } else {
        TransportError::Backend(text)
    }
}

/// `e` with the database's error code and the dialect's hint for it, if any.
fn described<D: Dialect>(e: &sqlx::Error) -> String {
    let code = match e {
        sqlx::Error::Database(db) => db.code().map(|c| c.into_owned()),
        _ => None,
    };
    let hint = code
        .as_deref()
        .and_then(|code| D::HINTS.iter().find(|(codes, _)| codes.contains(&code)))
        .map_or("", |(_, hint)| *hint);
    let code = code.map(|c| format!(" (code {c})")).unwrap_or_default();
    format!("{e}{code}{hint}")
}

/// Stops a store's background task when the last clone of the store is
/// dropped (the task waits on the other end).
#[derive(Debug, Clone)]
pub(crate) struct StopOnDrop(#[allow(dead_code)] std::sync::Arc<tokio::sync::oneshot::Sender<()>>);

impl StopOnDrop {
    /// A guard, and what the task waits on.
    pub(crate) fn new() -> (StopOnDrop, tokio::sync::oneshot::Receiver<()>) {
        let (stop, stopped) = tokio::sync::oneshot::channel();
        (StopOnDrop(std::sync::Arc::new(stop)), stopped)
    }
}

/// A connection that writes: a transaction, or on PostgreSQL a plain
/// connection for single statements; on SQLite it holds this process's write
/// turn until it ends. Or the caller's own transaction ([`Write::on`]),
/// which the caller commits.
pub(crate) struct Write<'c, D: Dialect> {
    conn: Conn<'c, D>,
    _turn: Option<D::Turn>,
    /// How long its statements wait for an answer ([`within`]); none on the
    /// caller's transaction, whose statements are the caller's to bound (a
    /// statement given up on there could still commit with it).
    answer_within: Option<std::time::Duration>,
}

enum Conn<'c, D: Dialect> {
    Tx(Begun<D>),
    Auto(PoolConnection<D>),
    /// A transaction of the application's: its commit is theirs.
    Theirs(&'c mut D::Connection),
}

impl<D: Dialect> Write<'static, D> {
    /// A write transaction; a BEGIN whose connection was lost is tried once
    /// more on another.
    pub(crate) async fn begin(store: &SqlStore<D>) -> Result<Self, TransportError> {
        // Timed until the write goes through: SQLite's BEGIN takes the
        // database's write lock.
        let _attempt = store.stalls.attempt();
        let turn = D::turn(&store.state).await;
        let tx = store
            .again_if_lost("begin", || async {
                // Open from before the BEGIN: a BEGIN cut short may have begun.
                let mut tx = Begun { conn: store.pool.acquire().await?, open: true };
                match D::execute_script(&mut tx.conn, D::BEGIN).await {
                    Ok(()) => Ok(tx),
                    Err(e) => {
                        // A BEGIN that failed began nothing (SQLite's waited
                        // for the write lock in vain): the connection goes
                        // back as it is.
                        tx.open = false;
                        Err(e)
                    }
                }
            })
            .await?;
        Ok(Write { conn: Conn::Tx(tx), _turn: turn, answer_within: store.answer_within })
    }

    /// A connection for one statement (a transaction where the database
    /// wants every write in one).
    pub(crate) async fn single(store: &SqlStore<D>) -> Result<Self, TransportError> {
        if !D::AUTOCOMMIT {
            return Self::begin(store).await;
        }
        let attempt = store.stalls.attempt();
        let turn = D::turn(&store.state).await;
        let conn = store.acquire("connect").await?;
        drop(attempt);
        Ok(Write { conn: Conn::Auto(conn), _turn: turn, answer_within: store.answer_within })
    }
}

impl<'c, D: Dialect> Write<'c, D> {
    /// Statements on the caller's open transaction (`conn` is the
    /// connection of a `sqlx::Transaction`): they commit or roll back with
    /// it. No write turn: on SQLite the database serializes it with the
    /// framework's writers (its busy timeout applies).
    pub(crate) fn on(conn: &'c mut D::Connection) -> Self {
        Write { conn: Conn::Theirs(conn), _turn: None, answer_within: None }
    }

    /// How long a statement on it waits for an answer: pass to [`within`].
    pub(crate) fn answer_within(&self) -> Option<std::time::Duration> {
        self.answer_within
    }

    /// The connection to run statements on.
    pub(crate) fn conn(&mut self) -> &mut D::Connection {
        match &mut self.conn {
            Conn::Tx(tx) => &mut tx.conn,
            Conn::Auto(conn) => conn,
            Conn::Theirs(conn) => conn,
        }
    }

    /// Commits on success; on failure rolls back at once. (A dropped
    /// transaction is only rolled back when its connection is next used, and
    /// until then PostgreSQL keeps its row locks: a lease would skip those
    /// rows as locked.) The caller's transaction is left to the caller.
    pub(crate) async fn finish<R>(self, result: Result<R, TransportError>) -> Result<R, TransportError> {
        let Conn::Tx(mut tx) = self.conn else { return result };
        let wait = self.answer_within;
        match result {
            Ok(value) => {
                within::<D, _, _>(wait, tx.end("COMMIT"), |e| e).await.map_err(|e| backend::<D>("commit", e))?;
                Ok(value)
            }
            Err(e) => {
                if let Err(rollback) = within::<D, _, _>(wait, tx.end("ROLLBACK"), |e| e).await {
                    tracing::debug!("{}: rollback failed, closing the connection: {rollback}", D::SYSTEM);
                }
                Err(e)
            }
        }
    }
}

/// A write transaction of ours on a pooled connection, begun and ended by
/// plain statements, not by a `sqlx::Transaction`. sqlx keeps its own count
/// of a connection's open transactions and trusts it: on SQLite a COMMIT
/// that fails for a full disk or an I/O error rolls the transaction back by
/// itself, sqlx's ROLLBACK after it then fails ("no transaction is active"),
/// and the count stayed at one, so every later BEGIN on that connection
/// failed ("attempted to call begin_with at non-zero transaction depth") for
/// as long as the pool kept it: a consumer that had met a full disk once
/// never wrote again, room or not (tried from outside on a 3 MB tmpfs). A
/// connection whose transaction did not end cleanly, or whose write was cut
/// short, is closed instead of going back to the pool; closing rolls back
/// whatever is still open (and PostgreSQL frees the rows' locks at once).
struct Begun<D: Dialect> {
    conn: PoolConnection<D>,
    /// Whether a transaction may be open: set before BEGIN, cleared once
    /// COMMIT or ROLLBACK succeeded.
    open: bool,
}

impl<D: Dialect> Begun<D> {
    /// Runs `COMMIT` or `ROLLBACK`.
    async fn end(&mut self, statement: &str) -> Result<(), sqlx::Error> {
        D::execute_script(&mut self.conn, statement).await?;
        self.open = false;
        Ok(())
    }
}

impl<D: Dialect> Drop for Begun<D> {
    fn drop(&mut self) {
        if self.open {
            self.conn.close_on_drop();
        }
    }
}

/// Which database a connection is on ([`Dialect::DATABASE`]).
async fn database_of<D: Dialect>(conn: &mut D::Connection, sql: &str) -> Result<String, TransportError> {
    let rows = D::fetch_all(conn, sql, &[]).await.map_err(fail::<D>("naming the database"))?;
    let name = rows.first().map(|r| D::text(r, 0)).transpose().map_err(fail::<D>("naming the database"))?;
    Ok(name.flatten().unwrap_or_default())
}

/// The database of a store's pool, asked once, against which a caller's
/// transaction is checked: a transaction of the same kind on another
/// database would write the framework's rows there.
#[derive(Debug, Clone, Default)]
pub(crate) struct Home(std::sync::Arc<tokio::sync::OnceCell<String>>);

impl Home {
    /// Fails with a sentence when `conn` is not on `store`'s database
    /// (`whose` names what lives there: "queue `orders`", "the outbox").
    pub(crate) async fn check<D: Dialect>(
        &self,
        store: &SqlStore<D>,
        conn: &mut D::Connection,
        whose: &str,
    ) -> Result<(), TransportError> {
        let Some(sql) = D::DATABASE else { return Ok(()) };
        let theirs = database_of::<D>(conn, sql).await?;
        let ours = self
            .0
            .get_or_try_init(|| async {
                let mut own = store.acquire("connect").await?;
                database_of::<D>(&mut own, sql).await
            })
            .await?;
        if theirs == *ours {
            return Ok(());
        }
        Err(TransportError::Rejected(format!(
            "the transaction is on {} database `{theirs}`, {whose} on `{ours}`: publish inside a transaction on that \
             database",
            D::SYSTEM
        )))
    }
}

/// Whether two texts are equal, the empty ones by their length alone: how
/// the inserts decide whether a batch's rows agree on a text column.
///
/// An empty `String` points at no memory, and glibc's AVX-512 `memcmp`
/// loads through the pointer even for a length of zero (a masked load, whose
/// fault the processor suppresses in microcode): 150 ns per compare against
/// 2 ns for a short text. A batch of plain messages, whose attributes texts
/// are all empty, spent a tenth of its publish CPU in those compares.
pub(crate) fn text_eq(a: &str, b: &str) -> bool {
    a.len() == b.len() && (a.is_empty() || a == b)
}

/// The ids of an insert's rows in input order, from what its RETURNING gave
/// as (id, seq) in no particular order, by each row's own sequence value.
/// `None`: the row was not inserted.
pub(crate) fn in_input_order(rows: &[Row], inserted: Vec<(i64, i64)>) -> Vec<Option<RowId>> {
    let by_seq: std::collections::HashMap<i64, i64> = inserted.into_iter().map(|(id, seq)| (seq, id)).collect();
    rows.iter().map(|r| by_seq.get(&(r.seq as i64)).map(|&id| id as RowId)).collect()
}

/// Row ids as the integers the database stores.
#[cfg(feature = "postgres")]
pub(crate) fn ids(ids: &[RowId]) -> impl Iterator<Item = i64> + '_ {
    ids.iter().map(|&id| id as i64)
}

/// Message rows in a database: `SqlStore<sqlx::Postgres>` or `SqlStore<sqlx::Sqlite>`.
#[derive(Debug)]
pub struct SqlStore<D: Dialect> {
    pub(crate) pool: Pool<D>,
    pub(crate) state: D::State,
    pub(crate) tables: Tables,
    diagnosis: Diagnosis,
    /// [`Dialect::ANSWER_WITHIN`] (shorter in tests).
    pub(crate) answer_within: Option<std::time::Duration>,
    /// How long its writes could not get through lately.
    pub(crate) stalls: Stalls,
}

impl<D: Dialect> Clone for SqlStore<D> {
    fn clone(&self) -> Self {
        SqlStore {
            pool: self.pool.clone(),
            state: self.state.clone(),
            tables: self.tables.clone(),
            diagnosis: self.diagnosis.clone(),
            answer_within: self.answer_within,
            stalls: self.stalls.clone(),
        }
    }
}

/// What [`SqlStore::failure`]'s own connection found, and when: the pool's
/// timeouts within [`Diagnosis::FRESH`] of it share that answer, and one
/// attempt runs at a time. Fifty receives timing out at once would
/// otherwise open fifty connections to a server that may have none to spare.
#[derive(Debug, Clone, Default)]
struct Diagnosis(std::sync::Arc<tokio::sync::Mutex<Option<(std::time::Instant, String)>>>);

impl Diagnosis {
    /// How long an answer is reused.
    const FRESH: std::time::Duration = std::time::Duration::from_secs(1);
}

impl<D: Dialect> SqlStore<D> {
    /// Connects to `url` (without the framework's options).
    pub async fn connect(url: &str) -> Result<Self, TransportError> {
        Self::connect_sized(url, None).await
    }

    /// Connects to `url` with a pool of at most `max_connections` (default:
    /// the database's).
    pub(crate) async fn connect_sized(url: &str, max_connections: Option<u32>) -> Result<Self, TransportError> {
        let (pool, state) = D::connect(url, max_connections.unwrap_or(D::MAX_CONNECTIONS)).await?;
        Ok(SqlStore::new(pool, state))
    }

    /// A store on `pool`, its tables in the connection's schema.
    pub(crate) fn new(pool: Pool<D>, state: D::State) -> Self {
        SqlStore {
            pool,
            state,
            tables: Tables::default(),
            diagnosis: Diagnosis::default(),
            answer_within: D::ANSWER_WITHIN,
            stalls: Stalls::default(),
        }
    }

    /// The connection pool.
    pub fn pool(&self) -> &Pool<D> {
        &self.pool
    }

    /// Closes the pool, with the connection the write turn keeps.
    #[cfg(all(test, feature = "sqlite"))]
    pub(crate) async fn close(&self) {
        D::release(&self.state).await;
        self.pool.close().await;
    }

    /// A pooled connection for `what`; when none comes in time, the error
    /// says why ([`Self::failure`]).
    pub(crate) async fn acquire(&self, what: &str) -> Result<PoolConnection<D>, TransportError> {
        self.pooled(what, self.pool.acquire()).await
    }

    /// What `work` (`what`, which takes a connection of the pool) returns,
    /// its error as [`Self::failure`] tells it.
    pub(crate) async fn pooled<T>(
        &self,
        what: &str,
        work: impl Future<Output = Result<T, sqlx::Error>>,
    ) -> Result<T, TransportError> {
        match work.await {
            Ok(value) => Ok(value),
            Err(e) => Err(self.failure(what, e).await),
        }
    }

    /// What `run` (`what`, which takes a connection of the pool) returns;
    /// when its connection turned out to be gone ([`Dialect::lost`]: the
    /// server restarted or failed over, or an operator killed its
    /// sessions), once more on another, since the mark that the first
    /// failure leaves closes the pool's connections of its age
    /// (PostgreSQL's `failover`). Only for statements that may run twice,
    /// for the server may have committed the first before it closed the
    /// connection: a BEGIN, a read, a claim (its processor's own is claimed
    /// again), its extension and release, a lease (rows a lost answer
    /// leased come back when the lease ends, as after any failure), an
    /// insert of plain messages (the copies share their message ids, as a
    /// redelivery's do). Not a completion, which would then find its rows
    /// gone and report them lost.
    pub(crate) async fn again_if_lost<T, F>(&self, what: &str, mut run: impl FnMut() -> F) -> Result<T, TransportError>
    where
        F: Future<Output = Result<T, sqlx::Error>>,
    {
        match within::<D, _, _>(self.answer_within, run(), |e| e).await {
            Ok(value) => Ok(value),
            Err(e) if D::lost(&e) => {
                D::noticed(&e);
                tracing::debug!("{}: {what} found its connection gone ({e}); once more on another", D::SYSTEM);
                self.pooled(what, within::<D, _, _>(self.answer_within, run(), |e| e)).await
            }
            Err(e) => Err(self.failure(what, e).await),
        }
    }

    /// `e`, the error of `what`, as the transport's. The pool retries a
    /// refused connection until its timeout and then says only "pool timed
    /// out while waiting for an open connection", which reads like a pool
    /// too small: with the database down, every receive logged that for as
    /// long as it was down. So after a timeout one connection of its own is
    /// tried, and the error says what that found.
    pub(crate) async fn failure(&self, what: &str, e: sqlx::Error) -> TransportError {
        if !matches!(e, sqlx::Error::PoolTimedOut) {
            return backend::<D>(what, e);
        }
        let waited = self.pool.options().get_acquire_timeout();
        let why = self.why_no_connection().await;
        TransportError::Backend(format!("{}: {what} failed: no connection within {waited:?}: {why}", D::SYSTEM))
    }

    /// Why the pool got no connection: what a connection of its own finds
    /// ([`Diagnosis`]).
    async fn why_no_connection(&self) -> String {
        let mut last = self.diagnosis.0.lock().await;
        if let Some((at, why)) = last.as_ref() {
            if at.elapsed() < Diagnosis::FRESH {
                return why.clone();
            }
        }
        let options = self.pool.connect_options();
        let connecting = <D::Connection as sqlx::Connection>::connect_with(&options);
        let why = match tokio::time::timeout(PROBE, connecting).await {
            Ok(Err(e)) => format!("a new connection fails: {}", described::<D>(&e)),
            Err(_) => format!("a new connection got no answer within {PROBE:?}"),
            Ok(Ok(conn)) => {
                drop(sqlx::Connection::close(conn).await);
                format!(
                    "the database accepts connections, but all {} of the pool's were in use for that long \
                     (long statements, or locks they wait on; `max_connections=` in the URL sets the pool's size)",
                    self.pool.options().get_max_connections()
                )
            }
        };
        *last = Some((std::time::Instant::now(), why.clone()));
        why
    }

    /// The rows of a reading statement, on a pooled connection.
    /// Runs once more when its connection was lost
    /// ([`Self::again_if_lost`]): every statement here may run twice (reads,
    /// and the idempotency claim).
    pub(crate) async fn query(
        &self,
        what: &str,
        parts: &[&str],
        args: &[Value<'_>],
    ) -> Result<Vec<D::Row>, TransportError> {
        let sql = self.tables.sql(parts);
        self.again_if_lost(what, || async {
            let mut conn = self.pool.acquire().await?;
            D::fetch_all(&mut conn, &sql, args).await
        })
        .await
    }

    /// The rows of a statement run on `w`.
    pub(crate) async fn query_in(
        &self,
        w: &mut Write<'_, D>,
        what: &str,
        parts: &[&str],
        args: &[Value<'_>],
    ) -> Result<Vec<D::Row>, TransportError> {
        let sql = self.tables.sql(parts);
        let wait = w.answer_within();
        within::<D, _, _>(wait, D::fetch_all(w.conn(), &sql, args), |e| e).await.map_err(fail::<D>(what))
    }

    /// Runs a statement on `w`; the rows it changed.
    pub(crate) async fn exec_in(
        &self,
        w: &mut Write<'_, D>,
        what: &str,
        parts: &[&str],
        args: &[Value<'_>],
    ) -> Result<u64, TransportError> {
        let sql = self.tables.sql(parts);
        let wait = w.answer_within();
        within::<D, _, _>(wait, D::execute(w.conn(), &sql, args), |e| e).await.map_err(fail::<D>(what))
    }

    /// Runs one writing statement by itself; the rows it changed.
    pub(crate) async fn exec(&self, what: &str, parts: &[&str], args: &[Value<'_>]) -> Result<u64, TransportError> {
        let mut w = Write::single(self).await?;
        let done = self.exec_in(&mut w, what, parts, args).await;
        w.finish(done).await
    }

    /// [`Self::exec`] for a statement that may run twice: once more when its
    /// connection was lost ([`Self::again_if_lost`]). SQLite's writes take
    /// the write turn, through [`Self::exec`]; its connections, files, are
    /// never lost.
    pub(crate) async fn exec_again_if_lost(
        &self,
        what: &str,
        parts: &[&str],
        args: &[Value<'_>],
    ) -> Result<u64, TransportError> {
        if !D::AUTOCOMMIT {
            return self.exec(what, parts, args).await;
        }
        let sql = self.tables.sql(parts);
        self.again_if_lost(what, || async {
            let mut conn = self.pool.acquire().await?;
            D::execute(&mut conn, &sql, args).await
        })
        .await
    }
}

/// Names a failed statement.
pub(crate) fn fail<D: Dialect>(what: &str) -> impl Fn(sqlx::Error) -> TransportError + '_ {
    move |e| backend::<D>(what, e)
}

/// What `statement` answers, or after `wait` without an answer the error
/// of a lost connection, through `error` ([`Dialect::lost`]: the
/// connections of its age are marked stale before the statement is
/// dropped, so that the pool closes this one as it comes back instead of
/// pinging it; and a statement that may run twice runs once more).
///
/// A server gone from the network (a failover that moved the name to
/// another address, a partition) answers nothing and closes nothing: tried
/// from outside through a proxy that stopped forwarding, a publish and
/// every worker statement waited for good (TCP gives up on unacknowledged
/// data after about 15 minutes, and never on a request whose answer does
/// not come), and the pool's places stayed taken by the connections
/// waiting, so that nothing recovered after the failover either.
pub(crate) async fn within<D: Dialect, T, E>(
    wait: Option<std::time::Duration>,
    statement: impl Future<Output = Result<T, E>>,
    error: impl FnOnce(sqlx::Error) -> E,
) -> Result<T, E> {
    let Some(wait) = wait else { return statement.await };
    let mut statement = std::pin::pin!(statement);
    tokio::select! {
        answer = &mut statement => answer,
        () = tokio::time::sleep(wait) => {
            let lost = sqlx::Error::Io(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                format!("no answer from the server within {wait:?}"),
            ));
            D::noticed(&lost);
            Err(error(lost))
        }
    }
}

/// Column `i` of the first row as a BIGINT (none: no row, or NULL).
pub(crate) fn int<D: Dialect>(rows: &[D::Row], i: usize, what: &str) -> Result<Option<i64>, TransportError> {
    Ok(rows.first().map(|r| D::int(r, i)).transpose().map_err(fail::<D>(what))?.flatten())
}

/// Column `i` of the first row as a flag (none: no row, or NULL).
pub(crate) fn flag<D: Dialect>(rows: &[D::Row], i: usize, what: &str) -> Result<Option<bool>, TransportError> {
    rows.first().map(|r| D::flag(r, i)).transpose().map_err(fail::<D>(what))
}

/// Leased rows, decoded and in the order they go out.
pub(crate) fn leased<D: Dialect>(found: &[D::Row]) -> Result<Vec<LeasedRow>, TransportError> {
    let records = found.iter().map(D::leased).collect::<Result<_, _>>().map_err(fail::<D>("lease"))?;
    Ok(super::record::in_order(records))
}

/// Whole message rows.
pub(crate) fn rows<D: Dialect>(found: &[D::Row]) -> Result<Vec<Row>, TransportError> {
    found.iter().map(|r| D::record(r).map_err(fail::<D>("reading a message"))?.try_into()).collect()
}

/// How a database skips rows other transactions hold ([`Dialect::SKIP_LOCKED`]).
#[derive(Debug, Clone, Copy)]
pub(crate) struct SkipLocked {
    /// [`Dialect::BY_IDS`] without the rows another transaction holds.
    pub(crate) by_ids: &'static str,
    /// [`SkipLocked::by_ids`] with the bodies read as empty.
    pub(crate) by_ids_without_bodies: &'static str,
    /// Bounds the current transaction's waits for a row lock.
    pub(crate) wait_briefly: &'static str,
    /// A condition that bounds its statement's waits for a row lock as
    /// [`SkipLocked::wait_briefly`] does, added to a one-row `UPDATE` that
    /// runs alone (no transaction to set it in, no round trip more).
    pub(crate) waiting_here: &'static str,
    /// The error code of a wait given up ([`TransportError::Held`]).
    pub(crate) held_code: &'static str,
}
