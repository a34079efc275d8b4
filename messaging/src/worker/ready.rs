//! The batches waiting to be handled, and the lanes that handle them.
//!
//! Received batches queue up here; lanes (at most the queue's concurrency)
//! claim units of work from the oldest batch and move on to the next one when
//! it runs dry, so a lane is only started when a batch arrives and there is
//! room, and only stops when nothing is left to claim. Deciding "stop" and
//! "start" under one lock means a batch never waits without a lane.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, MutexGuard};

use tokio::sync::Notify;

use super::inflight::{Batch, Unit};

/// Batches with units not yet claimed, and the number of running lanes.
pub(crate) struct Ready {
    state: Mutex<State>,
    /// Signalled when a batch runs dry or a lane stops.
    changed: Notify,
    concurrency: usize,
}

struct State {
    batches: VecDeque<Arc<Batch>>,
    lanes: usize,
}

impl Ready {
    pub(crate) fn new(concurrency: usize) -> Self {
        Ready {
            state: Mutex::new(State { batches: VecDeque::new(), lanes: 0 }),
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

    /// Claims the next unit of work for a lane: from the lane's `current`
    /// batch without locking while it lasts, else from the oldest batch with
    /// work left (which becomes `current`). `None` means nothing is left and
    /// the lane has been counted out (it must stop).
    pub(crate) fn next(&self, current: &mut Option<Arc<Batch>>) -> Option<Unit> {
        if let Some(unit) = current.as_ref().and_then(|batch| batch.claim()) {
            return Some(unit);
        }
        let mut state = self.lock();
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
                    return Some(unit);
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

    /// Waits until `ready(batches waiting, lanes running, concurrency)` holds.
    pub(crate) async fn until(&self, ready: impl Fn(usize, usize, usize) -> bool) {
        loop {
            let changed = self.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            {
                let state = self.lock();
                if ready(state.batches.len(), state.lanes, self.concurrency) {
                    return;
                }
            }
            changed.await;
        }
    }
}
