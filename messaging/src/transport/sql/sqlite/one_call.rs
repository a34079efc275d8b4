//! The three writes every message goes through, each one transaction in one
//! call to the connection's thread on the write turn's connection
//! ([`super::writer`]): the enqueue of plain messages, the lease, and the
//! completion. Each call's text is `BEGIN IMMEDIATE; …; COMMIT`, so whatever
//! it must decide is decided by its statements: a check that returns a row
//! when something is wrong, a statement that does nothing unless the one
//! before did what was expected, `changes()` read back.

use std::collections::{BTreeMap, HashSet};
use std::sync::{Arc, Mutex};

use sqlx::sqlite::{SqliteArguments, SqliteConnection, SqliteRow};
use sqlx::{Row as _, Sqlite};

use super::append;
use super::writer::{transaction, Turn};
use super::{int, missing_counter};
use crate::error::TransportError;
use crate::transport::sql::dialect::{fail, leased, SqlStore};
use crate::transport::sql::machine::{Enqueue, RowId, Take};
use crate::transport::sql::record::{Held, LeasedRow};
use crate::transport::sql::statements::{self as sql, FifoSearch, Tables};

/// A statement that returns a row (`missing_counter`) only when the counter
/// the enqueue order and lease tokens come from is gone.
const MISSING_COUNTER: &str =
    "SELECT 1 AS missing_counter WHERE NOT EXISTS (SELECT 1 FROM messaging_counters WHERE name = 'seq')";

/// Whether queue `$1` has pending rows: read before a lease takes the write lock.
const LOOK: &str = "SELECT EXISTS (SELECT 1 FROM messaging_messages WHERE queue = $1 AND status = 'pending')";

/// Whether the rows of a call include [`MISSING_COUNTER`]'s.
fn counter_missing(rows: &[SqliteRow]) -> bool {
    rows.first().is_some_and(|r| r.try_column("missing_counter").is_ok())
}

/// Inserts plain `items` (no identity) as new rows of `queue` in one
/// transaction, the enqueue order assigned in input order from the counter.
/// Their message ids and payloads are taken.
pub(super) async fn enqueue_plain(
    store: &SqlStore<Sqlite>,
    queue: &str,
    now: i64,
    items: &mut [Enqueue],
) -> Result<(), TransportError> {
    let n = items.len();
    let (statements, args) = plain(queue, now, items, true)?;
    let text = store.tables.sql(&[&statements]);
    let _attempt = store.stalls.attempt();
    let mut turn = Turn::take(&store.state.writer).await;
    let found =
        turn.transaction(&store.pool, sqlx::query_with(&text, args)).await.map_err(fail::<Sqlite>("enqueue"))?;
    plain_stored(n, &found)
}

/// [`enqueue_plain`] inside the caller's open transaction `conn`, in one
/// call (the counter moved apart from the inserts was a hop more per
/// `send_batch(..).in_transaction`).
pub(super) async fn enqueue_plain_in(
    conn: &mut SqliteConnection,
    tables: &Tables,
    queue: &str,
    now: i64,
    items: &mut [Enqueue],
) -> Result<(), TransportError> {
    let n = items.len();
    let (statements, args) = plain(queue, now, items, false)?;
    let text = tables.sql(&[&statements]);
    let found = sqlx::query_with(&text, args).fetch_all(conn).await.map_err(fail::<Sqlite>("enqueue"))?;
    plain_stored(n, &found)
}

/// The statements of a plain enqueue (in a transaction of their own when
/// `whole`) and their arguments: the counter checked and moved first by the
/// whole batch; each row's sequence is then the counter's new value less the
/// batch plus its place in it (1-based). A subquery in each row of a VALUES
/// list ran once per row (11 us a row); in the select list over the VALUES
/// it runs once.
fn plain<'q>(
    queue: &'q str,
    now: i64,
    items: &'q mut [Enqueue],
    whole: bool,
) -> Result<(Arc<str>, SqliteArguments<'q>), TransportError> {
    let n = int(items.len());
    let shapes = append::shapes(items, now);
    let text = PlainTexts::get((whole, shapes.clone()), || {
        let statements = format!(
            "{MISSING_COUNTER}; UPDATE messaging_counters SET value = value + ? WHERE name = 'seq'; {}",
            append::text(&shapes)
        );
        if whole {
            transaction(&statements)
        } else {
            statements
        }
    });
    let args = append::arguments(&[n], queue, now, items, &shapes)
        .map_err(|e| fail::<Sqlite>("enqueue")(sqlx::Error::Encode(e)))?;
    Ok((text, args))
}

