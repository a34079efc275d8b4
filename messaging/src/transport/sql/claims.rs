//! Idempotency claims in the database (table `messaging_idempotency`), one
//! store for PostgreSQL and SQLite.
//!
//! A claim is one atomic `INSERT ... ON CONFLICT DO UPDATE ... WHERE ...
//! RETURNING` statement, so concurrent deliveries of one message, in any
//! number of processes sharing the database, get exactly one
//! [`Claim::Claimed`]. Times are milliseconds since the Unix epoch by the
//! database's clock (see [`super::clock`]).

use std::time::{Duration, SystemTime};

use sqlx::Pool;

use super::dialect::Dialect;
use super::dialect::SqlStore;
use super::driver::Value;
use super::statements::{self as sql, Tables};
use crate::boxed::BoxFuture;
use crate::claims::{Claim, IdempotencyStore, SqlClaims};
use crate::error::TransportError;

/// Idempotency claims in PostgreSQL, shared by every process using the database.
#[cfg(feature = "postgres")]
pub type PostgresIdempotencyStore = SqlIdempotencyStore<sqlx::Postgres>;

/// Idempotency claims in a SQLite database file, shared by every process using the file.
#[cfg(feature = "sqlite")]
pub type SqliteIdempotencyStore = SqlIdempotencyStore<sqlx::Sqlite>;

/// How many times a claim is retried when the row changed between the claim
/// statement and the read that explains why the claim was refused.
const CLAIM_ATTEMPTS: usize = 3;

/// Whether a statement that changes claims may run twice ([`SqlIdempotencyStore::change`]).
#[derive(Clone, Copy)]
enum Runs {
    Once,
    Twice,
}

/// Idempotency claims in a database shared by every process using it:
/// [`PostgresIdempotencyStore`] or
/// [`SqliteIdempotencyStore`].
///
/// The table `messaging_idempotency` must exist: run the `migrate` command, or
/// provision it from the framework's migrations.
#[derive(Debug)]
pub struct SqlIdempotencyStore<D: Dialect> {
    pub(super) store: SqlStore<D>,
}

impl<D: Dialect> Clone for SqlIdempotencyStore<D> {
    fn clone(&self) -> Self {
        SqlIdempotencyStore { store: self.store.clone() }
    }
}

impl<D: Dialect> SqlIdempotencyStore<D> {
    /// Claims beside the messages of `store` (same pool, same clock).
    pub(crate) fn on(store: &SqlStore<D>) -> Self {
        SqlIdempotencyStore { store: store.clone() }
    }

    /// A store on a pool the application opened.
    pub fn new(pool: Pool<D>) -> Self {
        let state = D::adopt(&pool);
        SqlIdempotencyStore { store: SqlStore::new(pool, state) }
    }

    /// Connects to `url` (`postgres://user@host/db`, `sqlite://FILE`); on
    /// PostgreSQL `schema=NAME` names the schema of the claims table, as on
    /// the transport's URL.
    pub async fn connect(url: &str) -> Result<Self, TransportError> {
        let (options, rest) =
            super::SqlOptions::parse(url).map_err(|e| TransportError::Backend(format!("{}: {e}", D::SYSTEM)))?;
        let mut store = SqlStore::connect_sized(&rest, options.max_connections).await?;
        store.tables = Tables::in_schema(options.schema.as_deref());
        Ok(SqlIdempotencyStore { store })
    }

    /// Deletes the completed claims whose completion is older than
    /// `older_than`; returns how many were deleted. A later delivery of a
    /// purged message is claimed (and run) again, so keep completed claims
    /// longer than messages can be redelivered.
    pub async fn purge(&self, older_than: Duration) -> Result<u64, TransportError> {
        self.purge_at(older_than, self.now()).await
    }

    /// The shared clock, as a time.
    fn now(&self) -> SystemTime {
        let ms = u64::try_from(D::now(&self.store.state)).unwrap_or(0);
        SystemTime::UNIX_EPOCH + Duration::from_millis(ms)
    }

    /// Runs one statement that changes claims: texts, then a time; the rows
    /// affected. `Runs::Twice`: the statement may run twice, and runs once
    /// more when its connection was lost (`SqlStore::again_if_lost`): an
    /// extension, a release, a purge. Not a completion: run again after
    /// the server committed it, it would find the claim completed and
    /// report it lost.
    async fn change(
        &self,
        op: &str,
        template: &str,
        texts: &[&str],
        at: Option<i64>,
        runs: Runs,
    ) -> Result<u64, TransportError> {
        let args: Vec<Value<'_>> = texts.iter().map(|&t| t.into()).chain(at.map(Value::from)).collect();
        let changed = match runs {
            Runs::Once => self.store.exec(op, &[template], &args).await,
            Runs::Twice => self.store.exec_again_if_lost(op, &[template], &args).await,
        };
        changed.map_err(|e| named::<D>(op, e))
    }

