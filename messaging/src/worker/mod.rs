//! The worker: one per queue with handlers. It receives in batches, runs
//! handlers with the queue's concurrency (FIFO groups in order, distinct groups
//! in parallel), acknowledges only after success (in batches), keeps slow
//! messages invisible with a heartbeat, retries with backoff, dead-letters
//! permanent failures, and shuts down gracefully.

mod acker;
mod alone;
mod dispatch;
mod inflight;
mod newer;
mod outage;
mod pace;
mod ready;

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc;
use tokio::task::JoinSet;
use tokio::time::Instant;

use self::acker::Acker;
use self::dispatch::Step;
pub(crate) use self::inflight::Batch;
use self::inflight::{InFlight, Unit};
use self::pace::Pace;
use self::ready::{Ready, Task, Work};
use crate::control::{Counters, PauseWatch, Pauses, QueueCounters};
use crate::enrich::EnrichHook;
use crate::error::TransportError;
use crate::observe::SharedObserver;
use crate::pipeline::Pipeline;
use crate::registry::Routes;
use crate::retry::{backoff, retry_pause};
use crate::shutdown::Shutdown;
use crate::telemetry::Telemetry;
use crate::transport::{Delivery, Receipt, Transport};

/// Timing of a worker.
#[derive(Debug, Clone, Copy)]
pub(crate) struct WorkerSettings {
    /// How long one receive waits for a message (long polling).
    pub(crate) receive_wait: Duration,
    /// How long in-flight handlers may run on after shutdown begins.
    pub(crate) grace: Duration,
}

/// The consumer of one queue.
pub(crate) struct Worker {
    routes: Arc<Routes>,
    transport: Arc<dyn Transport>,
    pipeline: Arc<Pipeline>,
    hooks: Hooks,
    inflight: Arc<InFlight>,
    acker: Acker,
    ready: Ready,
    pace: Pace,
    /// Where lanes send work that must wait (see [`Worker::park`]).
    parked: mpsc::UnboundedSender<Parked>,
    /// The receiving end, taken by [`WorkerHandle::run`].
    parking: std::sync::Mutex<Option<mpsc::UnboundedReceiver<Parked>>>,
    /// The error of the last receive, while receives fail (for `/ready`).
    receive_error: std::sync::Mutex<Option<String>>,
    /// This queue's counts of handled and failed messages.
    counted: Arc<QueueCounters>,
    /// This queue's pause switch in this process.
    paused: PauseWatch,
    /// How long after it was sent a delivery that a newer build may read is
    /// given back for one ([`Setup::wait_for_newer`](crate::Setup::wait_for_newer)).
    newer_wait: Duration,
    /// Handled messages whose outcome (a retry, a dead letter) a stop cut
    /// off on its way to the transport: they come back after their
    /// visibility ([`Worker::storing`]).
    outcomes_cut: std::sync::atomic::AtomicUsize,
    /// The idempotency store refusing claims: receives wait meanwhile.
    outage: outage::ClaimOutage,
}

/// What watches a worker: the test observer, metrics, the span enrichment hook.
#[derive(Clone)]
pub(crate) struct Hooks {
    pub(crate) observer: SharedObserver,
    pub(crate) telemetry: Arc<Telemetry>,
    pub(crate) enrich: Option<EnrichHook>,
    /// This process's pause switches (the console's).
    pub(crate) pauses: Pauses,
    /// What the workers handled and failed, per queue (the console's rates).
    pub(crate) counters: Counters,
}

/// A running worker's handle, for drain detection.
#[derive(Clone)]
pub(crate) struct WorkerHandle {
    worker: Arc<Worker>,
}

impl WorkerHandle {
    /// No message received and unsettled, no ack waiting.
    pub(crate) fn is_idle(&self) -> bool {
        let w = &self.worker;
        w.inflight.is_empty() && w.acker.pending() == 0 && w.ready.lanes() == 0
    }

    pub(crate) fn queue(&self) -> &'static str {
        self.worker.routes.spec().name
    }

    /// The error of the last receive while receives fail, or what the
    /// idempotency store said while it refuses claims; `None` once receives
    /// succeed and claims are taken again (or before the first).
    pub(crate) fn receive_error(&self) -> Option<String> {
        let failed = self.worker.receive_error.lock().unwrap_or_else(|p| p.into_inner()).clone();
        failed.or_else(|| self.worker.outage.error())
    }
}

