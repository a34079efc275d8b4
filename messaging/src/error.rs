//! Error types. Each is a value the caller can branch on; nothing in the
//! framework panics on bad input.

use std::time::Duration;

/// A shorthand for results whose error is the framework's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Errors of assembly, configuration, startup validation and transports.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// Startup validation found one or more problems; all of them are listed.
    #[error("{0}")]
    Validation(#[from] ValidationErrors),
    /// The transport URL could not be understood.
    #[error("invalid transport URL `{url}`: {reason}")]
    Config {
        /// The URL as given.
        url: String,
        /// What is wrong with it and how to fix it.
        reason: String,
    },
    /// A transport operation failed.
    #[error(transparent)]
    Transport(#[from] TransportError),
    /// The setup hook of `#[messaging::main]` returned an error.
    #[error("setup failed: {0}")]
    Setup(Box<dyn std::error::Error + Send + Sync>),
    /// Telemetry or the HTTP endpoint could not be set up.
    #[error("telemetry: {0}")]
    Telemetry(String),
    /// A publish from the command line failed.
    #[error(transparent)]
    Publish(#[from] PublishError),
    /// A command-line argument names something that does not exist or does
    /// not fit; the message says what is known.
    #[error("{0}")]
    Command(String),
    /// A shutdown signal stopped the command line part way: a second one
    /// before the app's handlers finished, or one during a `dlq redrive` or
    /// `purge` (it exits with status 130).
    #[error("stopped by a shutdown signal")]
    Interrupted,
}

/// A failure reported by a transport backend.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum TransportError {
    /// The named queue is not known to the transport: not declared on it
    /// in this process, or (SQS) missing from the account.
    #[error(
        "queue `{0}` is not declared on this transport: `App::new(transport)` declares every \
         #[messaging::queue] of the program; a transport used without an app needs \
         `transport.declare(&Queue::SPEC)` first"
    )]
    QueueNotFound(String),
    /// The transport refuses the request as given: a message too large, a
    /// delay on a FIFO queue, a missing group id, a queue that exists unlike
    /// its declaration, a transaction on another database... The text is a
    /// whole sentence naming what was refused and why. (It read "message
    /// rejected: ..." before, which misnamed every refusal that was not of a
    /// message.)
    #[error("{0}")]
    Rejected(String),
    /// The transport does not offer this operation (`dlq purge` on SQS,
    /// say): nothing was done, and trying again does the same.
    #[error("{0}")]
    Unsupported(String),
    /// The receipt of a delivery is no longer valid (its visibility expired and
    /// it was delivered again, or it was already acknowledged).
    #[error("the receipt is stale: the message was redelivered or already settled")]
    StaleReceipt,
    /// The transport has been shut down.
    #[error("the transport is closed")]
    Closed,
    /// A bounded queue (`memory://?capacity=N`) stayed full for as long as a
    /// publish may wait: its consumers are behind.
    #[error(
        "queue `{queue}` is full ({capacity} messages) and had no room within {} ms: its consumers are \
         behind; publish again later, or raise the capacity", waited.as_millis()
    )]
    Full {
        /// The queue.
        queue: String,
        /// Its capacity.
        capacity: usize,
        /// How long the publish waited for room.
        waited: Duration,
    },
    /// A message's row is held by another transaction on the database, such
    /// as an application transaction that updated or locked it and has not
    /// ended: this call gave up waiting for it after a moment. Tried again,
    /// it goes through once that transaction ends (the worker does so for
    /// acknowledgements, without holding up the others; a nack, a failure
    /// or a dead letter waits for the row itself: see [`Transport::nack`]).
    ///
    /// [`Transport::nack`]: crate::transport::Transport::nack
    #[error("{0}")]
    Held(String),
    /// Any other backend failure.
    #[error("{0}")]
    Backend(String),
}

