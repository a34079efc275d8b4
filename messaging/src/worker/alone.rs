//! Running a suspect alone: the gate every handler of the process passes.
//!
//! A consumer that dies (an `abort`, a segfault, the OOM killer) lets every
//! lease it held run out, and the database queues cannot tell the message
//! that killed it from the others. So they give those leases' attempts back
//! and mark the messages; a message whose lease runs out a second time is a
//! suspect ([`Delivery::suspect`]; once is what any crash does to every
//! message held, and most crashes are not a message's doing); the worker runs
//! a suspect with no other handler running in the process, and tells the
//! transport so ([`Transport::isolate`]): if the process dies now, the
//! message is the cause, and only its attempt counts. Without this, one
//! message that aborts the process spent an attempt of every message held
//! with it at each crash: on a FIFO queue of six groups at concurrency 4, the
//! heads of all six groups were dead letters after three restarts (tried from
//! outside).
//!
//! The gate is process-wide (a `static`): a crash takes every queue's
//! handlers with it, so a suspect of one queue waits for the handlers of all.
//! A handler passes it with one atomic add and one subtract while no suspect
//! waits; the ones that arrive while a suspect waits or runs wait for it.
//!
//! [`Delivery::suspect`]: crate::transport::Delivery::suspect
//! [`Transport::isolate`]: crate::transport::Transport::isolate

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use tokio::sync::{Mutex, MutexGuard, Notify};

/// Set in [`Gate::state`] while a suspect waits for the handlers running to
/// end, or runs.
const CLOSED: usize = 1 << (usize::BITS - 1);

/// The process's gate (see the module's documentation).
pub(crate) static GATE: Gate = Gate::new();

/// Handlers running, and whether a suspect waits or runs.
pub(crate) struct Gate {
    /// The number of handlers running, plus [`CLOSED`].
    state: AtomicUsize,
    /// Wakes the suspect waiting for the handlers running to end.
    emptied: Notify,
    /// Wakes the handlers waiting for the suspect to end.
    opened: Notify,
    /// Tells acknowledgements waiting for more to go now ([`Gate::closing`]).
    closed: Notify,
    /// One suspect at a time.
    turn: Mutex<()>,
}

/// A handler running: counted until dropped.
#[must_use = "the handler counts as running only while this is held"]
pub(crate) struct Entered(&'static Gate);

/// A suspect running with the gate closed, until dropped.
#[must_use = "the gate stays closed only while this is held"]
pub(crate) struct Alone {
    gate: &'static Gate,
    _turn: MutexGuard<'static, ()>,
    /// Handlers that were still running when the wait ran out.
    pub(crate) beside: usize,
}

impl Gate {
    pub(super) const fn new() -> Gate {
        Gate {
            state: AtomicUsize::new(0),
            emptied: Notify::const_new(),
            opened: Notify::const_new(),
            closed: Notify::const_new(),
            turn: Mutex::const_new(()),
        }
    }

    /// Counts a handler in, once no suspect waits or runs.
    pub(crate) async fn enter(&'static self) -> Entered {
        loop {
            if self.state.fetch_add(1, Ordering::AcqRel) & CLOSED == 0 {
                return Entered(self);
            }
            // Closed: out again, and wait for it to open (registered before
            // looking, so that an opening in between is not missed).
            let opened = self.opened.notified();
            tokio::pin!(opened);
            opened.as_mut().enable();
            self.leave();
            if self.state.load(Ordering::Acquire) & CLOSED != 0 {
                opened.await;
            }
        }
    }

    fn leave(&self) {
        let before = self.state.fetch_sub(1, Ordering::AcqRel);
        if before & CLOSED != 0 && before & !CLOSED == 1 {
            self.emptied.notify_waiters();
        }
    }

    /// Closes the gate and waits until no handler runs, for `limit` at most:
    /// a handler that runs longer (a slow one, or one waiting for work that
    /// cannot start while the gate is closed) is not waited for beyond it,
    /// and the suspect runs beside it ([`Alone::beside`]) rather than never.
    pub(crate) async fn alone(&'static self, limit: Duration) -> Alone {
        let turn = self.turn.lock().await;
        let deadline = tokio::time::Instant::now() + limit;
        self.state.fetch_or(CLOSED, Ordering::AcqRel);
        self.closed.notify_waiters();
        loop {
            let emptied = self.emptied.notified();
            tokio::pin!(emptied);
            emptied.as_mut().enable();
            let running = self.state.load(Ordering::Acquire) & !CLOSED;
            if running == 0 || tokio::time::timeout_at(deadline, emptied).await.is_err() {
                let beside = self.state.load(Ordering::Acquire) & !CLOSED;
                return Alone { gate: self, _turn: turn, beside };
            }
        }
    }

    /// Whether a suspect waits or runs.
    pub(crate) fn is_closed(&self) -> bool {
        self.state.load(Ordering::Acquire) & CLOSED != 0
    }

    /// Completes when a suspect next closes the gate (enable it, then check
    /// [`Gate::is_closed`], so that a closing in between is not missed).
    pub(crate) fn closing(&self) -> tokio::sync::futures::Notified<'_> {
        self.closed.notified()
    }

    /// Handlers running now (tests).
    #[cfg(test)]
    fn running(&self) -> usize {
        self.state.load(Ordering::Acquire) & !CLOSED
    }
}