impl Worker {
    pub(crate) fn start(
        routes: Arc<Routes>,
        transport: Arc<dyn Transport>,
        pipeline: Arc<Pipeline>,
        hooks: Hooks,
        newer_wait: Duration,
    ) -> WorkerHandle {
        let inflight = Arc::new(InFlight::default());
        let acker = Acker::start(transport.clone(), routes.spec().name, inflight.clone());
        let ready = Ready::new(routes.spec().concurrency);
        let (parked, parking) = mpsc::unbounded_channel();
        let counted = hooks.counters.of(routes.spec().name);
        let paused = hooks.pauses.watch(routes.spec().name);
        WorkerHandle {
            worker: Arc::new(Worker {
                routes,
                transport,
                pipeline,
                hooks,
                inflight,
                acker,
                ready,
                pace: Pace::default(),
                parked,
                parking: std::sync::Mutex::new(Some(parking)),
                receive_error: std::sync::Mutex::new(None),
                counted,
                paused,
                newer_wait,
                outage: outage::ClaimOutage::default(),
                outcomes_cut: std::sync::atomic::AtomicUsize::new(0),
            }),
        }
    }
}

impl WorkerHandle {
    /// Consumes until `shutdown`, then lets the receives in flight finish and
    /// gives back what they return, lets running handlers finish within the
    /// grace period, releases what was not started and flushes acks.
    pub(crate) async fn run(self, settings: WorkerSettings, shutdown: Shutdown) -> Stopped {
        let worker = self.worker;
        let spec = worker.routes.spec().clone();
        let heartbeat = worker.start_heartbeat();
        // A receive in flight when shutdown begins is ended or waited for
        // (what it returns is given back at once), so its wait must fit in
        // the grace period: no long poll of ours outlives the process. (At
        // least a second: a shorter SQS wait is a short poll, and an idle
        // queue would be polled without pause.)
        let wait = settings.receive_wait.min(settings.grace.max(Duration::from_secs(1)));
        let drain_limit = settings.grace.saturating_add(Duration::from_secs(1));
        let mut lanes = JoinSet::new();
        let mut receiving: JoinSet<Received> = JoinSet::new();
        // Work waiting outside the lanes (a FIFO head's retry, a claim held
        // elsewhere): each a timer that hands the task back when it is due.
        let mut parked: JoinSet<Task> = JoinSet::new();
        let Some(mut parking) = worker.parking.lock().unwrap_or_else(|p| p.into_inner()).take() else {
            tracing::error!(queue = spec.name, "the worker of this queue was started twice");
            return Stopped::default();
        };
        let max = worker.transport.max_batch().max(1);
        // Receives kept going ahead of the lanes: as many as the transport
        // suits on a standard queue; none on a FIFO queue, whose groups must
        // be released (acked) before their next messages can come.
        let receivers = if spec.fifo { 0 } else { worker.transport.concurrent_receives() };
        let mut failures = 0u32;
        // What receives returned after the shutdown began (given back with
        // the rest, and counted), and the receives cut off unfinished.
        let mut returned: Vec<Receipt> = Vec::new();
        let mut cut_off = 0usize;
        loop {
            while lanes.try_join_next().is_some() {}
            // When to receive. Ahead of the lanes: while fewer than two
            // batches (or one per receiver) wait or are being received. Else
            // when a lane is free and every batch is claimed (a FIFO queue
            // also waits for its acks to reach the transport: a group stays
            // locked until its messages are deleted).
            let in_flight = receiving.len();
            let wanted = move |batches: usize, lanes: usize, concurrency: usize| {
                if receivers == 0 {
                    in_flight == 0 && batches == 0 && lanes < concurrency
                } else {
                    batches + in_flight < receivers.max(2)
                }
            };
            tokio::select! {
                biased;
                _ = shutdown.wait() => break,
                Some(done) = receiving.join_next(), if in_flight > 0 => {
                    let received = done.unwrap_or_else(|e| Err(TransportError::Backend(format!("the receive panicked: {e}"))));
                    worker.accept(received, &mut failures, &mut lanes, &shutdown);
                }
                Some(set_aside) = parking.recv() => set_aside.start(&mut parked),
                Some(Ok(task)) = parked.join_next(), if !parked.is_empty() => {
                    worker.start_lanes(worker.ready.resume(task), &mut lanes, &shutdown);
                }
                _ = worker.ready.until(wanted), if in_flight < receivers.max(1) => {
                    let pause = if failures == 0 { Duration::ZERO } else { backoff(failures) };
                    let receive = worker.clone().receive(spec.concurrency, max, wait, pause, shutdown.clone());
                    if receivers == 0 {
                        // On demand: receive here, sparing a task hop per batch;
                        // work set aside comes back meanwhile (a FIFO retry
                        // must not wait for a long poll).
                        let mut receive = std::pin::pin!(receive);
                        let received = loop {
                            tokio::select! {
                                r = &mut receive => break Some(r),
                                _ = shutdown.wait() => break None,
                                Some(set_aside) = parking.recv() => set_aside.start(&mut parked),
                                Some(Ok(task)) = parked.join_next(), if !parked.is_empty() => {
                                    worker.start_lanes(worker.ready.resume(task), &mut lanes, &shutdown);
                                }
                            }
                        };
                        match received {
                            Some(received) => worker.accept(received, &mut failures, &mut lanes, &shutdown),
                            None => {
                                let mut ended = false;
                                let end = async {
                                    let received = worker.interrupting(receive).await;
                                    returned.extend(receipts_of(received));
                                    ended = true;
                                };
                                until_stopped(&shutdown, drain_limit, end).await;
                                cut_off += usize::from(!ended);
                                break;
                            }
                        }
                    } else {
                        receiving.spawn(receive);
                    }
                }
            }
        }
        parked.abort_all();
        let stopping = tokio::time::Instant::now();
        // Acks refused from now on are tried until the stop's end (the
        // grace period; more below if the handlers take it all), not three
        // times: they gave up meanwhile while the handlers finished or the
        // release went on (SQS away as a stop released twelve messages).
        worker.acker.stopping_by(stopping + settings.grace);
        // Receives in flight finish (their wait fits in the grace period), and
        // what they return is given back with the rest, rather than left
        // invisible until its timeout. Only the receives count against a
        // forced stop's budget for them: given back inside it as well, a
        // receive of 1,000 messages and their release overran it on a busy
        // machine, and the stop's counts left those 1,000 out.
        let drained = async {
            while !receiving.is_empty() {
                let next = worker.interrupting(receiving.join_next()).await;
                if let Some(done) = next {
                    let received = done.unwrap_or_else(|e| Err(TransportError::Backend(e.to_string())));
                    returned.extend(receipts_of(received));
                }
            }
        };
        until_stopped(&shutdown, drain_limit, drained).await;
        cut_off += receiving.len();
        receiving.abort_all();
        if cut_off > 0 {
            tracing::warn!(
                queue = spec.name,
                receives = cut_off,
                "receives cut off by the shutdown: what they leased, if anything, comes back after its visibility \
                 timeout of {:?}",
                spec.visibility
            );
        }
        let mut report = Stopped { receives_cut_off: cut_off, ..Stopped::default() };
        if !returned.is_empty() {
            tracing::debug!(
                queue = spec.name,
                count = returned.len(),
                "giving back what receives returned at shutdown"
            );
        }
        if !shutdown.is_forced() {
            // Back at once, while the running handlers finish (unless the
            // stop is forced meanwhile, or the grace period runs out with the
            // database away: what is left then waits for its visibility
            // timeout, and is counted so).
            let until = async {
                tokio::select! {
                    () = shutdown.forced() => {}
                    () = tokio::time::sleep_until(stopping + settings.grace) => {}
                }
            };
            worker.give_back(std::mem::take(&mut returned), until, &mut report).await;
        }
        // Graceful end: let running handlers finish within the grace period
        // (or until the shutdown is forced).
        let finished = tokio::select! {
            done = tokio::time::timeout(settings.grace, async { while lanes.join_next().await.is_some() {} }) => done.is_ok(),
            _ = shutdown.forced() => lanes.is_empty(),
        };
        if !finished {
            report.handlers_stopped = lanes.len();
            let forced = shutdown.is_forced();
            if forced {
                tracing::warn!(queue = spec.name, handlers = lanes.len(), "shutdown forced: stopping running handlers");
            }
            lanes.abort_all();
            while lanes.join_next().await.is_some() {}
            // Neither released nor given back: a retry or dead letter still
            // on its way (waiting for a row another transaction holds). Said
            // in the same line as the others' release: said apart, after it,
            // it corrected a line that had just called every message released.
            let cut = worker.outcomes_cut.load(std::sync::atomic::Ordering::SeqCst);
            report.not_released += cut;
            let grace = settings.grace;
            match (forced, cut) {
                (false, 0) => tracing::warn!(
                    queue = spec.name,
                    "handlers still running after the grace period of {grace:?} were stopped; their messages are released"
                ),
                (false, cut) => tracing::warn!(
                    queue = spec.name,
                    count = cut,
                    "handlers still running after the grace period of {grace:?} were stopped; their messages are \
                     released, but for {cut} whose failure was being stored (a retry or a dead letter, waiting for a \
                     row another transaction holds): those come back when their visibility runs out, and the attempt \
                     is tried again"
                ),
                (true, 0) => {}
                (true, cut) => tracing::warn!(
                    queue = spec.name,
                    count = cut,
                    "stopped while storing the outcome of failed messages (a retry or a dead letter): they come back \
                     when their visibility runs out, and the attempt is tried again"
                ),
            }
        }
        heartbeat.abort();
        let mut held = worker.inflight.take_unsettled();
        if !held.is_empty() {
            tracing::info!(
                queue = spec.name,
                count = held.len(),
                "releasing messages that were received but not handled"
            );
        }
        // A forced stop gives back here what its receives returned, too.
        held.append(&mut returned);
        // The release and the last acks get what is left of the grace
        // period (at least `FLUSH_AT_LEAST`), a forced shutdown a budget for
        // each; what is left becomes visible again when its visibility runs
        // out. Unbounded before, a stop with the database away took 15 s
        // past its handlers (three tries of the acks, each waiting 5 s for a
        // connection), and gave up on acks a failover would have taken.
        // A stop forced meanwhile cuts either short, with the same budget.
        let forced = shutdown.is_forced();
        let now = tokio::time::Instant::now();
        let flush_by = if forced { now + FORCED_BUDGET } else { (stopping + settings.grace).max(now + FLUSH_AT_LEAST) };
        worker.acker.stopping_by(flush_by);
        let cut = || async {
            shutdown.forced().await;
            tokio::time::sleep(FORCED_BUDGET).await;
        };
        let until = async {
            tokio::select! {
                () = tokio::time::sleep_until(flush_by) => {}
                () = cut() => {}
            }
        };
        worker.give_back(held, until, &mut report).await;
        // Handled messages whose acks are still on their way stay invisible
        // while the acks are flushed (after the release: an extension racing
        // it would have kept a released message invisible).
        let heartbeat = (!worker.inflight.is_empty()).then(|| worker.start_heartbeat());
        let flush_by = if shutdown.is_forced() { tokio::time::Instant::now() + FORCED_BUDGET } else { flush_by };
        worker.acker.close_by(flush_by, cut()).await;
        if let Some(heartbeat) = heartbeat {
            heartbeat.abort();
        }
        // What the flush gave up, and what a forced stop left unflushed.
        report.not_acknowledged = worker.acker.lost() + worker.acker.pending();
        report
    }
}

