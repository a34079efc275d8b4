//! The transport seam: one small trait every backend implements, plus the
//! [`DeadLetters`] capability.
//!
//! Backends are modules of this one: [`memory`] (always available). Everything
//! above this seam (publisher, worker, dead-letter tools) is backend-neutral.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use crate::error::TransportError;
use crate::queue::QueueSpec;

mod browse;
mod id;
mod json;
pub mod memory;
mod outbox;
mod outbox_store;
pub(crate) mod schedules;
#[cfg(any(feature = "sqlite", feature = "postgres"))]
pub(crate) mod sql;
#[cfg(feature = "sqs")]
pub mod sqs;
#[cfg(test)]
pub(crate) mod stub;
mod url;

pub(crate) use browse::{bad_cursor, held_past_lease};
pub use browse::{Browse, Listing, MessagePage, MessageStatus, PauseScope, QueueCounts};
pub use bytes::Bytes;
pub use id::MessageId;
pub use json::{decoded, rfc3339};
pub use outbox::{Outbox, DEFAULT_MAX_AGE};
// For the relay's tests, which run where both databases are built.
#[cfg(all(test, feature = "postgres", feature = "sqlite"))]
pub(crate) use outbox_store::OutboxStore;
pub(crate) use outbox_store::{Claimed, OutboxWrite, Settle, MESSAGE_ID_ATTRIBUTE, WAKE as OUTBOX_WAKE};
pub use outbox_store::{FailedOutboxRow, OutboxQueue};
pub use url::{connect, DEFAULT_URL};
pub(crate) use url::{connect_existing, refuse_new_file_without_tables, with_migrate};

pub use crate::boxed::BoxFuture;

/// The bodies one receive should bring, at most: the worker's pace asks
/// for this much by their average size, and a database queue's lease stops
/// at it by the bodies' lengths in the rows (`sql::LEASE_BODIES`).
///
/// Fast handlers ask for up to a transport's whole batch (1,000 on the
/// database queues). With bodies of 512 KiB that was a lease of half a
/// gigabyte: tried from outside, a consumer of 2,000 such messages on
/// PostgreSQL (concurrency 8, handlers that return at once) peaked at 2.05
/// GB of memory, as two receives ahead of the lanes held the whole backlog
/// (80 MB with this bound, in the same time).
/// SQS hands out 10 messages of at most 1 MiB a receive; 8 MiB a receive
/// keeps a batch of messages of up to 8 KiB whole, and a worker holds about
/// three receives' worth beside what its lanes handle.
pub(crate) const RECEIVE_BODIES: u64 = 8 * 1024 * 1024;

/// String attributes carried beside the body (type, version, trace context...).
pub type Attributes = BTreeMap<String, String>;

/// One `QueueNotFound` per item of a batch sent or acknowledged to `queue`.
pub(crate) fn unknown_queue<T, R>(queue: &str, items: &[T]) -> Vec<Result<R, TransportError>> {
    items.iter().map(|_| Err(TransportError::QueueNotFound(queue.to_owned()))).collect()
}

/// A message on its way to a queue.
#[derive(Debug, Clone, Default)]
pub struct Outgoing {
    /// The encoded body.
    pub body: Bytes,
    /// FIFO message group id.
    pub group_id: Option<String>,
    /// FIFO deduplication id (5-minute window).
    pub dedup_id: Option<String>,
    /// Per-message delay (standard queues).
    pub delay: Option<Duration>,
    /// Message attributes.
    pub attributes: Attributes,
    /// The message's identity (`#[message(id = ..)]` or `.id(..)`): one row per
    /// identity on database queues.
    pub identity: Option<String>,
    /// Priority on database queues (higher first); ignored elsewhere.
    pub priority: i32,
}

/// Proof of receipt of one delivery, used to settle it. Stale receipts (the
/// message was redelivered since) are rejected by the transport.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Receipt {
    pub(crate) key: u64,
    pub(crate) token: u64,
    /// Where the message was when received, for a transport that can go
    /// there without a lookup (PostgreSQL: the row version's tuple id); 0
    /// for none.
    pub(crate) locator: u64,
    /// The broker's receipt handle (Amazon SQS).
    pub(crate) handle: Option<Arc<str>>,
}

