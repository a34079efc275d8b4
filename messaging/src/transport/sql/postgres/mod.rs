//! `postgres://`: queues in PostgreSQL. Many processes share a queue:
//! leasing takes rows with `FOR UPDATE SKIP LOCKED` in batches, enqueues
//! `NOTIFY` idle receivers (with polling as the fallback for poolers that drop
//! notifications), row transitions lock the row they change, and every
//! process reads the database's clock ([`super::clock`]).

use std::collections::HashSet;
use std::time::Duration;

use std::str::FromStr;

use sqlx::postgres::{PgConnectOptions, PgConnection, PgListener, PgPool, PgPoolOptions};
use sqlx::Connection as _;
use sqlx::{Pool, Postgres};
use tokio::sync::{broadcast, oneshot};

use super::clock::Clock;
use super::dialect::{
    backend, fail, full_disk_hint, ids, leased, within, Dialect, SkipLocked, SqlStore, StopOnDrop, Write,
};
use super::record::{Held, LeasedRow, Tuple};
use super::statements::{self as sql, FifoSearch, StoreForm, Tables};
use crate::error::TransportError;
use crate::transport::sql::machine::{Enqueue, Row, RowId, Take};

mod failover;
pub(crate) mod horizon;
mod idle;
mod insert;

/// The notification channel enqueues signal on (payload: the queue name).
const CHANNEL: &str = "messaging_enqueued";

/// The values each draw of `messaging_seq` reserves (its `INCREMENT BY`,
/// migration `20261210000001_seq_blocks.sql`): an append numbers up to this
/// many rows from one draw, and rows with an identity take their sequence
/// values the same way ([`Dialect::next_seqs`]).
const SEQ_BLOCK: i64 = 1024;

/// Rows in PostgreSQL.
#[cfg(all(test, feature = "sqlite"))]
pub(crate) type PostgresStore = SqlStore<Postgres>;

/// What a PostgreSQL store keeps beside its pool.
#[derive(Debug, Clone)]
pub struct PgState {
    changes: broadcast::Sender<String>,
    clock: Clock,
    _tasks: StopOnDrop,
}

/// The URL without its password, for error messages.
fn redact(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(scheme), Some(at)) if at > scheme => {
            let userinfo = &url[scheme + 3..at];
            match userinfo.split_once(':') {
                Some((user, _)) => format!("{}{user}:***{}", &url[..scheme + 3], &url[at..]),
                None => url.to_owned(),
            }
        }
        _ => url.to_owned(),
    }
}

/// The options of a store's pool of at most `max_connections`, under the
/// server's `idle_timeout` ([`idle`]), its connections' answers awaited for
/// `answer_within` ([`Dialect::ANSWER_WITHIN`]).
pub(crate) fn pool_options(
    max_connections: u32,
    idle_timeout: Option<Duration>,
    answer_within: Option<Duration>,
) -> PgPoolOptions {
    PgPoolOptions::new()
        .max_connections(max_connections)
        .acquire_timeout(Duration::from_secs(5))
        // No ping before each use: it was a round trip more on every
        // statement (a publish was four round trips where two do). Only a
        // connection that waited a second or more is pinged (within
        // `answer_within`), and none older than the last one found closed
        // is handed out (`failover`).
        .test_before_acquire(false)
        .before_acquire(move |conn, meta| {
            Box::pin(async move {
                Ok(failover::usable(&meta)
                    && idle::fresh(meta.idle_for, idle_timeout)
                    && failover::alive(conn, &meta, answer_within).await)
            })
        })
        // sqlx pings every connection given back, without a limit: on a
        // server gone from the network that ping waited for good, holding
        // one of the pool's places (in a test, connections given back as
        // the server went: the pool was short of them from then on). So a
        // stale connection is closed at once, and another is pinged first
        // within the limit (`failover::answers`), which leaves sqlx's own
        // ping right after it nothing to wait for.
        .after_release(move |conn, meta| {
            Box::pin(async move { Ok(failover::usable(&meta) && failover::answers(conn, answer_within).await) })
        })
}

/// The database's clock, in milliseconds since the Unix epoch.
async fn database_ms(pool: &PgPool) -> Result<i64, sqlx::Error> {
    sqlx::query_scalar("SELECT (extract(epoch FROM clock_timestamp()) * 1000)::bigint").fetch_one(pool).await
}

/// Starts the background task of a store on `pool`.
fn start(pool: &PgPool, clock: Clock) -> PgState {
    let changes = broadcast::channel(1024).0;
    let (stop, stopped) = StopOnDrop::new();
    tokio::spawn(background(pool.clone(), changes.clone(), clock.clone(), stopped));
    PgState { changes, clock, _tasks: stop }
}