    /// [`IdempotencyStore::claim`] at the time `now`.
    pub(crate) async fn claim_at(
        &self,
        message_id: &str,
        scope: &str,
        processor: &str,
        lease: Duration,
        now: SystemTime,
    ) -> Result<Claim, TransportError> {
        let now = millis(now);
        let expires = now.saturating_add(duration_millis(lease));
        let mut last_expiry = None;
        for _ in 0..CLAIM_ATTEMPTS {
            let args = [message_id.into(), scope.into(), processor.into(), expires.into(), now.into()];
            let claimed = self.store.query("claim", &[sql::CLAIM], &args).await.map_err(|e| named::<D>("claim", e))?;
            if !claimed.is_empty() {
                return Ok(Claim::Claimed);
            }
            let args = [message_id.into(), scope.into()];
            let found =
                self.store.query("claim", &[sql::CLAIM_READ], &args).await.map_err(|e| named::<D>("claim", e))?;
            let Some(row) = found.first() else {
                // Purged between the two statements: claim again.
                continue;
            };
            let read = |e: sqlx::Error| named::<D>("claim", TransportError::Backend(e.to_string()));
            let completed = D::flag(row, 0).map_err(read)?;
            let holder = D::text(row, 1).map_err(read)?;
            let expiry = D::int(row, 2).map_err(read)?;
            if completed {
                return Ok(Claim::Completed);
            }
            let free = holder.is_none() || expiry.is_none_or(|e| e <= now);
            if !free && holder.as_deref() != Some(processor) {
                return Ok(in_progress(expiry, now));
            }
            // Released or expired between the two statements: claim again.
            last_expiry = expiry;
        }
        Ok(in_progress(last_expiry, now))
    }

    /// [`IdempotencyStore::complete`] at the time `now`.
    pub(crate) async fn complete_at(
        &self,
        message_id: &str,
        scope: &str,
        processor: &str,
        now: SystemTime,
    ) -> Result<(), TransportError> {
        match self
            .change("complete", sql::CLAIM_COMPLETE, &[message_id, scope, processor], Some(millis(now)), Runs::Once)
            .await?
        {
            0 => Err(TransportError::StaleReceipt),
            _ => Ok(()),
        }
    }

    /// [`IdempotencyStore::extend`] at the time `now`.
    pub(crate) async fn extend_at(
        &self,
        message_id: &str,
        scope: &str,
        processor: &str,
        lease: Duration,
        now: SystemTime,
    ) -> Result<(), TransportError> {
        let until = millis(now).saturating_add(duration_millis(lease));
        match self
            .change("extend", sql::CLAIM_EXTEND, &[message_id, scope, processor], Some(until), Runs::Twice)
            .await?
        {
            0 => Err(TransportError::StaleReceipt),
            _ => Ok(()),
        }
    }

    /// [`SqlIdempotencyStore::purge`] at the time `now`.
    pub(crate) async fn purge_at(&self, older_than: Duration, now: SystemTime) -> Result<u64, TransportError> {
        let cutoff = millis(now).saturating_sub(duration_millis(older_than));
        self.change("purge", sql::CLAIMS_PURGE, &[], Some(cutoff), Runs::Twice).await
    }
}

impl<D: Dialect> IdempotencyStore for SqlIdempotencyStore<D> {
    fn claim<'a>(
        &'a self,
        message_id: &'a str,
        scope: &'a str,
        processor: &'a str,
        lease: Duration,
    ) -> BoxFuture<'a, Result<Claim, TransportError>> {
        Box::pin(self.claim_at(message_id, scope, processor, lease, self.now()))
    }

    fn complete<'a>(
        &'a self,
        message_id: &'a str,
        scope: &'a str,
        processor: &'a str,
    ) -> BoxFuture<'a, Result<(), TransportError>> {
        Box::pin(self.complete_at(message_id, scope, processor, self.now()))
    }

    fn release<'a>(
        &'a self,
        message_id: &'a str,
        scope: &'a str,
        processor: &'a str,
    ) -> BoxFuture<'a, Result<(), TransportError>> {
        Box::pin(async move {
            self.change("release", sql::CLAIM_RELEASE, &[message_id, scope, processor], None, Runs::Twice)
                .await
                .map(drop)
        })
    }

    fn extend<'a>(
        &'a self,
        message_id: &'a str,
        scope: &'a str,
        processor: &'a str,
        lease: Duration,
    ) -> BoxFuture<'a, Result<(), TransportError>> {
        Box::pin(self.extend_at(message_id, scope, processor, lease, self.now()))
    }

    fn sql_claims(&self) -> Option<SqlClaims> {
        Some(SqlClaims {
            schema: self.store.tables.schema(),
            offset_ms: D::now(&self.store.state) - super::clock::local_ms(),
        })
    }
}

/// A refused claim, with what is left of the holder's lease (none known: a
/// short pause, the claim having changed under two reads in a row).
fn in_progress(expiry: Option<i64>, now: i64) -> Claim {
    let remaining = expiry.map_or(100, |e| e.saturating_sub(now).max(0));
    Claim::InProgress { remaining: Duration::from_millis(u64::try_from(remaining).unwrap_or(0)) }
}

/// Milliseconds since the Unix epoch (0 before it, saturating far after it).
fn millis(at: SystemTime) -> i64 {
    at.duration_since(SystemTime::UNIX_EPOCH).map(duration_millis).unwrap_or(0)
}

fn duration_millis(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

/// Says which claim operation failed; a missing table says how to create it.
fn named<D: Dialect>(op: &str, e: TransportError) -> TransportError {
    let text = e.to_string();
    if text.contains(D::MISSING_TABLE) {
        return TransportError::Backend(format!(
            "idempotency {op} on {} failed: the table `messaging_idempotency` is missing; \
             run the `migrate` command (or provision the table from the framework's {} migrations): {text}",
            D::SYSTEM,
            D::SYSTEM
        ));
    }
    TransportError::Backend(format!("idempotency {op} on {}: {text}", D::SYSTEM))
}