/// A message received from a queue.
#[derive(Debug, Clone)]
pub struct Delivery {
    /// The transport's message id (the one `send` returned).
    pub message_id: MessageId,
    /// The body as published.
    pub body: Bytes,
    /// Settles this delivery.
    pub receipt: Receipt,
    /// How many times the message has been received, this time included
    /// (the database queues count the attempts charged: see
    /// [`Transport::record_failure`]).
    pub receive_count: u32,
    /// FIFO message group id.
    pub group_id: Option<String>,
    /// Attributes as published.
    pub attributes: Arc<Attributes>,
    /// When the message was first sent.
    pub sent_at: SystemTime,
    /// Whether earlier leases of this message ran out before it was settled,
    /// twice while its consumer held other messages too or once while it ran
    /// alone (database queues): its consumer may have died of it. The worker
    /// runs a suspect alone in its process, after telling the transport
    /// ([`Transport::isolate`]). Always `false` where the transport cannot
    /// tell (SQS, `memory://`).
    pub suspect: bool,
}

/// One failed attempt of a message, as its error history keeps it (database
/// queues and `memory://` keep the last [`FailedAttempt::KEPT`]; on SQS the
/// last one travels as the dead letter's reason). Serialized with the field
/// names shown here: this is the `attempt` of the JSON that `dlq peek --json`
/// prints.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct FailedAttempt {
    /// Which receive of the message failed (1 for the first).
    pub attempt: u32,
    /// When, in milliseconds since the Unix epoch.
    pub at_ms: i64,
    /// The error's type ([`HandlerError::kind`](crate::HandlerError::kind)),
    /// or what the transport saw (`LeaseExpired`).
    #[serde(rename = "type")]
    pub error_type: String,
    /// The error's message, cut at [`FailedAttempt::MAX_MESSAGE`] characters.
    pub message: String,
}

impl FailedAttempt {
    /// How many failed attempts a message's history keeps (the last ones).
    pub const KEPT: usize = 10;
    /// The longest message kept, in characters.
    pub const MAX_MESSAGE: usize = 1_000;

    /// Attempt `attempt` failed now with an error of type `error_type`.
    pub fn new(attempt: u32, error_type: &str, message: &str) -> FailedAttempt {
        let at_ms = SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as i64);
        let message = match message.char_indices().nth(Self::MAX_MESSAGE) {
            Some((cut, _)) => format!("{}…", &message[..cut]),
            None => message.to_owned(),
        };
        FailedAttempt { attempt, at_ms, error_type: error_type.to_owned(), message }
    }

    /// The error's type as an operator reads it: `None` when the handler
    /// failed with a plain message (`HandlerError::permanent("…")`), whose
    /// recorded type is OpenTelemetry's `_OTHER`.
    pub fn shown_type(&self) -> Option<&str> {
        (self.error_type != crate::error::UNTYPED).then_some(self.error_type.as_str())
    }

    /// The reason a message is dead-lettered with after this attempt:
    /// `"{message} (after N attempts)"`.
    pub fn reason(&self) -> String {
        let plural = if self.attempt == 1 { "" } else { "s" };
        format!("{} (after {} attempt{plural})", self.message, self.attempt)
    }

    /// Appends `self` to `history`, keeping the last [`FailedAttempt::KEPT`].
    pub(crate) fn push_onto(self, history: &mut Vec<FailedAttempt>) {
        history.push(self);
        let extra = history.len().saturating_sub(Self::KEPT);
        history.drain(..extra);
    }
}

/// `attempt 2 at 2026-12-03T16:40:48.123Z: Timeout: the warehouse did not
/// answer`, as `dlq peek` and `show` print it (without the type when the
/// error was a plain message).
impl std::fmt::Display for FailedAttempt {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "attempt {} at {}: ", self.attempt, rfc3339(self.at_ms))?;
        if let Some(kind) = self.shown_type() {
            write!(f, "{kind}: ")?;
        }
        f.write_str(&self.message)
    }
}

