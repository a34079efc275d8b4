//! The multi-row inserts of an enqueue: one statement for any number of
//! rows, which also tells other processes (`NOTIFY`) when it commits.
//!
//! Each column is bound either as one value for every row, when the rows
//! agree (a batch of one `send_batch` usually shares its identity, group,
//! attributes, priority, delay and status), or as an array unnested beside
//! the others. Measured on 1,000 rows into the framework's table, six forms
//! interleaved, medians of 50 per run, six runs: nine arrays, RETURNING one
//! row per message and a `pg_notify` statement after it took 12.6 ms; two
//! arrays with the notification in the statement 10.9 ms.
//!
//! Messages without identity are appended: nothing comes back, and the
//! rows are numbered in input order from one draw of the sequence per
//! block of rows (see [`statement`]). Against an insert of
//! the same columns with constants (`bench_shape` of the SQL benchmark), in
//! `pgbench` with the forms interleaved, medians of 200 per form, three
//! runs: returning the ids and sequence values as two arrays 1.16-1.23 of
//! its time, any RETURNING at all (one aggregate of the ids) 1.10-1.13, an
//! `ORDER BY` of the ordinality without RETURNING 1.02-1.06, neither
//! 0.95-0.97. Rows with an identity are inserted with their own sequence
//! values and return (id, seq), which tells the enqueue which met an
//! identity inserted meanwhile.

use sqlx::error::BoxDynError;
use sqlx::postgres::{PgArguments, PgConnection, PgHasArrayType};
use sqlx::query::QueryAs;
use sqlx::{Arguments as _, Encode, Postgres, Type};

use super::{CHANNEL, SEQ_BLOCK};
use crate::error::TransportError;
use crate::transport::sql::dialect::{fail, in_input_order, text_eq};
use crate::transport::sql::machine::{Enqueue, Row, RowId, Written};
use crate::transport::sql::statements::Tables;

/// A query of the insert, returning `O`.
type Insert<'q, O> = QueryAs<'q, Postgres, O, PgArguments>;

/// What an insert of identity rows returns: the ids and sequence values of
/// the rows inserted, as two arrays (NULL: none).
type Returned = (Option<Vec<i64>>, Option<Vec<i64>>);

/// The statement's columns after `queue` (`$1`) and `sent_at` (`$2`),
/// in the order they are bound from `$3` on.
struct Columns {
    /// The select list, one expression per column.
    select: Vec<String>,
    /// The arrays unnested, with their aliases.
    arrays: Vec<(String, &'static str)>,
    next: usize,
}

impl Columns {
    fn new() -> Self {
        Columns { select: Vec::new(), arrays: Vec::new(), next: 3 }
    }

    /// A column of SQL type `ty`: one parameter when `same`, else an array
    /// unnested as `alias`.
    fn column(&mut self, alias: &'static str, ty: &str, same: bool) {
        let n = self.next;
        self.next += 1;
        if same {
            self.select.push(format!("${n}::{ty}"));
        } else {
            self.select.push(alias.to_owned());
            self.arrays.push((format!("${n}::{ty}[]"), alias));
        }
    }

    /// A column whose value the statement computes.
    fn computed(&mut self, expression: &str) {
        self.select.push(expression.to_owned());
    }
}

/// Whether every value is the first.
fn same<T: PartialEq>(values: &[T]) -> bool {
    same_by(values, T::eq)
}

/// Whether every value is the first, by `eq`.
fn same_by<T>(values: &[T], eq: impl Fn(&T, &T) -> bool) -> bool {
    values.windows(2).all(|w| eq(&w[0], &w[1]))
}

/// [`same`] for texts.
fn same_text(values: &[&str]) -> bool {
    same_by(values, |a, b| text_eq(a, b))
}

/// [`same`] for optional texts.
fn same_optional_text(values: &[Option<&str>]) -> bool {
    same_by(values, |a, b| match (a, b) {
        (Some(a), Some(b)) => text_eq(a, b),
        (a, b) => a.is_none() && b.is_none(),
    })
}

/// Adds a column to `args` as [`Columns::column`] declared it.
fn add<'q, T>(args: &mut PgArguments, same: bool, values: Vec<T>) -> Result<(), BoxDynError>
where
    T: 'q + Send + Encode<'q, Postgres> + Type<Postgres> + PgHasArrayType,
{
    if same {
        args.add(values.into_iter().next())
    } else {
        args.add(values)
    }
}

/// What a statement of [`statement`] does with its rows.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Form {
    /// Rows without identity: numbered in input order from the sequence's
    /// draws, nothing returned.
    Append,
    /// Rows with an identity and their own sequence values: a row whose
    /// identity exists is skipped; (id, seq) of the others come back.
    Insert,
}

/// The rows of a statement, column by column, and which columns they agree
/// on ([`Columns`]' order: identity, group, attributes, priority,
/// process-at, status), each column collected once for both.
struct Values<'a> {
    identity: Vec<Option<&'a str>>,
    group: Vec<Option<&'a str>>,
    message_id: Vec<&'a str>,
    payload: Vec<&'a [u8]>,
    attributes: Vec<&'a str>,
    priority: Vec<i32>,
    process_at: Vec<Option<i64>>,
    status: Vec<&'a str>,
    uniform: [bool; 6],
}

