//! The [`Browse`] capability: what an operator's console reads and changes
//! of a queue beyond its dead letters. Database queues and `memory://` have
//! it; on Amazon SQS, reading a message means receiving it (which counts
//! toward its `maxReceiveCount`), so SQS offers counts only
//! ([`Transport::counts`](super::Transport::counts)) and its dead letters go
//! through [`DeadLetters`](super::DeadLetters).

use crate::boxed::BoxFuture;
use crate::error::TransportError;
use crate::transport::{MessageId, MessageReport};

/// Where a message stands, as the console groups them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MessageStatus {
    /// Can be received now.
    Pending,
    /// Waits for its time: a delay, or a retry's backoff.
    Sleeping,
    /// Received by a consumer and not settled yet.
    InFlight,
    /// Being handled while a newer version of its identity waits for the
    /// handler to end (database queues).
    AwaitingRelease,
    /// A dead letter.
    Dead,
}

impl MessageStatus {
    /// Every status, in the order a message goes through them.
    pub const ALL: [MessageStatus; 5] = [
        MessageStatus::Pending,
        MessageStatus::Sleeping,
        MessageStatus::InFlight,
        MessageStatus::AwaitingRelease,
        MessageStatus::Dead,
    ];

    /// The name the API and the command line use (`in_flight`, say).
    pub fn as_str(self) -> &'static str {
        match self {
            MessageStatus::Pending => "pending",
            MessageStatus::Sleeping => "sleeping",
            MessageStatus::InFlight => "in_flight",
            MessageStatus::AwaitingRelease => "awaiting_release",
            MessageStatus::Dead => "dead",
        }
    }

    /// The status named `name` ([`MessageStatus::as_str`]).
    pub fn parse(name: &str) -> Option<MessageStatus> {
        MessageStatus::ALL.into_iter().find(|s| s.as_str() == name)
    }
}

impl std::fmt::Display for MessageStatus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// How many messages a queue holds, by status; `None` where the transport
/// cannot tell (SQS does not count what waits for a release; `memory://`
/// and SQS keep no awaiting-release state at all and say 0).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
#[non_exhaustive]
pub struct QueueCounts {
    /// Can be received now.
    pub pending: Option<u64>,
    /// Waiting for a delay or a retry's backoff.
    pub sleeping: Option<u64>,
    /// Received and not settled.
    pub in_flight: Option<u64>,
    /// Handled while a newer version waits (database queues).
    pub awaiting_release: Option<u64>,
    /// Dead letters.
    pub dead: Option<u64>,
    /// Of those in flight or awaiting release, the ones whose lease (or
    /// visibility timeout) has run out unsettled: the consumer holding them
    /// stopped, lost touch with the queue, or runs a handler longer than the
    /// visibility timeout. They stay counted as in flight until a receive of
    /// the queue takes them back, so with no consumer running they stay
    /// there. `None`: not known (SQS).
    pub expired: Option<u64>,
    /// When the oldest message that is not a dead letter was sent, in
    /// milliseconds since the Unix epoch (`None`: none, or not known).
    pub oldest_sent_at_ms: Option<i64>,
    /// Of the messages that can be received now, when the one that has
    /// waited longest became receivable: when it was sent, or when its
    /// delay or retry backoff ended, in milliseconds since the Unix epoch
    /// (`None`: none, or not known; the database queues know it). How far
    /// the consumers are behind: a delayed message does not count until
    /// it is due.
    pub oldest_pending_since_ms: Option<i64>,
}

impl QueueCounts {
    /// Every status counted, at zero, and none expired (for a backend that
    /// counts them all).
    pub fn zeros() -> QueueCounts {
        let mut counts = QueueCounts { expired: Some(0), ..QueueCounts::default() };
        for status in MessageStatus::ALL {
            counts.set(status, 0);
        }
        counts
    }

    /// The count of `status`.
    pub fn of(&self, status: MessageStatus) -> Option<u64> {
        match status {
            MessageStatus::Pending => self.pending,
            MessageStatus::Sleeping => self.sleeping,
            MessageStatus::InFlight => self.in_flight,
            MessageStatus::AwaitingRelease => self.awaiting_release,
            MessageStatus::Dead => self.dead,
        }
    }

    /// Sets the count of `status`.
    pub fn set(&mut self, status: MessageStatus, count: u64) {
        let slot = match status {
            MessageStatus::Pending => &mut self.pending,
            MessageStatus::Sleeping => &mut self.sleeping,
            MessageStatus::InFlight => &mut self.in_flight,
            MessageStatus::AwaitingRelease => &mut self.awaiting_release,
            MessageStatus::Dead => &mut self.dead,
        };
        *slot = Some(count);
    }
}

