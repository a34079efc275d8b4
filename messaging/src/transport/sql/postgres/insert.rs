//! The multi-row insert of an enqueue: one statement for any number of rows,
//! which also tells other processes (`NOTIFY`) when it commits.
//!
//! Each column is bound either as one value for every row, when the rows
//! agree (a batch of one `send_batch` usually shares its identity, group,
//! attributes, priority, delay and status), or as an array unnested beside
//! the others. Measured on 1,000 rows into the framework's table, six forms
//! interleaved, medians of 50 per run, six runs: nine arrays, RETURNING one
//! row per message and a `pg_notify` statement after it took 12.6 ms; two
//! arrays with the notification in the statement 10.9 ms; the ids returned
//! as two arrays in one row 10.8 ms; the same insert without RETURNING
//! 10.5 ms. A plain insert of the same columns with constants
//! (`bench_shape` of the SQL benchmark) took 9.1 ms: the rest is
//! `nextval` for each row's sequence (0.6 ms: the enqueue order, assigned in
//! input order) and the RETURNING, which tells an identity run which rows
//! met an identity inserted meanwhile.

use sqlx::postgres::{PgArguments, PgConnection, PgHasArrayType};
use sqlx::query::QueryAs;
use sqlx::{Encode, Postgres, Type};

use super::CHANNEL;
use crate::error::TransportError;
use crate::transport::sql::dialect::{fail, in_input_order};
use crate::transport::sql::machine::{Row, RowId};
use crate::transport::sql::statements::Tables;

/// The ids and sequence values inserted (NULL: none).
type Insert<'q> = QueryAs<'q, Postgres, (Option<Vec<i64>>, Option<Vec<i64>>), PgArguments>;

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

/// Whether two texts are equal, the empty ones by their length alone.
///
/// An empty `String` points at no memory, and glibc's AVX-512 `memcmp`
/// loads through the pointer even for a length of zero (a masked load, whose
/// fault the processor suppresses in microcode): 150 ns per compare against
/// 2 ns for a short text. A batch of plain messages, whose attributes texts
/// are all empty, spent a tenth of its publish CPU in those compares.
fn text_eq(a: &str, b: &str) -> bool {
    a.len() == b.len() && (a.is_empty() || a == b)
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

/// Binds a column as [`Columns::column`] declared it.
fn bind<'q, T>(query: Insert<'q>, same: bool, values: Vec<T>) -> Insert<'q>
where
    T: 'q + Send + Encode<'q, Postgres> + Type<Postgres> + PgHasArrayType,
{
    if same {
        query.bind(values.into_iter().next())
    } else {
        query.bind(values)
    }
}

/// Inserts `rows` (not empty) of `queue` in one statement, in order, and
/// notifies other processes of `queue` when it commits: with the sequence
/// assigned here in order when `assign`, else with each row's own, skipping
/// a row whose identity exists already (`None`).
pub(super) async fn insert(
    conn: &mut PgConnection,
    tables: &Tables,
    queue: &str,
    now: i64,
    rows: &[Row],
    assign: bool,
) -> Result<Vec<Option<RowId>>, TransportError> {
    let identity: Vec<Option<&str>> = rows.iter().map(|r| r.identity.as_deref()).collect();
    let group: Vec<Option<&str>> = rows.iter().map(|r| r.group.as_deref()).collect();
    let message_id: Vec<&str> = rows.iter().map(|r| r.message_id.as_str()).collect();
    let payload: Vec<&[u8]> = rows.iter().map(|r| r.payload.as_slice()).collect();
    let attributes: Vec<&str> = rows.iter().map(|r| r.attributes.as_str()).collect();
    let priority: Vec<i32> = rows.iter().map(|r| r.priority).collect();
    let process_at: Vec<Option<i64>> = rows.iter().map(|r| r.process_at).collect();
    let status: Vec<&str> = rows.iter().map(|r| r.status.as_str()).collect();
    let seq: Vec<i64> = rows.iter().map(|r| r.seq as i64).collect();
    let uniform = [
        same_optional_text(&identity),
        same_optional_text(&group),
        same_text(&attributes),
        same(&priority),
        same(&process_at),
        same_text(&status),
    ];

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
    if assign {
        // Volatile functions run after ORDER BY (PostgreSQL 9.6+): the
        // assigned sequence follows the input order.
        columns.computed("nextval('messaging_seq')");
    } else {
        columns.column("q", "bigint", false);
    }
    let channel = columns.next;
    let (arrays, aliases): (Vec<String>, Vec<&str>) = columns.arrays.into_iter().unzip();
    // Rows are matched back by their (unique) sequence value: RETURNING has
    // no order; it comes back as two arrays in one row, not a row each. The
    // notification is one per statement, sent at commit (a statement of its
    // own cost a round trip and a commit per batch); no row inserted, no
    // notification.
    let sql = format!(
        "WITH inserted AS (INSERT INTO messaging_messages (queue, identity, group_id, message_id, payload, \
         attributes, priority, process_at, status, attempts, seq, sent_at) \
         SELECT $1, {select}, $2 FROM UNNEST({arrays}) WITH ORDINALITY AS t({aliases}, ord) ORDER BY ord {conflict}\
         RETURNING id, seq), \
         woken AS (SELECT pg_notify(${channel}, $1)) \
         SELECT array_agg(inserted.id), array_agg(inserted.seq) FROM inserted, woken",
        select = columns.select.join(", "),
        arrays = arrays.join(", "),
        aliases = aliases.join(", "),
        conflict = if assign { "" } else { "ON CONFLICT (queue, identity) WHERE identity IS NOT NULL DO NOTHING " },
    );
    let sql = tables.sql(&[&sql]);
    let mut query: Insert<'_> = sqlx::query_as(&sql).bind(queue).bind(now);
    query = bind(query, uniform[0], identity);
    query = bind(query, uniform[1], group);
    query = bind(query, false, message_id);
    query = bind(query, false, payload);
    query = bind(query, uniform[2], attributes);
    query = bind(query, uniform[3], priority);
    query = bind(query, uniform[4], process_at);
    query = bind(query, uniform[5], status);
    if !assign {
        query = bind(query, false, seq);
    }
    let (ids, seqs) = query.bind(CHANNEL).fetch_one(&mut *conn).await.map_err(fail::<sqlx::Postgres>("enqueue"))?;
    let inserted = ids.unwrap_or_default().into_iter().zip(seqs.unwrap_or_default()).collect();
    Ok(in_input_order(rows, inserted, assign))
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
