//! The batches a worker holds (received, not all done with), and the
//! heartbeat that keeps their messages invisible while they wait, run, or
//! wait for their outcome (an acknowledgement, a move to the dead letters)
//! to reach the transport.
//!
//! Bookkeeping is per batch: settling one message is a few atomic operations,
//! and the shared list is touched once when a batch arrives and once when its
//! last message is done with.

use std::sync::atomic::{AtomicU8, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use futures_util::StreamExt as _;
use tokio::time::Instant;

use crate::claims::{ClaimState, IdempotencyStore};
use crate::throttle::Throttle;
use crate::transport::{Delivery, Receipt, Transport};

/// One received batch, shared by the lanes that handle it.
pub(crate) struct Batch {
    pub(crate) deliveries: Vec<Delivery>,
    /// FIFO: the batch's messages grouped by message group, in order. Empty
    /// for standard queues, where each message is its own unit of work.
    chains: Vec<Vec<usize>>,
    next: AtomicUsize,
    /// Each message's [`HELD`], [`SETTLING`] or [`DONE`].
    states: Vec<AtomicU8>,
    /// Messages still [`HELD`]: waiting for a lane or being handled.
    unsettled: AtomicUsize,
    /// Messages not [`DONE`] with: the batch is held while there are any.
    open: AtomicUsize,
    /// When the visibility of the open messages was last set: just
    /// before the receive was sent, then before each heartbeat's extensions.
    /// The transport's own deadline is never earlier than this plus
    /// `visibility`.
    extended_at: Mutex<Instant>,
    /// Open messages whose last extension failed (a row an application
    /// holds, say), each with when its visibility was last set: they are
    /// invisible for less than [`Batch::extended_at`] says, and only they.
    /// Usually empty.
    behind: Mutex<Vec<(usize, Instant)>>,
    visibility: Duration,
    /// The idempotency claims held by running handlers of this batch, which
    /// the heartbeat extends with the messages' visibility.
    claims: Mutex<Vec<HeldClaim>>,
}

/// A message waiting for a lane or being handled.
const HELD: u8 = 0;
/// A message whose outcome is decided and on its way to the transport (an
/// acknowledgement queued or under way, a move to the dead letters under
/// way): still kept invisible, since until the transport has it the message
/// would otherwise come back and be handled again.
const SETTLING: u8 = 1;
/// A message the worker is done with: the transport has its outcome, or it
/// was given back.
const DONE: u8 = 2;

/// An idempotency claim a running handler holds.
struct HeldClaim {
    state: Arc<ClaimState>,
    /// The handler's `lease`: the longest the claim is extended at a time.
    cap: Duration,
}

impl Batch {
    /// A batch received with a receive sent at `received_at` on a queue whose
    /// visibility timeout is `visibility`.
    pub(crate) fn new(deliveries: Vec<Delivery>, fifo: bool, received_at: Instant, visibility: Duration) -> Self {
        let chains = if fifo { group_chains(&deliveries) } else { Vec::new() };
        let n = deliveries.len();
        Batch {
            deliveries,
            chains,
            next: AtomicUsize::new(0),
            states: (0..n).map(|_| AtomicU8::new(HELD)).collect(),
            unsettled: AtomicUsize::new(n),
            open: AtomicUsize::new(n),
            extended_at: Mutex::new(received_at),
            behind: Mutex::new(Vec::new()),
            visibility,
            claims: Mutex::new(Vec::new()),
        }
    }

    /// How long the message at `index` stays invisible at least (the
    /// heartbeat pushes this out): an idempotency claim taken now must not
    /// outlive it, or a redelivery after a crash would find it still held.
    pub(crate) fn visible_for(&self, index: usize) -> Duration {
        // In the order `extended` takes them.
        let extended_at = self.extended_at.lock().unwrap_or_else(|p| p.into_inner());
        let behind = self.behind.lock().unwrap_or_else(|p| p.into_inner());
        let since = behind.iter().find(|(i, _)| *i == index).map_or(*extended_at, |&(_, since)| since);
        (since + self.visibility).saturating_duration_since(Instant::now())
    }

    /// Notes a heartbeat round at `now` whose extensions went through for
    /// every open message but `failed` (indices): those keep the time their
    /// visibility was last set. A round where every one failed changes
    /// nothing. (Takes `extended_at`, then `behind`.)
    fn extended(&self, now: Instant, open: usize, failed: &[usize]) {
        if open > 0 && failed.len() == open {
            return;
        }
        let mut extended_at = self.extended_at.lock().unwrap_or_else(|p| p.into_inner());
        let mut behind = self.behind.lock().unwrap_or_else(|p| p.into_inner());
        let mut was_behind = std::mem::take(&mut *behind);
        for &index in failed {
            let since = match was_behind.iter().position(|(i, _)| *i == index) {
                Some(at) => was_behind.swap_remove(at).1,
                None => *extended_at,
            };
            behind.push((index, since));
        }
        *extended_at = now;
    }

    /// Keeps `claim` extended by the heartbeat (at most `cap` at a time)
    /// until [`Batch::drop_claim`].
    pub(crate) fn hold_claim(&self, claim: Arc<ClaimState>, cap: Duration) {
        self.claims.lock().unwrap_or_else(|p| p.into_inner()).push(HeldClaim { state: claim, cap });
    }

    /// Stops extending `claim` (its handler returned).
    pub(crate) fn drop_claim(&self, claim: &Arc<ClaimState>) {
        self.claims.lock().unwrap_or_else(|p| p.into_inner()).retain(|c| !Arc::ptr_eq(&c.state, claim));
    }

    /// Units of work: messages, or FIFO chains.
    pub(crate) fn units(&self) -> usize {
        if self.chains.is_empty() {
            self.deliveries.len()
        } else {
            self.chains.len()
        }
    }

    /// Claims the next unit of work; `None` when all are claimed.
    pub(crate) fn claim(&self) -> Option<Unit> {
        let u = self.next.fetch_add(1, Ordering::Relaxed);
        if u >= self.units() {
            return None;
        }
        Some(if self.chains.is_empty() { Unit::One(u) } else { Unit::Chain(u) })
    }

    /// The messages of FIFO chain `u`, in order.
    pub(crate) fn chain(&self, u: usize) -> &[usize] {
        &self.chains[u]
    }

    /// Marks message `i` done with (given back, or its outcome already with
    /// the transport); returns true when it was the batch's last.
    pub(crate) fn settle(&self, i: usize) -> bool {
        match self.states[i].swap(DONE, Ordering::AcqRel) {
            HELD => {
                self.unsettled.fetch_sub(1, Ordering::AcqRel);
            }
            SETTLING => {}
            _ => return false,
        }
        self.open.fetch_sub(1, Ordering::AcqRel) == 1
    }

    /// Marks message `i` handled, its outcome (an acknowledgement, a move to
    /// the dead letters) not yet with the transport: the heartbeat goes on
    /// extending it until [`Batch::settle`].
    pub(crate) fn settle_later(&self, i: usize) {
        self.unhold(i, SETTLING);
    }

    /// Moves message `i` from [`HELD`] to `to` ([`SETTLING`] or [`DONE`]);
    /// whether it was held.
    fn unhold(&self, i: usize, to: u8) -> bool {
        if self.states[i].compare_exchange(HELD, to, Ordering::AcqRel, Ordering::Acquire).is_err() {
            return false;
        }
        self.unsettled.fetch_sub(1, Ordering::AcqRel);
        if to == DONE {
            self.open.fetch_sub(1, Ordering::AcqRel);
        }
        true
    }

    /// The places in the batch and receipts of the messages to keep
    /// invisible: held, or handled with their outcome still on its way.
    fn open_receipts(&self) -> impl Iterator<Item = (usize, &Receipt)> + '_ {
        self.deliveries
            .iter()
            .zip(&self.states)
            .enumerate()
            .filter(|(_, (_, s))| s.load(Ordering::Acquire) != DONE)
            .map(|(i, (d, _))| (i, &d.receipt))
    }
}

