//! A transport for the crate's unit tests that answers nothing well: every
//! call fails after [`Stub::wait`] (a database away fails once a pool's wait
//! for a connection runs out), but the extensions and the acks, which
//! answer as the test scripts them.

use std::time::Duration;

use super::{Delivery, MessageId, Outgoing, QueueCounts, Receipt, Transport};
use crate::boxed::BoxFuture;
use crate::error::TransportError;
use crate::queue::QueueSpec;

/// How long [`Stub::away`] takes to fail.
pub(crate) const STALL: Duration = Duration::from_secs(5);

/// The answers of an `extend_all` of so many receipts.
pub(crate) type Extensions = fn(usize) -> Vec<Result<(), TransportError>>;

/// The answers of an `ack` of these receipts, after a wait.
pub(crate) type Acks = fn(&[Receipt]) -> (Duration, Vec<Result<(), TransportError>>);

/// See the module's documentation.
pub(crate) struct Stub {
    /// How long each question about a queue waits before it fails.
    pub(crate) wait: Duration,
    /// What `extend_all` answers, at once.
    pub(crate) extend_all: Extensions,
    /// What `ack` answers, and when.
    pub(crate) ack: Acks,
}

impl Stub {
    /// A transport whose database is away: every question about a queue
    /// fails after [`STALL`] with the refused connection as its cause.
    pub(crate) fn away() -> Stub {
        Stub { wait: STALL, extend_all: |n| vec![Err(TransportError::Closed); n], ack: Stub::closed }
    }

    /// Acks of a transport that is closed: refused at once.
    pub(crate) fn closed(receipts: &[Receipt]) -> (Duration, Vec<Result<(), TransportError>>) {
        (Duration::ZERO, vec![Err(TransportError::Closed); receipts.len()])
    }

    fn refuse<T>(&self) -> BoxFuture<'static, Result<T, TransportError>> {
        let wait = self.wait;
        Box::pin(async move {
            tokio::time::sleep(wait).await;
            Err(TransportError::Backend("no connection within 5s: connection refused".into()))
        })
    }
}

impl Transport for Stub {
    fn system(&self) -> &'static str {
        "stub"
    }

    fn declare<'a>(&'a self, _: &'a QueueSpec) -> BoxFuture<'a, Result<(), TransportError>> {
        self.refuse()
    }

    fn send<'a>(&'a self, _: &'a str, _: Outgoing) -> BoxFuture<'a, Result<MessageId, TransportError>> {
        self.refuse()
    }

    fn send_batch<'a>(
        &'a self,
        _: &'a str,
        messages: Vec<Outgoing>,
    ) -> BoxFuture<'a, Vec<Result<MessageId, TransportError>>> {
        Box::pin(async move { messages.iter().map(|_| Err(TransportError::Closed)).collect() })
    }

    fn receive<'a>(
        &'a self,
        _: &'a str,
        _: usize,
        _: Duration,
    ) -> BoxFuture<'a, Result<Vec<Delivery>, TransportError>> {
        self.refuse()
    }

    fn ack<'a>(&'a self, _: &'a str, receipts: Vec<Receipt>) -> BoxFuture<'a, Vec<Result<(), TransportError>>> {
        let (wait, answers) = (self.ack)(&receipts);
        Box::pin(async move {
            tokio::time::sleep(wait).await;
            answers
        })
    }

    fn nack<'a>(&'a self, _: &'a str, _: Receipt, _: Duration) -> BoxFuture<'a, Result<(), TransportError>> {
        self.refuse()
    }

    fn extend<'a>(&'a self, _: &'a str, _: &'a Receipt, _: Duration) -> BoxFuture<'a, Result<(), TransportError>> {
        self.refuse()
    }

    fn extend_all<'a>(
        &'a self,
        _: &'a str,
        receipts: Vec<Receipt>,
        _: Duration,
    ) -> BoxFuture<'a, Vec<Result<(), TransportError>>> {
        let answers = self.extend_all;
        Box::pin(async move { answers(receipts.len()) })
    }

    fn depth<'a>(&'a self, _: &'a str) -> BoxFuture<'a, Result<u64, TransportError>> {
        self.refuse()
    }

    fn counts<'a>(&'a self, _: &'a str) -> BoxFuture<'a, Result<QueueCounts, TransportError>> {
        self.refuse()
    }
}
