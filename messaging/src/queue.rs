//! The [`Queue`] trait and the runtime description of a queue, [`QueueSpec`].

use std::time::Duration;

use crate::message::Flag;

/// Marker for the two kinds of queue. The publisher's typestate uses it to
/// enforce FIFO rules at compile time.
pub trait QueueKind: Send + Sync + 'static {
    /// Whether the kind is FIFO.
    const FIFO: bool;
}

/// A FIFO queue: ordered within a message group, deduplicated, no per-message delay.
#[derive(Debug, Clone, Copy)]
pub struct Fifo;
/// A standard queue: best-effort order, per-message delay allowed.
#[derive(Debug, Clone, Copy)]
pub struct Standard;

impl QueueKind for Fifo {
    const FIFO: bool = true;
}
impl QueueKind for Standard {
    const FIFO: bool = false;
}

/// A declared queue. Implemented by `#[messaging::queue]` on a unit struct.
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not a declared queue",
    label = "expected a type annotated with `#[messaging::queue]`",
    note = "declare it with `#[messaging::queue(\"name\")] pub struct {Self};`"
)]
pub trait Queue: Send + Sync + 'static {
    /// `Fifo` or `Standard`.
    type Kind: QueueKind;
    /// `Yes` when the queue has a `default_group`.
    type HasDefaultGroup: Flag;
    /// Everything the runtime needs to know about the queue.
    const SPEC: QueueSpec;
}

/// The runtime description of a queue, as declared by `#[messaging::queue]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QueueSpec {
    /// The queue's name on the transport.
    pub name: &'static str,
    /// Whether it is a FIFO queue.
    pub fifo: bool,
    /// The dead-letter queue's name.
    pub dlq: Option<&'static str>,
    /// The group id used when neither the call nor the message gives one.
    pub default_group: Option<&'static str>,
    /// How many handlers run at once (1 = strictly sequential).
    pub concurrency: usize,
    /// How long a received message stays invisible to other consumers.
    pub visibility: Duration,
    /// How many attempts a message gets: after the last one fails, the
    /// worker moves it to the dead-letter queue with the error as its reason
    /// (database queues keep it as an `error` row; on `memory://` and SQS a
    /// queue without `dlq` gives it back to be retried after the backoff).
    /// On database queues a lease that expired (its process died) counts as
    /// an attempt.
    pub max_receives: u32,
    /// Database queues: an enqueue whose payload equals the stored version of
    /// the same identity is discarded.
    pub idempotent: bool,
}

impl QueueSpec {
    /// Default visibility timeout (as on Amazon SQS).
    pub const DEFAULT_VISIBILITY: Duration = Duration::from_secs(30);
    /// Default receive limit before dead-lettering.
    pub const DEFAULT_MAX_RECEIVES: u32 = 5;

    /// The receive count at which the transport's own redrive moves a message
    /// to the dead-letter queue (Amazon SQS's `maxReceiveCount` on queues the
    /// framework creates; the memory transport's limit): twice
    /// `max_receives`, at most 1,000 (SQS's limit, which leaves less room
    /// above 500 and none at 1,000). It is only a backstop: the
    /// worker dead-letters a failing message itself after `max_receives`
    /// attempts, and the room above leaves the receives that were not
    /// attempts (a consumer that crashed or shut down while holding the
    /// message, or held it for a FIFO group) from dead-lettering a message
    /// that never failed.
    pub const fn redrive_after(&self) -> u32 {
        let twice = self.max_receives.saturating_mul(2);
        if twice > 1000 {
            1000
        } else {
            twice
        }
    }

    /// A standard queue with default options; handy for tests and tools.
    pub const fn standard(name: &'static str) -> Self {
        QueueSpec {
            name,
            fifo: false,
            dlq: None,
            default_group: None,
            concurrency: 1,
            visibility: Self::DEFAULT_VISIBILITY,
            max_receives: Self::DEFAULT_MAX_RECEIVES,
            idempotent: false,
        }
    }
}

/// Checks a queue name: letters, digits, `-`, `_` and `.`, 1 to 80 characters,
/// and the `.fifo` suffix exactly when the queue is FIFO. Returns what is wrong.
pub fn check_queue_name(name: &str, fifo: bool) -> Result<(), String> {
    if name.is_empty() || name.len() > 80 {
        return Err(format!("queue name `{name}` must be 1 to 80 characters long (it has {})", name.len()));
    }
    if let Some(c) = name.chars().find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))) {
        return Err(format!("queue name `{name}` contains `{c}`; use only letters, digits, `-`, `_` and `.`"));
    }
    match (fifo, name.ends_with(".fifo")) {
        (true, false) => Err(format!("FIFO queue name `{name}` must end with `.fifo`")),
        (false, true) => Err(format!("queue name `{name}` ends with `.fifo`; add `fifo` to declare a FIFO queue")),
        _ => Ok(()),
    }
}
