//! What the macros register (through `inventory`), and the validated
//! [`Registry`] built from it at startup.

mod codec;
mod schedules;
mod validate;

use std::any::TypeId;
use std::sync::Arc;

pub use codec::{Decoded, Route, Routes};
pub use schedules::ScheduleEntry;
pub(crate) use schedules::Scheduled;
pub use validate::ValidationErrors;

use crate::extract::Requirement;
use crate::handler::{AnyMessage, ErasedHandler, IdempotencySpec, RetryPolicy};
use crate::queue::QueueSpec;

/// A queue declared with `#[messaging::queue]`.
#[derive(Debug)]
pub struct QueueEntry {
    /// The Rust type's path.
    pub type_name: &'static str,
    /// The queue's description.
    pub spec: fn() -> QueueSpec,
}

/// One version of a message type declared with `#[messaging::message]`.
#[derive(Debug)]
pub struct MessageEntry {
    /// The Rust type's path.
    pub type_name: &'static str,
    /// The Rust type's id.
    pub type_id: fn() -> TypeId,
    /// The logical name; `None` for a bare-body type.
    pub name: Option<&'static str>,
    /// The version.
    pub version: u32,
    /// The next version, for an older version (`upcast = T`).
    pub upcast: Option<Upcast>,
    /// Reads the JSON payload as this type.
    pub decode: DecodeFn,
    /// Reads JSON data as this type and writes it as it travels (the
    /// command line's `publish`).
    pub encode: fn(&[u8]) -> Result<crate::envelope::Encoded, serde_json::Error>,
}

/// Reads the JSON value at the start of the bytes as a message type: the
/// message, and the offset where the value ended.
pub type DecodeFn = fn(&[u8]) -> Result<(AnyMessage, usize), serde_json::Error>;

/// The edge from one version of a message to the next.
#[derive(Debug)]
pub struct Upcast {
    /// The target type's id.
    pub target: fn() -> TypeId,
    /// The target type's path.
    pub target_name: &'static str,
    /// Converts a decoded value of this version to the next (`From`).
    pub apply: fn(AnyMessage) -> Option<AnyMessage>,
}

/// A handler declared with `#[messaging::handler]`.
pub struct HandlerEntry {
    /// The function's path.
    pub name: &'static str,
    /// The queue's type path.
    pub queue_type: &'static str,
    /// The queue's description.
    pub queue: fn() -> QueueSpec,
    /// The message type's id.
    pub message_type: fn() -> TypeId,
    /// The message type's path.
    pub message_type_name: &'static str,
    /// The message's logical name (`None` for bare bodies).
    pub message_name: Option<&'static str>,
    /// The message's version.
    pub message_version: u32,
    /// Reads a JSON body as the message type (the legacy fallback of a
    /// single-type queue).
    pub decode: DecodeFn,
    /// `idempotent = "scope", lease = ".."`.
    pub idempotency: Option<IdempotencySpec>,
    /// `retry(base = "..", max = "..")`.
    pub retry: Option<RetryPolicy>,
    /// `timeout = ".."`: how long one run of the handler may take.
    pub timeout: Option<std::time::Duration>,
    /// The states its extractors need.
    pub requirements: fn() -> Vec<Requirement>,
    /// Builds the handler.
    pub handler: fn() -> Arc<dyn ErasedHandler>,
}

impl std::fmt::Debug for HandlerEntry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HandlerEntry")
            .field("name", &self.name)
            .field("queue", &self.queue_type)
            .finish_non_exhaustive()
    }
}

inventory::collect!(QueueEntry);
inventory::collect!(MessageEntry);
inventory::collect!(HandlerEntry);
inventory::collect!(ScheduleEntry);

/// Everything registered in this binary, checked: queues, message chains and
/// the routes of each queue.
#[derive(Debug)]
pub struct Registry {
    queues: Vec<QueueSpec>,
    routes: Vec<Arc<Routes>>,
    schedules: Vec<Arc<Scheduled>>,
}

impl Registry {
    /// Collects what the macros registered in this binary and validates it.
    pub fn from_inventory() -> Result<Registry, ValidationErrors> {
        let queues: Vec<&'static QueueEntry> = inventory::iter::<QueueEntry>.into_iter().collect();
        let messages: Vec<&'static MessageEntry> = inventory::iter::<MessageEntry>.into_iter().collect();
        let handlers: Vec<&'static HandlerEntry> = inventory::iter::<HandlerEntry>.into_iter().collect();
        let schedules: Vec<&'static ScheduleEntry> = inventory::iter::<ScheduleEntry>.into_iter().collect();
        validate::build(&queues, &messages, &handlers, &schedules)
    }

    /// Validates the given entries; every problem found is reported at once.
    pub fn build(
        queues: &[&'static QueueEntry],
        messages: &[&'static MessageEntry],
        handlers: &[&'static HandlerEntry],
    ) -> Result<Registry, ValidationErrors> {
        validate::build(queues, messages, handlers, &[])
    }

    /// Like [`Registry::build`] with schedules: each publishes to a declared
    /// queue, under a name no other schedule has.
    pub fn build_with_schedules(
        queues: &[&'static QueueEntry],
        messages: &[&'static MessageEntry],
        handlers: &[&'static HandlerEntry],
        schedules: &[&'static ScheduleEntry],
    ) -> Result<Registry, ValidationErrors> {
        validate::build(queues, messages, handlers, schedules)
    }

    /// The schedules, sorted by name.
    pub fn schedules(&self) -> impl Iterator<Item = &ScheduleEntry> + '_ {
        self.schedules.iter().map(|s| s.entry)
    }

    /// The schedules with their cadences, sorted by name.
    pub(crate) fn scheduled(&self) -> &[Arc<Scheduled>] {
        &self.schedules
    }

    /// The declared queues, sorted by name.
    pub fn queues(&self) -> &[QueueSpec] {
        &self.queues
    }

    /// The queues that have handlers, with their routes.
    pub fn routes(&self) -> &[Arc<Routes>] {
        &self.routes
    }

    /// Keeps only the handlers, and the schedules, of the named queues (for
    /// tools and tests).
    pub fn retain_queues(&mut self, keep: impl Fn(&str) -> bool) {
        self.routes.retain(|r| keep(r.spec().name));
        self.schedules.retain(|s| keep(s.spec.name));
    }
}

/// The message type names registered in this binary, sorted.
pub(crate) fn message_type_names() -> Vec<&'static str> {
    let mut names: Vec<&'static str> = inventory::iter::<MessageEntry>.into_iter().filter_map(|m| m.name).collect();
    names.sort_unstable();
    names.dedup();
    names
}
