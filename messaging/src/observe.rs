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
    /// The body could not be decoded for any handler; left for redelivery.
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
