//! The statements PostgreSQL and SQLite share, written once. Both drivers
//! take `$N` placeholders; `TRUE`/`FALSE` are booleans on PostgreSQL and 1/0
//! on SQLite. Tables are named here by their bare names and qualified by
//! [`Tables`] when a schema is set.

use std::borrow::Cow;
use std::sync::Arc;

/// Every column of `messaging_messages` that `record::Record` reads (a
/// macro, so that the statements that list them stay `&'static str`).
macro_rules! columns {
    () => {
        "id, identity, group_id, message_id, payload, attributes, priority, process_at, status, attempts, seq, \
         lease_token, lease_expires, deferred_message_id, deferred_payload, deferred_attributes, deferred_priority, \
         deferred_process_at, deferred_status, deferred_seq, deferred_sent_at, sent_at, processed_at, error, errors, \
         suspect"
    };
}
pub(crate) use columns;

/// [`columns!`] with both bodies read as empty (`payload`, and
/// `deferred_payload`, still NULL where there is no waiting version), for a
/// transition that changes neither ([`store_rows`] with `bodies` false).
/// The heartbeat's extension read every body and wrote it back: tried from
/// outside, 16 messages of 256 KiB held 10 s each on a 3 s visibility wrote
/// 66 MB of WAL on PostgreSQL, against 101 kB for bodies of 1 KiB.
macro_rules! columns_without_bodies {
    () => {
        "id, identity, group_id, message_id, substr(payload, 1, 0) AS payload, attributes, priority, process_at, \
         status, attempts, seq, lease_token, lease_expires, deferred_message_id, \
         substr(deferred_payload, 1, 0) AS deferred_payload, deferred_attributes, deferred_priority, \
         deferred_process_at, deferred_status, deferred_seq, deferred_sent_at, sent_at, processed_at, error, errors, \
         suspect"
    };
}
pub(crate) use columns_without_bodies;

/// The columns a lease returns (`record::LeasedRow`), with priority and seq
/// for ordering.
pub(crate) const LEASED: &str =
    "id, lease_token, message_id, payload, attempts, group_id, attributes, sent_at, priority, seq, suspect";

/// Where the framework's tables are: the connection's schema, or a named one.
#[derive(Debug, Clone, Default)]
pub(crate) struct Tables {
    /// `Some("app")` names `app.messaging_messages` and so on.
    schema: Option<Arc<str>>,
}

impl Tables {
    /// Tables in `schema` (none: the connection's default schema).
    pub(crate) fn in_schema(schema: Option<&str>) -> Tables {
        Tables { schema: schema.map(Arc::from) }
    }

    /// The schema, if one is named.
    pub(crate) fn schema(&self) -> Option<Arc<str>> {
        self.schema.clone()
    }

    /// The statement made of `parts`, with every table qualified.
    pub(crate) fn sql<'a>(&self, parts: &[&'a str]) -> Cow<'a, str> {
        let text = match parts {
            [one] => Cow::Borrowed(*one),
            _ => Cow::Owned(parts.concat()),
        };
        match &self.schema {
            None => text,
            Some(schema) => Cow::Owned(text.replace("messaging_", &format!("{schema}.messaging_"))),
        }
    }
}

pub(crate) const DECLARE: &str =
    "INSERT INTO messaging_queues (name, fifo, created_at) VALUES ($1, $2, $3) ON CONFLICT (name) DO NOTHING";
pub(crate) const QUEUE_KIND: &str = "SELECT fifo FROM messaging_queues WHERE name = $1";

/// A row by id (`$1` id, `$2` queue).
pub(crate) const BY_ID: &str = concat!("SELECT ", columns!(), " FROM messaging_messages WHERE id = $1 AND queue = $2");

/// The columns [`store_rows`] writes, `id` first, in the order of its values.
const STORED: [&str; 26] = [
    "id",
    "identity",
    "group_id",
    "message_id",
    "payload",
    "attributes",
    "priority",
    "process_at",
    "status",
    "attempts",
    "seq",
    "lease_token",
    "lease_expires",
    "deferred_message_id",
    "deferred_payload",
    "deferred_attributes",
    "deferred_priority",
    "deferred_process_at",
    "deferred_status",
    "deferred_seq",
    "deferred_sent_at",
    "sent_at",
    "processed_at",
    "error",
    "errors",
    "suspect",
];

