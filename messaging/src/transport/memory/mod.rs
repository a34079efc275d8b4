//! `memory://`: an in-process transport with Amazon SQS semantics.
//!
//! It is a product feature, not a mock: visibility timeouts, receive counts,
//! `max_receives` → dead-letter queue, per-message delay, FIFO groups (one
//! message of a group in flight at a time, order kept) and FIFO deduplication
//! within five minutes all behave as on SQS, so tests against it mean
//! something. Messages live as long as the process.

mod browse;
mod dead_letters;
mod state;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, RwLock};
use std::time::Duration;

use rustc_hash::FxHashMap as HashMap;
use tokio::sync::Notify;
use tokio::time::Instant;

use self::state::QueueState;
use super::{BoxFuture, DeadLetters, Delivery, MessageId, Outgoing, Receipt, Transport};
use crate::error::TransportError;
use crate::queue::QueueSpec;

/// The in-memory transport. Cheap to clone; clones share the queues.
#[derive(Clone, Default)]
pub struct MemoryTransport {
    queues: Arc<RwLock<HashMap<String, Arc<MemQueue>>>>,
    /// The most messages a queue holds, and how long a publish waits for room.
    bound: Option<Bound>,
}

/// The capacity of a bounded transport's queues.
#[derive(Debug, Clone, Copy)]
struct Bound {
    capacity: usize,
    wait: Duration,
}

/// How often a publish waiting for room looks again without a signal (room
/// made by a path that does not announce it: a redrive's move, say).
const ROOM_POLL: Duration = Duration::from_millis(20);

impl std::fmt::Debug for MemoryTransport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemoryTransport").finish_non_exhaustive()
    }
}

struct MemQueue {
    fifo: bool,
    state: Mutex<QueueState>,
    notify: Notify,
    /// Signalled when messages leave (a bounded queue has room again).
    room: Notify,
    /// Bumped by `interrupt_receives`: a waiting receive that sees it change returns.
    interrupts: std::sync::atomic::AtomicU64,
    /// Single publishes to a standard queue without bound, not yet in `state`:
    /// under a lock of its own, held for a push, so that a publish never
    /// waits for a receive or an ack holding `state` (the publisher's
    /// contended locks and the context switches they cost were the largest
    /// difference between one send per message and `send_batch` in the
    /// memory benchmark's profile). Whoever locks `state` moves them in
    /// first, in order, so every reader sees them.
    inbox: Mutex<Vec<state::Posted>>,
    /// Receives that may be waiting on `notify`: a publish wakes them only
    /// when there are any (`notify_waiters` takes a lock of its own, which
    /// every publish then contended for with the receiver).
    waiting: AtomicUsize,
}

/// Counts a receive as waiting for as long as it lives.
struct Waiting<'a>(&'a AtomicUsize);

impl<'a> Waiting<'a> {
    fn new(count: &'a AtomicUsize) -> Self {
        // SeqCst, with the publisher's load in `MemQueue::wake`: a receive
        // counts itself before it looks at the queue, so a publish either
        // happened before the look (and is seen) or sees the count.
        count.fetch_add(1, Ordering::SeqCst);
        Waiting(count)
    }
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

impl MemQueue {
    fn new(spec: QueueSpec) -> Self {
        MemQueue {
            fifo: spec.fifo,
            state: Mutex::new(QueueState::new(spec)),
            notify: Notify::new(),
            room: Notify::new(),
            interrupts: std::sync::atomic::AtomicU64::new(0),
            waiting: AtomicUsize::new(0),
            inbox: Mutex::new(Vec::new()),
        }
    }

    /// Adds a published message to the inbox and wakes waiting receives.
    fn post(&self, message: state::Posted) {
        self.inbox.lock().unwrap_or_else(|p| p.into_inner()).push(message);
        self.wake();
    }

    /// Wakes waiting receives after messages were added (the lock released).
    fn wake(&self) {
        if self.waiting.load(Ordering::SeqCst) > 0 {
            self.notify.notify_waiters();
        }
    }

    fn lock(&self) -> MutexGuard<'_, QueueState> {
        // A panic while holding the lock cannot leave the state half-changed in a
        // way that loses messages, so a poisoned lock is still usable.
        let mut state = self.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        // The inbox's lock is held for the swap only: publishers wait for
        // nothing longer (held through the admissions it measured 7 % slower).
        state.take_posted(&mut self.inbox.lock().unwrap_or_else(|p| p.into_inner()));
        state.admit_posted();
        state
    }
}

impl MemoryTransport {
    /// A transport with no queues yet; [`Transport::declare`] creates them.
    pub fn new() -> Self {
        Self::default()
    }

