//! The PostgreSQL idempotency store.
//!
//! Claims live in the table `messaging_idempotency` (see
//! `migrations/postgres`). A claim is one atomic
//! `INSERT ... ON CONFLICT DO UPDATE ... WHERE ... RETURNING` statement, so
//! concurrent deliveries of one message, in any number of processes, get
//! exactly one [`Claim::Claimed`]. Times are milliseconds since the Unix epoch
//! taken from the application's clock.

use std::time::{Duration, SystemTime};

use sqlx::postgres::{PgPool, PgPoolOptions};
use sqlx::Row;

use super::{Claim, IdempotencyStore};
use crate::error::TransportError;
use crate::transport::BoxFuture;

/// Inserts an unclaimed row or takes the existing one over when it is not
/// completed and free (no holder, expired lease) or held by the same processor.
/// Returns a row only when this caller got the claim.
const CLAIM: &str = "\
INSERT INTO messaging_idempotency (message_id, scope, processor_id, lease_expires_at, completed)
VALUES ($1, $2, $3, $4, FALSE)
ON CONFLICT (message_id, scope) DO UPDATE
SET processor_id = excluded.processor_id, lease_expires_at = excluded.lease_expires_at
WHERE NOT messaging_idempotency.completed
  AND (messaging_idempotency.processor_id IS NULL
       OR messaging_idempotency.lease_expires_at IS NULL
       OR messaging_idempotency.lease_expires_at <= $5
       OR messaging_idempotency.processor_id = excluded.processor_id)
RETURNING processor_id";

const READ: &str = "\
SELECT completed, processor_id, lease_expires_at FROM messaging_idempotency WHERE message_id = $1 AND scope = $2";

const COMPLETE: &str = "\
UPDATE messaging_idempotency SET completed = TRUE, completed_at = $4, lease_expires_at = NULL
WHERE message_id = $1 AND scope = $2 AND processor_id = $3 AND NOT completed";

const RELEASE: &str = "\
UPDATE messaging_idempotency SET processor_id = NULL, lease_expires_at = NULL
WHERE message_id = $1 AND scope = $2 AND processor_id = $3 AND NOT completed";

const EXTEND: &str = "\
UPDATE messaging_idempotency SET lease_expires_at = $4
WHERE message_id = $1 AND scope = $2 AND processor_id = $3 AND NOT completed";

const PURGE: &str = "DELETE FROM messaging_idempotency WHERE completed AND completed_at < $1";

/// How many times a claim is retried when the row changed between the claim
/// statement and the read that explains why the claim was refused.
const CLAIM_ATTEMPTS: usize = 3;

/// Idempotency claims in PostgreSQL, shared by every process using the database.
///
/// The table `messaging_idempotency` must exist: run the `migrate` command, or
/// provision it from `migrations/postgres`.
#[derive(Debug, Clone)]
pub struct PostgresIdempotencyStore {
    pool: PgPool,
}

impl PostgresIdempotencyStore {
    /// A store on an existing connection pool.
    pub fn new(pool: PgPool) -> Self {
        Self { pool }
    }

    /// Connects a pool to `url` (`postgres://user@host:port/database`).
    pub async fn connect(url: &str) -> Result<Self, TransportError> {
        let pool = PgPoolOptions::new()
            .connect(url)
            .await
            .map_err(|e| TransportError::Backend(format!("connecting the postgres idempotency store failed: {e}")))?;
        Ok(Self::new(pool))
    }

    /// Deletes the completed claims whose completion is older than
    /// `older_than`; returns how many were deleted. A later delivery of a
    /// purged message is claimed (and run) again, so keep completed claims
    /// longer than messages can be redelivered.
    pub async fn purge(&self, older_than: Duration) -> Result<u64, TransportError> {
        self.purge_at(older_than, SystemTime::now()).await
    }

    /// The connection pool.
    #[doc(hidden)]
    pub fn pool(&self) -> &PgPool {
        &self.pool
    }

    /// Runs the framework's PostgreSQL migrations (tests and the `migrate` command).
    #[doc(hidden)]
    pub async fn migrate(&self) -> Result<(), TransportError> {
        sqlx::migrate!("./migrations/postgres")
            .run(&self.pool)
            .await
            .map_err(|e| TransportError::Backend(format!("running the postgres migrations failed: {e}")))
    }

    /// Runs one raw SQL statement; returns the number of rows affected (test setup).
    #[doc(hidden)]
    pub async fn execute_sql(&self, sql: &str) -> Result<u64, TransportError> {
        sqlx::raw_sql(sql)
            .execute(&self.pool)
            .await
            .map(|r| r.rows_affected())
            .map_err(|e| TransportError::Backend(format!("sql on postgres failed: {e}")))
    }

    /// Closes the pool.
    #[doc(hidden)]
    pub async fn close(&self) {
        self.pool.close().await;
    }

