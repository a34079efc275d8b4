//! How long this process's writes could not get through, so that
//! housekeeping does not take back a lease its holder could not extend.
//!
//! A lease runs out when its holder does not extend it in time. But while no
//! write of this process gets through (on SQLite an application holding the
//! database's write lock past the busy timeout, on either database one that
//! is down or out of connections), the holder cannot extend its leases
//! either, and they run out through nobody's fault. When the database frees
//! up, a receive's housekeeping and the heartbeat's extension race for it,
//! and when housekeeping came first it took those leases back: tried from
//! outside on SQLite, a lock held 8 s on a 2 s visibility made 4 of 600
//! messages run twice, and their first runs' acknowledgements were refused
//! as too late (in an earlier trial, 15 of 600 with 12 s on 10 s).
//!
//! So each write attempt of the store is timed from before it waits for its
//! turn until it gets through (or gives up), and attempts of a second or
//! more that follow each other make one *stall*. Housekeeping then takes
//! back only leases that expired the stall's length ago: a lease that
//! expired during the stall gets back, after it, the time it had left when
//! the stall began. A stall still going on counts up to now, so that only
//! leases that expired before it began are taken back. The allowance ends
//! one stall length after the stall: by then every lease that expired in
//! it has had its time again.
//!
//! Every process on the database sees the stall through its own waiting
//! writes, so another process's housekeeping makes the same allowance,
//! from the time its own writes began to wait (a receive that found
//! messages, a heartbeat, an acknowledgement, its housekeeping); a lease
//! that expired before that is taken back as usual.
//!
//! An attempt costs 110 ns (two clock reads, two short locks; measured in
//! a loop), against some 60 us for one statement's hop on SQLite: a plain
//! mutex does.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// An attempt this long or longer is a stall (a write normally takes
/// milliseconds; a stall shorter than this would shift take-backs by less).
const LONG: Duration = Duration::from_secs(1);

/// Stalls this close one after the other make one: a write that gave up
/// after SQLite's busy timeout is followed by its retry, or by the next
/// write, within about this much.
const JOINS: Duration = Duration::from_secs(5);

/// The store's record of its writes' waits (shared by its clones).
#[derive(Debug, Clone, Default)]
pub(crate) struct Stalls(Arc<Mutex<State>>);

#[derive(Debug, Default)]
struct State {
    /// The attempts under way, by the order they began (so by their start).
    waiting: BTreeMap<u64, Instant>,
    /// The next attempt's number.
    next: u64,
    /// The latest stall: from the start of its first long attempt to the end
    /// of its last.
    last: Option<(Instant, Instant)>,
}

/// One write attempt, under way until dropped.
#[derive(Debug)]
pub(crate) struct Attempt {
    stalls: Arc<Mutex<State>>,
    number: u64,
}

impl Stalls {
    /// Times one write attempt: from now until the returned value is dropped.
    pub(crate) fn attempt(&self) -> Attempt {
        let mut state = self.0.lock().unwrap_or_else(|p| p.into_inner());
        let number = state.next;
        state.next += 1;
        state.waiting.insert(number, Instant::now());
        Attempt { stalls: self.0.clone(), number }
    }

    /// How much earlier than now a lease must have expired to be taken back.
    pub(crate) fn allowance(&self) -> Duration {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).allowance(Instant::now())
    }
}

impl State {
    fn allowance(&self, now: Instant) -> Duration {
        let mut allowance = Duration::ZERO;
        if let Some((began, ended)) = self.last {
            let length = ended - began;
            if now < ended + length {
                allowance = length;
            }
        }
        // The oldest attempt under way: a stall going on, if it is long.
        if let Some(&started) = self.waiting.values().next() {
            if now.saturating_duration_since(started) >= LONG {
                let began = match self.last {
                    Some((began, ended)) if started <= ended + JOINS => began.min(started),
                    _ => started,
                };
                allowance = allowance.max(now - began);
            }
        }
        allowance
    }

    fn ended(&mut self, started: Instant, now: Instant) {
        if now.saturating_duration_since(started) < LONG {
            return;
        }
        self.last = Some(match self.last {
            Some((began, ended)) if started <= ended + JOINS => (began.min(started), ended.max(now)),
            _ => (started, now),
        });
    }
}

impl Drop for Attempt {
    fn drop(&mut self) {
        let mut state = self.stalls.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(started) = state.waiting.remove(&self.number) {
            state.ended(started, Instant::now());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn secs(s: u64) -> Duration {
        Duration::from_secs(s)
    }

    #[test]
    fn quick_writes_make_no_allowance() {
        let t0 = Instant::now();
        let mut state = State::default();
        state.ended(t0, t0 + Duration::from_millis(900));
        assert_eq!(state.allowance(t0 + secs(1)), Duration::ZERO);
        assert_eq!(state.last, None);
    }

    #[test]
    fn a_stall_shifts_take_backs_by_its_length_for_as_long_again() {
        let t0 = Instant::now();
        let mut state = State::default();
        // Writes that gave up after 5 s, one after the other, then one that
        // got through at 12 s: one stall of 12 s.
        state.ended(t0, t0 + secs(5));
        state.ended(t0 + secs(5), t0 + secs(10));
        state.ended(t0 + secs(10), t0 + secs(12));
        assert_eq!(state.last, Some((t0, t0 + secs(12))));
        assert_eq!(state.allowance(t0 + secs(12)), secs(12), "just after: only leases expired before it");
        assert_eq!(state.allowance(t0 + secs(23)), secs(12));
        assert_eq!(state.allowance(t0 + secs(24)), Duration::ZERO, "over one stall length after it");
    }

    #[test]
    fn a_stall_going_on_counts_up_to_now() {
        let t0 = Instant::now();
        let mut state = State::default();
        state.waiting.insert(0, t0);
        assert_eq!(state.allowance(t0 + Duration::from_millis(500)), Duration::ZERO, "not long yet");
        assert_eq!(state.allowance(t0 + secs(3)), secs(3));
        // One that ended before it, within reach, began the stall.
        state.ended(t0 - secs(6), t0 - secs(2));
        assert_eq!(state.allowance(t0 + secs(3)), secs(9));
    }

    #[test]
    fn stalls_far_apart_are_told_apart() {
        let t0 = Instant::now();
        let mut state = State::default();
        state.ended(t0, t0 + secs(2));
        state.ended(t0 + secs(60), t0 + secs(63));
        assert_eq!(state.last, Some((t0 + secs(60), t0 + secs(63))));
    }

    #[test]
    fn an_attempt_is_timed_until_dropped() {
        let stalls = Stalls::default();
        let attempt = stalls.attempt();
        assert_eq!(stalls.allowance(), Duration::ZERO);
        drop(attempt);
        let state = stalls.0.lock().unwrap();
        assert!(state.waiting.is_empty());
        assert_eq!(state.last, None, "a quick attempt is no stall");
    }
}