impl<'a> Values<'a> {
    /// The columns of `rows`, in one pass.
    fn of(rows: impl ExactSizeIterator<Item = Written<'a>>) -> Self {
        let n = rows.len();
        let mut values = Values {
            identity: Vec::with_capacity(n),
            group: Vec::with_capacity(n),
            message_id: Vec::with_capacity(n),
            payload: Vec::with_capacity(n),
            attributes: Vec::with_capacity(n),
            priority: Vec::with_capacity(n),
            process_at: Vec::with_capacity(n),
            status: Vec::with_capacity(n),
            uniform: [true; 6],
        };
        for row in rows {
            values.identity.push(row.identity);
            values.group.push(row.group);
            values.message_id.push(row.message_id);
            values.payload.push(row.payload);
            values.attributes.push(row.attributes);
            values.priority.push(row.priority);
            values.process_at.push(row.process_at);
            values.status.push(row.status.as_str());
        }
        values.uniform = [
            same_optional_text(&values.identity),
            same_optional_text(&values.group),
            same_text(&values.attributes),
            same(&values.priority),
            same(&values.process_at),
            same_text(&values.status),
        ];
        values
    }

    /// About the bytes the binary encoding of these values takes: four for
    /// each element's length, the data, an array's header, the other
    /// columns at their widest when every row has its own.
    fn size(&self) -> usize {
        let texts = |values: &[&str]| values.iter().map(|v| 4 + v.len()).sum::<usize>();
        let bytes: usize = self.payload.iter().map(|p| 4 + p.len()).sum();
        let others =
            if self.uniform.iter().all(|u| *u) { 0 } else { 48 * self.message_id.len() + texts(&self.attributes) };
        256 + texts(&self.message_id) + bytes + others
    }
}

/// The insert of `values` (not empty) in the `form` ([`arguments`] are its
/// parameters); it notifies other processes of queue `$1` when it commits.
fn statement(tables: &Tables, values: &Values<'_>, form: Form) -> String {
    let uniform = values.uniform;
    let mut columns = Columns::new();
    columns.column("i", "text", uniform[0]);
    columns.column("g", "text", uniform[1]);
    columns.column("m", "text", false);
    columns.column("p", "bytea", false);
    columns.column("a", "text", uniform[2]);
    columns.column("pr", "int", uniform[3]);
    columns.column("pa", "bigint", uniform[4]);
    columns.column("s", "text", uniform[5]);
    columns.computed("0");
    // Each row's id is its sequence value, written to both columns. An
    // append draws `messaging_seq` once per block of rows (`SEQ_BLOCK`, the
    // sequence's increment) and numbers the rows from the value drawn by
    // their ordinality: the input order whatever the plan. Drawn per row, it
    // took 1.05-1.07 of the time (pgbench, appends of 1,000 rows into the
    // framework's table, the forms interleaved, six runs), and the order
    // rested on the plan reading the unnest straight into the insert. The
    // draw is a materialized CTE, read as often as the plan likes and drawn
    // once.
    let count = values.message_id.len();
    // Each row's id expression, and the CTE that draws what it reads.
    let (numbered, drawing) = match form {
        Form::Append if count as i64 <= SEQ_BLOCK => {
            ("b + n - 1".to_owned(), "drawn AS MATERIALIZED (SELECT nextval('messaging_seq') AS b), ".to_owned())
        }
        Form::Append => (
            format!("b[(n - 1) / {SEQ_BLOCK} + 1] + (n - 1) % {SEQ_BLOCK}"),
            format!(
                "drawn AS MATERIALIZED (SELECT array_agg(nextval('messaging_seq') ORDER BY k) AS b \
                 FROM generate_series(1, {}) AS k), ",
                count.div_ceil(SEQ_BLOCK as usize)
            ),
        ),
        Form::Insert => ("q".to_owned(), String::new()),
    };
    // The `seq` column: the same value as the id.
    match form {
        Form::Append => columns.computed(&numbered),
        Form::Insert => columns.column("q", "bigint", false),
    }
    let channel = columns.next;
    let (arrays, aliases): (Vec<String>, Vec<&str>) = columns.arrays.into_iter().unzip();
    let (arrays, aliases) = (arrays.join(", "), aliases.join(", "));
    let rows = match form {
        Form::Append => format!("drawn, UNNEST({arrays}) WITH ORDINALITY AS t({aliases}, n)"),
        Form::Insert => format!("UNNEST({arrays}) AS t({aliases})"),
    };
    let insert = format!(
        "INSERT INTO messaging_messages (id, queue, identity, group_id, message_id, payload, attributes, priority, \
         process_at, status, attempts, seq, sent_at) SELECT {numbered}, $1, {select}, $2 FROM {rows}",
        select = columns.select.join(", "),
    );
    // The notification is one per statement, sent at commit (a statement of
    // its own cost a round trip and a commit per batch). An insert's rows
    // are matched back by their (unique) sequence values: RETURNING has no
    // order; they come back as two arrays in one row, not a row each; no
    // row inserted, no notification.
    let sql = match form {
        Form::Append => {
            format!(
                "WITH {drawing}appended AS ({insert}), woken AS (SELECT pg_notify(${channel}, $1)) SELECT 1 FROM woken"
            )
        }
        Form::Insert => format!(
            "WITH inserted AS ({insert} ON CONFLICT (queue, identity) WHERE identity IS NOT NULL DO NOTHING \
             RETURNING id, seq), woken AS (SELECT pg_notify(${channel}, $1)) \
             SELECT array_agg(inserted.id), array_agg(inserted.seq) FROM inserted, woken"
        ),
    };
    tables.sql(&[&sql]).into_owned()
}