/// How long each of a forced shutdown's last steps (releasing what is held,
/// flushing acknowledgements) may take: together with
/// [`RECEIVES_BUDGET`] they fit the two seconds an operator's second Ctrl-C
/// is promised.
const FORCED_BUDGET: Duration = Duration::from_millis(800);

/// The least time a graceful stop gives the release of what it holds and
/// the last acknowledgements, when the handlers took the grace period.
const FLUSH_AT_LEAST: Duration = Duration::from_secs(2);

/// How long a forced shutdown still waits for the receives in flight to
/// return (what they return is given back with the rest, in
/// [`FORCED_BUDGET`]). An interrupted database or `memory://` receive
/// returns within a statement; one cut off instead leaves what its lease
/// took invisible until the visibility timeout, and is counted in
/// `Stopped::receives_cut_off` (an SQS long poll, which cannot be
/// interrupted, is left to run out).
const RECEIVES_BUDGET: Duration = Duration::from_millis(300);

/// Runs `work` (receives in flight, ended) for at most
/// `limit`, and once the shutdown is forced for at most [`RECEIVES_BUDGET`]
/// more.
async fn until_stopped(shutdown: &Shutdown, limit: Duration, work: impl std::future::Future<Output = ()>) {
    let mut work = std::pin::pin!(tokio::time::timeout(limit, work));
    tokio::select! {
        _ = &mut work => {}
        _ = shutdown.forced() => {
            let _ = tokio::time::timeout(RECEIVES_BUDGET, work).await;
        }
    }
}

