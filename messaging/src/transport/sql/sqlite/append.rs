//! The text and arguments of an enqueue of plain messages (no identity):
//! one `INSERT … SELECT … FROM (VALUES …)` per chunk of rows, after the
//! counter has moved by the whole batch.
//!
//! A column every row of a chunk agrees on (the group, the attributes, the
//! priority, the process-at time, the status: all of them for a batch of one
//! `send_batch` without delays) is bound once, in the select list; each row
//! binds only its payload and its place, and its message id unless the
//! chunk's ids are bound packed, as one blob (every id the framework makes).
//! Eight values a row were 8,000 arguments per 1,000 messages: sqlx copies
//! each borrowed one before handing them to the connection's thread, and
//! their 256 KB vector was fresh memory on every call (a profile of
//! `send_batch` of 1,000: a fifth of the caller's time in page faults, a
//! tenth in those copies).

use sqlx::sqlite::{SqliteArguments, SqliteRow};
use sqlx::{Arguments as _, Row as _};

use super::int;
use crate::error::TransportError;
use crate::transport::id::ID_LEN;
use crate::transport::sql::dialect::text_eq;
use crate::transport::sql::machine::Enqueue;

/// Rows per insert statement, and as many as `send_batch` gives at once
/// (`max_send_batch`): at most eight values each, under SQLite's 32,766
/// bound parameters.
pub(super) const INSERT_ROWS: usize = 1_000;

/// Which of the columns a chunk's rows may agree on (in the insert's order:
/// group, attributes, priority, process-at time, status) every row of
/// `chunk` agrees on.
fn agreed(chunk: &[Enqueue], now: i64) -> [bool; 5] {
    let Some(first) = chunk.first() else { return [true; 5] };
    let status = first.landing(now);
    let mut agreed = [true; 5];
    for e in &chunk[1..] {
        agreed[0] &= e.group == first.group;
        agreed[1] &= text_eq(&e.attributes, &first.attributes);
        agreed[2] &= e.priority == first.priority;
        agreed[3] &= e.process_at == first.process_at;
        agreed[4] &= e.landing(now) == status;
    }
    agreed
}

/// Whether every id of `chunk` has [`ID_LEN`] bytes (every id the framework
/// makes), so that the chunk's ids can be bound as one blob (see [`push_insert`]).
fn packable(chunk: &[Enqueue]) -> bool {
    chunk.iter().all(|e| e.message_id.len() == ID_LEN)
}

/// Appends the insert of one chunk to `text`: the queue, the shared values
/// that `agreed` says are one, the chunk's packed ids (when `packed`), the
/// batch's size less the rows of the chunks before and the time bound
/// first, then each row's message id (unless packed), payload, other values
/// and place in the chunk.
///
/// Packed, the ids are one blob of [`ID_LEN`] bytes a row, each row's cut
/// out by its place: a bound text costs SQLite a copy and an allocation of
/// its own (`sqlite3_bind_text64`, 516 instructions a row in callgrind of
/// the benchmark's publish), a cut of a bound blob into a register it
/// reuses row after row much less. Callgrind: about 800 instructions a
/// message fewer in all; the publish, six pairs in turn, 0.855 → 0.873 of
/// the shaped insert (medians; five pairs of six in favour).
fn push_insert(text: &mut String, rows: usize, agreed: [bool; 5], packed: bool) {
    if !text.is_empty() {
        text.push_str("; ");
    }
    text.push_str(
        "INSERT INTO messaging_messages (queue, identity, group_id, message_id, payload, attributes, \
         priority, process_at, status, attempts, seq, sent_at) SELECT ?, NULL, ",
    );
    // VALUES columns: the message id (unless packed), the payload, then the
    // shared columns the rows differ on, then the place.
    let mut column = 0;
    let mut next = || {
        column += 1;
        format!("column{column}")
    };
    let id = (!packed).then(&mut next);
    let payload = next();
    let mut select = |n: usize| if agreed[n] { "?".to_owned() } else { next() };
    let [group, attributes, priority, process_at, status] = [0, 1, 2, 3, 4].map(&mut select);
    let place = next();
    let values = column;
    let id = id.unwrap_or_else(|| format!("CAST(substr(?, {place} * {ID_LEN} - {}, {ID_LEN}) AS TEXT)", ID_LEN - 1));
    text.push_str(&format!(
        "{group}, {id}, {payload}, {attributes}, {priority}, {process_at}, {status}, 0, \
         (SELECT value FROM messaging_counters WHERE name = 'seq') - ? + {place}, ? FROM (VALUES "
    ));
    let mut tuple = String::with_capacity(3 * values);
    tuple.push('(');
    for v in 0..values {
        tuple.push_str(if v == 0 { "?" } else { ", ?" });
    }
    tuple.push(')');
    for i in 0..rows {
        if i > 0 {
            text.push_str(", ");
        }
        text.push_str(&tuple);
    }
    // Nothing without the counter (the enqueue's first statement says so).
    text.push_str(
        ") WHERE EXISTS (SELECT 1 FROM messaging_counters WHERE name = 'seq'); \
         SELECT changes() AS inserted",
    );
}