/// Values per row of [`store_rows`].
pub(crate) const STORED_COLUMNS: usize = STORED.len();

/// The two columns of [`STORED`] that hold bodies, which [`store_rows`]
/// leaves out when told to.
const BODY_COLUMNS: [usize; 2] = [4, 14];

/// Whether [`store_rows`] writes the `i`th column of [`STORED`] (and takes
/// its value), with or without the bodies.
pub(crate) fn writes_column(i: usize, bodies: bool) -> bool {
    bodies || !BODY_COLUMNS.contains(&i)
}

/// The columns [`store_rows`] writes, with or without the bodies.
fn stored(bodies: bool) -> impl Iterator<Item = &'static str> {
    STORED.iter().enumerate().filter(move |&(i, _)| writes_column(i, bodies)).map(|(_, c)| *c)
}

/// How rows are written back in one call ([`store_rows`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum StoreForm {
    /// One `UPDATE … FROM (VALUES …)` (PostgreSQL).
    #[cfg_attr(not(feature = "postgres"), allow(dead_code))]
    Values,
    /// One `UPDATE … WHERE id = $N` per row, joined by `;` in one call
    /// (SQLite, whose driver binds `$N` across the statements of a call).
    Joined,
}

/// Writes every column of `n` rows back after their transitions, in one
/// call, or every column but the bodies ([`BODY_COLUMNS`]) when `bodies` is
/// false: the values are [`STORED_COLUMNS`] per row (two fewer without the
/// bodies), `id` first. Both databases name the columns of a `VALUES` list
/// `column1`, `column2`, ….
pub(crate) fn store_rows(n: usize, form: StoreForm, bodies: bool) -> String {
    use std::fmt::Write as _;
    let per_row = stored(bodies).count();
    let one = |sql: &mut String, first: usize| {
        sql.push_str("UPDATE messaging_messages SET ");
        for (i, column) in stored(bodies).enumerate().skip(1) {
            let _ = write!(sql, "{}{column} = ${}", if i > 1 { ", " } else { "" }, first + i);
        }
        let _ = write!(sql, " WHERE id = ${first}");
    };
    let mut sql = String::new();
    if n == 1 || form == StoreForm::Joined {
        for row in 0..n {
            if row > 0 {
                sql.push_str("; ");
            }
            one(&mut sql, row * per_row + 1);
        }
        return sql;
    }
    sql.push_str("UPDATE messaging_messages AS m SET ");
    for (i, column) in stored(bodies).enumerate().skip(1) {
        let _ = write!(sql, "{}{column} = t.column{}", if i > 1 { ", " } else { "" }, i + 1);
    }
    sql.push_str(" FROM (VALUES ");
    for row in 0..n {
        sql.push_str(if row > 0 { ", (" } else { "(" });
        for column in 0..per_row {
            let _ = write!(sql, "{}${}", if column > 0 { ", " } else { "" }, row * per_row + column + 1);
        }
        sql.push(')');
    }
    sql.push_str(") AS t WHERE m.id = t.column1");
    sql
}

/// Splits `n` rows into calls of a power of two rows each, at most `max`
/// (a power of two): few distinct statements, so few prepared ones per
/// connection (at most 1 + log2 `max`).
pub(crate) fn power_of_two_chunks(mut n: usize, max: usize) -> impl Iterator<Item = usize> {
    std::iter::from_fn(move || {
        if n == 0 {
            return None;
        }
        let size = (1usize << n.ilog2()).min(max.max(1));
        n -= size;
        Some(size)
    })
}

pub(crate) const DELETE_ROW: &str = "DELETE FROM messaging_messages WHERE id = $1";