/// A unit of work claimed from a batch.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Unit {
    /// One message (standard queues).
    One(usize),
    /// One FIFO group's messages, in order ([`Batch::chain`]).
    Chain(usize),
}

/// Splits a FIFO batch into per-group chains, keeping the order within each.
fn group_chains(batch: &[Delivery]) -> Vec<Vec<usize>> {
    let mut chains: Vec<Vec<usize>> = Vec::new();
    for (i, delivery) in batch.iter().enumerate() {
        match chains.iter_mut().find(|c| batch[c[0]].group_id == delivery.group_id) {
            Some(chain) => chain.push(i),
            None => chains.push(vec![i]),
        }
    }
    chains
}

/// The batches with messages not done with.
#[derive(Default)]
pub(crate) struct InFlight {
    batches: Mutex<Vec<Arc<Batch>>>,
}

impl InFlight {
    fn lock(&self) -> MutexGuard<'_, Vec<Arc<Batch>>> {
        self.batches.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(crate) fn hold(&self, batch: Arc<Batch>) {
        self.lock().push(batch);
    }

    /// Marks message `i` of `batch` done with ([`Batch::settle`]), and
    /// forgets the batch when it was its last.
    pub(crate) fn settle(&self, batch: &Arc<Batch>, i: usize) {
        if batch.settle(i) {
            self.lock().retain(|b| !Arc::ptr_eq(b, batch));
        }
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.lock().is_empty()
    }

