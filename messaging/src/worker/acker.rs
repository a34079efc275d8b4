//! Batched acknowledgements: receipts queue up while a flush is in progress
//! and go out together, so acks cost one call per batch under load and add no
//! delay when idle.
//!
//! While messages the worker holds are still being handled, a flush of fewer
//! than `max_batch` receipts waits for more, as long as they keep coming
//! ([`GAP`] at most between two) and for [`LINGER`] at most in all: handlers
//! that take a few milliseconds otherwise end one at a time, and each ack
//! went out alone (measured on moto at concurrency 8: 0.29 requests per
//! message with 1 ms handlers, 0.49 with 5 ms, against 0.21 with handlers
//! that take no time; a fixed 20 ms wait still sent three deletes for a FIFO
//! group's ten messages handled in a row at 5 ms each, 0.40 per message on
//! LocalStack). When nothing the worker holds is unsettled, no further ack
//! can come before the next receive and the flush goes at once, so a FIFO
//! queue's next receive is not held up by the wait.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use tokio::sync::{mpsc, Notify};
use tokio::task::JoinHandle;
use tokio::time::Instant;

use super::alone::{Gate, GATE};
use super::inflight::{Batch, InFlight};
use crate::error::{TransportError, HELD_PAUSE, HELD_WARNING};
use crate::retry;
use crate::transport::{Receipt, Transport};

/// The longest a flush waits for the next ack while handlers are still
/// running: a few handlers' worth of milliseconds.
const GAP: Duration = Duration::from_millis(20);

/// The longest a flush waits in all: well under any visibility timeout, and
/// short enough that a handled message leaves the queue's depth about at once.
const LINGER: Duration = Duration::from_millis(200);

/// A handled message whose acknowledgement is queued or under way. Its batch
/// stays held, and the heartbeat keeps it invisible, until the transport has
/// taken the ack: a message no longer extended once handled came back while a
/// slow ack was still on its way, and was handled again.
struct Handled {
    batch: Arc<Batch>,
    index: usize,
}

impl Handled {
    fn receipt(&self) -> &Receipt {
        &self.batch.deliveries[self.index].receipt
    }

    /// Whether the message is still invisible to other consumers, as far
    /// as the heartbeat's last extension says: an ack tried after that
    /// would most likely find it taken back.
    fn invisible(&self) -> bool {
        !self.batch.visible_for(self.index).is_zero()
    }

    /// The transport has the ack (or it was given up): done with the message.
    fn done(self, held: &InFlight) {
        held.settle(&self.batch, self.index);
    }
}

/// Every acker of the process, so that a suspect can wait for the
/// acknowledgements of all queues' handled messages ([`all_settled`]).
static ACKERS: Mutex<Vec<Weak<Counts>>> = Mutex::new(Vec::new());

pub(crate) struct Acker {
    transport: Arc<dyn Transport>,
    queue: &'static str,
    held: Arc<InFlight>,
    tx: mpsc::UnboundedSender<Command>,
    counts: Arc<Counts>,
    task: Mutex<Option<JoinHandle<()>>>,
}

enum Command {
    Ack(Handled),
    /// Flush what came before, then stop.
    Close,
}

impl Acker {
    /// Starts the flush task of `queue`. `held` is the worker's batches: it
    /// tells whether acks may still come (messages received and not settled),
    /// and a batch leaves it once the transport has its last ack.
    pub(crate) fn start(transport: Arc<dyn Transport>, queue: &'static str, held: Arc<InFlight>) -> Self {
        // A transport whose calls cost no round trip (memory) gains nothing
        // from fuller acks, and the wait's timers and checks cost it a third
        // of its throughput (measured with the memory benchmark).
        let waits = Waits { linger: transport.concurrent_receives() > 0, gate: &GATE };
        Acker::start_with(transport, queue, held, waits)
    }

    /// [`Acker::start`] with `waits` (tests: a gate of their own, since the
    /// process's is shared by every test running).
    fn start_with(transport: Arc<dyn Transport>, queue: &'static str, held: Arc<InFlight>, waits: Waits) -> Self {
        let (tx, rx) = mpsc::unbounded_channel();
        let counts = Arc::new(Counts::default());
        {
            let mut all = ACKERS.lock().unwrap_or_else(|p| p.into_inner());
            all.retain(|c| c.strong_count() > 0);
            all.push(Arc::downgrade(&counts));
        }
        let task = tokio::spawn(flush_loop(transport.clone(), queue, rx, counts.clone(), held.clone(), waits));
        Acker { transport, queue, held, tx, counts, task: Mutex::new(Some(task)) }
    }

