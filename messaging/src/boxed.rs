//! [`BoxFuture`]: the future type of the object-safe traits (transports,
//! idempotency stores, handlers).

use std::future::Future;
use std::pin::Pin;

/// A boxed, sendable future, as used by the object-safe traits of the framework.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;