/// A suspect's handler runs alone from now: [`Row::isolate`] in one
/// statement (`$1` id, `$2` token, `$3` queue, `$4` now), the lease checked
/// as [`Row::holds`] does; a lost lease changes no row.
///
/// [`Row::isolate`]: crate::transport::sql::machine::Row::isolate
/// [`Row::holds`]: crate::transport::sql::machine::Row::holds
///
/// The checks sit inside a `CASE`, so that the row is found by its key
/// whatever the planner knows: as plain conditions they match the leased
/// index's predicate, from which PostgreSQL has planned such statements on
/// a table never analyzed (every leased row of the queue read).
pub(crate) const ISOLATE: &str = "UPDATE messaging_messages SET suspect = 2 WHERE id = $1 AND CASE \
    WHEN lease_token = $2 AND queue = $3 AND status IN ('processing', 'awaiting_release') \
    THEN TRUE ELSE FALSE END";

/// [`Row::rejoin`]: a leased row marked as running alone (2) is a plain
/// suspect (1) again; held by `$2`, as in [`ISOLATE`].
///
/// [`Row::rejoin`]: crate::transport::sql::machine::Row::rejoin
pub(crate) const REJOIN: &str =
    "UPDATE messaging_messages SET suspect = CASE WHEN suspect = 2 THEN 1 ELSE suspect END \
    WHERE id = $1 AND CASE \
    WHEN lease_token = $2 AND queue = $3 AND status IN ('processing', 'awaiting_release') \
    THEN TRUE ELSE FALSE END";

/// The processed version becomes the identity's previous message.
pub(crate) const RECORD_PREVIOUS: &str = "INSERT INTO messaging_previous (queue, identity, message_id, payload, \
    processed_at) VALUES ($1, $2, $3, $4, $5) ON CONFLICT (queue, identity) DO UPDATE SET \
    message_id = excluded.message_id, payload = excluded.payload, processed_at = excluded.processed_at";
/// Whether housekeeping has work (`$2`: now, `$3`: retention is on, `$4`: its
/// cutoff, `$5`-`$7`: the latest stall's start and end and now less its
/// length, as in [`EXPIRED`]): looked at without a write lock, since usually
/// there is none.
pub(crate) const HOUSEKEEPING_DUE: &str = "SELECT \
    EXISTS (SELECT 1 FROM messaging_messages WHERE queue = $1 AND status = 'sleeping' \
            AND (process_at IS NULL OR process_at <= $2)), \
    EXISTS (SELECT 1 FROM messaging_messages WHERE queue = $1 \
            AND status IN ('processing', 'awaiting_release') AND lease_expires <= $2 \
            AND (lease_expires <= $5 OR lease_expires > $6 OR lease_expires <= $7)), \
    $3 AND EXISTS (SELECT 1 FROM messaging_messages WHERE queue = $1 AND status = 'processed' \
            AND processed_at <= $4)";
/// Sleepers whose time came (one without a time is due, as in
/// `Row::is_eligible`), with [`Dialect::LOCK_SKIP`] and a closing
/// parenthesis after it: a sleeper another transaction holds (an
/// application's update by identity) wakes at a later round instead of
/// holding up this one, and with it every lease of the queue.
///
/// [`Dialect::LOCK_SKIP`]: super::Dialect::LOCK_SKIP
pub(crate) const WAKE: &str = "UPDATE messaging_messages SET status = 'pending' WHERE id IN (\
    SELECT id FROM messaging_messages WHERE queue = $1 \
    AND status = 'sleeping' AND (process_at IS NULL OR process_at <= $2)";
/// The leases housekeeping takes back: expired by `$2` (now), except those
/// that expired within the latest stall of this process's writes (after `$3`,
/// by `$4`) less than its length ago (after `$5`): `stalls::Lapse::takes`.
pub(crate) const EXPIRED: &str = concat!(
    "SELECT ",
    columns!(),
    " FROM messaging_messages WHERE queue = $1 AND status IN ('processing', 'awaiting_release') \
     AND lease_expires <= $2 AND (lease_expires <= $3 OR lease_expires > $4 OR lease_expires <= $5)"
);
pub(crate) const PURGE_PROCESSED: &str =
    "DELETE FROM messaging_messages WHERE queue = $1 AND status = 'processed' AND processed_at <= $2";