    /// Whether a held message is not settled yet (being handled, waiting to
    /// be, or set aside for a retry).
    pub(crate) fn has_unsettled(&self) -> bool {
        self.lock().iter().any(|b| b.unsettled.load(Ordering::Acquire) > 0)
    }

    /// Gives up every message not handled (at shutdown, to release them)
    /// and returns their receipts. Messages whose outcome is on its way stay
    /// with their batches, which the heartbeat goes on extending while the
    /// last acknowledgements are flushed.
    pub(crate) fn take_unsettled(&self) -> Vec<Receipt> {
        let mut receipts = Vec::new();
        self.lock().retain(|batch| {
            for (i, delivery) in batch.deliveries.iter().enumerate() {
                if batch.unhold(i, DONE) {
                    receipts.push(delivery.receipt.clone());
                }
            }
            batch.open.load(Ordering::Acquire) > 0
        });
        receipts
    }

    /// Every `period`, extends the visibility of the open messages (held,
    /// or handled with their acknowledgement on its way) of batches held for
    /// `period` or longer, and the idempotency claims their handlers hold,
    /// until the task is aborted.
    ///
    /// Claims are extended first, to at most the visibility, and the
    /// visibilities after them: so a claim never outlives its message's
    /// invisibility, and a message that becomes visible again (its process
    /// died) finds its claim expired. A batch whose extensions failed keeps
    /// its older time, so that new claims on it stay short.
    pub(crate) async fn heartbeat(
        self: Arc<Self>,
        transport: Arc<dyn Transport>,
        claims: Arc<dyn IdempotencyStore>,
        queue: &'static str,
        visibility: Duration,
        period: Duration,
    ) {
        let period = period.max(Duration::from_millis(50));
        let mut tick = tokio::time::interval(period);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let lagging = Throttle::default();
        let held_warned = Throttle::default();
        loop {
            tick.tick().await;
            let now = Instant::now();
            // Due at every tick once half a period has passed: a batch
            // extended at the last tick is a hair short of a full period
            // at this one (666.9 ms of 667, by the ticks' jitter, in a
            // trace of 500 handlers on a 2 s visibility), and `>= period`
            // extended it every other tick, 1.33 s apart, leaving a third
            // of the visibility to spare instead of two thirds.
            let due: Vec<Arc<Batch>> = self
                .lock()
                .iter()
                .filter(|b| now.duration_since(*b.extended_at.lock().unwrap_or_else(|p| p.into_inner())) >= period / 2)
                .cloned()
                .collect();
            // The due batches a few at a time: one after the other, a round
            // of 50 batches of ten on SQS (a request each) took longer than
            // a 2 s visibility from outside, on moto.
            let batches = due.len();
            let met_held = std::sync::atomic::AtomicBool::new(false);
            // The longest one batch's calls took (ns).
            let slowest = std::sync::atomic::AtomicU64::new(0);
            let (transport, claims, held_warned, met, slow) = (&transport, &claims, &held_warned, &met_held, &slowest);
            futures_util::stream::iter(due)
                .for_each_concurrent(HEARTBEAT_CALLS, |batch| async move {
                    let began = Instant::now();
                    if extend_batch(&batch, &**transport, &**claims, queue, visibility, now, held_warned).await {
                        met.store(true, Ordering::Relaxed);
                    }
                    let took = u64::try_from(began.elapsed().as_nanos()).unwrap_or(u64::MAX);
                    slow.fetch_max(took, Ordering::Relaxed);
                })
                .await;
            // A round longer than the period eats into the margin: each batch
            // is extended that much later, and once the gap between two of
            // its extensions passes the visibility, its messages come back
            // while held and are handled twice. Said before it happens (at
            // most once a minute): the warnings after it (an ack or lease
            // that came too late) do not say why.
            // (Not when a row another transaction holds took its moment:
            // said already, and the other batches were extended before it.)
            // When one batch alone took the period, the transport answered
            // slowly (on SQLite, an application held the write lock, tried
            // from outside): the advice to raise the visibility or lower the
            // concurrency would have been wrong.
            let took = now.elapsed();
            let slowest = Duration::from_nanos(slowest.into_inner());
            if took > period && !met_held.into_inner() && lagging.due(LAG_WARNING_EVERY, false) {
                if slowest >= period {
                    tracing::warn!(
                        queue,
                        batches,
                        "the heartbeat is falling behind: extending one batch took {slowest:?}, longer than its \
                         period of {period:?}: the transport was that slow to answer (a database another connection \
                         kept locked, or one overloaded or unreachable); held messages may come back and run twice \
                         once that passes the {visibility:?} visibility"
                    );
                } else {
                    tracing::warn!(
                        queue,
                        batches,
                        "the heartbeat is falling behind: extending {batches} batch(es) took {took:?}, longer than \
                         its period of {period:?}; held messages come back and run twice once a round takes longer \
                         than the {visibility:?} visibility (raise the queue's visibility, or lower its concurrency)"
                    );
                }
            }
        }
    }
}

