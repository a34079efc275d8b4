//! Idempotency claims: the store trait and the in-memory store (the
//! public face is `crate::idempotency`, in lib.rs).

mod memory;

use std::sync::atomic::AtomicBool;
use std::time::Duration;

pub use memory::MemoryIdempotencyStore;

/// Where a database store keeps its claims and how its clock differs from
/// this machine's, so that `IdempotencyClaim::complete_in` writes in the
/// caller's transaction what the store would.
#[doc(hidden)]
#[derive(Debug, Clone, Default)]
#[cfg_attr(not(any(feature = "sqlite", feature = "postgres")), allow(dead_code))]
pub struct SqlClaims {
    /// The schema of the claims table (none: the connection's own).
    pub(crate) schema: Option<std::sync::Arc<str>>,
    /// The store's clock minus this machine's, in milliseconds.
    pub(crate) offset_ms: i64,
}

/// The claim the framework took before calling an `idempotent = ".."` handler.
#[derive(Debug)]
pub(crate) struct ClaimState {
    /// The store's tables and clock (database stores only).
    #[cfg_attr(not(any(feature = "sqlite", feature = "postgres")), allow(dead_code))]
    pub(crate) sql: Option<SqlClaims>,
    pub(crate) message_id: String,
    pub(crate) scope: &'static str,
    pub(crate) processor: String,
    pub(crate) completed: AtomicBool,
}

use crate::boxed::BoxFuture;
use crate::error::TransportError;

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

/// The idempotency store could not be asked for a message's claim (its
/// database restarting, or out of reach). The handler did not run: the
/// worker holds the message and tries again, and this does not count as an
/// attempt.
#[derive(Debug, thiserror::Error)]
#[error("the idempotency store could not claim message `{message_id}` in scope `{scope}`: {error}")]
pub struct ClaimsUnavailable {
    /// The message id.
    pub message_id: String,
    /// The idempotency scope.
    pub scope: String,
    /// What the store said.
    pub error: TransportError,
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