/// The least time between two tries of a settlement (an acknowledgement, a
/// retry, a dead letter) refused as [`TransportError::Held`]: a try that
/// waited its moment for the row (twice 450 ms on PostgreSQL, queued
/// behind another of ours) goes on at once, so that a try is almost always
/// in line when the row is let go.
pub(crate) const HELD_PAUSE: Duration = Duration::from_millis(500);

/// How often at most each place that meets a row another transaction holds
/// ([`TransportError::Held`]) says so: the acker's lane, the heartbeat, a
/// transport's settlement, a suspect's mark. Each try fails for as long as
/// the row is held (17 warnings a minute from the heartbeat alone on a
/// 10 s visibility, tried from outside).
pub(crate) const HELD_WARNING: Duration = Duration::from_secs(60);

/// Why a publish failed. Publishing never panics: every failure is one of these.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PublishError {
    /// The message could not be serialized.
    #[error("could not serialize the message: {0}")]
    Serialize(#[from] serde_json::Error),
    /// The delay exceeds what the queue supports.
    #[error("delay of {requested:?} exceeds the maximum of {max:?}")]
    DelayTooLong {
        /// The delay asked for.
        requested: Duration,
        /// The largest delay the transport accepts.
        max: Duration,
    },
    /// A delay was asked for on a FIFO queue, which has none per message
    /// (the typed API does not compile such a send; this is the command
    /// line's error).
    #[error("FIFO queue `{queue}` takes no per-message delay")]
    DelayOnFifo {
        /// The queue's name.
        queue: &'static str,
    },
    /// A FIFO queue got an empty group id.
    #[error("FIFO queue `{queue}` needs a non-empty message group id")]
    EmptyGroup {
        /// The queue's name.
        queue: &'static str,
    },
    /// An identity, group id or deduplication id is empty, too long or has
    /// characters that not every transport accepts.
    #[error("invalid {field}: {reason}")]
    InvalidId {
        /// `identity`, `group id` or `deduplication id`.
        field: &'static str,
        /// What is wrong.
        reason: String,
    },
    /// More attributes than [`MAX_ATTRIBUTES`](crate::publish::MAX_ATTRIBUTES)
    /// were set with `.attribute(..)`.
    #[error(
        "a message carries at most {max} attributes (SQS takes 10; two are kept for the trace context); this one has {count}"
    )]
    TooManyAttributes {
        /// How many were set.
        count: usize,
        /// The most a message may carry.
        max: usize,
    },
    /// An attribute set with `.attribute(..)` has a name or value that not
    /// every transport carries (the Amazon SQS rules, applied everywhere).
    #[error("invalid attribute `{name}`: {reason}")]
    InvalidAttribute {
        /// The attribute's name.
        name: String,
        /// What is wrong, and what to do.
        reason: String,
    },
    /// The transport refused or failed the send.
    #[error(transparent)]
    Transport(#[from] TransportError),
}

impl PublishError {
    /// The failure's `error.type` for metrics and spans.
    pub fn kind(&self) -> &'static str {
        match self {
            PublishError::Serialize(_) => "Serialize",
            PublishError::DelayTooLong { .. } => "DelayTooLong",
            PublishError::DelayOnFifo { .. } => "DelayOnFifo",
            PublishError::EmptyGroup { .. } => "EmptyGroup",
            PublishError::InvalidId { .. } => "InvalidId",
            PublishError::TooManyAttributes { .. } => "TooManyAttributes",
            PublishError::InvalidAttribute { .. } => "InvalidAttribute",
            PublishError::Transport(TransportError::QueueNotFound(_)) => "QueueNotFound",
            PublishError::Transport(TransportError::Rejected(_)) => "Rejected",
            PublishError::Transport(TransportError::Full { .. }) => "QueueFull",
            PublishError::Transport(_) => "TransportError",
        }
    }
}

/// The error a handler returns. By default a failure is *transient*: the
/// message is retried with backoff until the queue's receive limit moves it to
/// the dead-letter queue. [`HandlerError::permanent`] dead-letters at once.
#[derive(Debug)]
pub struct HandlerError {
    source: Box<dyn std::error::Error + Send + Sync>,
    /// The error's type name (without its path), for `error.type`.
    type_name: &'static str,
    permanent: bool,
    retry_after: Option<Duration>,
}