/// One message as `app show` reports it: where it stands, its attempts and
/// their errors. Serialized with the field names shown here (the body apart:
/// the command line decodes it).
#[derive(Debug, Clone, serde::Serialize)]
pub struct MessageReport {
    /// The queue it is in (a dead letter: its source queue).
    pub queue: String,
    /// The transport's message id.
    #[serde(serialize_with = "as_str")]
    pub message_id: MessageId,
    /// Where it stands: `pending`, `sleeping`, `processing`,
    /// `awaiting_release`, `dead_letter`, `processed` on the database queues;
    /// `visible`, `delayed`, `in_flight`, `dead_letter` on `memory://`.
    pub status: String,
    /// Attempts of this version so far.
    pub attempts: u32,
    /// Its identity (`#[message(id = ..)]`), if any.
    pub identity: Option<String>,
    /// Its FIFO group, if any.
    pub group_id: Option<String>,
    /// When it was sent, in milliseconds since the Unix epoch.
    pub sent_at_ms: i64,
    /// Not handed out before this time (a delay or a retry's backoff).
    pub process_at_ms: Option<i64>,
    /// While a consumer holds it (in flight): when its lease or visibility
    /// ends and it comes back, unless settled first (also after that
    /// consumer crashed).
    pub held_until_ms: Option<i64>,
    /// The reason of its last failure (a dead letter's reason).
    pub reason: Option<String>,
    /// Whether it is a suspect: leases of it ran out before it was settled,
    /// so it runs alone when next received (database queues; see
    /// [`Delivery::suspect`]).
    pub suspect: bool,
    /// Its failed attempts, oldest first.
    pub history: Vec<FailedAttempt>,
    /// Its attributes.
    pub attributes: Attributes,
    /// The body as published.
    #[serde(skip)]
    pub body: Bytes,
    /// A newer version of its identity, waiting for the running handler to
    /// end (status `awaiting_release`, database queues).
    pub deferred: Option<DeferredVersion>,
    /// Where a listing goes on after this message (its cursor).
    #[serde(skip)]
    pub(crate) cursor: String,
}

/// The version of an identity that waits while an older one is handled.
#[derive(Debug, Clone, serde::Serialize)]
pub struct DeferredVersion {
    /// Its message id (the one its publish returned).
    pub message_id: String,
    /// When it was sent, in milliseconds since the Unix epoch.
    pub sent_at_ms: Option<i64>,
    /// Its body as published.
    #[serde(skip)]
    pub body: Bytes,
}

/// The envelope's type name and version, if `body` is an envelope.
fn envelope_of(body: &[u8]) -> Option<(String, u32)> {
    match crate::envelope::Incoming::parse(body) {
        Ok(crate::envelope::Incoming::Envelope { name, version, .. }) => Some((name.into_owned(), version)),
        _ => None,
    }
}

impl MessageReport {
    /// The envelope's type name and version, if the body is an envelope.
    pub fn envelope(&self) -> Option<(String, u32)> {
        envelope_of(&self.body)
    }

    /// The envelope's type name, if the body is an envelope.
    pub fn type_name(&self) -> Option<String> {
        self.envelope().map(|(name, _)| name)
    }
}

fn as_str<S: serde::Serializer>(id: &MessageId, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(id.as_str())
}

/// What [`Transport::send_now`] did with a message.
#[derive(Debug)]
#[non_exhaustive]
pub enum SendNow {
    /// Sent, or refused, at once: what [`Transport::send`] would return.
    Done(Result<MessageId, TransportError>),
    /// Not sent: the message, given back for [`Transport::send`].
    Later(Outgoing),
}