    /// Marks message `index` of `batch` handled and queues its deletion.
    ///
    /// Marked first: the flush goes at once when nothing held is left
    /// unsettled, which it could not see if the last ack arrived before its
    /// message was marked.
    pub(crate) fn ack(&self, batch: &Arc<Batch>, index: usize) {
        batch.settle_later(index);
        self.queue_ack(Handled { batch: batch.clone(), index });
    }

    fn queue_ack(&self, handled: Handled) {
        self.counts.pending.fetch_add(1, Ordering::SeqCst);
        if let Err(mpsc::error::SendError(Command::Ack(handled))) = self.tx.send(Command::Ack(handled)) {
            // The flush task is gone (the worker stopped): the message comes
            // back when its visibility runs out.
            self.counts.pending.fetch_sub(1, Ordering::SeqCst);
            handled.done(&self.held);
        }
    }

    /// [`Acker::ack`], now, in a call of its own (a suspect's, before the gate
    /// it ran behind opens); a refusal for now queues it as [`Acker::ack`]
    /// does, to be tried again.
    pub(crate) async fn ack_now(&self, batch: &Arc<Batch>, index: usize) {
        batch.settle_later(index);
        let handled = Handled { batch: batch.clone(), index };
        match self.transport.ack(self.queue, vec![handled.receipt().clone()]).await.pop() {
            Some(Ok(())) => handled.done(&self.held),
            Some(Err(TransportError::StaleReceipt)) => {
                too_late(self.queue);
                handled.done(&self.held);
            }
            Some(Err(_)) | None => self.queue_ack(handled),
        }
    }

    /// Acks queued but not yet confirmed by the transport.
    pub(crate) fn pending(&self) -> usize {
        self.counts.pending.load(Ordering::SeqCst)
    }

    /// Acks the transport refused until they were given up (see
    /// [`retry::again_while_running`]): their messages stay in the queue and
    /// come back after their visibility timeout.
    pub(crate) fn lost(&self) -> usize {
        self.counts.lost.load(Ordering::SeqCst)
    }

    /// Waits (at most `limit`) until every queued ack has reached the
    /// transport. A FIFO group stays locked until its messages are deleted, so
    /// receiving before that would only find the group busy.
    pub(crate) async fn settled(&self, limit: Duration) {
        self.counts.settled(Instant::now() + limit).await;
    }

    /// A stop has begun, to end by `deadline`: a batch the transport refuses
    /// from now on is tried again until then, instead of for as long as
    /// [`retry::again_while_running`] says.
    pub(crate) fn stopping_by(&self, deadline: Instant) {
        self.counts.stop_by(deadline);
    }

    /// Flushes everything queued and stops, by `deadline`: a batch the
    /// transport refuses is tried again until then (whether or not its
    /// messages stay invisible), so that acknowledgements outlast a database
    /// that is back within a stop's grace period (a failover during a
    /// deploy). What is not flushed by the deadline, or once `cut` completes
    /// (a forced stop's budget), stays [`pending`](Acker::pending): a call
    /// still under way then (a connection that cannot be had, say) is
    /// abandoned, and its messages come back after their visibility timeout.
    pub(crate) async fn close_by(&self, deadline: Instant, cut: impl std::future::Future<Output = ()>) {
        self.stopping_by(deadline);
        let _ = self.tx.send(Command::Close);
        let task = self.task.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(mut task) = task {
            let flushed = tokio::select! {
                done = tokio::time::timeout_at(deadline, &mut task) => done.is_ok(),
                () = cut => false,
            };
            if !flushed {
                task.abort();
                let _ = task.await;
            }
        }
    }
}

/// Waits (until `deadline` at most) for the acknowledgements queued by
/// every worker of the process to reach their transports: a suspect's, so
/// that a crash while it runs brings back no message handled before it, of
/// any queue.
pub(crate) async fn all_settled(deadline: Instant) {
    // (Ackers gone are pruned as new ones start.)
    let all: Vec<Arc<Counts>> =
        ACKERS.lock().unwrap_or_else(|p| p.into_inner()).iter().filter_map(Weak::upgrade).collect();
    for counts in all {
        counts.settled(deadline).await;
    }
}

