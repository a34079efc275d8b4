//! The batches waiting to be handled, and the lanes that handle them.
//!
//! Received batches queue up here; lanes (at most the queue's concurrency)
//! claim units of work from the oldest batch and move on to the next one when
//! it runs dry, so a lane is only started when a batch arrives and there is
//! room, and only stops when nothing is left to claim. Deciding "stop" and
//! "start" under one lock means a batch never waits without a lane.
//!
//! Work that waited outside the lanes (a FIFO chain whose head waits for its
//! retry, a message whose idempotency claim is held elsewhere) comes back
//! here as a [`Task`] when its time is up, and is taken before new batches.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use tokio::sync::Notify;

use super::inflight::{Batch, Unit};

/// Batches with units not yet claimed, work due again, and the number of
/// running lanes.
pub(crate) struct Ready {
    state: Mutex<State>,
    /// How many tasks wait in `State::resumed`: lanes look here without the
    /// lock before taking the next unit of their current batch.
    resumed: AtomicUsize,
    /// Signalled when a batch runs dry or a lane stops.
    changed: Notify,
    concurrency: usize,
}

struct State {
    batches: VecDeque<Arc<Batch>>,
    resumed: VecDeque<Task>,
    lanes: usize,
}

/// Work that left the lanes to wait and is due again: unit `unit` of
/// `batch`, from message `from` of its FIFO chain (0 for a single message),
/// whose first message already had `tries` attempts in this process.
pub(crate) struct Task {
    pub(crate) batch: Arc<Batch>,
    pub(crate) work: Work,
}

/// What a lane runs next (its batch is the lane's `current`).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Work {
    pub(crate) unit: Unit,
    /// The position in a FIFO chain to start at.
    pub(crate) from: usize,
    /// Attempts the message at `from` already had in this process (beyond
    /// the one its receive counts).
    pub(crate) tries: u32,
}

impl Work {
    fn new(unit: Unit) -> Self {
        Work { unit, from: 0, tries: 0 }
    }
}

impl Ready {
    pub(crate) fn new(concurrency: usize) -> Self {
        Ready {
            state: Mutex::new(State { batches: VecDeque::new(), resumed: VecDeque::new(), lanes: 0 }),
            resumed: AtomicUsize::new(0),
            changed: Notify::new(),
            concurrency: concurrency.max(1),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Queues a batch; returns how many new lanes to start for it.
    pub(crate) fn push(&self, batch: Arc<Batch>) -> usize {
        let mut state = self.lock();
        let units = batch.units();
        state.batches.push_back(batch);
        let start = (self.concurrency - state.lanes).min(units);
        state.lanes += start;
        start
    }

    /// Queues work that is due again; returns how many new lanes to start
    /// for it (one, when there is room).
    pub(crate) fn resume(&self, task: Task) -> usize {
        let mut state = self.lock();
        state.resumed.push_back(task);
        self.resumed.fetch_add(1, Ordering::Release);
        let start = usize::from(state.lanes < self.concurrency);
        state.lanes += start;
        start
    }

    /// Claims the next unit of work for a lane: work due again first, then
    /// the lane's `current` batch without locking while it lasts, else the
    /// oldest batch with work left. The batch of the work returned becomes
    /// `current`. `None` means nothing is left and the lane has been counted
    /// out (it must stop).
    pub(crate) fn next(&self, current: &mut Option<Arc<Batch>>) -> Option<Work> {
        if self.resumed.load(Ordering::Acquire) == 0 {
            if let Some(unit) = current.as_ref().and_then(|batch| batch.claim()) {
                return Some(Work::new(unit));
            }
        }
        let mut state = self.lock();
        if let Some(task) = state.resumed.pop_front() {
            self.resumed.fetch_sub(1, Ordering::Release);
            drop(state);
            self.changed.notify_waiters(); // one batch or task fewer waiting
            *current = Some(task.batch);
            return Some(task.work);
        }
        if let Some(unit) = current.as_ref().and_then(|batch| batch.claim()) {
            return Some(Work::new(unit));
        }
        loop {
            let Some(batch) = state.batches.front().cloned() else {
                state.lanes -= 1;
                drop(state);
                *current = None;
                self.changed.notify_waiters();
                return None;
            };
            match batch.claim() {
                Some(unit) => {
                    *current = Some(batch);
                    return Some(Work::new(unit));
                }
                None => {
                    state.batches.pop_front();
                    self.changed.notify_waiters();
                }
            }
        }
    }

    /// Counts out a lane that stops early (at shutdown).
    pub(crate) fn stop_lane(&self) {
        self.lock().lanes -= 1;
        self.changed.notify_waiters();
    }

    /// Running lanes.
    pub(crate) fn lanes(&self) -> usize {
        self.lock().lanes
    }

    /// Waits until `ready(batches and tasks waiting, lanes running,
    /// concurrency)` holds.
    pub(crate) async fn until(&self, ready: impl Fn(usize, usize, usize) -> bool) {
        loop {
            let changed = self.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            {
                let state = self.lock();
                if ready(state.batches.len() + state.resumed.len(), state.lanes, self.concurrency) {
                    return;
                }
            }
            changed.await;
        }
    }
}