/// A queue backend. Calls name the queue by its declared name.
///
/// The worker relies on SQS-like semantics: a received message is invisible
/// for the queue's visibility timeout; it is deleted only by [`Transport::ack`];
/// a FIFO queue never hands out a message while an earlier one of its group
/// is in flight.
pub trait Transport: Send + Sync + 'static {
    /// The `messaging.system` name of the backend (`memory`, `sqlite`, `aws_sqs`...).
    fn system(&self) -> &'static str;

    /// Makes the queue (and its dead-letter queue) usable, checking that it exists
    /// with the declared kind where the backend cannot create it.
    fn declare<'a>(&'a self, spec: &'a QueueSpec) -> BoxFuture<'a, Result<(), TransportError>>;

    /// Sends one message; returns its id.
    fn send<'a>(&'a self, queue: &'a str, message: Outgoing) -> BoxFuture<'a, Result<MessageId, TransportError>>;

    /// Sends one message at once, when the backend can without waiting
    /// (`memory://` without a capacity): [`SendNow::Done`] with what
    /// [`Transport::send`] would have returned, or [`SendNow::Later`] with the
    /// message, for `send`. A typed send calls it from its first poll, so a
    /// backend that sends at once spares each message the boxed future of
    /// `send` and the moves into it. The default sends nothing now.
    fn send_now(&self, queue: &str, message: Outgoing) -> SendNow {
        let _ = queue;
        SendNow::Later(message)
    }

    /// Sends several messages; one result per input, in input order.
    fn send_batch<'a>(
        &'a self,
        queue: &'a str,
        messages: Vec<Outgoing>,
    ) -> BoxFuture<'a, Vec<Result<MessageId, TransportError>>>;

    /// Sends `messages` inside the application's open database transaction,
    /// whose connection is `conn` (a `PgConnection` or `SqliteConnection`
    /// inside a `sqlx::Transaction`): they are stored with the transaction,
    /// visible when it commits, gone if it rolls back. All or nothing: an
    /// error refuses the whole call (roll the transaction back). Only the
    /// database transports take it; the others refuse with a clear error.
    fn send_in<'a>(
        &'a self,
        queue: &'a str,
        messages: Vec<Outgoing>,
        conn: &'a mut (dyn std::any::Any + Send),
    ) -> BoxFuture<'a, Result<Vec<MessageId>, TransportError>> {
        let _ = (messages, conn);
        Box::pin(async move {
            Err(TransportError::Rejected(format!(
                "queue `{queue}` is on {}: publishing inside a database transaction needs a database queue \
                 (sqlite://, postgres://) on the transaction's database, or an outbox in that database \
                 (--outbox URL, MESSAGING_OUTBOX_URL, or setup.outbox(..))",
                self.system()
            )))
        })
    }

    /// Whether [`Transport::send_in`] takes a transaction whose connection is
    /// `conn`: a database queue on that kind of database. Otherwise a
    /// publish inside that transaction goes through the app's
    /// [`Outbox`], when one is configured.
    fn takes_transaction(&self, conn: &dyn std::any::Any) -> bool {
        let _ = conn;
        false
    }

    /// Receives up to `max` messages, waiting up to `wait` for the first one.
    fn receive<'a>(
        &'a self,
        queue: &'a str,
        max: usize,
        wait: Duration,
    ) -> BoxFuture<'a, Result<Vec<Delivery>, TransportError>>;

    /// Deletes settled messages; one result per receipt, in order.
    fn ack<'a>(&'a self, queue: &'a str, receipts: Vec<Receipt>) -> BoxFuture<'a, Vec<Result<(), TransportError>>>;

    /// Makes a delivery visible again after `delay` (zero releases it at once).
    ///
    /// On a database queue, a message whose row another transaction holds
    /// (an application's that updated or locked it and has not ended) is
    /// waited for as long as it is held; so are [`Transport::fail`], [`Transport::postpone`],
    /// [`Transport::record_failure`] and [`DeadLetters::dead_letter`]. Drop
    /// the future to give up: the message then comes back when its
    /// visibility runs out.
    fn nack<'a>(
        &'a self,
        queue: &'a str,
        receipt: Receipt,
        delay: Duration,
    ) -> BoxFuture<'a, Result<(), TransportError>>;

    /// Makes deliveries that were received and not handled visible again at
    /// once, without charging the attempt where the backend counts attempts
    /// (what [`Transport::nack`] with a zero delay does), in as few calls as
    /// the backend takes: what a worker gives back when it stops. One result
    /// per receipt, in order. The default calls `nack` for each.
    fn release<'a>(&'a self, queue: &'a str, receipts: Vec<Receipt>) -> BoxFuture<'a, Vec<Result<(), TransportError>>> {
        Box::pin(async move {
            let mut results = Vec::with_capacity(receipts.len());
            for receipt in receipts {
                results.push(self.nack(queue, receipt, Duration::ZERO).await);
            }
            results
        })
    }

    /// Whether a worker of `spec` gives a delivery it cannot read yet (a
    /// newer version of its message, or a type no handler here takes) back
    /// with [`Transport::postpone`], for a newer build of the consumer to
    /// take during a rolling deploy. The default is `false`: every consumer
    /// of the queue runs in this process (`memory://`), so none would read
    /// it. SQS says so for standard queues only: a FIFO message is given
    /// back with the rest of its group, and every receive counts against
    /// each of them toward the redrive policy.
    fn postpones(&self, spec: &QueueSpec) -> bool {
        let _ = spec;
        false
    }

    /// Makes a delivery that this consumer cannot read yet visible again
    /// after `delay`, for another consumer to take (see
    /// [`Transport::postpones`]), without charging the attempt where the
    /// backend counts attempts; `reason` is what it says of the message
    /// meanwhile where it keeps a last error (`show`, the console). The
    /// default calls `nack` (on SQS every receive counts anyway: see
    /// [`QueueSpec::redrive_after`]).
    fn postpone<'a>(
        &'a self,
        queue: &'a str,
        receipt: Receipt,
        delay: Duration,
        reason: &'a str,
    ) -> BoxFuture<'a, Result<(), TransportError>> {
        let _ = reason;
        self.nack(queue, receipt, delay)
    }

    /// Like [`Transport::nack`] after a failed attempt: also records
    /// `failure` in the message's error history, where the backend keeps one
    /// (the default only calls `nack`).
    fn fail<'a>(
        &'a self,
        queue: &'a str,
        receipt: Receipt,
        delay: Duration,
        failure: FailedAttempt,
    ) -> BoxFuture<'a, Result<(), TransportError>> {
        let _ = failure;
        self.nack(queue, receipt, delay)
    }

    /// Records `failure` in the error history of a delivery that stays held
    /// and is tried again by its holder (a FIFO message: its group waits for
    /// it), where the backend keeps a history. The database queues also
    /// charge that next try, as a receive charges its first, so that a
    /// release at shutdown gives back only a try not made. The default
    /// records nothing (on SQS the dead letter's reason is the last error,
    /// and its receive count counts receives).
    fn record_failure<'a>(
        &'a self,
        queue: &'a str,
        receipt: &'a Receipt,
        failure: FailedAttempt,
    ) -> BoxFuture<'a, Result<(), TransportError>> {
        let _ = (queue, receipt, failure);
        Box::pin(std::future::ready(Ok(())))
    }

    /// Records that the handler of `receipt`'s delivery, a suspect
    /// ([`Delivery::suspect`]), runs alone in its process from now: if its
    /// lease runs out from here, the message is what stopped the process,
    /// and the attempt counts (a lease that runs out while its consumer held
    /// other messages too is not counted against any of them). The default
    /// records nothing: only a transport that marks suspects needs it.
    fn isolate<'a>(&'a self, queue: &'a str, receipt: &'a Receipt) -> BoxFuture<'a, Result<(), TransportError>> {
        let _ = (queue, receipt);
        Box::pin(std::future::ready(Ok(())))
    }

    /// Takes back [`Transport::isolate`]: the suspect's handler did not run
    /// after all (another delivery holds its idempotency claim), and the
    /// worker keeps the message to try later while other handlers run; if
    /// its lease runs out from here, the attempt is not counted against it.
    /// The default records nothing, as [`Transport::isolate`]'s.
    fn rejoin<'a>(&'a self, queue: &'a str, receipt: &'a Receipt) -> BoxFuture<'a, Result<(), TransportError>> {
        let _ = (queue, receipt);
        Box::pin(std::future::ready(Ok(())))
    }

    /// Pushes the visibility timeout of an in-flight delivery out to `visibility` from now.
    fn extend<'a>(
        &'a self,
        queue: &'a str,
        receipt: &'a Receipt,
        visibility: Duration,
    ) -> BoxFuture<'a, Result<(), TransportError>>;

    /// [`Transport::extend`] for many in-flight deliveries, in as few calls
    /// as the backend takes: what the worker's heartbeat does for a batch's
    /// messages not yet settled with the transport. One result per receipt,
    /// in order. The default calls `extend` for each.
    fn extend_all<'a>(
        &'a self,
        queue: &'a str,
        receipts: Vec<Receipt>,
        visibility: Duration,
    ) -> BoxFuture<'a, Vec<Result<(), TransportError>>> {
        Box::pin(async move {
            let mut results = Vec::with_capacity(receipts.len());
            for receipt in &receipts {
                results.push(self.extend(queue, receipt, visibility).await);
            }
            results
        })
    }

    /// Ends the receives of `queue` that are waiting for messages now: they
    /// return at once with what they have (maybe nothing). The worker calls it
    /// at shutdown, then waits for its receives and gives back what they
    /// return. Backends that wait in the process (databases, memory) implement
    /// it; a server-side long poll (SQS) cannot be ended and is waited for
    /// (the worker keeps its wait within the grace period).
    fn interrupt_receives(&self, _queue: &str) {}

    /// Wakes this process's waiting receivers of every queue, to look again
    /// now: what [`Publisher::commit`](crate::Publisher::commit) does after
    /// the application's transaction committed messages that no signal
    /// announced (SQLite). Backends that need no such nudge ignore it.
    fn wake_receivers(&self) {}

    /// How many receives a worker keeps going ahead of its lanes on a
    /// standard queue (FIFO queues receive one batch at a time). A remote
    /// queue whose receive is a round trip gains from more; a database whose
    /// concurrent leases contend for the same rows keeps one; `0` receives
    /// only when a lane is free, for a transport whose receive costs no round
    /// trip.
    fn concurrent_receives(&self) -> usize {
        1
    }

    /// The most messages one receive/ack call handles.
    fn max_batch(&self) -> usize {
        10
    }

    /// The most messages one `send_batch` call takes ([`Publisher::send_batch`](crate::Publisher::send_batch)
    /// splits larger batches): by default [`Transport::max_batch`].
    fn max_send_batch(&self) -> usize {
        self.max_batch()
    }

    /// The longest per-message delay the backend accepts.
    fn max_delay(&self) -> Duration {
        Duration::from_secs(15 * 60)
    }

    /// Approximate number of messages in the queue, visible or not.
    fn depth<'a>(&'a self, queue: &'a str) -> BoxFuture<'a, Result<u64, TransportError>>;

    /// How many messages `queue` holds by status, as far as the backend can
    /// tell: [`Browse::counts`] where the backend has it, else only the dead
    /// letters' count (SQS overrides it with its approximate counts).
    fn counts<'a>(&'a self, queue: &'a str) -> BoxFuture<'a, Result<QueueCounts, TransportError>> {
        Box::pin(async move {
            if let Some(browse) = self.browse() {
                return browse.counts(queue).await;
            }
            let mut counts = QueueCounts::default();
            if let Some(dead) = self.dead_letters() {
                counts.dead = Some(dead.depth(queue).await?);
            }
            Ok(counts)
        })
    }

    /// The browsing capability (list, retry now, delete, pause for every
    /// process), if the backend has it: database queues and `memory://`.
    fn browse(&self) -> Option<&dyn Browse> {
        None
    }

    /// The dead-letter capability, if the backend has it.
    fn dead_letters(&self) -> Option<&dyn DeadLetters> {
        None
    }

    /// Whether messages of `spec` that fail for good can be moved aside:
    /// the queue declares a dead-letter queue, or the backend keeps dead
    /// letters itself (database queues: rows in `error`). Otherwise a failing
    /// message is retried with backoff for as long as it fails.
    fn keeps_dead_letters(&self, spec: &QueueSpec) -> bool {
        self.dead_letters().is_some() && spec.dlq.is_some()
    }

    /// An idempotency store that lives with this transport's data (the same
    /// database), used by default for `idempotent = ".."` handlers.
    fn idempotency_store(&self) -> Option<Arc<dyn crate::claims::IdempotencyStore>> {
        None
    }

    /// The ledger of the app's schedules in this transport's database
    /// (database queues): a tick's message is enqueued in the transaction
    /// that records the tick, so it publishes once across processes. The
    /// framework's own: another transport keeps the default (the app then
    /// keeps its ledger in its outbox's database, or in the process).
    #[doc(hidden)]
    #[allow(private_interfaces)]
    fn schedule_ledger(&self) -> Option<Arc<dyn schedules::ScheduleLedger>> {
        None
    }

    /// The message `id` of `queue` (or of its dead letters), if the backend
    /// can look one up (database queues and `memory://`).
    fn inspect<'a>(
        &'a self,
        queue: &'a str,
        id: &'a MessageId,
    ) -> BoxFuture<'a, Result<Option<MessageReport>, TransportError>> {
        let _ = id;
        Box::pin(async move {
            Err(TransportError::Unsupported(format!(
                "looking up one message of `{queue}` is not supported by the {} transport",
                self.system()
            )))
        })
    }

    /// Creates or upgrades the backend's tables (the `migrate` command);
    /// nothing to do for backends without a schema.
    fn migrate(&self) -> BoxFuture<'_, Result<(), TransportError>> {
        Box::pin(async { Ok(()) })
    }
}

