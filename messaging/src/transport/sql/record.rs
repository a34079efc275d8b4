//! A message row as stored, decoded the same way on every database.

use crate::error::TransportError;
use crate::transport::sql::machine::{Deferred, Row, RowId, Status, Suspect};

/// One row of `messaging_messages` (the columns of `statements::columns!`).
#[derive(Debug, sqlx::FromRow)]
pub(crate) struct Record {
    id: i64,
    identity: Option<String>,
    group_id: Option<String>,
    message_id: String,
    payload: Vec<u8>,
    attributes: String,
    priority: i32,
    process_at: Option<i64>,
    status: String,
    attempts: i32,
    seq: i64,
    lease_token: Option<i64>,
    lease_expires: Option<i64>,
    deferred_message_id: Option<String>,
    deferred_payload: Option<Vec<u8>>,
    deferred_attributes: Option<String>,
    deferred_priority: Option<i32>,
    deferred_process_at: Option<i64>,
    deferred_status: Option<String>,
    deferred_seq: Option<i64>,
    deferred_sent_at: Option<i64>,
    sent_at: i64,
    processed_at: Option<i64>,
    error: Option<String>,
    errors: String,
    suspect: i32,
}

/// A leased row (the columns of `statements::LEASED`), with what orders it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct LeasedRow {
    /// The row.
    pub id: RowId,
    /// The lease token every later call must present.
    pub token: u64,
    /// The version's id.
    pub message_id: String,
    /// The payload.
    pub payload: Vec<u8>,
    /// Attempts including this one.
    pub attempts: u32,
    /// FIFO group.
    pub group: Option<String>,
    /// Attributes as JSON text ('' for none).
    pub attributes: String,
    /// When this version was enqueued (ms).
    pub sent_at: i64,
    /// Where the leased version lies (PostgreSQL; none on SQLite, whose
    /// lease does not return it).
    pub tuple: Tuple,
    /// Whether a lease of the message ran out before (see [`Suspect`]).
    pub suspect: Suspect,
    priority: i32,
    seq: i64,
}

/// The columns of `statements::LEASED`, in its order: [`LeasedRow`] reads
/// them by place. (A test checks the two agree.)
pub(crate) const LEASED_COLUMNS: [&str; 11] = [
    "id",
    "lease_token",
    "message_id",
    "payload",
    "attempts",
    "group_id",
    "attributes",
    "sent_at",
    "priority",
    "seq",
    "suspect",
];

/// Reads the leased columns by place, then `tuple` after them where the
/// lease returns it. Read by name (sqlx's derive), each column was looked up
/// by hashing its name, and SQLite's missing `tuple` built an error to throw
/// away: 3,700 instructions a row (callgrind of the SQLite drain).
impl<'r, R: sqlx::Row> sqlx::FromRow<'r, R> for LeasedRow
where
    usize: sqlx::ColumnIndex<R>,
    i64: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    i32: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    String: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    Option<String>: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    Vec<u8>: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    Tuple: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
{
    fn from_row(row: &'r R) -> Result<Self, sqlx::Error> {
        // A negative id, token or attempt count, named by its column.
        let out_of_range = |index: usize| {
            move |e: std::num::TryFromIntError| sqlx::Error::ColumnDecode {
                index: LEASED_COLUMNS[index].into(),
                source: e.into(),
            }
        };
        Ok(LeasedRow {
            id: u64::try_from(row.try_get::<i64, _>(0)?).map_err(out_of_range(0))?,
            token: u64::try_from(row.try_get::<i64, _>(1)?).map_err(out_of_range(1))?,
            message_id: row.try_get(2)?,
            payload: row.try_get(3)?,
            attempts: u32::try_from(row.try_get::<i32, _>(4)?).map_err(out_of_range(4))?,
            group: row.try_get(5)?,
            attributes: row.try_get(6)?,
            sent_at: row.try_get(7)?,
            priority: row.try_get(8)?,
            seq: row.try_get(9)?,
            suspect: Suspect::of_code(row.try_get(10)?),
            tuple: if row.len() > LEASED_COLUMNS.len() { row.try_get(LEASED_COLUMNS.len())? } else { Tuple::default() },
        })
    }
}

/// A receipt as the store completes it: the row, the lease token, and where
/// the leased version lay.
pub(crate) type Held = (RowId, u64, Tuple);

/// Where a row version lies in PostgreSQL's heap (its `ctid`: block and
/// line), packed as `block << 16 | line`; 0 for none (no line is 0).
///
/// A lease returns it so that the completion can go to each row straight
/// instead of looking it up by key: 300 lookups by primary key were a
/// quarter of the server's time in a drain (`perf`, 8 lanes). It only
/// points the way: a version that moved since (an extended lease) is not
/// found there, and a line that a vacuum gave to another row does not hold
/// the receipt's (id, token); either way the completion falls back to the
/// key.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) struct Tuple(pub u64);

#[cfg(feature = "postgres")]
mod tid {
    //! `Tuple` as PostgreSQL's `tid` in the binary protocol: a 4-byte block
    //! number and a 2-byte line number, big-endian (sqlx has no `tid`).

    use sqlx::encode::IsNull;
    use sqlx::error::BoxDynError;
    use sqlx::postgres::types::Oid;
    use sqlx::postgres::{PgArgumentBuffer, PgHasArrayType, PgTypeInfo, PgValueFormat, PgValueRef};
    use sqlx::{Decode, Encode, Postgres, Type};

