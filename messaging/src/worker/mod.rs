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

use self::acker::Acker;
use self::inflight::InFlight;
use crate::observe::SharedObserver;
use crate::pipeline::Pipeline;
use crate::registry::Routes;
use crate::shutdown::Shutdown;
use crate::transport::{Delivery, Transport};

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
    tasks_running: std::sync::atomic::AtomicUsize,
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
        w.inflight.is_empty() && w.acker.pending() == 0 && w.tasks_running.load(std::sync::atomic::Ordering::SeqCst) == 0
    }

    pub(crate) fn queue(&self) -> &'static str {
        self.worker.routes.spec().name
    }
}

impl Worker {
    pub(crate) fn new(
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
                tasks_running: Default::default(),
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
        let heartbeat = tokio::spawn(worker.inflight.clone().heartbeat(worker.transport.clone(), spec.name, spec.visibility));
        let permits = Arc::new(Semaphore::new(spec.concurrency.max(1)));
        let mut tasks = JoinSet::new();
        let max = worker.transport.max_batch().max(1);
        let mut failures = 0u32;
        while !shutdown.is_triggered() {
            while tasks.try_join_next().is_some() {}
            // Receive only when a handler slot is free, so that prefetch stays
            // bounded by one batch.
            let slot = tokio::select! {
                p = permits.clone().acquire_owned() => p,
                _ = shutdown.wait() => break,
            };
            drop(slot);
            let received = tokio::select! {
                r = worker.transport.receive(spec.name, max, settings.receive_wait) => r,
                _ = shutdown.wait() => break,
            };
            let batch = match received {
                Ok(batch) => {
                    failures = 0;
                    batch
                }
                Err(e) => {
                    failures += 1;
                    let pause = Duration::from_millis(100 * u64::from(failures.min(50)));
                    tracing::warn!(queue = spec.name, "receive failed ({e}); retrying in {pause:?}");
                    tokio::select! {
                        _ = tokio::time::sleep(pause) => continue,
                        _ = shutdown.wait() => break,
                    }
                }
            };
            if batch.is_empty() {
                continue;
            }
            worker.inflight.hold_all(batch.iter().map(|d| &d.receipt));
            if spec.concurrency <= 1 && spec.fifo {
                // Strictly sequential, group by group.
                for chain in group_chains(batch) {
                    worker.process_chain(chain, &shutdown).await;
                }
            } else if spec.concurrency <= 1 {
                // Strictly sequential: one handler at a time, in receive order.
                for delivery in batch {
                    if shutdown.is_triggered() {
                        break; // the rest is released below
                    }
                    worker.process(delivery).await;
                }
            } else if spec.fifo {
                for chain in group_chains(batch) {
                    let permit = tokio::select! {
                        p = permits.clone().acquire_owned() => p,
                        _ = shutdown.wait() => break,
                    };
                    let Ok(permit) = permit else { break };
                    let w = worker.clone();
                    let stop = shutdown.clone();
                    w.tasks_running.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                    tasks.spawn(async move {
                        w.process_chain(chain, &stop).await;
                        w.tasks_running.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
                        drop(permit);
                    });
                }
            } else {
                for delivery in batch {
                    let permit = tokio::select! {
                        p = permits.clone().acquire_owned() => p,
                        _ = shutdown.wait() => break,
                    };
                    let Ok(permit) = permit else { break };
                    let w = worker.clone();
                    w.tasks_running.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                    tasks.spawn(async move {
                        w.process(delivery).await;
                        w.tasks_running.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
                        drop(permit);
                    });
                }
            }
        }
        // Graceful end: let running handlers finish within the grace period.
        let finished = tokio::time::timeout(settings.grace, async { while tasks.join_next().await.is_some() {} }).await;
        if finished.is_err() {
            tracing::warn!(queue = spec.name, "handlers still running after the grace period of {:?} were stopped; their messages are released", settings.grace);
            tasks.abort_all();
            while tasks.join_next().await.is_some() {}
        }
        heartbeat.abort();
        let held = worker.inflight.take_all();
        if !held.is_empty() {
            tracing::info!(queue = spec.name, count = held.len(), "releasing messages that were received but not handled");
        }
        for receipt in held {
            let _ = worker.transport.nack(spec.name, receipt, Duration::ZERO).await;
        }
        worker.acker.close().await;
    }
}

impl Worker {
    /// Handles one FIFO group's messages in order; after a failure the rest
    /// of the chain is released (not handled out of order).
    async fn process_chain(&self, chain: Vec<Delivery>, shutdown: &Shutdown) {
        let mut rest = chain.into_iter();
        while let Some(delivery) = rest.next() {
            if shutdown.is_triggered() {
                return; // unstarted messages stay held and are released at the end
            }
            if !self.process(delivery).await {
                break;
            }
        }
        for delivery in rest {
            self.retry(&delivery, Duration::ZERO).await;
        }
    }
}

/// Splits a FIFO batch into per-group chains, keeping the order within each.
fn group_chains(batch: Vec<Delivery>) -> Vec<Vec<Delivery>> {
    let mut chains: Vec<Vec<Delivery>> = Vec::new();
    for delivery in batch {
        match chains.iter_mut().find(|c| c[0].group_id == delivery.group_id) {
            Some(chain) => chain.push(delivery),
            None => chains.push(vec![delivery]),
        }
    }
    chains
}
