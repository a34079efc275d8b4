//! Handlers: the type-erased form `#[messaging::handler]` generates, and what
//! a handler may return.

use std::any::Any;
use std::sync::Arc;
use std::time::Duration;

use crate::boxed::BoxFuture;
use crate::context::MessageContext;
use crate::error::HandlerError;
use crate::extract::Resources;

/// A decoded message whose type is known only at run time.
pub type AnyMessage = Box<dyn Any + Send>;

/// A handler with its types erased, as registered by `#[messaging::handler]`.
pub trait ErasedHandler: Send + Sync + 'static {
    /// Runs the handler on a decoded message.
    fn call(
        &self,
        message: AnyMessage,
        ctx: MessageContext,
        resources: Arc<Resources>,
    ) -> BoxFuture<'static, Result<(), HandlerError>>;
}

/// What a handler function may return: `()` or `Result<(), E>` with
/// `E: Into<HandlerError>`.
#[diagnostic::on_unimplemented(
    message = "a handler cannot return `{Self}`",
    label = "expected `()` or `Result<(), HandlerError>`",
    note = "return `Result<(), HandlerError>` (any `std::error::Error` converts with `?`) or nothing"
)]
pub trait IntoHandlerResult {
    /// Converts to the framework's result.
    fn into_handler_result(self) -> Result<(), HandlerError>;
}

impl IntoHandlerResult for () {
    fn into_handler_result(self) -> Result<(), HandlerError> {
        Ok(())
    }
}

impl<E: Into<HandlerError>> IntoHandlerResult for Result<(), E> {
    fn into_handler_result(self) -> Result<(), HandlerError> {
        self.map_err(Into::into)
    }
}

/// Retry backoff of a handler: `min(base * 2^(n-1), max)` before the n-th
/// retry, with jitter (each delay is drawn between half and all of it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryPolicy {
    /// The first retry's delay.
    pub base: Duration,
    /// The largest delay.
    pub max: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy { base: Duration::from_secs(1), max: Duration::from_secs(5 * 60) }
    }
}

impl RetryPolicy {
    /// The delay before retrying a message that failed on its `receive_count`-th receive.
    pub fn backoff(&self, receive_count: u32) -> Duration {
        let exp = receive_count.saturating_sub(1).min(30);
        let full = self.base.saturating_mul(1u32 << exp).min(self.max);
        let half = full / 2;
        half + half.mul_f64(fastrand::f64())
    }
}

/// Idempotency of a handler (`idempotent = "scope", lease = "60s"`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IdempotencySpec {
    /// The scope: one side effect per (message id, scope).
    pub scope: &'static str,
    /// The longest a claim holds before another delivery may take it over;
    /// a claim is also never held longer than its message stays invisible
    /// (the worker's heartbeat extends both).
    pub lease: Duration,
}

impl IdempotencySpec {
    /// Default lease when `lease` is not given.
    pub const DEFAULT_LEASE: Duration = Duration::from_secs(30);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_grows_and_is_capped() {
        let p = RetryPolicy { base: Duration::from_millis(100), max: Duration::from_secs(1) };
        for _ in 0..100 {
            let first = p.backoff(1);
            assert!(first >= Duration::from_millis(50) && first <= Duration::from_millis(100), "{first:?}");
            let third = p.backoff(3);
            assert!(third >= Duration::from_millis(200) && third <= Duration::from_millis(400), "{third:?}");
            assert!(p.backoff(40) <= Duration::from_secs(1));
        }
    }
}