/// What one worker's shutdown left behind.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Stopped {
    /// Handlers still running when the grace period ran out (or the shutdown
    /// was forced), stopped.
    pub(crate) handlers_stopped: usize,
    /// Messages held and not handled, given back to their queue.
    pub(crate) released: usize,
    /// Messages held that could not be given back (a failed or unfinished
    /// release), and failed messages whose retry or dead letter the stop cut
    /// off: they come back once their visibility runs out.
    pub(crate) not_released: usize,
    /// Receives still in flight when the shutdown stopped waiting for them.
    pub(crate) receives_cut_off: usize,
    /// Messages handled whose acknowledgement was not stored.
    pub(crate) not_acknowledged: usize,
}

/// Whether to say `error`: always, unless another transaction holding a
/// row refused it ([`TransportError::Held`]), which fails each try for as
/// long as the row is held and is said once per [`HELD_WARNING`] of
/// `held_said`.
///
/// [`HELD_WARNING`]: crate::error::HELD_WARNING
fn says(held_said: &crate::throttle::Throttle, error: &TransportError) -> bool {
    !matches!(error, TransportError::Held(_)) || held_said.due(crate::error::HELD_WARNING, false)
}

/// A receive's outcome and when it was sent.
type Received = Result<(Instant, Vec<Delivery>), TransportError>;