/// The earliest sleeper and lease expiry.
pub(crate) const NEXT_DUE: &str = "SELECT \
    (SELECT min(process_at) FROM messaging_messages WHERE queue = $1 AND status = 'sleeping'), \
    (SELECT min(lease_expires) FROM messaging_messages WHERE queue = $1 \
        AND status IN ('processing', 'awaiting_release'))";
pub(crate) const DEPTH: &str = "SELECT count(*) FROM messaging_messages WHERE queue = $1 \
    AND status IN ('pending', 'sleeping', 'processing', 'awaiting_release')";
pub(crate) const ERROR_DEPTH: &str = "SELECT count(*) FROM messaging_messages WHERE queue = $1 AND status = 'error'";
/// The enqueue position of the newest dead letter (NULL: none).
pub(crate) const LAST_ERROR_SEQ: &str = "SELECT max(seq) FROM messaging_messages WHERE queue = $1 AND status = 'error'";
pub(crate) const ERRORS: &str = concat!(
    "SELECT ",
    columns!(),
    " FROM messaging_messages WHERE queue = $1 AND status = 'error' ORDER BY seq LIMIT $2"
);
/// Dead letters after enqueue position `$3`, in enqueue order: the pages of a
/// redrive or a purge (the index on (queue, seq) of rows in error serves it).
pub(crate) const ERRORS_AFTER: &str = concat!(
    "SELECT ",
    columns!(),
    " FROM messaging_messages WHERE queue = $1 AND status = 'error' AND seq > $3 ORDER BY seq LIMIT $2"
);
/// A message by its id (`$2`) in queue `$1`, its current or its waiting
/// version (no index: an operator's lookup reads the queue's rows).
pub(crate) const BY_MESSAGE_ID: &str = concat!(
    "SELECT ",
    columns!(),
    " FROM messaging_messages WHERE queue = $1 AND (message_id = $2 OR deferred_message_id = $2)"
);
/// Deletes one dead letter by row id (`$1`) of queue `$2`.
pub(crate) const DELETE_DEAD: &str = "DELETE FROM messaging_messages WHERE id = $1 AND queue = $2 AND status = 'error'";
/// Deletes one dead letter by message id (`$1`) of queue `$2`.
pub(crate) const DELETE_DEAD_BY_MESSAGE_ID: &str =
    "DELETE FROM messaging_messages WHERE message_id = $1 AND queue = $2 AND status = 'error'";
/// How many rows `queue` (`$1`) holds per status, the oldest's send time,
/// how many of them are held past their lease at `$2` (now), and for the
/// pending rows when the longest waiting became receivable (its send, or
/// the end of its delay or backoff: a woken row keeps its `process_at`).
pub(crate) const COUNTS: &str = "SELECT status, count(*), min(sent_at), \
        count(CASE WHEN status IN ('processing', 'awaiting_release') AND lease_expires <= $2 THEN 1 END), \
        min(CASE WHEN status = 'pending' THEN coalesce(process_at, sent_at) END) \
     FROM messaging_messages WHERE queue = $1 GROUP BY status";
/// A page of the rows of `queue` in status `$2`, in lease order (priority,
/// then enqueue order) after the row at (`$3` priority, `$4` seq), of identity
/// `$6` and group `$7` when given: the console's listing (the ready index
/// serves the pending rows, the dead letters' index the rows in error).
pub(crate) const LIST: &str = concat!(
    "SELECT ",
    columns!(),
    " FROM messaging_messages WHERE queue = $1 AND status = $2 \
     AND (priority < $3 OR (priority = $3 AND seq > $4)) \
     AND (CAST($6 AS TEXT) IS NULL OR identity = $6) AND (CAST($7 AS TEXT) IS NULL OR group_id = $7) \
     ORDER BY priority DESC, seq LIMIT $5"
);
/// A sleeping message (`$2`) of `$1` becomes due now; a pending one is already.
pub(crate) const RETRY_NOW: &str = "UPDATE messaging_messages SET status = 'pending', process_at = NULL \
    WHERE queue = $1 AND message_id = $2 AND status IN ('sleeping', 'pending')";