/// The parameters of [`statement`]'s insert of `values` into `queue`: with
/// each row's sequence value (`seqs`) for [`Form::Insert`]. Their buffer is
/// sized for the rows up front: grown as the arrays were written, it was
/// copied eight times over for 1,000 rows (a `realloc` per doubling, 110
/// instructions a message in callgrind of the benchmark's publish).
fn arguments(queue: &str, now: i64, values: Values<'_>, seqs: Option<Vec<i64>>) -> Result<PgArguments, BoxDynError> {
    let uniform = values.uniform;
    let mut args = PgArguments::default();
    args.reserve(11, values.size());
    args.add(queue)?;
    args.add(now)?;
    add(&mut args, uniform[0], values.identity)?;
    add(&mut args, uniform[1], values.group)?;
    add(&mut args, false, values.message_id)?;
    add(&mut args, false, values.payload)?;
    add(&mut args, uniform[2], values.attributes)?;
    add(&mut args, uniform[3], values.priority)?;
    add(&mut args, uniform[4], values.process_at)?;
    add(&mut args, uniform[5], values.status)?;
    if let Some(seqs) = seqs {
        add(&mut args, false, seqs)?;
    }
    args.add(CHANNEL)?;
    Ok(args)
}

/// The error of parameters that could not be encoded.
fn unencodable(e: BoxDynError) -> TransportError {
    fail::<Postgres>("enqueue")(sqlx::Error::Encode(e))
}

/// Appends `items` (not empty, no identity) to `queue` in one statement, the
/// enqueue order drawn in input order; other processes are told of `queue`
/// when it commits.
/// The error is sqlx's, so that a caller can tell a lost connection.
pub(super) async fn append(
    conn: &mut PgConnection,
    tables: &Tables,
    queue: &str,
    now: i64,
    items: &[Enqueue],
) -> Result<(), sqlx::Error> {
    let values = Values::of(items.iter().map(|e| e.written(now)));
    let sql = statement(tables, &values, Form::Append);
    let query: Insert<'_, (i32,)> =
        sqlx::query_as_with(&sql, arguments(queue, now, values, None).map_err(sqlx::Error::Encode)?);
    query.fetch_one(&mut *conn).await?;
    Ok(())
}

/// Inserts `rows` (not empty) of `queue`, each with its identity and its own
/// sequence value, in one statement: a row whose identity exists already is
/// skipped (`None`); the others' ids, in input order. Other processes are
/// told of `queue` when it commits, if a row was inserted.
pub(super) async fn insert(
    conn: &mut PgConnection,
    tables: &Tables,
    queue: &str,
    now: i64,
    rows: &[Row],
) -> Result<Vec<Option<RowId>>, TransportError> {
    let values = Values::of(rows.iter().map(Row::written));
    let sql = statement(tables, &values, Form::Insert);
    let seqs = rows.iter().map(|r| r.seq as i64).collect();
    let args = arguments(queue, now, values, Some(seqs)).map_err(unencodable)?;
    let query: Insert<'_, Returned> = sqlx::query_as_with(&sql, args);
    let (ids, seqs) = query.fetch_one(&mut *conn).await.map_err(fail::<sqlx::Postgres>("enqueue"))?;
    let inserted = ids.unwrap_or_default().into_iter().zip(seqs.unwrap_or_default()).collect();
    Ok(in_input_order(rows, inserted))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_column_is_one_value_only_when_every_row_agrees() {
        assert!(same::<i32>(&[]));
        assert!(same(&[1, 1]) && !same(&[1, 2]));
        assert!(same_optional_text(&[Some("a"), Some("a")]));
        assert!(same_optional_text(&[None, None]));
        assert!(!same_optional_text(&[Some("a"), None]));
        assert!(!same_optional_text(&[None, Some("")]));
        assert!(!same_optional_text(&[Some("a"), Some("b")]));
        assert!(same_text(&["", ""]) && same_text(&["ab", "ab"]));
        assert!(!same_text(&["", "a"]) && !same_text(&["ab", "ac"]));
        let mut columns = Columns::new();
        columns.column("i", "text", true);
        columns.column("m", "text", false);
        columns.computed("0");
        assert_eq!(columns.select, ["$3::text", "m", "0"]);
        assert_eq!(columns.arrays, [("$4::text[]".to_owned(), "m")]);
        assert_eq!(columns.next, 5);
    }
}