/// A LISTEN connection on `pool`, or `None` (said once per outage,
/// `warned`): idle receivers poll meanwhile. `keep` becomes its keepalive
/// (`idle`), read before the LISTEN so that the session's last statement
/// names it.
async fn listen(
    pool: &PgPool,
    warned: &mut bool,
    keep: &mut Option<tokio::time::Interval>,
) -> Option<(PgListener, std::time::Instant)> {
    let opened = std::time::Instant::now();
    *keep = None;
    let failed = match PgListener::connect_with(pool).await {
        Ok(mut l) => {
            let keepalive = idle::keepalive_of(&mut l).await;
            match l.listen(CHANNEL).await {
                Ok(()) => {
                    if std::mem::take(warned) {
                        tracing::info!("LISTEN connection back; idle receivers are woken by new messages again");
                    }
                    *keep = keepalive;
                    return Some((l, opened));
                }
                Err(e) => format!("LISTEN failed ({e})"),
            }
        }
        Err(e) => format!("no LISTEN connection ({e})"),
    };
    if !std::mem::replace(warned, true) {
        tracing::warn!("{failed}; idle receivers fall back to polling, and it is tried again every 30 s");
    }
    None
}

/// Forwards NOTIFYs to `changes`, samples the clock and looks for a
/// transaction holding back cleanup ([`horizon`]), until `stop` fires.
/// The LISTEN connection is made again when it could not be made (tried on
/// each clock tick), and at once when a read-only error marks the
/// connections opened before it stale (a failover: it would listen on the
/// old primary, and hear nothing).
async fn background(pool: PgPool, changes: broadcast::Sender<String>, clock: Clock, mut stop: oneshot::Receiver<()>) {
    let mut warned = false;
    let mut reported = horizon::Reported::default();
    // Under the server's idle_session_timeout the LISTEN connection, which
    // only waits, runs a statement now and then, or the server closes it.
    let mut keep = None;
    let mut listener = listen(&pool, &mut warned, &mut keep).await;
    let mut tick = tokio::time::interval(super::clock::EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        let note = async {
            match &mut listener {
                Some((l, _)) => l.recv().await,
                None => std::future::pending().await,
            }
        };
        let stale = |listener: &Option<(PgListener, std::time::Instant)>| {
            listener.as_ref().is_some_and(|(_, opened)| failover::stale(*opened))
        };
        // Whether to make the LISTEN connection (again).
        let remake = tokio::select! {
            _ = &mut stop => return,
            () = failover::marked() => stale(&listener),
            _ = tick.tick() => {
                let wait = <Postgres as Dialect>::ANSWER_WITHIN;
                if let Err(e) = clock.sample(|| within::<Postgres, _, _>(wait, database_ms(&pool), |e| e)).await {
                    tracing::debug!("postgresql: reading the database clock failed ({e}); keeping the last offset");
                }
                // Bounded likewise: a hung check would stop this task.
                let _ = tokio::time::timeout(wait.unwrap_or(Duration::MAX), reported.check(&pool)).await;
                listener.is_none() || stale(&listener)
            }
            _ = async { keep.as_mut()?.tick().await; Some(()) }, if keep.is_some() => {
                if let Some((l, _)) = &mut listener {
                    if let Err(e) = sqlx::query("SELECT 1").execute(l).await {
                        tracing::debug!("postgresql: the LISTEN connection's keepalive failed ({e})");
                    }
                }
                false
            }
            received = note => {
                match received {
                    Ok(note) => {
                        let _ = changes.send(note.payload().to_owned());
                    }
                    // The listener reconnects by itself; meanwhile polling covers.
                    Err(e) => {
                        tracing::debug!("LISTEN connection lost ({e}); reconnecting");
                        tokio::time::sleep(Duration::from_millis(200)).await;
                    }
                }
                false
            }
        };
        if remake {
            if listener.is_some() {
                tracing::info!("postgresql: the LISTEN connection predates a read-only error; making it again");
            }
            // Back to the pool (which closes it) before another is taken.
            drop(listener.take());
            listener = listen(&pool, &mut warned, &mut keep).await;
        }
    }
}

/// Leases one standard queue's pending rows in one statement, with one token
/// for the whole lease: fencing compares (row, token), and a later lease of
/// any of these rows draws a newer token.
///
/// The locked rows are updated by tuple id (a row locked by this statement
/// keeps it until the statement ends), as the completion and the FIFO lease
/// do. Joined back by `id`, the update was planned as a hash join over a
/// sequential scan of the whole table once it had statistics: 30,000 rows,
/// a lease of 300, `EXPLAIN ANALYZE` 18.2 ms, 14 of them building the hash;
/// by tuple id 2.5 ms. The token is drawn once, and only when a row is
/// updated. Of the rows locked, [`LEASE_TAKEN`] keeps those the lease's
/// [`Take`](super::machine::Take) takes (`$4` bytes, `$5` rows at least).
pub(crate) const LEASE_WHOLE: &str = "WITH locked AS ( \
        SELECT ctid AS tuple, priority, seq, octet_length(payload) AS size FROM messaging_messages \
        WHERE queue = $1 AND status = 'pending' \
        ORDER BY priority DESC, seq LIMIT $2 FOR UPDATE SKIP LOCKED), ";