/// Deletes message `$2` of `$1` unless a consumer holds it.
pub(crate) const DELETE_WAITING: &str = "DELETE FROM messaging_messages WHERE queue = $1 AND message_id = $2 \
    AND status IN ('pending', 'sleeping', 'error')";
/// The row of dead letter `$2` of `$1`.
pub(crate) const DEAD_BY_MESSAGE_ID: &str =
    "SELECT id FROM messaging_messages WHERE queue = $1 AND message_id = $2 AND status = 'error'";
/// Whether queue `$1` is paused (for every process).
pub(crate) const PAUSED: &str = "SELECT paused FROM messaging_queues WHERE name = $1";
/// Pauses (`$2` true) or resumes queue `$1` for every process.
pub(crate) const SET_PAUSED: &str = "UPDATE messaging_queues SET paused = $2 WHERE name = $1";
#[cfg(all(test, feature = "sqlite"))]
pub(crate) const ROWS: &str = concat!("SELECT ", columns!(), " FROM messaging_messages WHERE queue = $1 ORDER BY id");

/// The columns `$cols` of the first `$limit` pending rows of queue `$1`, in
/// lease order: [`PICK_STANDARD`]'s parts.
macro_rules! first_pending {
    ($cols:literal, $limit:expr) => {
        concat!(
            "SELECT ",
            $cols,
            " FROM messaging_messages WHERE queue = $1 AND status = 'pending' ORDER BY priority DESC, seq LIMIT ",
            $limit
        )
    };
}

/// Standard queues on SQLite: the first `$2` pending rows by priority, then
/// enqueue order, each while the bodies before it come to less than `$4`
/// bytes or while it is among the first `$5`
/// ([`Take::takes`](super::machine::Take::takes); PostgreSQL's lease is
/// `postgres::LEASE_TAKEN`). Those rows are the first ones, so the pick is
/// the plain one with a `LIMIT` counted from their bodies' lengths: all `$2`
/// when they come to less than `$4` together, else as many as a running sum
/// over them takes. SQLite's window functions cost: the running sum over
/// every lease made a pick of 1,000 rows 1.15 us a row slower (0.39 against
/// 1.55 us, Python's `sqlite3`, SQLite 3.40, CPU time, medians of seven
/// rounds of 200), the sum first 0.26 us (0.68 against 0.94). `length` of a
/// blob reads its size from the record's header, not the blob.
#[cfg_attr(not(feature = "sqlite"), allow(dead_code))]
pub(crate) const PICK_STANDARD: &str = first_pending!(
    "id",
    concat!(
        "(SELECT CASE WHEN sum(size) < $4 THEN $2 ELSE (\
            SELECT count(*) FROM (SELECT sum(size) OVER taken - size AS before, row_number() OVER taken AS place \
                FROM (",
        first_pending!("priority, seq, length(payload) AS size", "$2"),
        ") WINDOW taken AS (ORDER BY priority DESC, seq ROWS UNBOUNDED PRECEDING)) \
            WHERE before < $4 OR place <= $5) END \
        FROM (",
        first_pending!("length(payload) AS size", "$2"),
        "))"
    )
);