/// The receipts of what a receive returned (none if it failed).
fn receipts_of(received: Received) -> impl Iterator<Item = Receipt> {
    received.map(|(_, d)| d).unwrap_or_default().into_iter().map(|d| d.receipt)
}

/// Counts a lane out of [`Ready`] when it ends, unless `next` already did
/// (it found nothing left): on every return, and if the lane panics (a
/// panicking observer or transport), so that a stale count never keeps work
/// that comes back from getting a lane.
struct LaneCount<'a> {
    ready: &'a Ready,
    counted: bool,
}

impl Drop for LaneCount<'_> {
    fn drop(&mut self) {
        if self.counted {
            self.ready.stop_lane();
        }
    }
}

/// Work handed to the run loop to wait outside the lanes.
struct Parked {
    after: Duration,
    task: Task,
}

impl Parked {
    /// Starts the timer that hands the task back when it is due.
    fn start(self, timers: &mut JoinSet<Task>) {
        timers.spawn(async move {
            tokio::time::sleep(self.after).await;
            self.task
        });
    }
}

impl Worker {
    /// One receive: after `pause` (backing off after failures), for a FIFO
    /// queue once its acks have reached the transport, as many messages as
    /// the handlers' pace asks for.
    async fn receive(
        self: Arc<Self>,
        concurrency: usize,
        max: usize,
        wait: Duration,
        pause: Duration,
        shutdown: Shutdown,
    ) -> Received {
        if !pause.is_zero() {
            tokio::select! {
                _ = tokio::time::sleep(pause) => {}
                _ = shutdown.wait() => {}
            }
        }
        let spec = self.routes.spec();
        // Paused by an operator (this process's switch): nothing is received
        // until the queue is resumed or shutdown begins.
        if self.paused.is_paused() {
            tokio::select! {
                _ = self.paused.resumed() => {}
                _ = shutdown.wait() => {}
            }
        }
        // Claims refused: what is received now would only be held.
        self.outage.passed(spec.name, &shutdown).await;
        if spec.fifo {
            self.acker.settled(Duration::from_secs(1)).await;
        }
        if shutdown.is_triggered() {
            // No new receive once shutdown began (on SQS it would count a
            // receive against every message it returns, only to give them back).
            return Ok((Instant::now(), Vec::new()));
        }
        let n = self.pace.batch(concurrency, max);
        let mut sent = Instant::now();
        let deliveries = self.transport.receive(spec.name, n, wait).await?;
        self.pace.received(deliveries.iter().map(|d| d.body.len()));
        // The transport set their visibility some time during the wait: when
        // that may be long ago, set it again now, so that what a claim may
        // take (`Batch::visible_for`) is not cut short by a long poll.
        let now = Instant::now();
        if !deliveries.is_empty() && now.duration_since(sent) >= spec.visibility / 4 {
            let receipts = deliveries.iter().map(|d| d.receipt.clone()).collect();
            if self.transport.extend_all(spec.name, receipts, spec.visibility).await.iter().all(Result::is_ok) {
                sent = now;
            }
        }
        Ok((sent, deliveries))
    }