/// The rows of a standard lease's `locked` rows that its bodies' bound
/// takes: each while the bodies before it come to less than `$4` bytes, or
/// while it is among the first `$5` ([`Take::takes`](super::machine::Take::takes)).
/// A row locked and not taken stays pending; its lock ends with the
/// statement. `octet_length` reads a body's length from its header, without
/// reading a body stored apart (TOAST) or decompressing one. The running sum
/// costs a sort of the rows locked: in `psql`, a lease of 1,000 took 14.49
/// against 14.01 ms (medians of 30, in turn), and the framework's drain of
/// 200,000 alone ran at 60,700 msgs/s against 58,200 before (medians of
/// three in turn: no difference to tell). Summing first and sorting only
/// when the sum passes the bound measured the same (60,000), so the lease
/// keeps the one form.
pub(crate) const LEASE_TAKEN: &str = "picked AS ( \
        SELECT tuple FROM (SELECT tuple, sum(size) OVER taken - size AS before, row_number() OVER taken AS place \
            FROM locked WINDOW taken AS (ORDER BY priority DESC, seq ROWS UNBOUNDED PRECEDING)) t \
        WHERE before < $4 OR place <= $5) ";

/// [`LEASE_WHOLE`] in one partition (`id % $7 = $6`). The filter applies
/// before rows are locked, so concurrent leases of different partitions
/// never lock each other's rows.
///
/// The filter is a `CASE`, whose selectivity the planner takes as one half
/// (a boolean expression it knows nothing of): written `id % $5 = $4` it
/// was estimated as an equality on an expression, 0.5 % of the rows, so
/// that a lease of 300 from an analyzed table of 30,000 pending rows
/// expected to find 150 and was planned as a sequential scan and a sort of
/// the whole table instead of a walk of the ready index.
pub(crate) const LEASE_PART: &str = "WITH locked AS ( \
        SELECT ctid AS tuple, priority, seq, octet_length(payload) AS size FROM messaging_messages \
        WHERE queue = $1 AND status = 'pending' AND CASE WHEN id % $7 = $6 THEN TRUE ELSE FALSE END \
        ORDER BY priority DESC, seq LIMIT $2 FOR UPDATE SKIP LOCKED), ";

/// The rest of [`LEASE_WHOLE`] and [`LEASE_PART`], after [`LEASE_TAKEN`]. (A row whose lock
/// followed a newer version than the statement sees is not updated: it
/// stays pending for the next lease.)
pub(crate) const LEASE_PICKED: &str = "UPDATE messaging_messages SET status = 'processing', \
        lease_token = (SELECT nextval('messaging_seq')), lease_expires = $3, attempts = attempts + 1 \
     WHERE ctid = ANY(ARRAY(SELECT tuple FROM picked)) AND status = 'pending' RETURNING ";

/// Leases a FIFO queue's heads ([`sql::PICK_FIFO`], between the two
/// parts), with one token. Each picked row is looked up by primary key and
/// updated by tuple id, as the completion does, so that no estimate decides
/// how the rows are found: updated by `id = ANY(ARRAY(pick))`, on a table
/// never analyzed they were found through the ready index (every queue's
/// pending rows, the ids a filter: `auto_explain` from outside); `id IN
/// (pick)` happened to be planned by primary key there, a choice of the
/// planner's. Leases of the queue take turns under the advisory lock; the
/// `LATERAL` locks each head it takes, skipping one another transaction
/// holds (its group waits for it, as for a head in flight). Without the
/// lock the update waited for such a row: tried from outside, an
/// application's transaction holding one pending row of a FIFO queue for
/// 20 s stopped every group of the queue for 20 s, and the lease that
/// waited handed out leases that had run out meanwhile (4 messages ran
/// twice).
pub(crate) const LEASE_HEADS: [&str; 2] = [
    "WITH picked AS MATERIALIZED (SELECT r.tuple FROM (",
    ") AS p, LATERAL (SELECT ctid AS tuple, status FROM messaging_messages WHERE id = p.id LIMIT 1 \
            FOR UPDATE SKIP LOCKED) r \
        WHERE r.status = 'pending') \
     UPDATE messaging_messages SET status = 'processing', \
        lease_token = (SELECT nextval('messaging_seq')), lease_expires = $3, attempts = attempts + 1 \
     WHERE ctid = ANY(ARRAY(SELECT tuple FROM picked)) AND status = 'pending' RETURNING ",
];

