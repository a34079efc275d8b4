//! The worker: one per queue with handlers. It receives in batches, runs
//! handlers with the queue's concurrency (FIFO groups in order, distinct groups
//! in parallel), acknowledges only after success (in batches), keeps slow
//! messages invisible with a heartbeat, retries with backoff, dead-letters
//! permanent failures, and shuts down gracefully.

mod acker;
mod dispatch;
mod inflight;
mod pace;
mod ready;

use std::sync::Arc;
use std::time::Duration;

use tokio::task::JoinSet;

use self::acker::Acker;
pub(crate) use self::inflight::Batch;
use self::inflight::{InFlight, Unit};
use self::pace::Pace;
use self::ready::Ready;
use crate::error::TransportError;
use crate::observe::SharedObserver;
use crate::pipeline::Pipeline;
use crate::registry::Routes;
use crate::shutdown::Shutdown;
use crate::telemetry::{EnrichHook, Telemetry};
use crate::transport::{Delivery, Transport};

/// Timing of a worker.
#[derive(Debug, Clone, Copy)]
pub(crate) struct WorkerSettings {
    /// How long one receive waits for a message (long polling).
    pub(crate) receive_wait: Duration,
    /// How long in-flight handlers may run on after shutdown begins.
    pub(crate) grace: Duration,
}

/// The pause before receiving again after `failures` failed receives in a row.
fn backoff(failures: u32) -> Duration {
    Duration::from_millis(100 * u64::from(failures.min(50)))
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
}

/// What watches a worker: the test observer, metrics, the span enrichment hook.
#[derive(Clone)]
pub(crate) struct Hooks {
    pub(crate) observer: SharedObserver,
    pub(crate) telemetry: Arc<Telemetry>,
    pub(crate) enrich: Option<EnrichHook>,
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
}

impl Worker {
    pub(crate) fn start(
        routes: Arc<Routes>,
        transport: Arc<dyn Transport>,
        pipeline: Arc<Pipeline>,
        hooks: Hooks,
    ) -> WorkerHandle {
        let acker = Acker::start(transport.clone(), routes.spec().name);
        let ready = Ready::new(routes.spec().concurrency);
        WorkerHandle {
            worker: Arc::new(Worker {
                routes,
                transport,
                pipeline,
                hooks,
                inflight: Arc::new(InFlight::default()),
                acker,
                ready,
                pace: Pace::default(),
            }),
        }
    }
}