    /// A transport whose queues hold at most `capacity` messages each
    /// (received ones included, until acknowledged): a publish to a full
    /// queue waits for room, up to `wait`, then fails with
    /// [`TransportError::Full`]. Dead letters and redriven messages are
    /// never refused. What `memory://?capacity=N&full_wait=5s` opens.
    pub fn bounded(capacity: usize, wait: Duration) -> Self {
        MemoryTransport { bound: Some(Bound { capacity: capacity.max(1), wait }), ..Self::default() }
    }

    /// Opens `memory://` with its options: `capacity=N` (bounded queues) and
    /// `full_wait=5s` (how long a publish waits for room; default 5 s).
    pub(crate) fn from_url(url: &str) -> Result<Self, crate::error::Error> {
        let config = |reason: String| crate::error::Error::Config { url: url.to_owned(), reason };
        let query = url.split_once('?').map_or("", |(_, q)| q);
        let (mut capacity, mut wait) = (None, Duration::from_secs(5));
        for pair in query.split('&').filter(|p| !p.is_empty()) {
            let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
            match key {
                "capacity" => match value.parse::<usize>() {
                    Ok(n) if n > 0 => capacity = Some(n),
                    _ => return Err(config(format!("`capacity={value}`: write a number of messages above 0"))),
                },
                "full_wait" => wait = crate::duration::parse_duration(value).map_err(config)?,
                other => {
                    return Err(config(format!(
                        "unknown option `{other}` of memory://; known: capacity=N (messages per queue), full_wait=5s"
                    )))
                }
            }
        }
        Ok(match capacity {
            Some(capacity) => MemoryTransport::bounded(capacity, wait),
            None => {
                if query.contains("full_wait") {
                    return Err(config("`full_wait` applies to a bounded queue: add `capacity=N`".to_owned()));
                }
                MemoryTransport::new()
            }
        })
    }

    /// Whether `state` has room for one more message.
    fn has_room(&self, state: &QueueState) -> bool {
        self.bound.is_none_or(|b| state.len() < b.capacity)
    }

    /// The error of a publish that found no room in time.
    fn full(&self, queue: &str, waited: Duration) -> TransportError {
        let capacity = self.bound.map_or(usize::MAX, |b| b.capacity);
        TransportError::Full { queue: queue.to_owned(), capacity, waited }
    }

    /// Stores `messages` in order, each as soon as `q` has room: the rest
    /// fail with [`TransportError::Full`] once the bound's wait is over.
    async fn store(
        &self,
        queue: &str,
        q: &MemQueue,
        messages: Vec<Outgoing>,
    ) -> Vec<Result<MessageId, TransportError>> {
        let started = Instant::now();
        let mut results = Vec::with_capacity(messages.len());
        let mut pending = messages.into_iter().peekable();
        loop {
            let room = q.room.notified();
            tokio::pin!(room);
            room.as_mut().enable();
            {
                let mut state = q.lock();
                let mut clock = state::Clock::default();
                while pending.peek().is_some() && self.has_room(&state) {
                    if let Some(message) = pending.next() {
                        results.push(state.send(message, &mut clock));
                    }
                }
            }
            q.wake();
            if pending.peek().is_none() {
                return results;
            }
            let deadline = started + self.bound.map_or(Duration::ZERO, |b| b.wait);
            let now = Instant::now();
            if now >= deadline {
                let waited = now.duration_since(started);
                results.extend(pending.map(|_| Err(self.full(queue, waited))));
                return results;
            }
            tokio::select! {
                _ = &mut room => {}
                _ = tokio::time::sleep_until(deadline.min(now + ROOM_POLL)) => {}
            }
        }
    }

    fn queue(&self, name: &str) -> Result<Arc<MemQueue>, TransportError> {
        let queues = self.queues.read().unwrap_or_else(|p| p.into_inner());
        queues.get(name).cloned().ok_or_else(|| TransportError::QueueNotFound(name.to_owned()))
    }

    fn create(&self, spec: QueueSpec) {
        let mut queues = self.queues.write().unwrap_or_else(|p| p.into_inner());
        queues.entry(spec.name.to_owned()).or_insert_with(|| Arc::new(MemQueue::new(spec)));
    }

    /// Moves messages that exceeded the receive limit into the dead-letter queue.
    fn bury(&self, queue: &QueueSpec, expired: Vec<state::Stored>) {
        if expired.is_empty() {
            return;
        }
        let Some(dlq) = queue.dlq.and_then(|name| self.queue(name).ok()) else { return };
        let mut state = dlq.lock();
        for stored in expired {
            tracing::warn!(queue = queue.name, message.id = %stored.id, "message moved to the dead-letter queue: {}",
                stored.reason().unwrap_or("receive limit reached"));
            state.insert(stored, QueueState::visible());
        }
    }

