//! Publishing a message whose type is known only at run time: JSON data read
//! as a registered type (the command line's `publish`), under the same rules
//! and telemetry as a typed send.

use std::time::Duration;

use super::{single, Publisher, SendOptions};
use crate::envelope::Encoded;
use crate::error::PublishError;
use crate::queue::QueueSpec;
use crate::transport::{Attributes, MessageId};

/// The options of a send built at run time.
#[derive(Debug, Default)]
pub(crate) struct EncodedSend {
    /// The FIFO group, over the message's own and the queue's default.
    pub(crate) group: Option<String>,
    /// The identity (and deduplication id), over the message's own.
    pub(crate) identity: Option<String>,
    /// A delay, on standard queues only.
    pub(crate) delay: Option<Duration>,
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
        let options = SendOptions {
            group: send.group,
            identity: send.identity,
            delay: send.delay,
            attributes: send.attributes,
            ..SendOptions::default()
        };
        let outgoing = options.outgoing_encoded(spec, message, self.transport.max_delay());
        single::send_one(self, spec.name, outgoing).await
    }
}