impl WorkerHandle {
    /// Consumes until `shutdown`, then finishes in-flight work within the
    /// grace period, releases what was not started and flushes acks.
    pub(crate) async fn run(self, settings: WorkerSettings, shutdown: Shutdown) {
        let worker = self.worker;
        let spec = worker.routes.spec().clone();
        let heartbeat =
            tokio::spawn(worker.inflight.clone().heartbeat(worker.transport.clone(), spec.name, spec.visibility));
        let mut lanes = JoinSet::new();
        let mut receiving: JoinSet<Result<Vec<Delivery>, TransportError>> = JoinSet::new();
        let max = worker.transport.max_batch().max(1);
        // Receives kept going ahead of the lanes: as many as the transport
        // suits on a standard queue; none on a FIFO queue, whose groups must
        // be released (acked) before their next messages can come.
        let receivers = if spec.fifo { 0 } else { worker.transport.receivers() };
        let mut failures = 0u32;
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
                _ = worker.ready.until(wanted), if in_flight < receivers.max(1) => {
                    let pause = if failures == 0 { Duration::ZERO } else { backoff(failures) };
                    let receive = worker.clone().receive(spec.concurrency, max, settings.receive_wait, pause);
                    if receivers == 0 {
                        // On demand: receive here, sparing a task hop per batch.
                        let received = tokio::select! {
                            r = receive => r,
                            _ = shutdown.wait() => break,
                        };
                        worker.accept(received, &mut failures, &mut lanes, &shutdown);
                    } else {
                        receiving.spawn(receive);
                    }
                }
            }
        }
        // Receives that complete within a moment give their messages back at
        // once (rather than leaving them invisible until their timeout).
        let _ = tokio::time::timeout(Duration::from_millis(250), async {
            while let Some(done) = receiving.join_next().await {
                for delivery in done.ok().and_then(Result::ok).unwrap_or_default() {
                    let _ = worker.transport.nack(spec.name, delivery.receipt, Duration::ZERO).await;
                }
            }
        })
        .await;
        receiving.abort_all();
        // Graceful end: let running handlers finish within the grace period.
        let finished = tokio::time::timeout(settings.grace, async { while lanes.join_next().await.is_some() {} }).await;
        if finished.is_err() {
            tracing::warn!(
                queue = spec.name,
                "handlers still running after the grace period of {:?} were stopped; their messages are released",
                settings.grace
            );
            lanes.abort_all();
            while lanes.join_next().await.is_some() {}
        }
        heartbeat.abort();
        let held = worker.inflight.take_unsettled();
        if !held.is_empty() {
            tracing::info!(
                queue = spec.name,
                count = held.len(),
                "releasing messages that were received but not handled"
            );
        }
        for receipt in held {
            let _ = worker.transport.nack(spec.name, receipt, Duration::ZERO).await;
        }
        worker.acker.close().await;
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
    ) -> Result<Vec<Delivery>, TransportError> {
        if !pause.is_zero() {
            tokio::time::sleep(pause).await;
        }
        let spec = self.routes.spec();
        if spec.fifo {
            self.acker.settled(Duration::from_secs(1)).await;
        }
        let n = self.pace.batch(concurrency, max);
        self.transport.receive(spec.name, n, wait).await
    }

    /// Takes a receive's outcome: queues the batch, and starts lanes for it
    /// where there is room (running lanes move on to it when theirs runs dry).
    fn accept(
        self: &Arc<Self>,
        received: Result<Vec<Delivery>, TransportError>,
        failures: &mut u32,
        lanes: &mut JoinSet<()>,
        shutdown: &Shutdown,
    ) {
        let spec = self.routes.spec();
        let deliveries = match received {
            Ok(deliveries) => {
                *failures = 0;
                deliveries
            }
            Err(e) => {
                *failures += 1;
                tracing::warn!(queue = spec.name, "receive failed ({e}); retrying in {:?}", backoff(*failures));
                return;
            }
        };
        if deliveries.is_empty() {
            return;
        }
        let batch = Arc::new(Batch::new(deliveries, spec.fifo));
        self.inflight.hold(batch.clone());
        for _ in 0..self.ready.push(batch) {
            let (w, stop) = (self.clone(), shutdown.clone());
            lanes.spawn(async move { w.lane(&stop).await });
        }
    }
}

impl Worker {
    /// Handles units of work from the waiting batches until none is left (or
    /// shutdown). A FIFO chain runs in order; after a failure the rest of the
    /// chain is released, not handled out of order.
    async fn lane(&self, shutdown: &Shutdown) {
        let (mut current, mut clock) = (None, None);
        while let Some(unit) = self.ready.next(&mut current) {
            let Some(batch) = current.as_ref() else {
                self.ready.stop_lane(); // `next` sets `current` with every unit it returns
                return;
            };
            if shutdown.is_triggered() {
                // Unstarted messages stay held and are released at the end.
                self.ready.stop_lane();
                return;
            }
            match unit {
                Unit::One(i) => {
                    self.process(batch, i, &mut clock).await;
                }
                Unit::Chain(u) => {
                    let mut rest = batch.chain(u).iter();
                    for &i in rest.by_ref() {
                        if shutdown.is_triggered() {
                            self.ready.stop_lane();
                            return;
                        }
                        if !self.process(batch, i, &mut clock).await {
                            break;
                        }
                    }
                    for &i in rest {
                        self.settle(batch, i);
                        self.release(&batch.deliveries[i], Duration::ZERO).await;
                    }
                }
            }
        }
    }

    /// Marks a message settled, forgetting the batch with its last message.
    fn settle(&self, batch: &Arc<Batch>, i: usize) {
        if batch.settle(i) {
            self.inflight.release_batch(batch);
        }
    }
}