    async fn receive_from(&self, name: &str, max: usize, wait: Duration) -> Result<Vec<Delivery>, TransportError> {
        let queue = self.queue(name)?;
        let deadline = Instant::now() + wait;
        let interrupts = queue.interrupts.load(std::sync::atomic::Ordering::Acquire);
        let _waiting = Waiting::new(&queue.waiting);
        loop {
            let notified = queue.notify.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if queue.interrupts.load(std::sync::atomic::Ordering::Acquire) != interrupts {
                return Ok(Vec::new());
            }
            let (received, next_timer, spec) = {
                let mut state = queue.lock();
                let received = state.receive(max.max(1), Instant::now());
                let spec = (!received.expired.is_empty()).then(|| state.spec.clone());
                (received, state.next_timer(), spec)
            };
            if let Some(spec) = spec {
                self.bury(&spec, received.expired);
            }
            let now = Instant::now();
            if !received.deliveries.is_empty() || now >= deadline {
                return Ok(received.deliveries);
            }
            let wake = next_timer.map_or(deadline, |t| t.min(deadline));
            tokio::select! {
                _ = &mut notified => {}
                _ = tokio::time::sleep_until(wake) => {}
            }
        }
    }
}

/// Makes the body's buffer shared now, before the queue's lock is taken: a
/// body made from a `Vec` allocates its reference count at its first clone,
/// which would otherwise be the receive's, under the lock that publishers
/// wait for.
fn share(message: &Outgoing) {
    drop(message.body.clone());
}

