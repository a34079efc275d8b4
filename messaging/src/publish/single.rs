//! [`SendBuilder`]: one message.

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
use crate::transport::{MessageId, SendNow};
use tracing::Instrument as _;

/// A send of one message to queue `Q`, configured by chained calls and sent by
/// `.await` (the builder is itself the future). Created by [`Publisher::send`].
#[must_use = "a send does nothing until it is `.await`ed"]
pub struct SendBuilder<'a, Q, M, G> {
    publisher: &'a Publisher,
    message: &'a M,
    options: SendOptions,
    sending: Option<Sending<'a, Result<MessageId, PublishError>>>,
    _state: PhantomData<fn() -> (Q, G)>,
}

impl<'a, Q: Queue, M: Message> SendBuilder<'a, Q, M, Ungrouped> {
    pub(super) fn new(publisher: &'a Publisher, message: &'a M) -> Self {
        SendBuilder { publisher, message, options: SendOptions::default(), sending: None, _state: PhantomData }
    }
}

impl<'a, Q: Queue, M: Message, G> SendBuilder<'a, Q, M, G> {
    /// Sets the FIFO message group id (messages of one group are handled in order).
    pub fn group(self, group: impl Into<String>) -> SendBuilder<'a, Q, M, Grouped> {
        let mut options = self.options;
        options.group = Some(group.into());
        SendBuilder { publisher: self.publisher, message: self.message, options, sending: None, _state: PhantomData }
    }

    /// Sets the deduplication id (FIFO queues drop a repeat within five minutes).
    /// Defaults to the message's identity (`#[message(id = field)]`).
    pub fn dedup_id(mut self, id: impl Into<String>) -> Self {
        self.options.dedup_id = Some(id.into());
        self
    }

    /// Sets the message's identity (default: its `#[message(id = ..)]` field).
    /// On database queues there is at most one message per identity: a new
    /// enqueue updates it. On FIFO queues it is also the deduplication id.
    pub fn id(mut self, identity: impl Into<String>) -> Self {
        self.options.identity = Some(identity.into());
        self
    }

    /// Sets the priority on database queues (higher is handled first; default 0).
    pub fn priority(mut self, priority: i32) -> Self {
        self.options.priority = priority;
        self
    }

    /// Adds a message attribute.
    pub fn attribute(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.options.attributes.insert(key.into(), value.into());
        self
    }

    /// Delays delivery (standard queues only, at most 15 minutes on SQS).
    pub fn delay(mut self, delay: Duration) -> Self
    where
        Q::Kind: DelaySupported<Q>,
    {
        self.options.delay = Some(delay);
        self
    }
}

impl<'a, Q, M, G> Future for SendBuilder<'a, Q, M, G>
where
    Q: Queue,
    M: Message,
    G: 'a,
    (Q::Kind, G, Q::HasDefaultGroup, M::HasGroup): GroupResolved<Q, M>,
{
    type Output = Result<MessageId, PublishError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.get_mut();
        if this.sending.is_none() {
            match this.start() {
                Begun::Done(sent) => return Poll::Ready(sent),
                Begun::Sending(sending) => this.sending = Some(sending),
            }
        }
        match this.sending.as_mut() {
            Some(sending) => sending.as_mut().poll(cx),
            None => Poll::Pending, // just set above
        }
    }
}

impl<'a, Q, M, G> SendBuilder<'a, Q, M, G>
where
    Q: Queue,
    M: Message,
    G: 'a,
    (Q::Kind, G, Q::HasDefaultGroup, M::HasGroup): GroupResolved<Q, M>,
{
    /// Publishes inside the application's open transaction `tx`, on the
    /// database of a `sqlite://` or `postgres://` queue: the message is
    /// stored with the transaction (with the identity rules of any send),
    /// invisible until it commits, and gone if it rolls back. On PostgreSQL
    /// receivers are woken when it commits (one `NOTIFY` per transaction);
    /// on SQLite commit with [`Publisher::commit`] to wake this process's
    /// receivers (otherwise they find it at their next poll). An
    /// error means nothing was written for this call: roll back, or go on
    /// without the message. A queue on another transport (SQS,
    /// `memory://`, another database) goes through the app's
    /// [`Outbox`](crate::transport::Outbox) in the transaction's database
    /// when it has one, and is refused otherwise.
    ///
    /// ```rust,no_run
    /// # use messaging::prelude::*;
    /// # #[messaging::queue("orders-tx")] struct Orders;
    /// # #[messaging::message(name = "order.placed.tx", v = 1)]
    /// # #[derive(Debug, Clone, Serialize, Deserialize)] struct OrderPlaced { id: u32 }
    /// # async fn place(pool: messaging::sqlx::PgPool, publisher: Publisher) -> Result<(), Box<dyn std::error::Error>> {
    /// let mut tx = pool.begin().await?;
    /// messaging::sqlx::query("INSERT INTO orders (id) VALUES ($1)").bind(7).execute(&mut *tx).await?;
    /// publisher.send::<Orders, _>(&OrderPlaced { id: 7 }).in_transaction(&mut tx).await?;
    /// tx.commit().await?; // the order and its event, or neither
    /// # Ok(()) }
    /// ```
    #[cfg(any(feature = "postgres", feature = "sqlite"))]
    pub async fn in_transaction<DB: crate::transport::sql::Dialect>(
        self,
        tx: &mut sqlx::Transaction<'_, DB>,
    ) -> Result<MessageId, PublishError> {
        let outgoing = self.options.outgoing(&Q::SPEC, self.message, self.publisher.transport.max_delay());
        let mut sent = send_in(self.publisher, (Q::SPEC.name, Q::SPEC.fifo), vec![outgoing?], &mut **tx).await?;
        sent.pop().ok_or_else(|| PublishError::Transport(crate::error::TransportError::Backend("no id".into())))
    }
}

