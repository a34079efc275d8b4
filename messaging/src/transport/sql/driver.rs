//! What the shared SQL needs of a sqlx driver: run a statement on a
//! connection, read a column, decode a message row. [`Driver`] is implemented
//! once, for every sqlx database whose types fit (PostgreSQL and SQLite), so
//! that the store's code is written once and names no driver.
//!
//! Statements are bound with values of the few types the tables use
//! ([`Value`]); both drivers accept `$N` placeholders.

use futures_util::future::BoxFuture;
use sqlx::{ColumnIndex, Database, Decode, Encode, Executor, FromRow, IntoArguments, Row as _, Type};

use super::record::{LeasedRow, Record};

/// A bound parameter.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Value<'q> {
    /// BIGINT.
    Int(Option<i64>),
    /// INTEGER (priorities, attempts).
    Int4(Option<i32>),
    /// BOOLEAN (an INTEGER 0/1 on SQLite).
    Bool(bool),
    /// TEXT.
    Text(Option<&'q str>),
    /// BYTEA / BLOB.
    Bytes(Option<&'q [u8]>),
}

/// `From` conversions into [`Value`] for the types the store binds.
macro_rules! values {
    ($($t:ty => |$v:ident| $e:expr;)*) => {
        $(impl<'q> From<$t> for Value<'q> {
            fn from($v: $t) -> Self {
                $e
            }
        })*
    };
}

values! {
    i64 => |v| Value::Int(Some(v));
    Option<i64> => |v| Value::Int(v);
    i32 => |v| Value::Int4(Some(v));
    Option<i32> => |v| Value::Int4(v);
    bool => |v| Value::Bool(v);
    &'q str => |v| Value::Text(Some(v));
    &'q String => |v| Value::Text(Some(v));
    Option<&'q str> => |v| Value::Text(v);
    &'q [u8] => |v| Value::Bytes(Some(v));
    Option<&'q [u8]> => |v| Value::Bytes(v);
}

/// The rows a statement changed (sqlx has no driver-neutral accessor).
pub(crate) trait Affected {
    /// How many rows the statement changed.
    fn rows(&self) -> u64;
}

#[cfg(feature = "postgres")]
impl Affected for sqlx::postgres::PgQueryResult {
    fn rows(&self) -> u64 {
        self.rows_affected()
    }
}

#[cfg(feature = "sqlite")]
impl Affected for sqlx::sqlite::SqliteQueryResult {
    fn rows(&self) -> u64 {
        self.rows_affected()
    }
}

/// Runs statements and reads columns, for any database whose driver fits.
pub(crate) trait Driver: Database {
    /// Every row of `sql` run with `args`.
    fn fetch_all<'e>(
        conn: &'e mut Self::Connection,
        sql: &'e str,
        args: &'e [Value<'e>],
    ) -> BoxFuture<'e, Result<Vec<Self::Row>, sqlx::Error>>;

    /// Runs `sql` with `args`; the rows affected.
    fn execute<'e>(
        conn: &'e mut Self::Connection,
        sql: &'e str,
        args: &'e [Value<'e>],
    ) -> BoxFuture<'e, Result<u64, sqlx::Error>>;

    /// Runs a script of several statements, without parameters.
    fn execute_script<'e>(conn: &'e mut Self::Connection, sql: &'e str) -> BoxFuture<'e, Result<(), sqlx::Error>>;

    /// Column `i` as a BIGINT (or NULL).
    fn int(row: &Self::Row, i: usize) -> Result<Option<i64>, sqlx::Error>;

    /// Column `i` as a boolean.
    fn flag(row: &Self::Row, i: usize) -> Result<bool, sqlx::Error>;

    /// Column `i` as TEXT (or NULL).
    fn text(row: &Self::Row, i: usize) -> Result<Option<String>, sqlx::Error>;

    /// Column `i` as bytes (or NULL).
    fn bytes(row: &Self::Row, i: usize) -> Result<Option<Vec<u8>>, sqlx::Error>;

    /// A whole message row.
    fn record(row: &Self::Row) -> Result<Record, sqlx::Error>;

    /// A leased row.
    fn leased(row: &Self::Row) -> Result<LeasedRow, sqlx::Error>;
}

