//! The worker: one per queue with handlers. It receives in batches, runs
//! handlers with the queue's concurrency (FIFO groups in order, distinct groups
//! in parallel), acknowledges only after success (in batches), keeps slow
//! messages invisible with a heartbeat, retries with backoff, dead-letters
//! permanent failures, and shuts down gracefully.

mod acker;
mod dispatch;
mod inflight;

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Semaphore;
use tokio::task::JoinSet;

use std::sync::atomic::Ordering;

use self::acker::Acker;
pub(crate) use self::inflight::Batch;
use self::inflight::{InFlight, Unit};
use crate::observe::SharedObserver;
use crate::pipeline::Pipeline;
use crate::registry::Routes;
use crate::shutdown::Shutdown;
use crate::transport::Transport;

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
    observer: SharedObserver,
    inflight: Arc<InFlight>,
    acker: Acker,
    lanes_running: std::sync::atomic::AtomicUsize,
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
        w.inflight.is_empty() && w.acker.pending() == 0 && w.lanes_running.load(Ordering::SeqCst) == 0
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
        observer: SharedObserver,
    ) -> WorkerHandle {
        let acker = Acker::start(transport.clone(), routes.spec().name);
        WorkerHandle {
            worker: Arc::new(Worker {
                routes,
                transport,
                pipeline,
                observer,
                inflight: Arc::new(InFlight::default()),
                acker,
                lanes_running: Default::default(),
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
        let permits = Arc::new(Semaphore::new(spec.concurrency.max(1)));
        let mut lanes = JoinSet::new();
        let max = worker.transport.max_batch().max(1);
        let mut failures = 0u32;
        while !shutdown.is_triggered() {
            while lanes.try_join_next().is_some() {}
            // Receive only when a handler slot is free, so that what is
            // received but not started stays bounded by one batch.
            let first = tokio::select! {
                p = permits.clone().acquire_owned() => p,
                _ = shutdown.wait() => break,
            };
            let Ok(first) = first else { break };
            if spec.fifo {
                worker.acker.settled(Duration::from_secs(1)).await;
            }
            let received = tokio::select! {
                r = worker.transport.receive(spec.name, max, settings.receive_wait) => r,
                _ = shutdown.wait() => break,
            };
            let deliveries = match received {
                Ok(deliveries) => {
                    failures = 0;
                    deliveries
                }
                Err(e) => {
                    failures += 1;
                    let pause = Duration::from_millis(100 * u64::from(failures.min(50)));
                    tracing::warn!(queue = spec.name, "receive failed ({e}); retrying in {pause:?}");
                    drop(first);
                    tokio::select! {
                        _ = tokio::time::sleep(pause) => continue,
                        _ = shutdown.wait() => break,
                    }
                }
            };
            if deliveries.is_empty() {
                continue;
            }
            let batch = Arc::new(Batch::new(deliveries, spec.fifo));
            worker.inflight.hold(batch.clone());
            // One lane per free slot (at most one per unit of work); lanes
            // take messages (or FIFO chains) from the batch until it is empty.
            let mut slots = vec![first];
            while slots.len() < batch.units() {
                match permits.clone().try_acquire_owned() {
                    Ok(p) => slots.push(p),
                    Err(_) => break,
                }
            }
            for slot in slots {
                let (w, b, stop) = (worker.clone(), batch.clone(), shutdown.clone());
                w.lanes_running.fetch_add(1, Ordering::SeqCst);
                lanes.spawn(async move {
                    w.lane(&b, &stop).await;
                    w.lanes_running.fetch_sub(1, Ordering::SeqCst);
                    drop(slot);
                });
            }
        }
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
    /// Handles units of work from `batch` until none is left (or shutdown).
    /// A FIFO chain runs in order; after a failure the rest of the chain is
    /// released, not handled out of order.
    async fn lane(&self, batch: &Arc<Batch>, shutdown: &Shutdown) {
        while let Some(unit) = batch.claim() {
            match unit {
                Unit::One(i) => {
                    if shutdown.is_triggered() {
                        return; // unstarted messages stay held and are released at the end
                    }
                    self.process(batch, i).await;
                }
                Unit::Chain(chain) => {
                    let mut rest = chain.iter();
                    for &i in rest.by_ref() {
                        if shutdown.is_triggered() {
                            return;
                        }
                        if !self.process(batch, i).await {
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