impl<'a, Q, M, G> SendBuilder<'a, Q, M, G>
where
    Q: Queue,
    M: Message,
    G: 'a,
{
    fn start(&self) -> Begun<'a> {
        let outgoing = self.options.outgoing(&Q::SPEC, self.message, self.publisher.transport.max_delay());
        begin(self.publisher, Q::SPEC.name, outgoing)
    }
}

/// A send as its first step left it.
pub(super) enum Begun<'a> {
    /// Sent (or failed) at once.
    Done(Result<MessageId, PublishError>),
    /// Under way.
    Sending(Sending<'a, Result<MessageId, PublishError>>),
}

/// Sends one encoded message in a producer span, recording the outcome: at
/// once where the transport can ([`Transport::send_now`]: `memory://`),
/// else in the boxed [`Transport::send`]. The publisher is borrowed, not
/// cloned: a clone of each `Arc` per message wrote to the cache line its
/// counts share with the data other threads read.
///
/// (At once, `memory://` one send per message at concurrency 8 skipped two
/// allocations and the moves of two futures a message: see
/// docs/PERFORMANCE.md, nineteenth session.)
///
/// [`Transport::send_now`]: crate::transport::Transport::send_now
/// [`Transport::send`]: crate::transport::Transport::send
pub(super) fn begin<'a>(
    publisher: &'a Publisher,
    queue: &'static str,
    outgoing: Result<crate::transport::Outgoing, PublishError>,
) -> Begun<'a> {
    if let Some(withheld) = &publisher.withheld {
        return Begun::Done(outgoing.map(|_| {
            withheld.record(queue, 1);
            MessageId::random()
        }));
    }
    let transport = &publisher.transport;
    let system = transport.system();
    let span = crate::telemetry::producer_span(system, queue, 1);
    let sent = match outgoing {
        Ok(mut outgoing) => {
            crate::telemetry::inject(&span, &mut outgoing.attributes);
            match span.in_scope(|| transport.send_now(queue, outgoing)) {
                SendNow::Done(sent) => sent.map_err(PublishError::from),
                SendNow::Later(outgoing) => {
                    return Begun::Sending(Box::pin(send_later(publisher, queue, span, outgoing)));
                }
            }
        }
        Err(e) => Err(e),
    };
    publisher.telemetry.published(&span, system, queue, std::slice::from_ref(&sent));
    Begun::Done(sent)
}

/// The rest of [`begin`] when the transport did not send at once.
async fn send_later(
    publisher: &Publisher,
    queue: &'static str,
    span: tracing::Span,
    outgoing: crate::transport::Outgoing,
) -> Result<MessageId, PublishError> {
    let transport = &publisher.transport;
    let sent = transport.send(queue, outgoing).instrument(span.clone()).await.map_err(PublishError::from);
    publisher.telemetry.published(&span, transport.system(), queue, std::slice::from_ref(&sent));
    sent
}

/// [`begin`] to its end.
pub(super) async fn send_one(
    publisher: &Publisher,
    queue: &'static str,
    outgoing: Result<crate::transport::Outgoing, PublishError>,
) -> Result<MessageId, PublishError> {
    match begin(publisher, queue, outgoing) {
        Begun::Done(sent) => sent,
        Begun::Sending(sending) => sending.await,
    }
}

/// Sends `outgoing` inside the caller's transaction (its connection
/// `conn`), with the producer span and the published-messages metric of any
/// send: on the transport when it takes the transaction (a database queue on
/// that database), else into the outbox when one is configured.
pub(super) async fn send_in(
    publisher: &Publisher,
    (queue, fifo): (&'static str, bool),
    mut outgoing: Vec<crate::transport::Outgoing>,
    conn: &mut (dyn std::any::Any + Send),
) -> Result<Vec<MessageId>, PublishError> {
    if let Some(withheld) = &publisher.withheld {
        withheld.record(queue, outgoing.len());
        return Ok(outgoing.iter().map(|_| MessageId::random()).collect());
    }
    let transport = &publisher.transport;
    let system = transport.system();
    let span = crate::telemetry::producer_span(system, queue, outgoing.len());
    for message in &mut outgoing {
        crate::telemetry::inject(&span, &mut message.attributes);
    }
    let n = outgoing.len();
    let outbox = if transport.takes_transaction(conn) { None } else { publisher.outbox() };
    let sent = match outbox {
        Some(outbox) => {
            let rows =
                outgoing.into_iter().map(|outgoing| crate::transport::OutboxWrite { queue, fifo, outgoing }).collect();
            outbox.store.write(conn, rows).instrument(span.clone()).await
        }
        None => transport.send_in(queue, outgoing, conn).instrument(span.clone()).await,
    };
    // Every message failed as the call did, with its own error kind.
    let results: Vec<Result<MessageId, PublishError>> = match &sent {
        Ok(ids) => ids.iter().cloned().map(Ok).collect(),
        Err(e) => (0..n).map(|_| Err(PublishError::Transport(e.clone()))).collect(),
    };
    publisher.telemetry.published(&span, system, queue, &results);
    sent.map_err(PublishError::from)
}

/// The boxed send in progress.
type Sending<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;