/// The completion of plain rows (`$1` where each receipt's row was leased,
/// `$2` the ids in increasing order, `$3` their tokens, `$4` the queue, `$5`
/// now when rows are kept): deleted, or kept as processed; returns the (id,
/// token) of each row it deleted or updated. A lease holds until it is
/// taken back, even once its time has run out (`Row::holds`).
///
/// The rows are fetched by tuple id, and joined to the receipts by it: a
/// row is completed only if its tuple still holds the receipt's row and
/// lease. The tuple ids come through `ARRAY(SELECT …)`, which the planner
/// takes for ten without looking, so that no table is small enough for a
/// sequential scan to look cheaper: bound as an array, 300 tuple ids were
/// costed as 300 random pages, and a table of 10,000 rows was scanned
/// whole. The checks sit inside a `CASE`, where no index's predicate can
/// match them. Rows are locked in the order of the join's probe side: as
/// planned here, the receipts in id order (the smaller estimate, the tuple
/// scan's ten, is the one hashed). Two statements that lock shared rows in
/// different orders can deadlock; PostgreSQL then cancels one of them after
/// a second, and the worker retries a cancelled acknowledgement (and the
/// heartbeat a cancelled extension at its next tick).
/// Looked up by primary key instead (a `LATERAL … LIMIT 1 FOR UPDATE` per
/// receipt), 300 receipts took 0.85-1.0 ms of execution against 0.42-0.46
/// this way (`EXPLAIN ANALYZE`, warm, three each), and the lookups were a
/// quarter of the server's time in a drain of eight lanes (`perf`). The
/// plain join by key, `USING UNNEST(ids, tokens)` on a table never
/// analyzed, had been planned from the leased index: 60 ms for 300 receipts
/// with 126,000 rows leased.
///
/// A row whose lease was extended since it was leased lies elsewhere now
/// (an update writes a new version): it is left out, and completed by
/// `Row::complete` in a statement of its own, as is a row another
/// transaction changed while this one waited for its lock (its tuple
/// moved), or a receipt whose tuple a vacuum gave to another row (its id or
/// token differs).
///
/// A row another transaction holds (an application's that published a
/// new version by identity, or locked the row, and has not ended) is waited
/// for 450 ms at most (`lock_timeout`, as `Dialect::SKIP_LOCKED` says; set for this statement alone by
/// the first thing it evaluates, [`TUPLES_WAITING`]), and then the statement fails with
/// SQLSTATE 55P03, having completed nothing. Waited for without a bound,
/// one such row held up every acknowledgement of the queue: tried from
/// outside, one row of 600 locked for 60 s left 592 handled messages
/// unacknowledged for the whole minute, and after 30 s the statement was
/// taken for a lost connection (the pool's connections closed, four
/// messages run twice). With `skip_held`, the rows another transaction
/// holds are left out at once (`FOR UPDATE SKIP LOCKED`), the others
/// completed: the second try after such a failure. Not the first form:
/// locking before deleting writes each row twice.
pub(super) fn completion(retain: bool, skip_held: bool) -> [&'static str; 4] {
    const RECEIPTS: &str = " UNNEST($1::tid[], $2::bigint[], $3::bigint[]) AS t(tuple, id, token) WHERE m.ctid = ANY(";
    const SKIPPING: &str =
        "ARRAY(SELECT ctid FROM messaging_messages WHERE ctid = ANY($1::tid[]) FOR UPDATE SKIP LOCKED))";
    const CHECKS: &str = " AND m.ctid = t.tuple \
            AND CASE WHEN m.id = t.id AND m.lease_token = t.token AND m.queue = $4 AND m.status = 'processing' \
            AND m.identity IS NULL THEN TRUE ELSE FALSE END \
        RETURNING m.id, t.token";
    let complete = if retain {
        "UPDATE messaging_messages m SET status = 'processed', processed_at = $5, lease_token = NULL, \
         lease_expires = NULL, suspect = 0 FROM"
    } else {
        "DELETE FROM messaging_messages m USING"
    };
    [complete, RECEIPTS, if skip_held { SKIPPING } else { TUPLES_WAITING }, CHECKS]
}

/// The tuple ids of [`completion`]'s receipts, setting the statement's
/// `lock_timeout` as they are read: before the scan, so before any row is
/// locked. In the subquery the statement evaluates first anyway: as a
/// condition of its own, `(SELECT set_config(…)) IS NOT NULL`, it cost the
/// statement 10-20 µs more than this form, 5-10 µs (pgbench, a `DELETE` of
/// that shape that finds nothing, medians of 4 s, four rounds in turn).
pub(super) const TUPLES_WAITING: &str =
    "ARRAY(SELECT unnest(CASE WHEN set_config('lock_timeout', '450ms', true) IS NOT NULL THEN $1::tid[] END)))";

