//! Publishing a message whose type is known only at run time: JSON data read
//! as a registered type (the command line's `publish`), under the same rules
//! and telemetry as a typed send.

use std::time::Duration;

use super::{single, Publisher, SendOptions};
use crate::envelope::Encoded;
use crate::error::PublishError;
use crate::queue::QueueSpec;
use crate::transport::{Attributes, MessageId, Outgoing};

/// The options of a send built at run time.
#[derive(Debug, Default)]
pub(crate) struct EncodedSend {
    /// The FIFO group, over the message's own and the queue's default.
    pub(crate) group: Option<String>,
    /// The identity (and deduplication id), over the message's own.
    pub(crate) identity: Option<String>,
    /// A delay, on standard queues only.
    pub(crate) delay: Option<Duration>,
    /// The deduplication id, over the identity.
    pub(crate) dedup_id: Option<String>,
    /// Message attributes.
    pub(crate) attributes: Attributes,
}

impl Publisher {
    /// Sends `message` to the queue `spec` as a typed send would: group from
    /// the options, then the message, then the queue's default; ids and
    /// attributes checked; no delay on a FIFO queue
    /// ([`SendOptions::outgoing_encoded`]).
    pub(crate) async fn send_encoded(
        &self,
        spec: &QueueSpec,
        message: Encoded,
        send: EncodedSend,
    ) -> Result<MessageId, PublishError> {
        let outgoing = self.outgoing_encoded(spec, message, send);
        single::send_one(self, spec.name, outgoing).await
    }

    /// The message a send of `message` to `spec` with `send` would carry,
    /// checked by the rules of [`Publisher::send_encoded`], for a caller
    /// that sends it later ([`Publisher::send_outgoing`]).
    pub(crate) fn outgoing_encoded(
        &self,
        spec: &QueueSpec,
        message: Encoded,
        send: EncodedSend,
    ) -> Result<Outgoing, PublishError> {
        let options = SendOptions {
            group: send.group,
            identity: send.identity,
            dedup_id: send.dedup_id,
            delay: send.delay,
            attributes: send.attributes,
            ..SendOptions::default()
        };
        options.outgoing_encoded(spec, message, self.transport.max_delay())
    }

    /// Sends `outgoing` to `spec` with the producer span and metrics of any
    /// send: inside the open transaction whose connection is `conn` (on the
    /// transport when it takes it, else into the outbox), or by itself.
    pub(crate) async fn send_outgoing(
        &self,
        spec: &QueueSpec,
        outgoing: Outgoing,
        conn: Option<&mut (dyn std::any::Any + Send)>,
    ) -> Result<Vec<MessageId>, PublishError> {
        match conn {
            Some(conn) => single::send_in(self, (spec.name, spec.fifo), vec![outgoing], conn).await,
            None => single::send_one(self, spec.name, Ok(outgoing)).await.map(|id| vec![id]),
        }
    }
}