/// FIFO: the heads of groups with nothing leased, by priority, then enqueue
/// order (`$1` queue, `$2` how many; `$3` is the lease's; `$4` and `$5`
/// bound the first two ways below, [`FifoSearch`]). The head of a group is
/// its earliest waiting (pending or sleeping) row; a sleeping head holds the
/// group back. Every message of a FIFO queue has a group (the transport
/// refuses one without), so rows without one are never picked.
///
/// Reading every waiting row to find the heads (a sort of the whole
/// backlog) took 45-60 ms per lease on PostgreSQL and 40-90 ms on SQLite
/// with 25,000 waiting, whether in 10 groups or in 25,000, so a FIFO queue
/// with a backlog drained at a few hundred messages a second. The statement
/// now tries two ways that read little, each of which is exact when it
/// answers, and reads everything only when neither does (`tier`):
/// 1. the walk: the first `$4` pending rows in lease order (the ready
///    index); of each group's rows among them the earliest, kept if no
///    earlier row of its group waits or is leased (one probe of the groups
///    index) and its group is not locked. Exact when it finds `$2`: a row it
///    did not reach comes later in lease order. This is the answer when most
///    waiting rows are heads (a group per customer). Probing only each
///    group's earliest row keeps a walk over a few long groups to a probe
///    per group: probing every row, a FIFO worker's lease of 300 over 10
///    groups walked 1,264 rows for 8.4 ms, which bounded the drain.
/// 2. the groups: each group with waiting or leased rows, found by a skip
///    scan of the groups index (one probe per group, at most `$5` groups),
///    and its first row. Exact when the scan reached the last group. This is
///    the answer for a few long groups, where the walk finds their heads but
///    not `$2` of them.
/// 3. otherwise, every waiting row (more than `$5` groups, and the first `$4`
///    rows mostly behind locked or sleeping heads).
///
/// With 25,000 waiting: 1.3-3 ms (PostgreSQL) and 1-2 ms (SQLite) per lease
/// of 32, in 10 groups or in 25,000. SQLite evaluates a scalar subquery in a
/// WHERE clause row by row, so the third way's scan joins `tier` first
/// (`CROSS JOIN` keeps that order) and does not start unless it is chosen.
pub(crate) const PICK_FIFO: &str = "WITH RECURSIVE \
    locked AS MATERIALIZED ( \
        SELECT DISTINCT group_id FROM messaging_messages \
        WHERE queue = $1 AND status IN ('processing', 'awaiting_release') AND group_id IS NOT NULL), \
    walk AS MATERIALIZED ( \
        SELECT w.id, w.priority, w.seq FROM ( \
            SELECT id, group_id, priority, seq, row_number() OVER (PARTITION BY group_id ORDER BY seq) AS place \
            FROM (SELECT id, group_id, priority, seq FROM messaging_messages WHERE queue = $1 \
                AND status = 'pending' ORDER BY priority DESC, seq LIMIT $4) window_rows) w \
        WHERE w.place = 1 AND w.group_id NOT IN (SELECT group_id FROM locked) \
            AND (SELECT 1 FROM messaging_messages e WHERE e.queue = $1 AND e.group_id = w.group_id \
                AND e.seq < w.seq AND e.group_id IS NOT NULL \
                AND e.status IN ('pending', 'sleeping', 'processing', 'awaiting_release') LIMIT 1) IS NULL \
        ORDER BY w.priority DESC, w.seq LIMIT $2), \
    groups (group_id, n) AS MATERIALIZED ( \
        SELECT (SELECT group_id FROM messaging_messages WHERE queue = $1 AND group_id IS NOT NULL \
            AND status IN ('pending', 'sleeping', 'processing', 'awaiting_release') ORDER BY group_id LIMIT 1), 1 \
        UNION ALL \
        SELECT (SELECT m.group_id FROM messaging_messages m WHERE m.queue = $1 AND m.group_id > g.group_id \
            AND m.group_id IS NOT NULL AND m.status IN ('pending', 'sleeping', 'processing', 'awaiting_release') \
            ORDER BY m.group_id LIMIT 1), g.n + 1 \
        FROM groups g WHERE g.group_id IS NOT NULL AND g.n <= $5), \
    tier AS MATERIALIZED ( \
        SELECT CASE WHEN (SELECT count(*) FROM walk) >= $2 THEN 1 \
            WHEN EXISTS (SELECT 1 FROM groups WHERE group_id IS NULL) THEN 2 ELSE 3 END AS way), \
    heads AS MATERIALIZED ( \
        SELECT (SELECT m.id FROM messaging_messages m WHERE m.queue = $1 AND m.group_id = g.group_id \
                AND m.group_id IS NOT NULL AND m.status IN ('pending', 'sleeping', 'processing', 'awaiting_release') \
                ORDER BY m.seq LIMIT 1) AS id \
        FROM groups g WHERE (SELECT way FROM tier) = 2 AND g.group_id NOT IN (SELECT group_id FROM locked)) \
    SELECT id FROM ( \
    SELECT id, priority, seq FROM walk WHERE (SELECT way FROM tier) = 1 \
    UNION ALL \
    SELECT id, (SELECT priority FROM messaging_messages p WHERE p.id = heads.id), \
            (SELECT seq FROM messaging_messages s WHERE s.id = heads.id) FROM heads \
        WHERE (SELECT status FROM messaging_messages h WHERE h.id = heads.id) = 'pending' \
    UNION ALL \
    SELECT id, priority, seq FROM ( \
            SELECT id, group_id, status, seq, priority, \
                row_number() OVER (PARTITION BY group_id ORDER BY seq) AS place \
            FROM tier CROSS JOIN messaging_messages WHERE tier.way = 3 AND (SELECT way FROM tier) = 3 \
                AND queue = $1 AND group_id IS NOT NULL AND status IN ('pending', 'sleeping')) first_rows \
        WHERE place = 1 AND status = 'pending' AND group_id NOT IN (SELECT group_id FROM locked) \
    ) picked ORDER BY priority DESC, seq LIMIT $2";

