#![doc = include_str!("../README.md")]

pub mod app;
pub mod cli;
pub mod context;
pub mod envelope;
pub mod error;
pub mod extract;
pub mod handler;
mod health;
pub mod idempotency;
pub mod identity;
pub mod message;
pub mod observe;
pub mod pipeline;
pub mod publish;
pub mod queue;
pub mod registry;
pub mod shutdown;
pub mod telemetry;
pub mod testing;
pub mod transport;
mod worker;

#[doc(hidden)]
pub mod __private;

pub use app::{App, RunMode, Running, Setup};
pub use context::MessageContext;
pub use error::{Error, HandlerError, PublishError, Result, TransportError};
pub use extract::{FromContext, State};
pub use handler::RetryPolicy;
pub use idempotency::IdempotencyClaim;
pub use message::Message;
pub use pipeline::{Behaviour, Next};
pub use publish::Publisher;
pub use queue::{Fifo, Queue, QueueSpec, Standard};
pub use shutdown::Shutdown;
/// The database driver of the SQL transports, re-exported so that handlers
/// that share their transaction with an [`IdempotencyClaim`] use the same version.
#[cfg(any(feature = "sqlite", feature = "postgres"))]
pub use sqlx;
pub use transport::{BoxFuture, MessageId};

/// Declares a queue on a unit struct. See the [crate docs](crate#queues).
#[doc(inline)]
pub use messaging_macros::queue;

/// Declares a message type, its wire name, version and upcast. See the [crate docs](crate#messages).
#[doc(inline)]
pub use messaging_macros::message;

/// Declares a handler. See the [crate docs](crate#handlers).
#[doc(inline)]
pub use messaging_macros::handler;

/// Turns `async fn main` into a service with a command line. See the [crate docs](crate#main).
#[doc(inline)]
pub use messaging_macros::main;

/// The names most apps need: `use messaging::prelude::*;`.
pub mod prelude {
    pub use crate::{
        Behaviour, HandlerError, IdempotencyClaim, Message, MessageContext, MessageId, Next, PublishError, Publisher,
        Queue, RunMode, Setup, State,
    };
    pub use serde::{Deserialize, Serialize};
}