/// The texts of the latest plain enqueues, by whether each is a transaction
/// of its own and the shapes of its inserts. A text is a function of those
/// alone, and a service sends batches of few shapes. A `send_batch` of 1,000
/// built its 11 KB text anew every call: 150 of the caller's 3,500
/// instructions a message (callgrind of the benchmark's publish); kept, the
/// publish went from 0.84-0.87 to 0.87-0.90 of the shaped insert (three
/// runs each, in turn).
struct PlainTexts;

/// What a plain enqueue's text is a function of: whether it is a
/// transaction of its own, and the shapes of its inserts.
type PlainKey = (bool, Vec<append::Shape>);

impl PlainTexts {
    /// How many texts are kept.
    const KEPT: usize = 8;

    /// The text of `key`, built by `build` unless kept.
    fn get(key: PlainKey, build: impl FnOnce() -> String) -> Arc<str> {
        static RECENT: Mutex<Vec<(PlainKey, Arc<str>)>> = Mutex::new(Vec::new());
        // A panic cannot leave the list half-changed: it is only pushed to
        // and truncated.
        let lock = || RECENT.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some((_, text)) = lock().iter().find(|(k, _)| *k == key) {
            return text.clone();
        }
        let text: Arc<str> = build().into();
        let mut recent = lock();
        recent.insert(0, (key, text.clone()));
        recent.truncate(Self::KEPT);
        text
    }
}

/// Checks what [`plain`]'s statements returned for `n` messages.
fn plain_stored(n: usize, found: &[SqliteRow]) -> Result<(), TransportError> {
    if counter_missing(found) {
        return Err(missing_counter());
    }
    append::check_inserted(n, found)
}

/// Leases as many rows of `queue` as `take` says until `expires`: the first
/// pending ones, or a FIFO queue's heads (by `take.rows` alone) looked for as
/// far as `fifo` says.
pub(super) async fn lease(
    store: &SqlStore<Sqlite>,
    queue: &str,
    take: Take,
    expires: i64,
    fifo: Option<FifoSearch>,
) -> Result<Vec<LeasedRow>, TransportError> {
    let pick = if fifo.is_some() { sql::PICK_FIFO } else { sql::PICK_STANDARD };
    // The picked rows take the counter's next value as their token, and the
    // counter moves only if some row was leased (`changes()`: the rows the
    // statement before changed): a FIFO queue whose groups are all leased
    // finds pending rows but picks none, poll after poll, and writes nothing.
    // Without the counter nothing is leased, and the first statement says so.
    // The leased rows are read back by their token (unique: the counter only
    // moves on) on the leased index rather than by `RETURNING`, which SQLite
    // gathers into a temporary table before handing out the first row: 5.0
    // -> 3.9 us per row for the call (sqlx's statement log, 20,000 rows,
    // medians of five).
    let whole = transaction(
        &[
            MISSING_COUNTER,
            "; UPDATE messaging_messages SET status = 'processing', \
            lease_token = (SELECT value + 1 FROM messaging_counters WHERE name = 'seq'), \
            lease_expires = $3, attempts = attempts + 1 \
         WHERE id IN (",
            pick,
            ") AND EXISTS (SELECT 1 FROM messaging_counters WHERE name = 'seq'); SELECT ",
            sql::LEASED,
            " FROM messaging_messages WHERE queue = $1 AND status IN ('processing', 'awaiting_release') \
         AND lease_expires = $3 AND lease_token = (SELECT value + 1 FROM messaging_counters WHERE name = 'seq'); \
         UPDATE messaging_counters SET value = value + 1 WHERE name = 'seq' AND changes() > 0",
        ]
        .concat(),
    );
    let text = store.tables.sql(&[&whole]);
    let mut query = sqlx::query(&text).bind(queue).bind(int(take.rows)).bind(expires);
    query = match fifo {
        Some(search) => query.bind(search.walk).bind(search.groups),
        None => query.bind(take.bytes).bind(int(take.at_least)),
    };
    let _attempt = store.stalls.attempt();
    let mut turn = Turn::take(&store.state.writer).await;
    // Most idle polls find nothing: look before taking the write lock (which
    // an application sharing the file may hold), on the turn's connection.
    let look = store.tables.sql(&[LOOK]);
    let pending = turn.read(&store.pool, sqlx::query(&look).bind(queue)).await.map_err(fail::<Sqlite>("lease"))?;
    if !pending.first().is_some_and(|r| r.try_get::<bool, _>(0).unwrap_or(true)) {
        return Ok(Vec::new());
    }
    let found = turn.transaction(&store.pool, query).await.map_err(fail::<Sqlite>("lease"))?;
    if counter_missing(&found) {
        return Err(missing_counter());
    }
    leased::<Sqlite>(&found)
}