impl Drop for Entered {
    fn drop(&mut self) {
        self.0.leave();
    }
}

impl Drop for Alone {
    fn drop(&mut self) {
        self.gate.state.fetch_and(!CLOSED, Ordering::AcqRel);
        self.gate.opened.notify_waiters();
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::AtomicBool;
    use std::sync::Arc;

    use super::*;

    // One gate per test: the process's is shared by every test running.
    fn gate() -> &'static Gate {
        Box::leak(Box::new(Gate::new()))
    }

    #[tokio::test(start_paused = true)]
    async fn a_suspect_waits_for_the_handlers_running_and_holds_back_new_ones() {
        let gate = gate();
        let first = gate.enter().await;
        let second = gate.enter().await;
        assert_eq!(gate.running(), 2);
        let suspect = tokio::spawn(async move {
            let alone = gate.alone(Duration::from_secs(10)).await;
            let beside = alone.beside;
            tokio::time::sleep(Duration::from_millis(100)).await;
            drop(alone);
            beside
        });
        tokio::task::yield_now().await;
        // A handler arriving now waits for the suspect.
        let late_ran = Arc::new(AtomicBool::new(false));
        let late = tokio::spawn({
            let late_ran = late_ran.clone();
            async move {
                let entered = gate.enter().await;
                late_ran.store(true, Ordering::SeqCst);
                drop(entered);
            }
        });
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(!late_ran.load(Ordering::SeqCst), "a handler started while a suspect waited");
        drop(first);
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(!suspect.is_finished(), "the suspect started beside a running handler");
        drop(second);
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(!late_ran.load(Ordering::SeqCst), "a handler started while the suspect ran");
        assert_eq!(suspect.await.unwrap(), 0, "nothing ran beside the suspect");
        late.await.unwrap();
        assert!(late_ran.load(Ordering::SeqCst));
        assert_eq!(gate.running(), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn a_handler_that_outlasts_the_wait_is_not_waited_for_beyond_it() {
        let gate = gate();
        let slow = gate.enter().await;
        let started = tokio::time::Instant::now();
        let alone = gate.alone(Duration::from_secs(10)).await;
        assert_eq!(started.elapsed(), Duration::from_secs(10));
        assert_eq!(alone.beside, 1);
        drop(alone);
        // Open again: handlers pass at once.
        drop(gate.enter().await);
        drop(slow);
        assert_eq!(gate.running(), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn suspects_take_turns() {
        let gate = gate();
        let one = gate.alone(Duration::from_secs(1)).await;
        let other = tokio::spawn(async move { gate.alone(Duration::from_secs(1)).await.beside });
        tokio::time::sleep(Duration::from_secs(5)).await;
        assert!(!other.is_finished(), "two suspects ran at once");
        drop(one);
        assert_eq!(other.await.unwrap(), 0);
    }
}
