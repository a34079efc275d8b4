//! Dispatch outcomes, reported to an optional observer (the test harness uses
//! it to await "handled", "retried" or "dead-lettered").

use std::sync::Arc;

/// What happened to one delivery.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Outcome {
    /// The handler succeeded; the message is acknowledged.
    Handled,
    /// The handler failed transiently; the message will be retried.
    Retried {
        /// The error's message.
        error: String,
    },
    /// The handler failed permanently; the message went to the dead-letter queue.
    DeadLettered {
        /// The error's message.
        error: String,
    },
    /// The message's idempotency claim is held by another delivery; the
    /// message is kept and tried again when that claim's lease ends (not an
    /// attempt: it does not bring the message closer to the dead-letter queue).
    InProgressElsewhere {
        /// When it is tried again.
        retry_in: std::time::Duration,
    },
    /// The idempotency store could not be asked for the message's claim
    /// (its database restarting, or out of reach): the handler did not run,
    /// and the message is kept and tried again (not an attempt).
    ClaimsUnavailable {
        /// What the store said.
        error: String,
        /// When it is tried again.
        retry_in: std::time::Duration,
    },
    /// The body is of a newer version, or a type no handler here takes,
    /// and was given back uncharged for a newer build of the consumer to
    /// take (see [`Setup::wait_for_newer`](crate::Setup::wait_for_newer)).
    AwaitingNewer {
        /// Why this build could not read it.
        error: String,
        /// When it may be received again.
        retry_in: std::time::Duration,
    },
    /// The body could not be decoded for any handler; retried like a failure
    /// (and dead-lettered after `max_receives` attempts).
    Undecodable {
        /// Why.
        error: String,
    },
}

/// One delivery's outcome.
#[derive(Debug, Clone)]
pub struct DispatchEvent {
    /// The queue.
    pub queue: &'static str,
    /// The transport's message id.
    pub message_id: crate::transport::MessageId,
    /// The receive count of this delivery.
    pub receive_count: u32,
    /// What happened.
    pub outcome: Outcome,
}

/// Receives dispatch events.
pub trait Observer: Send + Sync + 'static {
    /// Called once per delivery, after it is settled.
    fn on_dispatch(&self, event: &DispatchEvent);
}

pub(crate) type SharedObserver = Option<Arc<dyn Observer>>;