/// Heartbeat calls at once: batches extended concurrently in one round.
const HEARTBEAT_CALLS: usize = 8;

/// How often at most the heartbeat says that it is falling behind.
const LAG_WARNING_EVERY: Duration = Duration::from_secs(60);

/// Extends the claims a batch's running handlers hold (to at most the
/// visibility), then the visibility of its open messages in one call;
/// notes the time when every extension went through. Whether a row another
/// transaction holds refused its extension (after a moment's wait).
async fn extend_batch(
    batch: &Batch,
    transport: &dyn Transport,
    claims: &dyn IdempotencyStore,
    queue: &'static str,
    visibility: Duration,
    now: Instant,
    held_warned: &Throttle,
) -> bool {
    let held: Vec<(Arc<ClaimState>, Duration)> = batch
        .claims
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .iter()
        .map(|c| (c.state.clone(), c.cap.min(visibility)))
        .collect();
    for (claim, lease) in held {
        match claims.extend(&claim.message_id, claim.scope, &claim.processor, lease).await {
            Ok(()) | Err(crate::error::TransportError::StaleReceipt) => {}
            Err(e) => tracing::warn!(queue, "could not extend an idempotency claim: {e}"),
        }
    }
    // One call for the batch's open messages: one at a time,
    // a batch of 300 on PostgreSQL took longer than a short
    // visibility, and its last messages came back while held.
    let (places, open): (Vec<usize>, Vec<Receipt>) = batch.open_receipts().map(|(i, r)| (i, r.clone())).unzip();
    let mut failed = Vec::new();
    let mut met_held = false;
    if !open.is_empty() {
        let results = transport.extend_all(queue, open, visibility).await;
        for (index, result) in places.iter().zip(results) {
            match result {
                Ok(()) | Err(crate::error::TransportError::StaleReceipt) => {}
                Err(e) => {
                    met_held |= matches!(e, crate::error::TransportError::Held(_));
                    if failed.is_empty() && super::says(held_warned, &e) {
                        tracing::warn!(queue, "could not extend a message's visibility: {e}");
                    }
                    failed.push(*index);
                }
            }
        }
    }
    // Only the messages whose extension failed are now invisible for less:
    // one row an application held longer than the visibility had every
    // message of its batch counted as about to come back (claims taken for
    // a millisecond, refused acks given up at once).
    batch.extended(now, places.len(), &failed);
    met_held
}