/// What the flush task shares with its [`Acker`] (and [`all_settled`]).
#[derive(Default)]
struct Counts {
    /// Acks queued and not yet confirmed or given up.
    pending: AtomicUsize,
    /// Acks given up while running or by a stop.
    lost: AtomicUsize,
    /// Told after each flush.
    flushed: Notify,
    /// Set by a stop: refused acks are tried again until then.
    stop_deadline: Mutex<Option<Instant>>,
}

impl Counts {
    fn stop_by(&self, deadline: Instant) {
        *self.stop_deadline.lock().unwrap_or_else(|p| p.into_inner()) = Some(deadline);
    }

    fn stop_deadline(&self) -> Option<Instant> {
        *self.stop_deadline.lock().unwrap_or_else(|p| p.into_inner())
    }

    async fn settled(&self, deadline: Instant) {
        while self.pending.load(Ordering::SeqCst) > 0 {
            let flushed = self.flushed.notified();
            tokio::pin!(flushed);
            flushed.as_mut().enable();
            if self.pending.load(Ordering::SeqCst) == 0 {
                return;
            }
            if tokio::time::timeout_at(deadline, flushed).await.is_err() {
                return;
            }
        }
    }
}

/// How a flush waits for more acks.
#[derive(Clone, Copy)]
struct Waits {
    /// Whether it waits for the acks of handlers still running (see
    /// [`LINGER`]), or only lets them run one turn.
    linger: bool,
    /// The gate whose closing (a suspect about to run alone) ends a wait.
    gate: &'static Gate,
}

async fn flush_loop(
    transport: Arc<dyn Transport>,
    queue: &'static str,
    mut rx: mpsc::UnboundedReceiver<Command>,
    counts: Arc<Counts>,
    held: Arc<InFlight>,
    Waits { linger, gate }: Waits,
) {
    let max = transport.max_batch().max(1);
    let mut commands = Vec::with_capacity(max);
    let mut batch = Vec::with_capacity(max);
    let mut closing = false;
    // Acks of rows another transaction holds wait there, not here (a
    // JoinSet: aborted with this task, by a stop that runs out of time).
    let (to_lane, lane_rx) = mpsc::unbounded_channel();
    let mut lane = tokio::task::JoinSet::new();
    lane.spawn(held_lane(transport.clone(), queue, lane_rx, counts.clone(), held.clone()));
    while !closing && rx.recv_many(&mut commands, max).await > 0 {
        take(&mut commands, &mut batch, &mut closing);
        if !linger && !closing && batch.len() < max && held.has_unsettled() {
            // No timer, but one turn of the scheduler while handlers are
            // still running: they add their acks, and the flush takes them
            // along. Woken by every ack, the task flushed one or two at a
            // time, each a call, a queue lookup and a lock; with the turn,
            // one send per message at concurrency 8 on `memory://` used 0.91
            // of the CPU and 0.89 of the wall time (nine pairs). The last
            // ack of what the worker holds goes at once, as with lingering.
            tokio::task::yield_now().await;
            while batch.len() + commands.len() < max {
                let Ok(command) = rx.try_recv() else { break };
                commands.push(command);
            }
            take(&mut commands, &mut batch, &mut closing);
        }
        // Wait for the acks of handlers still running, while they keep
        // coming; not while a suspect waits to run alone (the process's gate
        // is closed): no handler starts then, and the suspect waits for these.
        let until_at_most = Instant::now() + LINGER;
        while linger && !closing && !batch.is_empty() && batch.len() < max && held.has_unsettled() {
            let until = until_at_most.min(Instant::now() + GAP);
            let closed = gate.closing();
            tokio::pin!(closed);
            closed.as_mut().enable();
            if gate.is_closed() {
                break;
            }
            tokio::select! {
                more = tokio::time::timeout_at(until, rx.recv_many(&mut commands, max - batch.len())) => match more {
                    Ok(0) => closing = true,
                    Ok(_) => take(&mut commands, &mut batch, &mut closing),
                    Err(_) => break,
                },
                () = &mut closed => break,
            }
        }
        if batch.is_empty() {
            continue;
        }
        let mut count = batch.len();
        let mut attempt = 0;
        let mut first_refused = None;
        loop {
            let receipts = batch.iter().map(|handled| handled.receipt().clone()).collect();
            let tried = Instant::now();
            let mut results = transport.ack(queue, receipts).await.into_iter();
            let mut retry = Vec::new();
            let mut failure = None;
            for handled in batch.drain(..) {
                let missing = || Err(TransportError::Backend("the transport answered no result for this ack".into()));
                match results.next().unwrap_or_else(missing) {
                    Ok(()) => handled.done(&held),
                    Err(TransportError::StaleReceipt) => {
                        too_late(queue);
                        handled.done(&held);
                    }
                    Err(TransportError::Held(e)) => {
                        // Its own lane, counted there.
                        count -= 1;
                        if let Err(mpsc::error::SendError((handled, ..))) = to_lane.send((handled, e, tried)) {
                            counts.lost.fetch_add(1, Ordering::SeqCst);
                            handled.done(&held);
                        }
                    }
                    Err(e) => {
                        failure.get_or_insert(e);
                        retry.push(handled);
                    }
                }
            }
            attempt += 1;
            let Some(e) = failure else { break };
            // One line per attempt of the batch (one per receipt was as many
            // lines as messages, all alike, while the database was down),
            // and fewer as the tries go on.
            let now = Instant::now();
            let first = *first_refused.get_or_insert(now);
            let deadline = counts.stop_deadline();
            let again = match deadline {
                Some(deadline) => now < deadline,
                None => retry::again_while_running(attempt, first, || retry.iter().any(Handled::invisible)),
            };
            if !again {
                counts.lost.fetch_add(retry.len(), Ordering::SeqCst);
                tracing::warn!(
                    queue,
                    messages = retry.len(),
                    "could not acknowledge {} handled message(s) after {attempt} attempts ({e}): they stay in the \
                     queue and are received and handled again once their visibility timeout runs out",
                    retry.len()
                );
                for handled in retry {
                    handled.done(&held);
                }
                break;
            }
            let told = attempt <= retry::TRIES_AT_LEAST || attempt.is_power_of_two();
            match deadline {
                None if told => tracing::warn!(
                    queue,
                    messages = retry.len(),
                    "acknowledging {} message(s) failed (attempt {attempt}; tried again while they stay invisible, \
                     for up to {:.1} s more): {e}",
                    retry.len(),
                    (first + retry::TRY_FOR).saturating_duration_since(now).as_secs_f32()
                ),
                Some(deadline) if told => tracing::warn!(
                    queue,
                    messages = retry.len(),
                    "acknowledging {} message(s) failed (attempt {attempt}; the stop tries again for up to {:.1} s \
                     more): {e}",
                    retry.len(),
                    deadline.saturating_duration_since(Instant::now()).as_secs_f32()
                ),
                _ => {}
            }
            batch = retry;
            tokio::time::sleep(retry::retry_pause(attempt)).await;
        }
        batch.clear();
        counts.pending.fetch_sub(count, Ordering::SeqCst);
        counts.flushed.notify_waiters();
    }
    // The lane ends once what it holds is acknowledged, or at a stop's
    // deadline.
    drop(to_lane);
    while lane.join_next().await.is_some() {}
}