/// A message in a dead-letter queue, as [`DeadLetters::peek`] shows it.
#[derive(Debug, Clone)]
pub struct DeadLetter {
    /// The transport's message id.
    pub message_id: MessageId,
    /// The body as published.
    pub body: Bytes,
    /// FIFO group id.
    pub group_id: Option<String>,
    /// Attributes as published.
    pub attributes: Arc<Attributes>,
    /// How many times it was received before it was dead-lettered (the
    /// database queues count the attempts charged, as for a delivery). On
    /// SQS, where the letter is a copy in the dead-letter queue, how many
    /// times that copy was received, peeks included: the attempts are in the
    /// reason.
    pub receive_count: u32,
    /// Why it was dead-lettered, when known.
    pub reason: Option<String>,
    /// Its failed attempts, oldest first (empty where the backend keeps none).
    pub history: Vec<FailedAttempt>,
}

impl DeadLetter {
    /// The envelope's type name, if the body is an envelope.
    pub fn type_name(&self) -> Option<String> {
        envelope_of(&self.body).map(|(name, _)| name)
    }
}

/// A predicate choosing dead letters.
pub type DeadLetterFilter = Arc<dyn Fn(&DeadLetter) -> bool + Send + Sync>;

/// Which dead letters a redrive (or a purge) takes, oldest first.
#[derive(Clone, Default)]
pub struct RedriveOptions {
    /// At most this many messages (all when `None`).
    pub max: Option<usize>,
    /// Only messages for which this returns true; the others stay.
    pub filter: Option<DeadLetterFilter>,
    /// Count what would be taken without changing anything.
    pub dry_run: bool,
}