    /// Awaits `receive` at shutdown, ending its wait where the transport can
    /// (see [`Transport::interrupt_receives`]); asked again every 50 ms, since
    /// a receive that had not begun waiting when first asked would not see it.
    async fn interrupting<F: std::future::Future>(&self, receive: F) -> F::Output {
        let name = self.routes.spec().name;
        let mut receive = std::pin::pin!(receive);
        loop {
            self.transport.interrupt_receives(name);
            tokio::select! {
                r = &mut receive => return r,
                _ = tokio::time::sleep(Duration::from_millis(50)) => {}
            }
        }
    }

    /// Gives `receipts` back to the queue, a receive's worth per call,
    /// until done or until `until` completes, and counts in `report` how
    /// many went back and how many did not. What the transport refuses
    /// (the database restarting) is tried again meanwhile: given up after
    /// one try, twelve messages a stop released with PostgreSQL away stayed
    /// invisible for their whole visibility timeout, although the database
    /// was back well within the grace period.
    async fn give_back(
        &self,
        receipts: Vec<Receipt>,
        until: impl std::future::Future<Output = ()>,
        report: &mut Stopped,
    ) {
        let name = self.routes.spec().name;
        let total = receipts.len();
        let mut released = 0;
        let release = async {
            let mut left = receipts;
            for attempt in 1u32.. {
                let mut refused = Vec::new();
                let mut failure = None;
                for chunk in left.chunks(self.transport.max_batch().max(1)) {
                    let results = self.transport.release(name, chunk.to_vec()).await;
                    for (receipt, result) in chunk.iter().zip(results) {
                        match result {
                            Ok(()) => released += 1,
                            // Not ours any more: taken back, or settled.
                            Err(TransportError::StaleReceipt) => {}
                            Err(e) => {
                                failure.get_or_insert(e);
                                refused.push(receipt.clone());
                            }
                        }
                    }
                }
                let Some(e) = failure else { break };
                if attempt == 1 {
                    tracing::warn!(
                        queue = name,
                        messages = refused.len(),
                        "giving back {} message(s) failed ({e}); trying again until the stop's end",
                        refused.len()
                    );
                }
                left = refused;
                tokio::time::sleep(retry_pause(attempt)).await;
            }
        };
        tokio::select! {
            () = release => {}
            () = until => {}
        }
        report.released += released;
        report.not_released += total - released;
    }

    /// Starts the heartbeat of the messages this worker holds.
    fn start_heartbeat(&self) -> tokio::task::JoinHandle<()> {
        tokio::spawn(self.inflight.clone().heartbeat(
            self.transport.clone(),
            self.pipeline.idempotency.clone(),
            self.routes.spec().name,
            self.routes.spec().visibility,
            self.heartbeat_period(),
        ))
    }

    /// How often the heartbeat runs: a third of the visibility timeout, or
    /// of the shortest idempotency lease of the queue's handlers if shorter
    /// (claims are extended by at most their lease).
    fn heartbeat_period(&self) -> Duration {
        let spec = self.routes.spec();
        let shortest = self
            .routes
            .routes()
            .iter()
            .filter_map(|route| route.entry.idempotency.map(|i| i.lease))
            .fold(spec.visibility, Duration::min);
        shortest / 3
    }

