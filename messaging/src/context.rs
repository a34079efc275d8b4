//! [`MessageContext`]: what a handler knows about the delivery it handles.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use crate::claims::ClaimState;
use crate::transport::{Attributes, Delivery};

/// The received batch a context points into (the worker's, which sits
/// above this module and implements it).
pub(crate) trait Received: Send + Sync {
    /// The delivery at `index`.
    fn delivery(&self, index: usize) -> &Delivery;
    /// How long the message at `index` stays invisible at least.
    fn visible_for(&self, index: usize) -> Duration;
    /// Has the heartbeat extend `claim` (by at most `cap`) while the handler runs.
    fn hold_claim(&self, claim: Arc<ClaimState>, cap: Duration);
    /// Stops extending `claim`.
    fn drop_claim(&self, claim: &Arc<ClaimState>);
}

/// Facts about the delivery being handled. Cheap to clone: it points into
/// the received batch rather than copying the delivery.
#[derive(Clone)]
pub struct MessageContext {
    batch: Arc<dyn Received>,
    index: usize,
    queue: &'static str,
    system: &'static str,
    type_name: Option<&'static str>,
    version: Option<u32>,
    claim: Option<Arc<ClaimState>>,
}

impl std::fmt::Debug for MessageContext {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MessageContext")
            .field("queue", &self.queue)
            .field("message_id", &self.message_id())
            .field("receive_count", &self.receive_count())
            .field("type_name", &self.type_name)
            .field("wire_version", &self.version)
            .finish_non_exhaustive()
    }
}

impl MessageContext {
    pub(crate) fn new(
        queue: &'static str,
        system: &'static str,
        batch: Arc<dyn Received>,
        index: usize,
        type_name: Option<&'static str>,
        version: Option<u32>,
    ) -> Self {
        MessageContext { batch, index, queue, system, type_name, version, claim: None }
    }

    /// The same context with the idempotency claim taken for this dispatch.
    pub(crate) fn with_claim(&self, claim: Arc<ClaimState>) -> Self {
        MessageContext { claim: Some(claim), ..self.clone() }
    }

    pub(crate) fn claim(&self) -> Option<Arc<ClaimState>> {
        self.claim.clone()
    }

    /// How long the message stays invisible at least.
    pub(crate) fn visible_for(&self) -> Duration {
        self.batch.visible_for(self.index)
    }

    /// Has the heartbeat extend `claim` (by at most `cap`) while the handler runs.
    pub(crate) fn hold_claim(&self, claim: Arc<ClaimState>, cap: Duration) {
        self.batch.hold_claim(claim, cap);
    }

    /// Stops extending `claim`.
    pub(crate) fn drop_claim(&self, claim: &Arc<ClaimState>) {
        self.batch.drop_claim(claim);
    }

    fn delivery(&self) -> &Delivery {
        self.batch.delivery(self.index)
    }

    /// The queue the message was received from.
    pub fn queue(&self) -> &'static str {
        self.queue
    }

    /// The transport's `messaging.system` name (`memory`, `sqlite`, `aws_sqs`...).
    pub fn system(&self) -> &'static str {
        self.system
    }

    /// The transport's id of the message (stable across redeliveries).
    pub fn message_id(&self) -> &str {
        &self.delivery().message_id
    }

    /// How many times the message has been received, this time included.
    /// On the database queues, the attempts charged so far, this one
    /// included: a FIFO message that a worker tried again without a new
    /// receive counts each try.
    pub fn receive_count(&self) -> u32 {
        self.delivery().receive_count
    }

    /// The FIFO message group id.
    pub fn group_id(&self) -> Option<&str> {
        self.delivery().group_id.as_deref()
    }

    /// All message attributes.
    pub fn attributes(&self) -> &Attributes {
        &self.delivery().attributes
    }

    /// One message attribute.
    pub fn attribute(&self, key: &str) -> Option<&str> {
        self.delivery().attributes.get(key).map(String::as_str)
    }

    /// When the message was sent, as the transport recorded it.
    pub fn sent_at(&self) -> SystemTime {
        self.delivery().sent_at
    }

    /// The envelope's logical type name; `None` for a bare body.
    pub fn type_name(&self) -> Option<&'static str> {
        self.type_name
    }

    /// The version the message had on the wire (before upcasting); `None` for
    /// a bare body.
    pub fn wire_version(&self) -> Option<u32> {
        self.version
    }

    /// The producer's W3C `traceparent`, if the message carries one.
    pub fn traceparent(&self) -> Option<&str> {
        self.attribute("traceparent")
    }

    /// The producer's span context (from `traceparent` and `tracestate`), if
    /// the message carries a valid one. The framework's consumer span already
    /// continues that trace; use this to parent or link spans of your own.
    pub fn producer_context(&self) -> Option<opentelemetry::trace::SpanContext> {
        crate::telemetry::extract_span_context(&self.delivery().attributes)
    }
}