/// The shape of one insert statement: its rows, which of the columns that
/// [`agreed`] looks at they agree on, and whether its ids are bound packed
/// ([`packable`]). A statement's text is a function of its shape alone.
pub(super) type Shape = (usize, [bool; 5], bool);

/// The shapes of the inserts of `items` at `now`, one per chunk of
/// [`INSERT_ROWS`].
pub(super) fn shapes(items: &[Enqueue], now: i64) -> Vec<Shape> {
    items.chunks(INSERT_ROWS).map(|chunk| (chunk.len(), agreed(chunk, now), packable(chunk))).collect()
}

/// The text of the inserts of `shapes`, each followed by a `SELECT
/// changes() AS inserted` (see [`check_inserted`]). Their arguments come
/// from [`arguments`].
pub(super) fn text(shapes: &[Shape]) -> String {
    let rows: usize = shapes.iter().map(|(rows, ..)| rows).sum();
    let mut text = String::with_capacity(400 * shapes.len() + rows * 12);
    for &(rows, agreed, packed) in shapes {
        push_insert(&mut text, rows, agreed, packed);
    }
    text
}

/// The arguments of [`text`]`(shapes)` (the shapes of `items`), after
/// `lead` (the arguments of any statements before them): the enqueue of
/// `items` (taking their message ids and payloads) into `queue` at `now`,
/// once the counter has moved by their number in the same transaction.
pub(super) fn arguments<'q>(
    lead: &[i64],
    queue: &'q str,
    now: i64,
    items: &'q mut [Enqueue],
    shapes: &[Shape],
) -> Result<SqliteArguments<'q>, sqlx::error::BoxDynError> {
    let n = int(items.len());
    let mut args = SqliteArguments::default();
    args.reserve(lead.len() + 8 * shapes.len() + 3 * items.len(), 0);
    for &value in lead {
        args.add(value)?;
    }
    for (c, (chunk, &(_, agreed, packed))) in items.chunks_mut(INSERT_ROWS).zip(shapes).enumerate() {
        let Some(first) = chunk.first() else { continue };
        args.add(queue)?;
        let status = first.landing(now);
        if agreed[0] {
            args.add(first.group.clone())?;
        }
        if packed {
            let mut ids = Vec::with_capacity(ID_LEN * chunk.len());
            for item in chunk.iter() {
                ids.extend_from_slice(item.message_id.as_bytes());
            }
            args.add(ids)?;
        }
        if agreed[1] {
            args.add(first.attributes.clone())?;
        }
        if agreed[2] {
            args.add(first.priority)?;
        }
        if agreed[3] {
            args.add(first.process_at)?;
        }
        if agreed[4] {
            args.add(status.as_str())?;
        }
        // Each row's place is counted within its chunk.
        args.add(n - int(c * INSERT_ROWS))?;
        args.add(now)?;
        for (i, item) in chunk.iter_mut().enumerate() {
            if !packed {
                args.add(std::mem::take(&mut item.message_id))?;
            }
            args.add(std::mem::take(&mut item.payload))?;
            if !agreed[0] {
                args.add(item.group.as_deref())?;
            }
            if !agreed[1] {
                args.add(item.attributes.as_str())?;
            }
            if !agreed[2] {
                args.add(item.priority)?;
            }
            if !agreed[3] {
                args.add(item.process_at)?;
            }
            if !agreed[4] {
                args.add(item.landing(now).as_str())?;
            }
            args.add(int(i + 1))?;
        }
    }
    Ok(args)
}

/// Checks what [`text`]'s statements reported (`inserted`, in order) for
/// `items` rows: rows cannot conflict without an identity, so each insert
/// stores all its rows or the call fails.
pub(super) fn check_inserted(items: usize, found: &[SqliteRow]) -> Result<(), TransportError> {
    let inserted: Vec<i64> = found.iter().filter_map(|row| row.try_get::<i64, _>("inserted").ok()).collect();
    let expected = (0..items.div_ceil(INSERT_ROWS)).map(|c| int((items - c * INSERT_ROWS).min(INSERT_ROWS)));
    if inserted.len() != items.div_ceil(INSERT_ROWS) || !expected.clone().eq(inserted.iter().copied()) {
        return Err(TransportError::Backend(format!(
            "sqlite: inserts of {:?} messages reported {inserted:?} stored",
            expected.collect::<Vec<_>>()
        )));
    }
    Ok(())
}
