//! [`MessageContext`]: what a handler knows about the delivery it handles.

use std::sync::Arc;
use std::time::SystemTime;

use crate::transport::{Attributes, Delivery, MessageId};

/// Facts about the delivery being handled. Cheap to clone.
#[derive(Debug, Clone)]
pub struct MessageContext {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    queue: &'static str,
    system: &'static str,
    message_id: MessageId,
    receive_count: u32,
    group_id: Option<String>,
    attributes: Arc<Attributes>,
    sent_at: SystemTime,
    type_name: Option<String>,
    version: Option<u32>,
}

impl MessageContext {
    pub(crate) fn new(
        queue: &'static str,
        system: &'static str,
        delivery: &Delivery,
        type_name: Option<String>,
        version: Option<u32>,
    ) -> Self {
        MessageContext {
            inner: Arc::new(Inner {
                queue,
                system,
                message_id: delivery.message_id.clone(),
                receive_count: delivery.receive_count,
                group_id: delivery.group_id.clone(),
                attributes: delivery.attributes.clone(),
                sent_at: delivery.sent_at,
                type_name,
                version,
            }),
        }
    }

    /// The queue the message was received from.
    pub fn queue(&self) -> &'static str {
        self.inner.queue
    }

    /// The transport's `messaging.system` name (`memory`, `sqlite`, `aws_sqs`...).
    pub fn system(&self) -> &'static str {
        self.inner.system
    }

    /// The transport's id of the message (stable across redeliveries).
    pub fn message_id(&self) -> &str {
        &self.inner.message_id
    }

    /// How many times the message has been received, this time included.
    pub fn receive_count(&self) -> u32 {
        self.inner.receive_count
    }

    /// The FIFO message group id.
    pub fn group_id(&self) -> Option<&str> {
        self.inner.group_id.as_deref()
    }

    /// All message attributes.
    pub fn attributes(&self) -> &Attributes {
        &self.inner.attributes
    }

    /// One message attribute.
    pub fn attribute(&self, key: &str) -> Option<&str> {
        self.inner.attributes.get(key).map(String::as_str)
    }

    /// When the message was sent, as the transport recorded it.
    pub fn sent_at(&self) -> SystemTime {
        self.inner.sent_at
    }

    /// The envelope's logical type name; `None` for a bare body.
    pub fn type_name(&self) -> Option<&str> {
        self.inner.type_name.as_deref()
    }

    /// The version the message had on the wire (before upcasting); `None` for
    /// a bare body.
    pub fn wire_version(&self) -> Option<u32> {
        self.inner.version
    }

    /// The producer's W3C `traceparent`, if the message carries one.
    pub fn traceparent(&self) -> Option<&str> {
        self.attribute("traceparent")
    }
}
