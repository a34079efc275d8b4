//! The outbox relay: sends the rows of the app's [`Outbox`] to their queues
//! and deletes them once the transport accepted them. `run` starts one in
//! every process; any number may run against one outbox.
//!
//! A round claims up to [`CLAIM_ROWS`] rows of one queue for [`LEASE`],
//! sends them in batches of the transport's size (10 per `SendMessageBatch`
//! on SQS) and settles them in one transaction: sent rows are deleted, rows
//! the transport refused for good are set aside as `failed`, the others wait
//! for a retry with backoff. A settle the outbox's database refuses is tried
//! again while the claim holds. A send that has not answered within
//! [`SEND_TIMEOUT`] counts as failed, well before the lease ends, so that a
//! hung request does not let a second relay send the same rows meanwhile.
//!
//! FIFO queues: the outbox's claim hands out a group's rows only while no
//! earlier row of the group is claimed or waiting for a retry, and a round
//! sends a group's rows in order and gives back the rest of a group after a
//! failure, so a group's messages reach the queue in the order they were
//! written. The deduplication id of a message without one is its id (the one
//! its publish returned): a relay that dies between the broker's acceptance
//! and the delete makes the next relay send the rows again, and SQS drops
//! the repeat if it comes within its five-minute deduplication window.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use tracing::Instrument as _;

use crate::error::TransportError;
use crate::retry;
use crate::shutdown::Shutdown;
use crate::transport::{Claimed, MessageId, Outbox, Outgoing, Settle, Transport, MESSAGE_ID_ATTRIBUTE};

/// Rows one round claims.
pub(crate) const CLAIM_ROWS: usize = 100;

/// How long a claim keeps other relays off its rows.
pub(crate) const LEASE: Duration = Duration::from_secs(30);

/// How long one batch's send may take before it counts as failed.
pub(crate) const SEND_TIMEOUT: Duration = Duration::from_secs(20);

/// The longest wait before a failed row is tried again.
const MAX_BACKOFF: Duration = Duration::from_secs(60);

/// The wait before the next try of a row claimed `attempts` times.
fn backoff(attempts: u32) -> Duration {
    let exp = attempts.saturating_sub(1).min(6);
    (Duration::from_secs(1) * 2u32.pow(exp)).min(MAX_BACKOFF)
}

/// One relay: an outbox, the transport its rows go to, and the queues it serves.
pub(crate) struct Relay {
    pub(crate) outbox: Outbox,
    pub(crate) transport: Arc<dyn Transport>,
    /// The declared queues: rows of others are left to the apps that declare them.
    pub(crate) queues: Vec<&'static str>,
    /// How long a claim keeps other relays off its rows ([`LEASE`]).
    pub(crate) lease: Duration,
}