/// Builds the sqlx query of `sql` with `args`.
fn query<'q, DB>(sql: &'q str, args: &'q [Value<'q>]) -> sqlx::query::Query<'q, DB, DB::Arguments<'q>>
where
    DB: Database,
    Option<i64>: Encode<'q, DB> + Type<DB>,
    Option<i32>: Encode<'q, DB> + Type<DB>,
    bool: Encode<'q, DB> + Type<DB>,
    Option<&'q str>: Encode<'q, DB> + Type<DB>,
    Option<&'q [u8]>: Encode<'q, DB> + Type<DB>,
{
    args.iter().fold(sqlx::query::<DB>(sql), |q, &value| match value {
        Value::Int(v) => q.bind(v),
        Value::Int4(v) => q.bind(v),
        Value::Bool(v) => q.bind(v),
        Value::Text(v) => q.bind(v),
        Value::Bytes(v) => q.bind(v),
    })
}

impl<DB> Driver for DB
where
    DB: Database,
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
    for<'q> DB::Arguments<'q>: IntoArguments<'q, DB>,
    DB::QueryResult: Affected,
    for<'q> Option<i64>: Encode<'q, DB> + Decode<'q, DB> + Type<DB>,
    for<'q> Option<i32>: Encode<'q, DB> + Type<DB>,
    for<'q> bool: Encode<'q, DB> + Decode<'q, DB> + Type<DB>,
    for<'q> Option<&'q str>: Encode<'q, DB> + Type<DB>,
    for<'q> Option<&'q [u8]>: Encode<'q, DB> + Type<DB>,
    for<'r> Option<String>: Decode<'r, DB> + Type<DB>,
    for<'r> Option<Vec<u8>>: Decode<'r, DB> + Type<DB>,
    for<'r> Record: FromRow<'r, DB::Row>,
    for<'r> LeasedRow: FromRow<'r, DB::Row>,
    usize: ColumnIndex<DB::Row>,
{
    fn fetch_all<'e>(
        conn: &'e mut Self::Connection,
        sql: &'e str,
        args: &'e [Value<'e>],
    ) -> BoxFuture<'e, Result<Vec<Self::Row>, sqlx::Error>> {
        conn.fetch_all(query::<DB>(sql, args))
    }

    fn execute<'e>(
        conn: &'e mut Self::Connection,
        sql: &'e str,
        args: &'e [Value<'e>],
    ) -> BoxFuture<'e, Result<u64, sqlx::Error>> {
        let run = conn.execute(query::<DB>(sql, args));
        Box::pin(async move { run.await.map(|done| done.rows()) })
    }

    fn execute_script<'e>(conn: &'e mut Self::Connection, sql: &'e str) -> BoxFuture<'e, Result<(), sqlx::Error>> {
        let run = conn.execute(sqlx::raw_sql(sql));
        Box::pin(async move { run.await.map(drop) })
    }

    fn int(row: &Self::Row, i: usize) -> Result<Option<i64>, sqlx::Error> {
        row.try_get(i)
    }

    fn flag(row: &Self::Row, i: usize) -> Result<bool, sqlx::Error> {
        row.try_get(i)
    }

    fn text(row: &Self::Row, i: usize) -> Result<Option<String>, sqlx::Error> {
        row.try_get(i)
    }

    fn bytes(row: &Self::Row, i: usize) -> Result<Option<Vec<u8>>, sqlx::Error> {
        row.try_get(i)
    }

    fn record(row: &Self::Row) -> Result<Record, sqlx::Error> {
        Record::from_row(row)
    }

    fn leased(row: &Self::Row) -> Result<LeasedRow, sqlx::Error> {
        LeasedRow::from_row(row)
    }
}