impl HandlerError {
    /// A transient failure: the message will be delivered again after a backoff.
    pub fn transient<E: Into<Box<dyn std::error::Error + Send + Sync>>>(error: E) -> Self {
        HandlerError { source: error.into(), type_name: short_type_name::<E>(), permanent: false, retry_after: None }
    }

    /// A permanent failure: retrying cannot help, so the message goes to the
    /// dead-letter queue at once.
    pub fn permanent<E: Into<Box<dyn std::error::Error + Send + Sync>>>(error: E) -> Self {
        HandlerError { source: error.into(), type_name: short_type_name::<E>(), permanent: true, retry_after: None }
    }

    /// A transient failure that asks to be retried after `delay` instead of the
    /// computed backoff.
    pub fn retry_after<E: Into<Box<dyn std::error::Error + Send + Sync>>>(error: E, delay: Duration) -> Self {
        HandlerError {
            source: error.into(),
            type_name: short_type_name::<E>(),
            permanent: false,
            retry_after: Some(delay),
        }
    }

    /// Whether this failure sends the message to the dead-letter queue at once.
    pub fn is_permanent(&self) -> bool {
        self.permanent
    }

    /// The delay the handler asked for, if any.
    pub fn requested_delay(&self) -> Option<Duration> {
        self.retry_after
    }

    /// The failure's `error.type` for metrics and spans: the name of the
    /// error's type (`MessageInProgress`, `sqlx::Error` gives `Error`...), or
    /// `_OTHER` for a plain message (`&str`, `String`), as the OpenTelemetry
    /// conventions ask.
    pub fn kind(&self) -> &'static str {
        self.type_name
    }

    /// The underlying error.
    pub fn source_error(&self) -> &(dyn std::error::Error + Send + Sync + 'static) {
        &*self.source
    }
}

impl std::fmt::Display for HandlerError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Display::fmt(&self.source, f)
    }
}

/// The `error.type` of a failure whose error has no telling type (a plain
/// message, a boxed error), as the OpenTelemetry conventions name it.
pub(crate) const UNTYPED: &str = "_OTHER";

/// The last path segment of `E`'s name without generic arguments; `_OTHER`
/// for strings and boxed errors, whose type says nothing about the failure.
fn short_type_name<E>() -> &'static str {
    let full = std::any::type_name::<E>();
    let bare = full.split('<').next().unwrap_or(full);
    let name = bare.rsplit("::").next().unwrap_or(bare);
    match name {
        "" | "&str" | "str" | "String" | "Box" | "Cow" => UNTYPED,
        name if name.starts_with('&') => UNTYPED,
        name => name,
    }
}

/// `?` inside a handler turns any error into a transient failure: every
/// `std::error::Error + Send + Sync`, `anyhow::Error`, `Box<dyn Error + Send +
/// Sync>`, `String` and `&str` (whatever converts into a boxed error).
/// ([`HandlerError::permanent`] stays explicit.) Like `anyhow::Error`,
/// `HandlerError` itself does not implement `std::error::Error`, which is what
/// makes this one blanket conversion possible.
impl<E> From<E> for HandlerError
where
    E: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    fn from(error: E) -> Self {
        HandlerError::transient(error)
    }
}

/// Every problem startup validation found, before anything was consumed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ValidationErrors {
    problems: Vec<String>,
}

impl ValidationErrors {
    /// The problems, one sentence each.
    pub fn problems(&self) -> &[String] {
        &self.problems
    }

    pub(crate) fn new(problems: Vec<String>) -> Self {
        ValidationErrors { problems }
    }
}

impl std::fmt::Display for ValidationErrors {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(f, "startup validation found {} problem(s):", self.problems.len())?;
        for (i, p) in self.problems.iter().enumerate() {
            writeln!(f, "  {}. {p}", i + 1)?;
        }
        Ok(())
    }
}

impl std::error::Error for ValidationErrors {}