/// The completion of plain rows `items` (sorted), as [`completion`] says,
/// `skip_held` or waiting a moment for a held row: the (id, token) of those
/// completed.
async fn complete_plain_rows(
    store: &SqlStore<Postgres>,
    queue: &str,
    now: i64,
    items: &[Held],
    retention_ms: i64,
    skip_held: bool,
) -> Result<HashSet<(RowId, u64)>, TransportError> {
    let sql = store.tables.sql(&completion(retention_ms > 0, skip_held));
    let mut w = Write::single(store).await?;
    let mut completion = sqlx::query_as(&sql)
        .bind(items.iter().map(|&(_, _, tuple)| tuple).collect::<Vec<Tuple>>())
        .bind(items.iter().map(|&(id, _, _)| id as i64).collect::<Vec<_>>())
        .bind(items.iter().map(|&(_, token, _)| token as i64).collect::<Vec<_>>())
        .bind(queue);
    if retention_ms > 0 {
        // `processed_at`.
        completion = completion.bind(now);
    }
    let wait = w.answer_within();
    let done: Result<Vec<(i64, i64)>, _> = within::<Postgres, _, _>(wait, completion.fetch_all(w.conn()), |e| e)
        .await
        .map_err(fail::<Postgres>("completing messages"));
    let done = w.finish(done).await?;
    Ok(done.into_iter().map(|(id, token)| (id as RowId, token as u64)).collect())
}

/// What a lease returns besides [`sql::LEASED`]: where each leased version
/// lies, for [`completion`].
const LEASED_AT: &str = ", ctid AS tuple";

/// Dead letters `$2` (ids) of queue `$1` back to pending, at the back of the
/// queue in the order given. As [`completion`]: each row looked up by primary
/// key and locked, then changed by its tuple id. `id = ANY($2) AND queue = $1
/// AND status = 'error'` on a table never analyzed was planned from the
/// dead-letter index, every dead letter of the queue read for each page:
/// 92 ms for a page of 500 among 50,000 letters (a whole redrive quadratic
/// in the letters), 6.8 ms this way. The enqueue order is drawn in the
/// order of the ids (volatile functions run after the rows are ordered),
/// where it used to follow the order the rows were found in.
pub(super) const REDRIVE: &str = "WITH picked AS MATERIALIZED ( \
        SELECT r.ctid AS tuple, nextval('messaging_seq') AS seq \
        FROM UNNEST($2::bigint[]) WITH ORDINALITY AS t(id, ord), \
        LATERAL (SELECT ctid, queue, status FROM messaging_messages WHERE id = t.id LIMIT 1 FOR UPDATE) r \
        WHERE r.queue = $1 AND r.status = 'error' ORDER BY t.ord) \
    UPDATE messaging_messages m SET status = 'pending', attempts = 0, process_at = NULL, seq = picked.seq \
    FROM picked WHERE m.ctid = picked.tuple";

/// [`Dialect::BY_IDS`] with the row lock `$lock`, reading `$columns`.
macro_rules! by_ids {
    ($lock:literal) => {
        by_ids!($lock, sql::columns!())
    };
    ($lock:literal, $($columns:tt)+) => {
        concat!(
            "SELECT m.* FROM (SELECT DISTINCT json_array_elements_text($2::json)::bigint AS k ORDER BY 1) AS keys, \
             LATERAL (SELECT ",
            $($columns)+,
            " FROM messaging_messages WHERE id = keys.k AND queue = $1 LIMIT 1 ",
            $lock,
            ") m"
        )
    };
}