impl crate::context::Received for Batch {
    fn delivery(&self, index: usize) -> &Delivery {
        &self.deliveries[index]
    }

    fn visible_for(&self, index: usize) -> Duration {
        Batch::visible_for(self, index)
    }

    fn hold_claim(&self, claim: Arc<ClaimState>, cap: Duration) {
        Batch::hold_claim(self, claim, cap);
    }

    fn drop_claim(&self, claim: &Arc<ClaimState>) {
        Batch::drop_claim(self, claim);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::claims::MemoryIdempotencyStore;
    use crate::error::TransportError;
    use crate::queue::QueueSpec;
    use crate::transport::memory::MemoryTransport;
    use crate::transport::stub::Stub;
    use crate::transport::Outgoing;

    /// Extensions that go through for every receipt but the second of each
    /// call (a row an application holds).
    fn holds_second(n: usize) -> Vec<Result<(), TransportError>> {
        (0..n)
            .map(|i| match i {
                1 => Err(TransportError::Held("canceling statement due to lock timeout".into())),
                _ => Ok(()),
            })
            .collect()
    }

    #[tokio::test(start_paused = true)]
    async fn a_message_whose_extension_fails_is_the_only_one_counted_as_coming_back() {
        let memory = MemoryTransport::new();
        memory.declare(&QueueSpec::standard("q")).await.unwrap();
        for _ in 0..3 {
            memory.send("q", Outgoing { body: b"{}".to_vec().into(), ..Outgoing::default() }).await.unwrap();
        }
        let deliveries = memory.receive("q", 3, Duration::ZERO).await.unwrap();
        let minute = Duration::from_secs(60);
        let batch = Batch::new(deliveries, false, Instant::now(), minute);
        let claims = MemoryIdempotencyStore::new();
        let transport = Stub { wait: Duration::ZERO, extend_all: holds_second, ack: Stub::closed };
        let (printed, warned) = (crate::printed::Printed::default(), Throttle::default());
        let _logs = tracing::subscriber::set_default(printed.subscriber().finish());
        tokio::time::advance(Duration::from_secs(50)).await;
        extend_batch(&batch, &transport, &claims, "q", minute, Instant::now(), &warned).await;
        let left = |i| batch.visible_for(i).as_secs();
        assert_eq!((left(0), left(1), left(2)), (60, 10, 60), "only the second keeps its old deadline");

        // The second's next extension fails too: its deadline stays where
        // it was, the others' move on.
        tokio::time::advance(Duration::from_secs(30)).await;
        extend_batch(&batch, &transport, &claims, "q", minute, Instant::now(), &warned).await;
        assert_eq!((left(0), left(1), left(2)), (60, 0, 60));

        // Settled, the second is no longer extended; a round where every
        // open message goes through leaves none behind.
        batch.states[1].store(DONE, Ordering::Release);
        batch.extended(Instant::now(), 2, &[]);
        assert_eq!((left(0), left(1), left(2)), (60, 60, 60));

        // A round where every extension fails changes nothing.
        tokio::time::advance(Duration::from_secs(30)).await;
        batch.extended(Instant::now(), 2, &[0, 2]);
        assert_eq!((left(0), left(2)), (30, 30));

        // The held row was said at the first round and not at the second,
        // 30 s later; a minute after the first, it is said again.
        extend_batch(&batch, &transport, &claims, "q", minute, Instant::now(), &warned).await;
        let text = printed.text();
        let warnings: Vec<&str> = text.lines().filter(|l| l.contains("could not extend")).collect();
        assert_eq!(warnings.len(), 2, "{text}");
    }
}