/// How far [`PICK_FIFO`] looks before it reads every waiting row.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct FifoSearch {
    /// Pending rows the walk reads (`$4`).
    pub(crate) walk: i64,
    /// Groups the skip scan enumerates (`$5`).
    pub(crate) groups: i64,
}

impl FifoSearch {
    /// For a lease of `n`: a walk of four times as many rows and 64 more
    /// (room for rows behind locked heads), and up to 512 groups (a probe
    /// each, about 10 us on PostgreSQL: 5 ms at most, a tenth of reading a
    /// backlog of 25,000).
    pub(crate) fn for_lease(n: usize) -> FifoSearch {
        let n = i64::try_from(n).unwrap_or(i64::MAX / 8);
        FifoSearch { walk: n.saturating_mul(4).saturating_add(64), groups: 512 }
    }
}

// Idempotency claims.

/// Inserts an unclaimed row or takes the existing one over when it is not
/// completed and free (no holder, expired lease) or held by the same
/// processor. Returns a row only when this caller got the claim.
pub(crate) const CLAIM: &str = "INSERT INTO messaging_idempotency \
    (message_id, scope, processor_id, lease_expires_at, completed) VALUES ($1, $2, $3, $4, FALSE) \
    ON CONFLICT (message_id, scope) DO UPDATE \
    SET processor_id = excluded.processor_id, lease_expires_at = excluded.lease_expires_at \
    WHERE messaging_idempotency.completed = FALSE \
      AND (messaging_idempotency.processor_id IS NULL \
           OR messaging_idempotency.lease_expires_at IS NULL \
           OR messaging_idempotency.lease_expires_at <= $5 \
           OR messaging_idempotency.processor_id = excluded.processor_id) \
    RETURNING processor_id";
pub(crate) const CLAIM_READ: &str = "SELECT completed, processor_id, lease_expires_at FROM messaging_idempotency \
    WHERE message_id = $1 AND scope = $2";
pub(crate) const CLAIM_COMPLETE: &str = "UPDATE messaging_idempotency \
    SET completed = TRUE, completed_at = $4, lease_expires_at = NULL \
    WHERE message_id = $1 AND scope = $2 AND processor_id = $3 AND completed = FALSE";
pub(crate) const CLAIM_RELEASE: &str = "UPDATE messaging_idempotency SET processor_id = NULL, lease_expires_at = NULL \
    WHERE message_id = $1 AND scope = $2 AND processor_id = $3 AND completed = FALSE";
pub(crate) const CLAIM_EXTEND: &str = "UPDATE messaging_idempotency SET lease_expires_at = $4 \
    WHERE message_id = $1 AND scope = $2 AND processor_id = $3 AND completed = FALSE";
