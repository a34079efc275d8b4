//! Idempotency: an atomic claim/lease on (message id, scope), so that a
//! side effect runs at most once per message even when the message is
//! delivered twice.
//!
//! `#[messaging::handler(.., idempotent = "scope", lease = "60s")]` wraps the
//! handler: [`Claim::Claimed`] runs it and completes the claim on success or
//! releases it on failure; [`Claim::InProgress`] keeps the delivery (invisible
//! to other consumers) and tries again when the holder's lease ends, without
//! counting an attempt; [`Claim::Completed`] acknowledges without running it.
//!
//! A claim never outlives its message's visibility: the worker claims for at
//! most the time the message has left to be invisible (and at most `lease`),
//! and its heartbeat extends the claim together with the visibility. So when
//! a crashed process's message becomes visible again, its claim has expired
//! too, and the redelivery runs at once.

mod claim;
mod memory;

use std::time::Duration;

#[cfg(any(feature = "postgres", feature = "sqlite"))]
pub use crate::transport::sql::SqlIdempotencyStore;
pub(crate) use claim::ClaimState;
#[cfg(any(feature = "postgres", feature = "sqlite"))]
pub use claim::ClaimsConnection;
pub use claim::IdempotencyClaim;
pub use memory::MemoryIdempotencyStore;

/// Idempotency claims in PostgreSQL, shared by every process using the database.
#[cfg(feature = "postgres")]
pub type PostgresIdempotencyStore = SqlIdempotencyStore<sqlx::Postgres>;

/// Idempotency claims in a SQLite database file, shared by every process using the file.
#[cfg(feature = "sqlite")]
pub type SqliteIdempotencyStore = SqlIdempotencyStore<sqlx::Sqlite>;

/// Where a database store keeps its claims and how its clock differs from
/// this machine's, so that [`IdempotencyClaim::complete_in`] writes in the
/// caller's transaction what the store would.
#[doc(hidden)]
#[derive(Debug, Clone, Default)]
pub struct SqlClaims {
    #[cfg(any(feature = "postgres", feature = "sqlite"))]
    pub(crate) tables: crate::transport::sql::Tables,
    pub(crate) offset_ms: i64,
}

use crate::error::TransportError;
use crate::transport::BoxFuture;

/// The outcome of a claim.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Claim {
    /// This caller holds the lease and must run the side effect.
    Claimed,
    /// Another caller holds an unexpired lease.
    InProgress {
        /// How long the holder's lease has left (the delivery is tried again
        /// after it).
        remaining: Duration,
    },
    /// The side effect already ran.
    Completed,
}

/// A handler's message is being processed by another delivery right now; the
/// delivery is kept and tried again when the holder's lease ends (this does
/// not count as an attempt).
#[derive(Debug, Clone, thiserror::Error)]
#[error("message `{message_id}` is in progress in scope `{scope}` elsewhere")]
pub struct MessageInProgress {
    /// The message id.
    pub message_id: String,
    /// The idempotency scope.
    pub scope: String,
}

/// A store of idempotency claims.
pub trait IdempotencyStore: Send + Sync + 'static {
    /// Tries to claim (message id, scope) for `processor` for `lease`.
    fn claim<'a>(
        &'a self,
        message_id: &'a str,
        scope: &'a str,
        processor: &'a str,
        lease: Duration,
    ) -> BoxFuture<'a, Result<Claim, TransportError>>;

    /// Marks the claim held by `processor` completed.
    fn complete<'a>(
        &'a self,
        message_id: &'a str,
        scope: &'a str,
        processor: &'a str,
    ) -> BoxFuture<'a, Result<(), TransportError>>;

    /// Gives up the claim held by `processor` so that a redelivery can run.
    fn release<'a>(
        &'a self,
        message_id: &'a str,
        scope: &'a str,
        processor: &'a str,
    ) -> BoxFuture<'a, Result<(), TransportError>>;

    /// Pushes the lease of the claim held by `processor` out to `lease` from
    /// now (the worker's heartbeat, while the handler runs). Fails with
    /// [`TransportError::StaleReceipt`] when `processor` no longer holds an
    /// open claim (it was completed, released or taken over).
    fn extend<'a>(
        &'a self,
        message_id: &'a str,
        scope: &'a str,
        processor: &'a str,
        lease: Duration,
    ) -> BoxFuture<'a, Result<(), TransportError>>;

    /// The tables and clock of a database store (`None` for others).
    #[doc(hidden)]
    fn sql_claims(&self) -> Option<SqlClaims> {
        None
    }
}

impl<T: IdempotencyStore> IdempotencyStore for std::sync::Arc<T> {
    fn claim<'a>(
        &'a self,
        message_id: &'a str,
        scope: &'a str,
        processor: &'a str,
        lease: Duration,
    ) -> BoxFuture<'a, Result<Claim, TransportError>> {
        (**self).claim(message_id, scope, processor, lease)
    }

    fn complete<'a>(
        &'a self,
        message_id: &'a str,
        scope: &'a str,
        processor: &'a str,
    ) -> BoxFuture<'a, Result<(), TransportError>> {
        (**self).complete(message_id, scope, processor)
    }

    fn release<'a>(
        &'a self,
        message_id: &'a str,
        scope: &'a str,
        processor: &'a str,
    ) -> BoxFuture<'a, Result<(), TransportError>> {
        (**self).release(message_id, scope, processor)
    }

    fn extend<'a>(
        &'a self,
        message_id: &'a str,
        scope: &'a str,
        processor: &'a str,
        lease: Duration,
    ) -> BoxFuture<'a, Result<(), TransportError>> {
        (**self).extend(message_id, scope, processor, lease)
    }

    fn sql_claims(&self) -> Option<SqlClaims> {
        (**self).sql_claims()
    }
}