impl RedriveOptions {
    /// The dead letters with these ids, and no others.
    pub fn of_ids(ids: &[MessageId]) -> RedriveOptions {
        let wanted = ids.to_vec();
        RedriveOptions {
            filter: Some(Arc::new(move |l: &DeadLetter| wanted.contains(&l.message_id))),
            ..Default::default()
        }
    }
}

impl std::fmt::Debug for RedriveOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedriveOptions")
            .field("max", &self.max)
            .field("filter", &self.filter.as_ref().map(|_| ".."))
            .field("dry_run", &self.dry_run)
            .finish()
    }
}

/// The result of a redrive.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RedriveOutcome {
    /// Messages moved back to the source queue (on a dry run: that would be).
    pub moved: usize,
    /// Messages left in the dead-letter queue by the filter.
    pub skipped: usize,
}

/// The result of a purge.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PurgeOutcome {
    /// Dead letters deleted (on a dry run: that would be).
    pub deleted: usize,
    /// Dead letters left by the filter.
    pub skipped: usize,
}

/// The error of a dead-letter operation a transport does not offer.
fn unsupported(what: &str, queue: &str) -> TransportError {
    TransportError::Unsupported(format!("{what} the dead letters of `{queue}` is not supported by this transport"))
}

/// Dead-letter operations of a backend.
pub trait DeadLetters: Send + Sync {
    /// Moves an in-flight delivery of `queue` to its dead-letter queue now,
    /// after `failure` (its reason: [`FailedAttempt::reason`]).
    fn dead_letter<'a>(
        &'a self,
        queue: &'a str,
        delivery: &'a Delivery,
        failure: FailedAttempt,
    ) -> BoxFuture<'a, Result<(), TransportError>>;

    /// Shows up to `max` dead letters of `queue` without removing them.
    fn peek<'a>(&'a self, queue: &'a str, max: usize) -> BoxFuture<'a, Result<Vec<DeadLetter>, TransportError>>;

    /// Moves dead letters back to `queue` (republish first, then delete).
    fn redrive<'a>(
        &'a self,
        queue: &'a str,
        options: RedriveOptions,
    ) -> BoxFuture<'a, Result<RedriveOutcome, TransportError>>;

    /// Number of dead letters of `queue`.
    fn depth<'a>(&'a self, queue: &'a str) -> BoxFuture<'a, Result<u64, TransportError>>;

    /// Deletes the dead letters of `queue` with these ids, for good; how
    /// many there were. (Database queues and `memory://`.)
    fn delete<'a>(&'a self, queue: &'a str, ids: &'a [MessageId]) -> BoxFuture<'a, Result<usize, TransportError>> {
        let _ = ids;
        Box::pin(async move { Err(unsupported("deleting", queue)) })
    }

    /// Deletes the dead letters of `queue` that `options` choose, for good
    /// (all of them by default; a dry run counts them). (Database queues and
    /// `memory://`.)
    fn purge<'a>(
        &'a self,
        queue: &'a str,
        options: RedriveOptions,
    ) -> BoxFuture<'a, Result<PurgeOutcome, TransportError>> {
        let _ = options;
        Box::pin(async move { Err(unsupported("purging", queue)) })
    }
}

/// Whether SQS carries `c` in a message body or attribute value: tab, line
/// feed, carriage return and every character from U+0020 up but U+FFFE and
/// U+FFFF (Rust strings hold no surrogates).
pub(crate) fn sqs_text_char(c: char) -> bool {
    matches!(c, '\t' | '\n' | '\r') || (c >= ' ' && c != '\u{FFFE}' && c != '\u{FFFF}')
}

#[cfg(test)]
mod tests {
    use super::FailedAttempt;

    #[test]
    fn a_failed_attempt_reads_with_its_type_unless_it_was_a_plain_message() {
        let typed = FailedAttempt { at_ms: 1_764_780_048_123, ..FailedAttempt::new(2, "Timeout", "no answer") };
        assert_eq!(typed.to_string(), "attempt 2 at 2025-12-03T16:40:48.123Z: Timeout: no answer");
        let error = crate::HandlerError::permanent("card declined");
        let plain = FailedAttempt { at_ms: 0, ..FailedAttempt::new(1, error.kind(), &error.to_string()) };
        assert_eq!(plain.shown_type(), None);
        assert_eq!(plain.to_string(), "attempt 1 at 1970-01-01T00:00:00.000Z: card declined");
    }
}