    /// [`IdempotencyStore::claim`] at the time `now`.
    #[doc(hidden)]
    pub async fn claim_at(
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
            let claimed = sqlx::query(CLAIM)
                .bind(message_id)
                .bind(scope)
                .bind(processor)
                .bind(expires)
                .bind(now)
                .fetch_all(&self.pool)
                .await
                .map_err(|e| backend("claim", e))?;
            if !claimed.is_empty() {
                return Ok(Claim::Claimed);
            }
            let row = sqlx::query(READ)
                .bind(message_id)
                .bind(scope)
                .fetch_optional(&self.pool)
                .await
                .map_err(|e| backend("claim", e))?;
            let Some(row) = row else {
                // Purged between the two statements: claim again.
                continue;
            };
            let completed: bool = row.try_get("completed").map_err(|e| backend("claim", e))?;
            let holder: Option<String> = row.try_get("processor_id").map_err(|e| backend("claim", e))?;
            let expiry: Option<i64> = row.try_get("lease_expires_at").map_err(|e| backend("claim", e))?;
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
    #[doc(hidden)]
    pub async fn complete_at(
        &self,
        message_id: &str,
        scope: &str,
        processor: &str,
        now: SystemTime,
    ) -> Result<(), TransportError> {
        let done = sqlx::query(COMPLETE)
            .bind(message_id)
            .bind(scope)
            .bind(processor)
            .bind(millis(now))
            .execute(&self.pool)
            .await
            .map_err(|e| backend("complete", e))?;
        if done.rows_affected() == 0 {
            return Err(TransportError::StaleReceipt);
        }
        Ok(())
    }

    /// [`IdempotencyStore::extend`] at the time `now`.
    #[doc(hidden)]
    pub async fn extend_at(
        &self,
        message_id: &str,
        scope: &str,
        processor: &str,
        lease: Duration,
        now: SystemTime,
    ) -> Result<(), TransportError> {
        let done = sqlx::query(EXTEND)
            .bind(message_id)
            .bind(scope)
            .bind(processor)
            .bind(millis(now).saturating_add(duration_millis(lease)))
            .execute(&self.pool)
            .await
            .map_err(|e| backend("extend", e))?;
        if done.rows_affected() == 0 {
            return Err(TransportError::StaleReceipt);
        }
        Ok(())
    }

    /// [`PostgresIdempotencyStore::purge`] at the time `now`.
    #[doc(hidden)]
    pub async fn purge_at(&self, older_than: Duration, now: SystemTime) -> Result<u64, TransportError> {
        let cutoff = millis(now).saturating_sub(duration_millis(older_than));
        let done = sqlx::query(PURGE).bind(cutoff).execute(&self.pool).await.map_err(|e| backend("purge", e))?;
        Ok(done.rows_affected())
    }
}

impl IdempotencyStore for PostgresIdempotencyStore {
    fn claim<'a>(
        &'a self,
        message_id: &'a str,
        scope: &'a str,
        processor: &'a str,
        lease: Duration,
    ) -> BoxFuture<'a, Result<Claim, TransportError>> {
        Box::pin(self.claim_at(message_id, scope, processor, lease, SystemTime::now()))
    }

    fn complete<'a>(
        &'a self,
        message_id: &'a str,
        scope: &'a str,
        processor: &'a str,
    ) -> BoxFuture<'a, Result<(), TransportError>> {
        Box::pin(self.complete_at(message_id, scope, processor, SystemTime::now()))
    }

    fn release<'a>(
        &'a self,
        message_id: &'a str,
        scope: &'a str,
        processor: &'a str,
    ) -> BoxFuture<'a, Result<(), TransportError>> {
        Box::pin(async move {
            sqlx::query(RELEASE)
                .bind(message_id)
                .bind(scope)
                .bind(processor)
                .execute(&self.pool)
                .await
                .map_err(|e| backend("release", e))?;
            Ok(())
        })
    }
    fn extend<'a>(
        &'a self,
        message_id: &'a str,
        scope: &'a str,
        processor: &'a str,
        lease: Duration,
    ) -> BoxFuture<'a, Result<(), TransportError>> {
        Box::pin(self.extend_at(message_id, scope, processor, lease, SystemTime::now()))
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

/// Says which operation failed; a missing table (SQLSTATE 42P01,
/// undefined_table) says how to create it.
fn backend(op: &str, err: sqlx::Error) -> TransportError {
    if let sqlx::Error::Database(db) = &err {
        if db.code().as_deref() == Some("42P01") {
            return TransportError::Backend(format!(
                "idempotency {op} on postgres failed: the table `messaging_idempotency` is missing; \
                 run the `migrate` command (or provision the table from the framework's postgres migrations): {err}"
            ));
        }
    }
    TransportError::Backend(format!("idempotency {op} on postgres failed: {err}"))
}