    /// Takes a receive's outcome: queues the batch, and starts lanes for it
    /// where there is room (running lanes move on to it when theirs runs dry).
    fn accept(self: &Arc<Self>, received: Received, failures: &mut u32, lanes: &mut JoinSet<()>, shutdown: &Shutdown) {
        let spec = self.routes.spec();
        let (sent, deliveries) = match received {
            Ok(received) => {
                if *failures > 0 {
                    *failures = 0;
                    *self.receive_error.lock().unwrap_or_else(|p| p.into_inner()) = None;
                    tracing::info!(queue = spec.name, "receiving again");
                }
                received
            }
            Err(e) => {
                *failures += 1;
                tracing::warn!(queue = spec.name, "receive failed ({e}); retrying in {:?}", backoff(*failures));
                *self.receive_error.lock().unwrap_or_else(|p| p.into_inner()) = Some(e.to_string());
                return;
            }
        };
        if deliveries.is_empty() {
            return;
        }
        let batch = Arc::new(Batch::new(deliveries, spec.fifo, sent, spec.visibility));
        self.inflight.hold(batch.clone());
        self.start_lanes(self.ready.push(batch), lanes, shutdown);
    }

    /// Starts `count` lanes.
    fn start_lanes(self: &Arc<Self>, count: usize, lanes: &mut JoinSet<()>, shutdown: &Shutdown) {
        for _ in 0..count {
            let (w, stop) = (self.clone(), shutdown.clone());
            lanes.spawn(async move { w.lane(&stop).await });
        }
    }
}

impl Worker {
    /// Handles work from the waiting batches until none is left (or
    /// shutdown). A FIFO chain runs in order: a message that fails is tried
    /// again in this process while the rest of its chain waits (held
    /// invisible by the heartbeat), and after its own attempts are spent it
    /// is dead-lettered alone and the chain goes on. Work that must wait
    /// leaves the lane (see [`Worker::park`]), so other groups keep flowing.
    async fn lane(&self, shutdown: &Shutdown) {
        let mut counted = LaneCount { ready: &self.ready, counted: true };
        let (mut current, mut clock) = (None, None);
        while let Some(work) = self.ready.next(&mut current) {
            let Some(batch) = current.as_ref() else {
                return; // (`next` sets `current` with every unit it returns)
            };
            if shutdown.is_triggered() {
                // Unstarted messages stay held and are released at the end.
                return;
            }
            match work.unit {
                Unit::One(i) => {
                    if let Step::Again { after, counted } = self.process(batch, i, work.tries, &mut clock).await {
                        let tries = work.tries + u32::from(counted);
                        self.park(batch, Work { tries, ..work }, after);
                    }
                }
                Unit::Chain(u) => {
                    let chain = batch.chain(u);
                    let (mut at, mut tries) = (work.from, work.tries);
                    while let Some(&i) = chain.get(at) {
                        if shutdown.is_triggered() {
                            return;
                        }
                        match self.process(batch, i, tries, &mut clock).await {
                            Step::Handled | Step::DeadLettered => (at, tries) = (at + 1, 0),
                            Step::Released => {
                                // Its successors must not overtake it: given
                                // back with it, in one call.
                                let rest: Vec<Receipt> = chain[at + 1..]
                                    .iter()
                                    .map(|&i| {
                                        self.inflight.settle(batch, i);
                                        batch.deliveries[i].receipt.clone()
                                    })
                                    .collect();
                                if !rest.is_empty() {
                                    let name = self.routes.spec().name;
                                    let failed = self
                                        .transport
                                        .release(name, rest)
                                        .await
                                        .into_iter()
                                        .filter(Result::is_err)
                                        .count();
                                    if failed > 0 {
                                        tracing::warn!(queue = name, failed,
                                            "could not give back the rest of a FIFO group's batch; it comes back when its visibility times out");
                                    }
                                }
                                break;
                            }
                            Step::Again { after, counted } => {
                                let tries = tries + u32::from(counted);
                                self.park(batch, Work { from: at, tries, ..work }, after);
                                break;
                            }
                        }
                    }
                }
            }
        }
        counted.counted = false; // `next` counted the lane out when it found nothing
    }

    /// Sets work aside for `after` without holding a lane; its messages stay
    /// held (the heartbeat keeps them invisible) and the run loop hands it
    /// back to the lanes when it is due. During shutdown the run loop is gone
    /// and the messages are released with the rest.
    fn park(&self, batch: &Arc<Batch>, work: Work, after: Duration) {
        let _ = self.parked.send(Parked { after, task: Task { batch: batch.clone(), work } });
    }
}