    use super::Tuple;

    impl Type<Postgres> for Tuple {
        fn type_info() -> PgTypeInfo {
            PgTypeInfo::with_oid(Oid(27))
        }
    }

    impl PgHasArrayType for Tuple {
        fn array_type_info() -> PgTypeInfo {
            PgTypeInfo::with_oid(Oid(1010))
        }
    }

    impl Encode<'_, Postgres> for Tuple {
        fn encode_by_ref(&self, buf: &mut PgArgumentBuffer) -> Result<IsNull, BoxDynError> {
            let block = u32::try_from(self.0 >> 16)?;
            buf.extend_from_slice(&block.to_be_bytes());
            buf.extend_from_slice(&((self.0 & 0xFFFF) as u16).to_be_bytes());
            Ok(IsNull::No)
        }
    }

    impl Decode<'_, Postgres> for Tuple {
        fn decode(value: PgValueRef<'_>) -> Result<Self, BoxDynError> {
            let (block, line) = match value.format() {
                PgValueFormat::Binary => match value.as_bytes()? {
                    &[b0, b1, b2, b3, l0, l1] => (u32::from_be_bytes([b0, b1, b2, b3]), u16::from_be_bytes([l0, l1])),
                    other => return Err(format!("a tid of {} bytes", other.len()).into()),
                },
                // "(block,line)"
                PgValueFormat::Text => {
                    let text = value.as_str()?;
                    let inner = text.trim_start_matches('(').trim_end_matches(')');
                    let (block, line) = inner.split_once(',').ok_or_else(|| format!("a tid `{text}`"))?;
                    (block.parse()?, line.parse()?)
                }
            };
            Ok(Tuple((u64::from(block) << 16) | u64::from(line)))
        }
    }
}

#[cfg(feature = "sqlite")]
mod rowid {
    //! SQLite's lease returns no tuple (rows are found by key there); these
    //! let `LeasedRow` decode from SQLite rows all the same.

    use sqlx::error::BoxDynError;
    use sqlx::sqlite::{SqliteTypeInfo, SqliteValueRef};
    use sqlx::{Decode, Sqlite, Type};

    use super::Tuple;

    impl Type<Sqlite> for Tuple {
        fn type_info() -> SqliteTypeInfo {
            <i64 as Type<Sqlite>>::type_info()
        }
    }

    impl Decode<'_, Sqlite> for Tuple {
        fn decode(value: SqliteValueRef<'_>) -> Result<Self, BoxDynError> {
            Ok(Tuple(u64::try_from(<i64 as Decode<Sqlite>>::decode(value)?)?))
        }
    }
}

impl LeasedRow {
    /// The receipt this lease gives, as the store completes it.
    #[cfg(all(test, feature = "sqlite"))]
    pub(crate) fn held(&self) -> Held {
        (self.id, self.token, self.tuple)
    }
}

/// Leased rows in the order they go out (a RETURNING clause comes in no
/// particular order): by priority then enqueue order (on a FIFO queue, one
/// head per group).
pub(crate) fn in_order(mut leased: Vec<LeasedRow>) -> Vec<LeasedRow> {
    leased.sort_by_key(|r| (std::cmp::Reverse(r.priority), r.seq));
    leased
}

fn status(text: &str) -> Result<Status, TransportError> {
    Status::parse(text)
        .ok_or_else(|| TransportError::Backend(format!("unknown status `{text}` in table `messaging_messages`")))
}

impl TryFrom<Record> for Row {
    type Error = TransportError;

    fn try_from(r: Record) -> Result<Row, TransportError> {
        let deferred = match r.deferred_payload {
            None => None,
            Some(payload) => Some(Deferred {
                message_id: r.deferred_message_id.unwrap_or_default(),
                payload,
                priority: r.deferred_priority.unwrap_or_default(),
                process_at: r.deferred_process_at,
                status_after_release: r.deferred_status.as_deref().map(status).transpose()?,
                seq: r.deferred_seq.unwrap_or_default() as u64,
                attributes: r.deferred_attributes.unwrap_or_default(),
                sent_at: r.deferred_sent_at.unwrap_or_default(),
            }),
        };
        Ok(Row {
            id: r.id as RowId,
            identity: r.identity,
            group: r.group_id,
            message_id: r.message_id,
            payload: r.payload,
            priority: r.priority,
            process_at: r.process_at,
            status: status(&r.status)?,
            attempts: r.attempts.max(0) as u32,
            seq: r.seq as u64,
            lease_token: r.lease_token.map(|t| t as u64),
            lease_expires: r.lease_expires,
            deferred,
            processed_at: r.processed_at,
            error: r.error,
            // A history that does not parse is shown empty rather than
            // stopping the message.
            history: serde_json::from_str(&r.errors).unwrap_or_default(),
            attributes: r.attributes,
            sent_at: r.sent_at,
            suspect: Suspect::of_code(r.suspect),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::LEASED_COLUMNS;
    use crate::transport::sql::statements as sql;

    /// `LeasedRow` reads the columns by place: the list it reads by must
    /// be the statements' list, in its order.
    #[test]
    fn the_leased_columns_are_read_in_the_statements_order() {
        let listed: Vec<&str> = sql::LEASED.split(',').map(str::trim).collect();
        assert_eq!(listed, LEASED_COLUMNS);
    }
}