impl Relay {
    /// Relays until `stop` is triggered; then makes one more pass (so that
    /// what handlers published while stopping leaves too) and returns.
    pub(crate) async fn run(self, stop: Shutdown) {
        let mut changes = self.outbox.store.changes();
        let mut last_error: Option<String> = None;
        loop {
            let notified = self.outbox.local.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            let stopping = stop.is_triggered();
            let mut busy = false;
            for &queue in &self.queues {
                match self.round_until(queue, &stop).await {
                    Ok(claimed) => {
                        busy |= claimed > 0;
                        if last_error.take().is_some() {
                            tracing::info!(queue, "the outbox relay works again");
                        }
                    }
                    Err(e) => {
                        let text = e.to_string();
                        if last_error.as_deref() != Some(&text) {
                            tracing::warn!(
                                queue,
                                "an outbox relay round failed ({text}); the relay tries again, and rows it sent \
                                 but could not settle are sent again once their claim ends"
                            );
                        }
                        last_error = Some(text);
                    }
                }
            }
            if stopping {
                return;
            }
            if busy {
                continue;
            }
            let wake = async {
                match &mut changes {
                    Some(changes) => loop {
                        match changes.recv().await {
                            Ok(payload) if payload != crate::transport::OUTBOX_WAKE => continue,
                            Err(tokio::sync::broadcast::error::RecvError::Closed) => std::future::pending::<()>().await,
                            _ => return,
                        }
                    },
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                _ = &mut notified => {}
                _ = wake => {}
                _ = tokio::time::sleep(self.outbox.poll) => {}
                _ = stop.wait() => {}
            }
        }
    }

    /// Claims, sends and settles one batch of `queue`'s rows; how many rows
    /// it claimed.
    #[cfg(all(test, feature = "postgres", feature = "sqlite"))]
    pub(crate) async fn round(&self, queue: &'static str) -> Result<usize, TransportError> {
        self.round_until(queue, &Shutdown::new()).await
    }

    /// [`Relay::round`], whose settling is tried again until `stop` is
    /// triggered (see [`Relay::settle`]).
    async fn round_until(&self, queue: &'static str, stop: &Shutdown) -> Result<usize, TransportError> {
        let claimed_at = tokio::time::Instant::now();
        let (token, rows) = self.outbox.store.claim(queue, CLAIM_ROWS, self.lease).await?;
        let claimed = rows.len();
        if claimed == 0 {
            return Ok(0);
        }
        let chunk = self.transport.max_batch().clamp(1, CLAIM_ROWS);
        let mut outcomes = Vec::with_capacity(claimed);
        // FIFO groups with a failed row this round: their later rows wait.
        let mut held: HashSet<String> = HashSet::new();
        let mut rows = rows.into_iter();
        loop {
            let mut batch = Vec::with_capacity(chunk);
            for row in rows.by_ref() {
                if row.fifo && row.outgoing.group_id.as_ref().is_some_and(|g| held.contains(g)) {
                    outcomes.push((row.id, Settle::Untried));
                    continue;
                }
                batch.push(row);
                if batch.len() == chunk {
                    break;
                }
            }
            if batch.is_empty() {
                break;
            }
            let results = self.send(queue, &batch).await;
            let now = self.outbox.store.now();
            for (row, result) in batch.into_iter().zip(results) {
                let outcome = match result {
                    Ok(_) => Settle::Sent,
                    Err(TransportError::Rejected(reason)) => {
                        tracing::warn!(
                            queue,
                            message_id = %row.message_id,
                            "the transport refused an outbox message for good; it is kept as failed \
                             (`outbox` shows it, `outbox retry` sends it again): {reason}"
                        );
                        Settle::Failed { error: reason }
                    }
                    Err(e) => {
                        if let (true, Some(group)) = (row.fifo, &row.outgoing.group_id) {
                            held.insert(group.clone());
                        }
                        let wait = backoff(row.attempts);
                        tracing::debug!(queue, message_id = %row.message_id, "outbox send failed, retry in {wait:?}: {e}");
                        Settle::Retry { at_ms: now + wait.as_millis() as i64, error: e.to_string() }
                    }
                };
                outcomes.push((row.id, outcome));
            }
        }
        self.settle(queue, token, outcomes, claimed_at + self.lease, stop).await?;
        Ok(claimed)
    }

    /// Settles the claim `token`, trying again what the outbox's database
    /// refuses while the claim holds (until `by`) and no stop has begun.
    /// Tried once, a settle refused by a database restarting left the rows
    /// claimed although the broker had them: once the claim ran out, a relay
    /// sent them again, a second delivery on a standard queue.
    async fn settle(
        &self,
        queue: &'static str,
        token: i64,
        outcomes: Vec<(i64, Settle)>,
        by: tokio::time::Instant,
        stop: &Shutdown,
    ) -> Result<(), TransportError> {
        let again = |e: &TransportError, refused: retry::Refusal| {
            let pause = retry::retry_pause(refused.attempt);
            if stop.is_triggered() || tokio::time::Instant::now() + pause >= by {
                return false;
            }
            if refused.attempt == 1 {
                tracing::warn!(
                    queue,
                    rows = outcomes.len(),
                    "settling {} outbox row(s) the broker answered for failed ({e}); trying again while the claim \
                     holds",
                    outcomes.len()
                );
            }
            true
        };
        retry::tried(|| self.outbox.store.settle(token, outcomes.clone()), again, stop.wait()).await
    }

    /// Sends one batch in a span linked to each message's producer span; one
    /// result per row, in order.
    async fn send(&self, queue: &'static str, batch: &[Claimed]) -> Vec<Result<MessageId, TransportError>> {
        let span = crate::telemetry::relay_span(
            self.transport.system(),
            queue,
            batch.len(),
            batch.iter().filter_map(|row| crate::telemetry::extract_span_context(&row.outgoing.attributes)),
        );
        let outgoing: Vec<Outgoing> = batch.iter().map(outgoing_of).collect();
        let within = SEND_TIMEOUT.min(self.lease * 2 / 3);
        let sent = tokio::time::timeout(within, self.transport.send_batch(queue, outgoing)).instrument(span);
        match sent.await {
            Ok(results) if results.len() == batch.len() => results,
            Ok(_) => batch
                .iter()
                .map(|_| Err(TransportError::Backend("the transport returned too few results".into())))
                .collect(),
            Err(_) => batch
                .iter()
                .map(|_| Err(TransportError::Backend(format!("no answer from the transport within {within:?}"))))
                .collect(),
        }
    }
}

/// The message a row stands for, as the relay sends it: its id in an
/// attribute, and on a FIFO queue that id as the deduplication id when it
/// has none of its own.
fn outgoing_of(row: &Claimed) -> Outgoing {
    let mut outgoing = row.outgoing.clone();
    // Where there is room: SQS takes 10 attributes, a publish at most
    // MAX_ATTRIBUTES of the application's and two of the trace context. A
    // message that fills them all arrives under the broker's own id.
    if outgoing.attributes.len() < crate::publish::MAX_ATTRIBUTES + 2 {
        outgoing.attributes.insert(MESSAGE_ID_ATTRIBUTE.to_owned(), row.message_id.to_string());
    }
    if row.fifo && outgoing.dedup_id.is_none() {
        outgoing.dedup_id = Some(row.message_id.to_string());
    }
    outgoing
}

#[cfg(all(test, feature = "postgres", feature = "sqlite"))]
mod tests;
