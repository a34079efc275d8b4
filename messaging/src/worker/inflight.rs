//! The batches a worker holds (received, not all settled), and the heartbeat
//! that keeps their unsettled messages invisible while they wait or run.
//!
//! Bookkeeping is per batch: settling one message is two atomic operations,
//! and the shared list is touched once when a batch arrives and once when its
//! last message is settled.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::time::Instant;

use crate::transport::{Delivery, Receipt, Transport};

/// One received batch, shared by the lanes that handle it.
pub(crate) struct Batch {
    pub(crate) deliveries: Vec<Delivery>,
    /// FIFO: the batch's messages grouped by message group, in order. Empty
    /// for standard queues, where each message is its own unit of work.
    chains: Vec<Vec<usize>>,
    next: AtomicUsize,
    settled: Vec<AtomicBool>,
    unsettled: AtomicUsize,
    extended_at: Mutex<Instant>,
}

impl Batch {
    pub(crate) fn new(deliveries: Vec<Delivery>, fifo: bool) -> Self {
        let chains = if fifo { group_chains(&deliveries) } else { Vec::new() };
        let n = deliveries.len();
        Batch {
            deliveries,
            chains,
            next: AtomicUsize::new(0),
            settled: (0..n).map(|_| AtomicBool::new(false)).collect(),
            unsettled: AtomicUsize::new(n),
            extended_at: Mutex::new(Instant::now()),
        }
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

    /// Marks message `i` settled; returns true when it was the batch's last.
    pub(crate) fn settle(&self, i: usize) -> bool {
        if self.settled[i].swap(true, Ordering::AcqRel) {
            return false;
        }
        self.unsettled.fetch_sub(1, Ordering::AcqRel) == 1
    }

    fn unsettled_receipts(&self) -> impl Iterator<Item = &Receipt> + '_ {
        self.deliveries.iter().zip(&self.settled).filter(|(_, s)| !s.load(Ordering::Acquire)).map(|(d, _)| &d.receipt)
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

/// The batches with unsettled messages.
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

    /// Forgets a fully settled batch.
    pub(crate) fn release_batch(&self, batch: &Arc<Batch>) {
        self.lock().retain(|b| !Arc::ptr_eq(b, batch));
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.lock().is_empty()
    }

    /// Takes the receipts of every unsettled message (at shutdown, to release them).
    pub(crate) fn take_unsettled(&self) -> Vec<Receipt> {
        let batches = std::mem::take(&mut *self.lock());
        batches.iter().flat_map(|b| b.unsettled_receipts().cloned().collect::<Vec<_>>()).collect()
    }

    /// Extends the visibility of unsettled messages of batches held for a third
    /// of the visibility timeout or longer, until the task is aborted.
    pub(crate) async fn heartbeat(
        self: Arc<Self>,
        transport: Arc<dyn Transport>,
        queue: &'static str,
        visibility: Duration,
    ) {
        let period = (visibility / 3).max(Duration::from_millis(50));
        let mut tick = tokio::time::interval(period);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            let now = Instant::now();
            let due: Vec<Arc<Batch>> = self
                .lock()
                .iter()
                .filter(|b| now.duration_since(*b.extended_at.lock().unwrap_or_else(|p| p.into_inner())) >= period)
                .cloned()
                .collect();
            for batch in due {
                for (delivery, settled) in batch.deliveries.iter().zip(&batch.settled) {
                    if settled.load(Ordering::Acquire) {
                        continue;
                    }
                    match transport.extend(queue, &delivery.receipt, visibility).await {
                        Ok(()) | Err(crate::error::TransportError::StaleReceipt) => {}
                        Err(e) => tracing::warn!(queue, "could not extend a message's visibility: {e}"),
                    }
                }
                *batch.extended_at.lock().unwrap_or_else(|p| p.into_inner()) = Instant::now();
            }
        }
    }
}