/// Acknowledges the handled messages whose rows another transaction holds
/// (an application's that updated or locked them and has not ended,
/// [`TransportError::Held`]), each in a call of its own, again and again
/// until that transaction ends: the transport waits a moment for the row
/// each time, so that the acknowledgement is first in line when it is let
/// go. The heartbeat cannot extend a held row, but nothing else can take
/// it back either, and a lease holds until it is taken back, so the
/// acknowledgement goes through though the lease's time ran out while it
/// waited. Tried in the flush with
/// the others, a held row held up every acknowledgement of its queue (one
/// row held for a minute, tried from outside: 592 handled messages left
/// unacknowledged for that minute). A stop gives up at its deadline: the
/// message stays pending, and comes back.
async fn held_lane(
    transport: Arc<dyn Transport>,
    queue: &'static str,
    mut rx: mpsc::UnboundedReceiver<(Handled, String, Instant)>,
    counts: Arc<Counts>,
    held: Arc<InFlight>,
) {
    let warned = crate::throttle::Throttle::default();
    let mut waiting: Vec<(Handled, Instant)> = Vec::new();
    loop {
        if waiting.is_empty() {
            let Some(first) = rx.recv().await else { return };
            waiting.push(arrived(first, queue, &warned));
        }
        while let Ok(more) = rx.try_recv() {
            waiting.push(arrived(more, queue, &warned));
        }
        if counts.stop_deadline().is_some_and(|deadline| Instant::now() >= deadline) {
            // Left pending, as a stop leaves what it could not flush.
            return;
        }
        let round = Instant::now();
        let mut still = Vec::with_capacity(waiting.len());
        for (handled, since) in waiting.drain(..) {
            match transport.ack(queue, vec![handled.receipt().clone()]).await.pop() {
                Some(Ok(())) => {
                    tracing::info!(
                        queue,
                        "acknowledged a handled message whose row another transaction held, after {:.1} s",
                        since.elapsed().as_secs_f32()
                    );
                    settled(handled, &counts, &held);
                }
                Some(Err(TransportError::StaleReceipt)) => {
                    too_late(queue);
                    settled(handled, &counts, &held);
                }
                // Held still, or refused otherwise (the database gone
                // meanwhile): again, until the row is let go or a stop's
                // deadline.
                Some(Err(_)) | None => still.push((handled, since)),
            }
        }
        waiting = still;
        if !waiting.is_empty() {
            // Each try waits its moment for the row; a round that did not
            // (a refusal of another kind) waits here instead.
            tokio::time::sleep(HELD_PAUSE.saturating_sub(round.elapsed())).await;
        }
    }
}