pub(crate) const CLAIMS_PURGE: &str = "DELETE FROM messaging_idempotency WHERE completed = TRUE AND completed_at < $1";
/// Whether [`CLAIMS_PURGE`] has anything to delete (a read: no write lock).
pub(crate) const CLAIMS_PURGE_DUE: &str =
    "SELECT EXISTS (SELECT 1 FROM messaging_idempotency WHERE completed = TRUE AND completed_at < $1)";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tables_are_qualified_only_with_a_schema() {
        let plain = Tables::default();
        assert!(matches!(plain.sql(&[DEPTH]), Cow::Borrowed(_)));
        let app = Tables::in_schema(Some("app"));
        let sql = app.sql(&[BY_ID, " FOR UPDATE"]);
        assert!(sql.contains("FROM app.messaging_messages WHERE"), "{sql}");
        assert!(sql.ends_with(" FOR UPDATE"));
        assert!(app.sql(&[CLAIM]).contains("WHERE app.messaging_idempotency.completed"));
    }

    #[test]
    fn stored_rows_are_written_column_by_column() {
        let two = store_rows(2, StoreForm::Values, true);
        assert!(two.starts_with("UPDATE messaging_messages AS m SET identity = t.column2, group_id = t.column3"));
        assert!(two.contains("errors = t.column25, suspect = t.column26 FROM (VALUES ($1, $2,"), "{two}");
        assert!(two.contains("$26), ($27, "), "{two}");
        assert!(two.ends_with("$52)) AS t WHERE m.id = t.column1"), "{two}");
        let one = store_rows(1, StoreForm::Values, true);
        assert!(one.starts_with("UPDATE messaging_messages SET identity = $2, group_id = $3"), "{one}");
        assert!(one.ends_with("errors = $25, suspect = $26 WHERE id = $1"), "{one}");
        assert_eq!(one, store_rows(1, StoreForm::Joined, true));
        let joined = store_rows(2, StoreForm::Joined, true);
        assert!(
            joined.contains("suspect = $26 WHERE id = $1; UPDATE messaging_messages SET identity = $28,"),
            "{joined}"
        );
        assert!(joined.ends_with("suspect = $52 WHERE id = $27"), "{joined}");
    }

    #[test]
    fn stored_rows_without_their_bodies_leave_both_out() {
        let two = store_rows(2, StoreForm::Values, false);
        assert!(!two.contains("payload ="), "{two}");
        assert!(two.starts_with(
            "UPDATE messaging_messages AS m SET identity = t.column2, group_id = t.column3, \
            message_id = t.column4, attributes = t.column5"
        ));
        assert!(two.contains("deferred_message_id = t.column13, deferred_attributes = t.column14"), "{two}");
        assert!(two.contains("suspect = t.column24 FROM (VALUES ($1, $2,"), "{two}");
        assert!(two.ends_with("$48)) AS t WHERE m.id = t.column1"), "{two}");
        let joined = store_rows(2, StoreForm::Joined, false);
        assert!(!joined.contains("payload ="), "{joined}");
        assert!(
            joined.contains("suspect = $24 WHERE id = $1; UPDATE messaging_messages SET identity = $26,"),
            "{joined}"
        );
        let read = columns_without_bodies!()
            .replace("substr(payload, 1, 0) AS ", "")
            .replace("substr(deferred_payload, 1, 0) AS ", "");
        assert_eq!(read, columns!(), "the same columns, in the same order");
    }

    #[test]
    fn rows_are_stored_in_chunks_of_powers_of_two() {
        let chunks = |n, max| power_of_two_chunks(n, max).collect::<Vec<_>>();
        assert_eq!(chunks(0, 512), Vec::<usize>::new());
        assert_eq!(chunks(1, 512), [1]);
        assert_eq!(chunks(1000, 512), [512, 256, 128, 64, 32, 8]);
        assert_eq!(chunks(1200, 512), [512, 512, 128, 32, 16]);
        assert_eq!(chunks(7, 1), [1; 7]);
    }
}