impl Transport for MemoryTransport {
    fn system(&self) -> &'static str {
        "memory"
    }

    fn declare<'a>(&'a self, spec: &'a QueueSpec) -> BoxFuture<'a, Result<(), TransportError>> {
        Box::pin(async move {
            if let Ok(existing) = self.queue(spec.name) {
                let fifo = existing.fifo;
                if fifo != spec.fifo {
                    return Err(TransportError::Rejected(format!(
                        "queue `{}` already exists as a {} queue",
                        spec.name,
                        if fifo { "FIFO" } else { "standard" }
                    )));
                }
            }
            self.create(spec.clone());
            if let Some(dlq) = spec.dlq {
                let mut dlq_spec = QueueSpec::standard(dlq);
                dlq_spec.fifo = spec.fifo;
                dlq_spec.visibility = spec.visibility;
                self.create(dlq_spec);
            }
            Ok(())
        })
    }

    fn send<'a>(&'a self, queue: &'a str, message: Outgoing) -> BoxFuture<'a, Result<MessageId, TransportError>> {
        Box::pin(async move {
            let message = match self.send_now(queue, message) {
                super::SendNow::Done(sent) => return sent,
                super::SendNow::Later(message) => message,
            };
            let q = self.queue(queue)?;
            let stored = self.store(queue, &q, vec![message]).await.pop();
            stored.unwrap_or_else(|| Err(self.full(queue, Duration::ZERO)))
        })
    }

    /// At once unless the queue is bounded (a send may wait for room).
    fn send_now(&self, queue: &str, message: Outgoing) -> super::SendNow {
        if self.bound.is_some() {
            return super::SendNow::Later(message);
        }
        let sent = self.queue(queue).and_then(|q| {
            share(&message);
            if !q.fifo {
                let id = MessageId::random();
                q.post(state::Posted::new(id.clone(), message));
                return Ok(id);
            }
            let id = q.lock().send(message, &mut state::Clock::default())?;
            q.wake();
            Ok(id)
        });
        super::SendNow::Done(sent)
    }

    fn send_batch<'a>(
        &'a self,
        queue: &'a str,
        messages: Vec<Outgoing>,
    ) -> BoxFuture<'a, Vec<Result<MessageId, TransportError>>> {
        Box::pin(async move {
            let q = match self.queue(queue) {
                Ok(q) => q,
                Err(_) => return crate::transport::unknown_queue(queue, &messages),
            };
            messages.iter().for_each(share);
            // (A batch takes the queue's lock once for all its messages: the
            // inbox of one-by-one sends measured 2 % slower here.)
            if self.bound.is_some() {
                return self.store(queue, &q, messages).await;
            }
            let results = {
                let mut state = q.lock();
                let mut clock = state::Clock::default();
                messages.into_iter().map(|m| state.send(m, &mut clock)).collect()
            };
            q.wake();
            results
        })
    }

    fn receive<'a>(
        &'a self,
        queue: &'a str,
        max: usize,
        wait: Duration,
    ) -> BoxFuture<'a, Result<Vec<Delivery>, TransportError>> {
        Box::pin(self.receive_from(queue, max, wait))
    }

    fn interrupt_receives(&self, queue: &str) {
        if let Ok(q) = self.queue(queue) {
            q.interrupts.fetch_add(1, std::sync::atomic::Ordering::AcqRel);
            q.notify.notify_waiters();
        }
    }

    fn ack<'a>(&'a self, queue: &'a str, receipts: Vec<Receipt>) -> BoxFuture<'a, Vec<Result<(), TransportError>>> {
        Box::pin(async move {
            let q = match self.queue(queue) {
                Ok(q) => q,
                Err(_) => return crate::transport::unknown_queue(queue, &receipts),
            };
            let removed: Vec<_> = {
                let mut state = q.lock();
                receipts.iter().map(|r| state.ack(r)).collect()
            };
            // Freed here, not under the lock: dropping a batch's messages
            // there held up every publisher (the producer's contended locks
            // were 6 % of the memory benchmark at concurrency 8).
            let results = removed.into_iter().map(|r| r.map(drop)).collect();
            // Acks can unlock FIFO groups, and make room.
            if q.fifo {
                q.notify.notify_waiters();
            }
            if self.bound.is_some() {
                q.room.notify_waiters();
            }
            results
        })
    }

    fn nack<'a>(
        &'a self,
        queue: &'a str,
        receipt: Receipt,
        delay: Duration,
    ) -> BoxFuture<'a, Result<(), TransportError>> {
        Box::pin(async move {
            let q = self.queue(queue)?;
            q.lock().nack(&receipt, delay, Instant::now())?;
            q.notify.notify_waiters();
            Ok(())
        })
    }

    fn fail<'a>(
        &'a self,
        queue: &'a str,
        receipt: Receipt,
        delay: Duration,
        failure: crate::transport::FailedAttempt,
    ) -> BoxFuture<'a, Result<(), TransportError>> {
        Box::pin(async move {
            let q = self.queue(queue)?;
            {
                let mut state = q.lock();
                state.record(&receipt, failure)?;
                state.nack(&receipt, delay, Instant::now())?;
            }
            q.notify.notify_waiters();
            Ok(())
        })
    }

    fn record_failure<'a>(
        &'a self,
        queue: &'a str,
        receipt: &'a Receipt,
        failure: crate::transport::FailedAttempt,
    ) -> BoxFuture<'a, Result<(), TransportError>> {
        Box::pin(async move { self.queue(queue)?.lock().record(receipt, failure) })
    }

    fn inspect<'a>(
        &'a self,
        queue: &'a str,
        id: &'a MessageId,
    ) -> BoxFuture<'a, Result<Option<crate::transport::MessageReport>, TransportError>> {
        Box::pin(async move {
            let q = self.queue(queue)?;
            let dlq = q.lock().spec.dlq;
            if let Some(found) = q.lock().iter_ordered().into_iter().find(|(_, m)| &m.id == id) {
                return Ok(Some(found.1.report(queue, None)));
            }
            let Some(dlq) = dlq.and_then(|name| self.queue(name).ok()) else { return Ok(None) };
            let state = dlq.lock();
            let found = state.iter_ordered().into_iter().find(|(_, m)| &m.id == id);
            Ok(found.map(|(_, m)| m.report(queue, Some("dead_letter"))))
        })
    }

    fn extend<'a>(
        &'a self,
        queue: &'a str,
        receipt: &'a Receipt,
        visibility: Duration,
    ) -> BoxFuture<'a, Result<(), TransportError>> {
        Box::pin(async move {
            let q = self.queue(queue)?;
            let result = q.lock().extend(receipt, visibility, Instant::now());
            result
        })
    }

    fn concurrent_receives(&self) -> usize {
        // A receive is a lock, not a round trip: receiving ahead only adds wake-ups.
        0
    }

    fn max_batch(&self) -> usize {
        // No request limit in memory; larger batches mean fewer lock round trips.
        100
    }

    fn depth<'a>(&'a self, queue: &'a str) -> BoxFuture<'a, Result<u64, TransportError>> {
        Box::pin(async move { Ok(self.queue(queue)?.lock().len() as u64) })
    }

    fn browse(&self) -> Option<&dyn super::Browse> {
        Some(self)
    }

    fn dead_letters(&self) -> Option<&dyn DeadLetters> {
        Some(self)
    }
}

#[cfg(test)]
mod tests;