/// What `n` messages in flight past their lease ([`QueueCounts::expired`])
/// mean, for an operator (the console, `app queues`); `None` for none. After
/// a crash nothing else says why they stay in flight with no consumer
/// running.
pub(crate) fn held_past_lease(n: u64) -> Option<String> {
    if n == 0 {
        return None;
    }
    let (messages, their, them) = if n == 1 { ("message is", "its", "it") } else { ("messages are", "their", "them") };
    Some(format!(
        "{n} {messages} held past {their} lease: the consumer that received {them} stopped or lost touch with the \
         queue. The next receive from this queue takes {them} back."
    ))
}

/// Which messages of a queue to list: one status, oldest first, a page at a
/// time (keyset pagination: `after` is the previous page's
/// [`MessagePage::next`]), optionally only those of an envelope type, an
/// identity or a FIFO group.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Listing {
    /// The status listed.
    pub status: MessageStatus,
    /// Where the page starts: the cursor of the page before (none: the oldest).
    pub after: Option<String>,
    /// At most this many messages (at least 1).
    pub limit: usize,
    /// Only messages whose envelope has this type name.
    pub type_name: Option<String>,
    /// Only the message of this identity (database queues).
    pub identity: Option<String>,
    /// Only messages of this FIFO group.
    pub group: Option<String>,
}

impl Listing {
    /// The first page of `status`, 50 messages.
    pub fn of(status: MessageStatus) -> Listing {
        Listing { status, after: None, limit: 50, type_name: None, identity: None, group: None }
    }

    /// Whether `report` passes the filters that need its body or fields.
    pub(crate) fn matches(&self, report: &MessageReport) -> bool {
        self.group.as_ref().is_none_or(|g| report.group_id.as_ref() == Some(g))
            && self.identity.as_ref().is_none_or(|i| report.identity.as_ref() == Some(i))
            && self.type_name.as_ref().is_none_or(|t| report.type_name().as_deref() == Some(t.as_str()))
    }
}

/// One page of a listing.
#[derive(Debug, Clone, Default)]
pub struct MessagePage {
    /// The messages, oldest first.
    pub messages: Vec<MessageReport>,
    /// The cursor of the next page, when there may be one.
    pub next: Option<String>,
}

/// Whether the queue is paused, and for whom.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum PauseScope {
    /// Every process of the queue's database honours the pause, within one
    /// poll interval (database queues).
    AllProcesses,
    /// Only this process's workers are paused (SQS, `memory://`).
    ThisProcess,
}

/// Listing, inspecting and acting on the messages of a queue, for an
/// operator's console (database queues and `memory://`).
pub trait Browse: Send + Sync {
    /// The statuses a message can have here, which [`Browse::list`] takes.
    fn statuses(&self) -> &'static [MessageStatus] {
        &MessageStatus::ALL
    }

    /// Whether messages carry an identity that listings can filter by
    /// (database queues: one row per identity).
    fn identities(&self) -> bool {
        true
    }

    /// Whether [`Browse::set_paused`] pauses the queue for every process.
    fn shares_pauses(&self) -> bool {
        true
    }

    /// How many messages `queue` holds, by status.
    fn counts<'a>(&'a self, queue: &'a str) -> BoxFuture<'a, Result<QueueCounts, TransportError>>;

    /// A page of the messages of `queue` that `listing` chooses, oldest first.
    fn list<'a>(&'a self, queue: &'a str, listing: &'a Listing) -> BoxFuture<'a, Result<MessagePage, TransportError>>;

    /// Makes the sleeping or pending messages with these ids due now (a
    /// delay or a retry's backoff cut short); how many were.
    fn retry_now<'a>(&'a self, queue: &'a str, ids: &'a [MessageId]) -> BoxFuture<'a, Result<usize, TransportError>>;

    /// Deletes the messages with these ids that are not in flight (pending,
    /// sleeping or dead letters), for good; how many there were.
    fn delete<'a>(&'a self, queue: &'a str, ids: &'a [MessageId]) -> BoxFuture<'a, Result<usize, TransportError>>;

    /// Moves the dead letters with these ids back to `queue`; how many moved.
    fn redrive_ids<'a>(&'a self, queue: &'a str, ids: &'a [MessageId]) -> BoxFuture<'a, Result<usize, TransportError>>;

    /// Pauses or resumes `queue` for every process, where the transport keeps
    /// the flag (database queues); `Ok(false)` where it does not (the
    /// pause is then this process's own).
    fn set_paused<'a>(&'a self, queue: &'a str, paused: bool) -> BoxFuture<'a, Result<bool, TransportError>> {
        let _ = (queue, paused);
        Box::pin(async { Ok(false) })
    }

    /// Whether `queue` is paused for every process (`None`: the transport
    /// keeps no such flag).
    fn paused<'a>(&'a self, queue: &'a str) -> BoxFuture<'a, Result<Option<bool>, TransportError>> {
        let _ = queue;
        Box::pin(async { Ok(None) })
    }
}

/// The refusal of a listing cursor that is not one.
pub(crate) fn bad_cursor(text: &str) -> TransportError {
    TransportError::Rejected(format!("`{text}` is not a page cursor: pass the `next` of the page before"))
}
