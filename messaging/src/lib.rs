#![doc = include_str!("../README.md")]
//!
//! # The public API
//!
//! | to | use |
//! |---|---|
//! | declare queues, messages, handlers, `main` | [`queue`](macro@queue), [`message`](macro@message), [`handler`](macro@handler), [`main`](macro@main); the traits [`Queue`], [`Message`] |
//! | recurring messages | [`schedule`](macro@schedule) and the [`schedule`](mod@schedule) module ([`Tick`](schedule::Tick), [`CatchUp`](schedule::CatchUp)) |
//! | assemble and run a service | [`App`], [`Setup`], [`Running`], [`Stopped`], [`RunMode`], [`Shutdown`]; the command line: [`cli`] |
//! | publish | [`Publisher`] (and [`publish`] for its builders and limits) |
//! | write handlers | [`MessageContext`], [`State`], [`FromContext`], [`HandlerError`], [`RetryPolicy`], [`IdempotencyClaim`] |
//! | wrap every dispatch | [`Behaviour`], [`Next`] |
//! | exactly-once side effects | [`idempotency`] (claim stores, [`IdempotencyClaim::complete_in`]) |
//! | transports | [`transport::connect`] and the [`transport::Transport`] trait (memory, SQLite, PostgreSQL, SQS) |
//! | wire format | [`envelope`] (versioned envelopes, upcasting) |
//! | errors | [`Error`], [`TransportError`], [`PublishError`] |
//! | observability | [`telemetry`] (spans, metrics, logging setup) |
//! | tests of your own service | [`testing`] (an app on the in-memory transport) |
//! | an operator's console (feature `console`) | `console` (a JSON API and pages over every queue) |
//! | everything at once | [`prelude`] |

pub mod app;
mod boxed;
mod claims;
pub mod cli;
#[cfg(feature = "console")]
pub mod console;
pub mod context;
mod control;
mod duration;
mod enrich;
pub mod envelope;
pub mod error;
pub mod extract;
mod handler;
mod health;
// `hint::nearest` serves only the database URLs' options.
#[cfg_attr(not(any(feature = "sqlite", feature = "postgres")), allow(dead_code))]
mod hint;
#[cfg(test)]
mod layers;
pub mod message;
pub mod observe;
mod pipeline;
#[cfg(test)]
mod printed;
pub mod publish;
pub mod queue;
pub mod registry;
mod relay;
mod retry;
pub mod schedule;
mod scheduler;
pub mod shutdown;
pub mod telemetry;
pub mod testing;
mod throttle;
pub mod transport;
mod worker;

#[doc(hidden)]
pub mod __private;

/// Idempotency: an atomic claim/lease on (message id, scope), so that a side
/// effect runs at most once per message even when the message is delivered
/// twice.
///
/// `#[messaging::handler(.., idempotent = "scope", lease = "60s")]` wraps the
/// handler: [`Claim::Claimed`](idempotency::Claim::Claimed) runs it and
/// completes the claim on success or releases it on failure;
/// [`Claim::InProgress`](idempotency::Claim::InProgress) keeps the delivery
/// (invisible to other consumers) and tries again when the holder's lease
/// ends, without counting an attempt;
/// [`Claim::Completed`](idempotency::Claim::Completed) acknowledges without
/// running it.
///
/// A claim never outlives its message's visibility: the worker claims for at
/// most the time the message has left to be invisible (and at most `lease`),
/// and its heartbeat extends the claim together with the visibility. So when
/// a crashed process's message becomes visible again, its claim has expired
/// too, and the redelivery runs at once.
pub mod idempotency {
    #[doc(hidden)]
    pub use crate::claims::SqlClaims;
    pub use crate::claims::{Claim, ClaimsUnavailable, IdempotencyStore, MemoryIdempotencyStore, MessageInProgress};
    #[cfg(any(feature = "postgres", feature = "sqlite"))]
    pub use crate::extract::ClaimsConnection;
    pub use crate::extract::IdempotencyClaim;
    #[cfg(feature = "postgres")]
    pub use crate::transport::sql::PostgresIdempotencyStore;
    #[cfg(feature = "sqlite")]
    pub use crate::transport::sql::SqliteIdempotencyStore;
    #[cfg(any(feature = "postgres", feature = "sqlite"))]
    pub use crate::transport::sql::{Dialect, SqlIdempotencyStore};
}

pub use app::{App, RunMode, Running, Setup, Stopped};
pub use boxed::BoxFuture;
pub use context::MessageContext;
pub use error::{Error, HandlerError, PublishError, Result, TransportError};
pub use extract::IdempotencyClaim;
pub use extract::{FromContext, State};
pub use handler::RetryPolicy;
pub use message::Message;
pub use pipeline::{Behaviour, Next};
pub use publish::Publisher;
pub use queue::{Fifo, Queue, QueueSpec, Standard};
pub use shutdown::Shutdown;
/// The database driver of the SQL transports, re-exported so that handlers
/// that share their transaction with an [`IdempotencyClaim`] use the same version.
#[cfg(any(feature = "sqlite", feature = "postgres"))]
pub use sqlx;
pub use transport::MessageId;

/// Declares a queue on a unit struct. See the [crate docs](crate#queues).
#[doc(inline)]
pub use messaging_macros::queue;

/// Declares a message type, its wire name, version and upcast. See the [crate docs](crate#messages).
#[doc(inline)]
pub use messaging_macros::message;

/// Declares a handler. See the [crate docs](crate#handlers).
#[doc(inline)]
pub use messaging_macros::handler;

/// Declares a recurring message: a function run on a cron expression or an
/// interval, whose message is published once per tick. See [`schedule`](mod@schedule).
#[doc(inline)]
pub use messaging_macros::schedule;

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
