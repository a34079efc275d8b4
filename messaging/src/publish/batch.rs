//! [`BatchBuilder`]: many messages, one result each.

use std::future::Future;
use std::marker::PhantomData;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use super::state::{DelaySupported, GroupResolved, Grouped, Ungrouped};
use super::{Publisher, SendOptions};
use crate::error::PublishError;
use crate::message::Message;
use crate::queue::Queue;
use crate::transport::MessageId;
use tracing::Instrument as _;

/// A send of several messages to queue `Q`. `.await` gives one result per
/// message in input order; a failure of one does not stop the others.
/// Created by [`Publisher::send_batch`].
#[must_use = "a send does nothing until it is `.await`ed"]
pub struct BatchBuilder<'a, Q, M, G> {
    publisher: &'a Publisher,
    messages: &'a [M],
    options: SendOptions,
    sending: Option<Sending<'a, Vec<Result<MessageId, PublishError>>>>,
    _state: PhantomData<fn() -> (Q, G)>,
}

impl<'a, Q: Queue, M: Message> BatchBuilder<'a, Q, M, Ungrouped> {
    pub(super) fn new(publisher: &'a Publisher, messages: &'a [M]) -> Self {
        BatchBuilder { publisher, messages, options: SendOptions::default(), sending: None, _state: PhantomData }
    }
}

impl<'a, Q: Queue, M: Message, G> BatchBuilder<'a, Q, M, G> {
    /// Sets the FIFO message group id of every message of the batch.
    pub fn group(self, group: impl Into<String>) -> BatchBuilder<'a, Q, M, Grouped> {
        let mut options = self.options;
        options.group = Some(group.into());
        BatchBuilder { publisher: self.publisher, messages: self.messages, options, sending: None, _state: PhantomData }
    }

    /// Adds a message attribute to every message.
    pub fn attribute(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.options.attributes.insert(key.into(), value.into());
        self
    }

    /// Delays delivery of every message (standard queues only).
    pub fn delay(mut self, delay: Duration) -> Self
    where
        Q::Kind: DelaySupported<Q>,
    {
        self.options.delay = Some(delay);
        self
    }
}

impl<'a, Q, M, G> Future for BatchBuilder<'a, Q, M, G>
where
    Q: Queue,
    M: Message,
    G: 'a,
    (Q::Kind, G, Q::HasDefaultGroup, M::HasGroup): GroupResolved<Q, M>,
{
    type Output = Vec<Result<MessageId, PublishError>>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.get_mut();
        if this.sending.is_none() {
            this.sending = Some(this.start());
        }
        match this.sending.as_mut() {
            Some(sending) => sending.as_mut().poll(cx),
            None => Poll::Pending, // just set above
        }
    }
}

impl<'a, Q, M, G> BatchBuilder<'a, Q, M, G>
where
    Q: Queue,
    M: Message,
    G: 'a,
    (Q::Kind, G, Q::HasDefaultGroup, M::HasGroup): GroupResolved<Q, M>,
{
    /// Publishes every message inside the application's open transaction
    /// `tx` (see [`SendBuilder::in_transaction`](super::SendBuilder::in_transaction)):
    /// all of them or, on an error, none; the ids in input order.
    #[cfg(any(feature = "postgres", feature = "sqlite"))]
    pub async fn in_transaction<DB: crate::transport::sql::Dialect>(
        self,
        tx: &mut sqlx::Transaction<'_, DB>,
    ) -> Result<Vec<MessageId>, PublishError> {
        let max_delay = self.publisher.transport.max_delay();
        let outgoing = self
            .messages
            .iter()
            .map(|m| self.options.outgoing(&Q::SPEC, m, max_delay))
            .collect::<Result<Vec<_>, _>>()?;
        super::single::send_in(self.publisher, (Q::SPEC.name, Q::SPEC.fifo), outgoing, &mut **tx).await
    }
}

impl<'a, Q, M, G> BatchBuilder<'a, Q, M, G>
where
    Q: Queue,
    M: Message,
    G: 'a,
{
    fn start(&self) -> Sending<'a, Vec<Result<MessageId, PublishError>>> {
        let transport = self.publisher.transport.clone();
        let telemetry = self.publisher.telemetry.clone();
        let (system, queue) = (transport.system(), Q::SPEC.name);
        let span = crate::telemetry::producer_span(system, queue, self.messages.len());
        let max_delay = transport.max_delay();
        let n = self.messages.len();
        let mut results: Vec<Option<Result<MessageId, PublishError>>> = Vec::with_capacity(n);
        // The encoded messages and their places in the input, apart: a batch
        // that fits one transport call goes as it is (pairs unzipped per
        // chunk were every message moved once more).
        let (mut indices, mut outgoing) = (Vec::with_capacity(n), Vec::with_capacity(n));
        for (index, message) in self.messages.iter().enumerate() {
            match self.options.outgoing(&Q::SPEC, message, max_delay) {
                Ok(encoded) => {
                    results.push(None);
                    indices.push(index);
                    outgoing.push(encoded);
                }
                Err(e) => results.push(Some(Err(e))),
            }
        }
        if let Some(withheld) = &self.publisher.withheld {
            withheld.record(queue, outgoing.len());
            let results = results.into_iter().map(|r| r.unwrap_or_else(|| Ok(MessageId::random()))).collect();
            return Box::pin(std::future::ready(results));
        }
        let producer = span.clone();
        let sending = async move {
            for message in outgoing.iter_mut() {
                crate::telemetry::inject(&producer, &mut message.attributes);
            }
            let chunk = transport.max_send_batch().max(1);
            let mut indices = indices.into_iter();
            while !outgoing.is_empty() {
                let rest = if outgoing.len() > chunk { outgoing.split_off(chunk) } else { Vec::new() };
                let batch = std::mem::replace(&mut outgoing, rest);
                let count = batch.len();
                let sent = transport.send_batch(Q::SPEC.name, batch).await;
                let mut sent = sent.into_iter();
                for index in indices.by_ref().take(count) {
                    let result = sent.next().unwrap_or_else(|| {
                        Err(crate::error::TransportError::Backend(
                            "the transport returned too few batch results".into(),
                        ))
                    });
                    results[index] = Some(result.map_err(PublishError::from));
                }
            }
            let results: Vec<_> = results
                .into_iter()
                .map(|r| r.unwrap_or(Err(PublishError::Transport(crate::error::TransportError::Closed))))
                .collect();
            telemetry.published(&producer, system, queue, &results);
            results
        };
        Box::pin(sending.instrument(span))
    }
}

/// The boxed send in progress.
type Sending<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;