// The dialect's items are the framework's own (the trait is sealed).
#[allow(private_interfaces)]
impl Dialect for Postgres {
    const SYSTEM: &'static str = "postgresql";
    const LOCK: &'static str = " FOR UPDATE";
    const LOCK_SKIP: &'static str = " FOR UPDATE SKIP LOCKED";
    const CONCURRENT_LEASES: u32 = 2;
    const SCHEMA_COLUMNS: &'static str = "SELECT table_name::text, column_name::text FROM information_schema.columns \
        WHERE table_schema = current_schema() AND table_name LIKE 'messaging\\_%'";
    const SEQUENCE_STEP: Option<(&'static str, i64)> = Some((
        "SELECT increment_by FROM pg_sequences WHERE schemaname = current_schema() AND sequencename = 'messaging_seq'",
        SEQ_BLOCK,
    ));
    const SCHEMAS: bool = true;
    const AUTOCOMMIT: bool = true;
    // Generous: the framework's statements take milliseconds (a lease of
    // 1,000 rows about 10 ms); a server that has not answered in half a
    // minute is gone, or so stalled that a new connection is as good.
    const ANSWER_WITHIN: Option<Duration> = Some(Duration::from_secs(30));
    // SQLSTATE 42P01 (undefined_table), whatever the server's language.
    const MIGRATION_LOCK: &'static str = "SELECT pg_advisory_xact_lock(hashtext('messaging:migrate'))";
    const MISSING_TABLE: &'static str = "(code 42P01)";
    const HINTS: &'static [(&'static [&'static str], &'static str)] = &[
        // SQLSTATE 53100 (disk_full).
        (&["53100"], full_disk_hint!("the database server's disk")),
        // A server turned read-only: the connections before it are
        // replaced (`failover`).
        (
            &[failover::READ_ONLY],
            ": the server is read-only (a standby, or `default_transaction_read_only` is on). After a failover the \
             connections opened before it may still reach the old primary: they are closed now, and a retry \
             connects anew",
        ),
        // SQLSTATE 57014 (query_canceled). Seen from outside: a database
        // shared with an application that set `statement_timeout` for its
        // own queries (`ALTER DATABASE … SET`) cancelled the framework's
        // leases too, with nothing in the error to say where the limit
        // came from or that the URL can lift it for these connections.
        (
            &["57014"],
            ": the server cancelled the statement, because of a `statement_timeout` (set for the database, the \
             role or the URL, often meant for the application's own queries) or an operator's cancel. It can be \
             tried again; to give the framework's connections their own limit, add \
             `options=-c%20statement_timeout%3D60s` (or `%3D0` for none) to its URL",
        ),
        // SQLSTATE 55P03 (lock_not_available): an extension or a
        // completion of a row another transaction holds, after its brief
        // wait (`Dialect::SKIP_LOCKED`).
        (
            &["55P03"],
            ": another transaction holds the message's row, such as an application transaction that updated or \
             locked rows of messaging_messages (a publish by identity, a `SELECT … FOR UPDATE`) and has not \
             ended; the other messages go on, and this one is tried again until that transaction ends",
        ),
        // Too many connections, for the server or the role. The pool
        // retries them until its timeout; the connection tried after
        // that (`SqlStore::failure`) carries this hint.
        (
            &["53300"],
            ": the server (or this role) allows no more connections. Each process of the app opens up to \
             `max_connections` (10 unless the URL says; one of them listens for new messages): lower \
             `max_connections=` in the URL, or raise the server's or the role's limit",
        ),
    ];
    const OUTBOX_LOCK: &'static str = "SELECT pg_advisory_xact_lock(hashtext($1))";
    const DATABASE: Option<&'static str> = Some(
        "SELECT current_database() || '@' || coalesce(host(inet_server_addr()), 'socket') || ':' \
         || coalesce(inet_server_port(), 0)::text",
    );

    type State = PgState;

    fn noticed(e: &sqlx::Error) {
        failover::noticed(e);
    }

    fn lost(e: &sqlx::Error) -> bool {
        failover::lost(e)
    }

    const MAX_CONNECTIONS: u32 = 10;

    async fn connect(url: &str, max_connections: u32) -> Result<(Pool<Self>, PgState), TransportError> {
        let refused = |e: &dyn std::fmt::Display| {
            TransportError::Backend(format!("cannot connect to PostgreSQL at {}: {e}", redact(url)))
        };
        let options = PgConnectOptions::from_str(url).map_err(|e| refused(&e))?;
        // One connection first: the pool retries until its timeout and then
        // says only "pool timed out"; a single attempt says what failed
        // (connection refused, unknown host, authentication).
        let idle_timeout =
            match tokio::time::timeout(Duration::from_secs(5), PgConnection::connect_with(&options)).await {
                Ok(Ok(mut first)) => {
                    let timeout = idle::timeout(&mut first).await;
                    drop(first.close().await);
                    timeout
                }
                Ok(Err(e)) => return Err(refused(&e)),
                Err(_) => return Err(refused(&"no answer within 5 s")),
            };
        let pool = pool_options(max_connections, idle_timeout, Self::ANSWER_WITHIN)
            .connect_with(options)
            .await
            .map_err(|e| refused(&e))?;
        let clock = Clock::default();
        clock.sample(|| database_ms(&pool)).await.map_err(|e| backend::<Postgres>("reading the clock", e))?;
        let state = start(&pool, clock);
        Ok((pool, state))
    }

    fn adopt(pool: &Pool<Self>) -> PgState {
        // The background task samples the clock first thing.
        start(pool, Clock::default())
    }

    fn migrations() -> &'static sqlx::migrate::Migrator {
        static MIGRATIONS: sqlx::migrate::Migrator = sqlx::migrate!("./migrations/postgres");
        &MIGRATIONS
    }

    fn now(state: &PgState) -> i64 {
        state.clock.now()
    }

    type Turn = ();

    async fn turn(_: &PgState) -> Option<()> {
        None
    }

    async fn release(_: &PgState) {}

    const BEGIN: &'static str = "BEGIN";

    // One draw per block of values (`SEQ_BLOCK`), the values of a block in
    // turn.
    async fn next_seqs(conn: &mut PgConnection, tables: &Tables, n: usize) -> Result<Vec<u64>, TransportError> {
        let sql = tables.sql(&["SELECT nextval('messaging_seq') FROM generate_series(1, $1)"]);
        let blocks = i64::try_from(n.div_ceil(SEQ_BLOCK as usize)).unwrap_or(i64::MAX);
        let mut firsts: Vec<i64> =
            sqlx::query_scalar(&sql).bind(blocks).fetch_all(conn).await.map_err(fail::<Self>("nextval"))?;
        firsts.sort_unstable();
        Ok(firsts.into_iter().flat_map(|first| (first..first + SEQ_BLOCK).map(|s| s as u64)).take(n).collect())
    }

    // One index lookup per identity (a LATERAL with LIMIT is not flattened
    // into a join the planner may reorder), locked in identity order so that
    // concurrent batches cannot deadlock. Measured: the plain
    // `identity IN (SELECT json_array_elements_text($2))`, on a table last
    // analyzed while empty and now holding 20,000 rows, was planned as a
    // nested loop over the whole queue: 7 to 11 s per 1,000 identities,
    // against 4 ms this way.
    const BY_IDENTITIES: &'static str = concat!(
        "SELECT m.* FROM (SELECT DISTINCT json_array_elements_text($2::json) AS k ORDER BY 1) AS keys, \
         LATERAL (SELECT ",
        sql::columns!(),
        " FROM messaging_messages WHERE queue = $1 AND identity = keys.k LIMIT 1 FOR UPDATE) m"
    );
    // By primary key whatever the statistics say (as the completion and
    // the redrive), and locked in id order, so that two batches naming the
    // same rows wait for each other instead of deadlocking.
    const BY_IDS: &'static str = by_ids!("FOR UPDATE");
    const BY_IDS_WITHOUT_BODIES: &'static str = by_ids!("FOR UPDATE", sql::columns_without_bodies!());
    // A row an application's transaction holds (an update by identity
    // inside a long transaction, a `SELECT … FOR UPDATE`) held up the
    // heartbeat's whole round, tried from outside: one row of 40 locked
    // for 30 s on a 10 s visibility left every message's lease unextended,
    // and 40 jobs were handled 83 times. A moment is long enough for the
    // framework's own statements on the row (a completion) to end.
    const SKIP_LOCKED: Option<SkipLocked> = Some(SkipLocked {
        by_ids: by_ids!("FOR UPDATE SKIP LOCKED"),
        by_ids_without_bodies: by_ids!("FOR UPDATE SKIP LOCKED", sql::columns_without_bodies!()),
        // Two such waits under sqlx's threshold for a slow statement (1 s),
        // which each wait for a held row otherwise also logged at WARN:
        // some 60 lines a minute beside the framework's own while a row was
        // held at 1 s, 30 at 900 ms (a statement queued behind another of
        // ours on the same row waits for the row's lock, then for the
        // transaction: twice).
        wait_briefly: "SET LOCAL lock_timeout = '450ms'",
        // Pseudo-constant, so evaluated once before the scan (a one-time
        // filter), before any row is locked.
        waiting_here: " AND (SELECT set_config('lock_timeout', '450ms', true)) IS NOT NULL",
        // SQLSTATE 55P03 (lock_not_available).
        held_code: "55P03",
    });
    // 12,800 parameters, under the protocol's 65,535. New versions of 5,000
    // pending rows, 1,000 per `send_batch`: 3,061 msgs/s one row per
    // statement, 14,005 in one.
    const STORE_ROWS: (usize, StoreForm) = (512, StoreForm::Values);
    const PREVIOUS_OF: &'static str = "SELECT p.identity, p.message_id, p.payload \
        FROM (SELECT DISTINCT json_array_elements_text($2::json) AS k) AS keys, \
        LATERAL (SELECT identity, message_id, payload FROM messaging_previous \
            WHERE queue = $1 AND identity = keys.k LIMIT 1) p";

    async fn append<'a>(
        conn: &'a mut PgConnection,
        tables: &'a Tables,
        queue: &'a str,
        now: i64,
        items: &'a mut [Enqueue],
    ) -> Result<(), TransportError> {
        if items.is_empty() {
            return Ok(());
        }
        insert::append(conn, tables, queue, now, items).await.map_err(fail::<Self>("enqueue"))
    }

    async fn insert<'a>(
        conn: &'a mut PgConnection,
        tables: &'a Tables,
        queue: &'a str,
        now: i64,
        rows: &'a [Row],
    ) -> Result<Vec<Option<RowId>>, TransportError> {
        if rows.is_empty() {
            return Ok(Vec::new());
        }
        insert::insert(conn, tables, queue, now, rows).await
    }

    async fn lease<'a>(
        store: &'a SqlStore<Self>,
        queue: &'a str,
        now: i64,
        take: Take,
        lease_ms: i64,
        fifo: Option<FifoSearch>,
        partition: Option<(u32, u32)>,
    ) -> Result<Vec<LeasedRow>, TransportError> {
        let limit = i64::try_from(take.rows).unwrap_or(i64::MAX);
        let Some(search) = fifo else {
            let pick = if partition.is_some() { LEASE_PART } else { LEASE_WHOLE };
            let sql = store.tables.sql(&[pick, LEASE_TAKEN, LEASE_PICKED, sql::LEASED, LEASED_AT]);
            let at_least = i64::try_from(take.at_least).unwrap_or(i64::MAX);
            let rows = store
                .again_if_lost("lease", || {
                    let mut query =
                        sqlx::query(&sql).bind(queue).bind(limit).bind(now + lease_ms).bind(take.bytes).bind(at_least);
                    if let Some((part, of)) = partition {
                        query = query.bind(i64::from(part)).bind(i64::from(of));
                    }
                    query.fetch_all(&store.pool)
                })
                .await?;
            return leased::<Self>(&rows);
        };
        // FIFO: leases of one queue take turns under an advisory lock, so
        // that two never pick the same group's head.
        let mut w = Write::begin(store).await?;
        let wait = w.answer_within();
        let result = async {
            let lock = sqlx::query("SELECT pg_advisory_xact_lock(hashtext('messaging:' || $1))").bind(queue);
            within::<Self, _, _>(wait, lock.execute(&mut *w.conn()), |e| e)
                .await
                .map_err(fail::<Self>("lease lock"))?;
            let update = store.tables.sql(&[LEASE_HEADS[0], sql::PICK_FIFO, LEASE_HEADS[1], sql::LEASED, LEASED_AT]);
            let update =
                sqlx::query(&update).bind(queue).bind(limit).bind(now + lease_ms).bind(search.walk).bind(search.groups);
            within::<Self, _, _>(wait, update.fetch_all(&mut *w.conn()), |e| e).await.map_err(fail::<Self>("lease"))
        }
        .await;
        leased::<Self>(&w.finish(result).await?)
    }

    async fn enqueue_plain<'a>(
        store: &'a SqlStore<Self>,
        queue: &'a str,
        now: i64,
        items: &'a mut [Enqueue],
    ) -> Result<(), TransportError> {
        // One statement, which also notifies. Sent once more when its
        // connection was lost (a restart, a failover, an operator's kill):
        // the same rows, with the same message ids, so that in the rare
        // case where the server had committed it before it closed the
        // connection, the two copies are one message to an idempotent
        // handler, as a redelivery is. Tried from outside, four kills of
        // every session during 3,000 publishes failed 5 or 6 of them (two
        // runs); with the pool's mark and ping alone, 1 to 3 (the first
        // publish after a kill); with this, none in three runs.
        if items.is_empty() {
            return Ok(());
        }
        let items = &*items;
        store
            .again_if_lost("enqueue", || async {
                let mut conn = store.pool.acquire().await?;
                insert::append(&mut conn, &store.tables, queue, now, items).await
            })
            .await
    }

    async fn complete_plain<'a>(
        store: &'a SqlStore<Self>,
        queue: &'a str,
        now: i64,
        items: &'a [Held],
        retention_ms: i64,
    ) -> Result<HashSet<(RowId, u64)>, TransportError> {
        let mut items = items.to_vec();
        items.sort_unstable();
        // A row another transaction holds failed the statement after a
        // second (see `completion`): the others at once, without it.
        match complete_plain_rows(store, queue, now, &items, retention_ms, false).await {
            Err(TransportError::Held(_)) => complete_plain_rows(store, queue, now, &items, retention_ms, true).await,
            done => done,
        }
    }

    async fn redrive<'a>(
        conn: &'a mut PgConnection,
        tables: &'a Tables,
        queue: &'a str,
        rows: &'a [RowId],
    ) -> Result<usize, TransportError> {
        let sql = tables.sql(&[REDRIVE]);
        let moved = sqlx::query(&sql)
            .bind(queue)
            .bind(ids(rows).collect::<Vec<_>>())
            .execute(&mut *conn)
            .await
            .map_err(fail::<Self>("redrive"))?;
        Ok(moved.rows_affected() as usize)
    }

    async fn notify<'a>(pool: &'a Pool<Self>, queue: &'a str) {
        let notify = sqlx::query("SELECT pg_notify($1, $2)").bind(CHANNEL).bind(queue).execute(pool);
        if let Err(e) = within::<Self, _, _>(Self::ANSWER_WITHIN, notify, |e| e).await {
            tracing::debug!("NOTIFY failed ({e}); receivers will poll");
        }
    }

    async fn notify_in<'a>(conn: &'a mut PgConnection, queue: &'a str) {
        if let Err(e) = sqlx::query("SELECT pg_notify($1, $2)").bind(CHANNEL).bind(queue).execute(conn).await {
            tracing::debug!("NOTIFY failed ({e}); receivers will poll");
        }
    }

    fn changes(state: &PgState) -> Option<broadcast::Receiver<String>> {
        Some(state.changes.subscribe())
    }
}