/// A message come to the lane of held rows, said (once a minute at most),
/// with when its acknowledgement was first tried.
fn arrived(
    (handled, why, tried): (Handled, String, Instant),
    queue: &str,
    warned: &crate::throttle::Throttle,
) -> (Handled, Instant) {
    if warned.due(HELD_WARNING, false) {
        tracing::warn!(
            queue,
            "acknowledging a handled message waits for its row ({why}); the queue's other acknowledgements go on, \
             and this one is tried again until that transaction ends"
        );
    }
    (handled, tried)
}

/// The transport has the ack of a message from the lane of held rows (or
/// found it redelivered).
fn settled(handled: Handled, counts: &Counts, held: &InFlight) {
    handled.done(held);
    counts.pending.fetch_sub(1, Ordering::SeqCst);
    counts.flushed.notify_waiters();
}

/// Says that an acknowledgement was refused: its lease had run out.
fn too_late(queue: &str) {
    tracing::warn!(
        queue,
        "an acknowledgement came too late: the message had been redelivered and may be handled twice (raise the \
         queue's visibility timeout if handlers are slow)"
    );
}

/// Moves received commands into the batch of receipts.
fn take(commands: &mut Vec<Command>, batch: &mut Vec<Handled>, closing: &mut bool) {
    for command in commands.drain(..) {
        match command {
            Command::Ack(handled) => batch.push(handled),
            Command::Close => *closing = true,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::queue::QueueSpec;
    use crate::transport::memory::MemoryTransport;
    use crate::transport::Outgoing;
    use crate::worker::inflight::Batch;

    /// When the one acknowledgement of a worker that still holds another
    /// message goes out, after the gate was closed (by a suspect) `closing_after`
    /// from the ack, or never.
    async fn first_ack_after(closing_after: Option<Duration>) -> Duration {
        let gate: &'static Gate = Box::leak(Box::new(Gate::new()));
        let transport = Arc::new(MemoryTransport::new());
        transport.declare(&QueueSpec::standard("q")).await.unwrap();
        for _ in 0..2 {
            transport.send("q", Outgoing { body: b"{}".to_vec().into(), ..Outgoing::default() }).await.unwrap();
        }
        let deliveries = transport.receive("q", 2, Duration::ZERO).await.unwrap();
        assert_eq!(deliveries.len(), 2);
        let batch = Arc::new(Batch::new(deliveries, false, Instant::now(), Duration::from_secs(60)));
        let held = Arc::new(InFlight::default());
        held.hold(batch.clone());
        // Lingering as on a database (`memory://` itself does not).
        let acker = Acker::start_with(transport.clone(), "q", held, Waits { linger: true, gate });
        let started = Instant::now();
        let suspect = closing_after.map(|after| {
            tokio::spawn(async move {
                tokio::time::sleep(after).await;
                let alone = gate.alone(Duration::from_secs(1)).await;
                tokio::time::sleep(Duration::from_secs(1)).await;
                drop(alone);
            })
        });
        // The first message is handled; the second is still held.
        acker.ack(&batch, 0);
        // Settled the moment the transport took the ack (`memory://` answers
        // at once).
        acker.settled(Duration::from_secs(1)).await;
        let took = started.elapsed();
        assert_eq!(acker.pending(), 0, "acknowledged");
        if let Some(suspect) = suspect {
            suspect.await.unwrap();
        }
        acker.close_by(Instant::now() + Duration::from_secs(1), std::future::pending()).await;
        took
    }

    /// The receipt whose row another transaction holds, and whether it has
    /// let it go ([`held_row`]).
    static HELD_KEY: AtomicUsize = AtomicUsize::new(usize::MAX);
    static LET_GO: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

    /// Acks as PostgreSQL answers them while another transaction holds the
    /// row of [`HELD_KEY`]: the others at once; that one after a second's
    /// wait for the row, refused as held until [`LET_GO`].
    fn held_row(receipts: &[Receipt]) -> (Duration, Vec<Result<(), TransportError>>) {
        let held = |r: &Receipt| r.key as usize == HELD_KEY.load(Ordering::SeqCst) && !LET_GO.load(Ordering::SeqCst);
        let wait = if receipts.iter().any(held) { Duration::from_secs(1) } else { Duration::ZERO };
        let answers = receipts
            .iter()
            .map(|r| if held(r) { Err(TransportError::Held("lock timeout".into())) } else { Ok(()) })
            .collect();
        (wait, answers)
    }

    /// Waits (on paused time) until `acker` has `pending` acks left, at most
    /// `limit`; how long that took.
    async fn until_pending(acker: &Acker, pending: usize, limit: Duration) -> Duration {
        let started = Instant::now();
        while acker.pending() != pending {
            assert!(started.elapsed() < limit, "{} pending after {limit:?}", acker.pending());
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        started.elapsed()
    }

    #[tokio::test(start_paused = true)]
    async fn an_ack_whose_row_another_transaction_holds_waits_in_its_own_lane_until_it_is_let_go() {
        let gate: &'static Gate = Box::leak(Box::new(Gate::new()));
        let memory = MemoryTransport::new();
        memory.declare(&QueueSpec::standard("q")).await.unwrap();
        for _ in 0..4 {
            memory.send("q", Outgoing { body: b"{}".to_vec().into(), ..Outgoing::default() }).await.unwrap();
        }
        let deliveries = memory.receive("q", 4, Duration::ZERO).await.unwrap();
        HELD_KEY.store(deliveries[1].receipt.key as usize, Ordering::SeqCst);
        // A visibility of 5 s, which the heartbeat cannot extend for a held row.
        let batch = Arc::new(Batch::new(deliveries, false, Instant::now(), Duration::from_secs(5)));
        let held = Arc::new(InFlight::default());
        held.hold(batch.clone());
        let stub = crate::transport::stub::Stub { wait: Duration::ZERO, extend_all: |_| Vec::new(), ack: held_row };
        let acker = Acker::start_with(Arc::new(stub), "q", held, Waits { linger: true, gate });
        for i in 0..3 {
            acker.ack(&batch, i);
        }
        // The others go through at once, beside the held one (which took the
        // flush a second); a later ack is not held up behind it, though each
        // try of the held one waits a second.
        let took = until_pending(&acker, 1, Duration::from_secs(3)).await;
        assert!(took <= Duration::from_secs(2), "{took:?}");
        acker.ack(&batch, 3);
        let took = until_pending(&acker, 1, Duration::from_secs(3)).await;
        assert!(took <= Duration::from_millis(300), "{took:?}");
        // Tried again for as long as the row is held, well past its
        // visibility, and never given up.
        tokio::time::sleep(Duration::from_secs(60)).await;
        assert_eq!((acker.pending(), acker.lost()), (1, 0));
        // Let go: acknowledged at the next try.
        LET_GO.store(true, Ordering::SeqCst);
        until_pending(&acker, 0, Duration::from_secs(3)).await;
        assert_eq!(acker.lost(), 0);
        acker.close_by(Instant::now() + Duration::from_secs(1), std::future::pending()).await;
    }

    #[tokio::test(start_paused = true)]
    async fn an_ack_waits_for_more_unless_a_suspect_closes_the_gate() {
        // Open: it waits for the acknowledgements of handlers still running,
        // one gap at most when none comes.
        assert_eq!(first_ack_after(None).await, GAP);
        // A suspect closes the gate while it waits: no handler starts now,
        // and the suspect waits for this ack, so it goes at once.
        assert_eq!(first_ack_after(Some(Duration::from_millis(5))).await, Duration::from_millis(5));
        // Closed already: no wait at all.
        assert_eq!(first_ack_after(Some(Duration::ZERO)).await, Duration::ZERO);
    }
}