/// Completes the plain rows whose lease the items hold (deleted, or kept as
/// processed); returns those items.
pub(super) async fn complete_plain(
    store: &SqlStore<Sqlite>,
    queue: &str,
    now: i64,
    items: &[Held],
    retention_ms: i64,
) -> Result<HashSet<(RowId, u64)>, TransportError> {
    // Per lease token among the items (usually one or two leases), one
    // statement that completes its rows only if it still holds every one of
    // them (a count of them in the same statement), then `changes()`. Usually
    // all do; the items of a token that did not are left for the caller to
    // settle one by one. (Before: a savepoint, the statements, the count, and
    // the statements again returning their rows when some receipt had lost
    // its row: four calls where one does.)
    let mut by_token: BTreeMap<u64, Vec<i64>> = BTreeMap::new();
    for &(id, token, _) in items {
        by_token.entry(token).or_default().push(id as i64);
    }
    let complete = if retention_ms <= 0 {
        "DELETE FROM messaging_messages"
    } else {
        "UPDATE messaging_messages SET status = 'processed', processed_at = ?, lease_token = NULL, \
         lease_expires = NULL, suspect = 0"
    };
    let held = "id IN (SELECT value FROM json_each(?)) AND lease_token = ? AND queue = ? AND status = 'processing' \
                AND identity IS NULL";
    let one = format!(
        "{complete} WHERE {held} AND (SELECT count(*) FROM messaging_messages WHERE {held}) = ?; \
         SELECT changes() AS completed"
    );
    let text = vec![one.as_str(); by_token.len()].join("; ");
    let whole = transaction(&text);
    let text = store.tables.sql(&[&whole]);
    let mut query = sqlx::query(&text);
    let lists: Vec<String> = by_token.values().map(|ids| super::json_ids(ids.iter().copied())).collect();
    for ((token, ids), list) in by_token.iter().zip(&lists) {
        if retention_ms > 0 {
            query = query.bind(now);
        }
        for _ in 0..2 {
            query = query.bind(list.as_str()).bind(*token as i64).bind(queue);
        }
        query = query.bind(int(ids.len()));
    }
    let _attempt = store.stalls.attempt();
    let mut turn = Turn::take(&store.state.writer).await;
    let found = turn.transaction(&store.pool, query).await.map_err(fail::<Sqlite>("completing messages"))?;
    let mut done = HashSet::with_capacity(items.len());
    for ((token, ids), row) in by_token.iter().zip(&found) {
        let completed: i64 = row.try_get("completed").map_err(fail::<Sqlite>("completing messages"))?;
        if completed == int(ids.len()) {
            done.extend(ids.iter().map(|&id| (id as RowId, *token)));
        }
    }
    Ok(done)
}
