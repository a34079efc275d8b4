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
//! more that follow each other make one *stall*. A lease that expired
//! during the stall is then taken back only the stall's length after it
//! expired: it gets back, after the stall, the time it had left when the
//! stall began ([`Lapse`]). A stall still going on counts up to now, so
//! that only leases that expired before it began are taken back. Leases
//! that expire after the stall are not touched: a consumer that dies after
//! a long outage has its leases taken back on time. The rule lapses one
//! stall length after the stall, when every lease that expired in it has
//! had its time again.
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

    /// Which expired leases housekeeping takes back at `now_ms` (the
    /// store's clock, in ms), given this process's latest stall.
    pub(crate) fn lapse(&self, now_ms: i64) -> Lapse {
        let now = Instant::now();
        let window = self.0.lock().unwrap_or_else(|p| p.into_inner()).window(now);
        let Some((began, ended)) = window else { return Lapse::exact(now_ms) };
        let ms = |d: Duration| i64::try_from(d.as_millis()).unwrap_or(i64::MAX / 4);
        Lapse {
            now: now_ms,
            from: now_ms - ms(now.saturating_duration_since(began)),
            to: now_ms - ms(now.saturating_duration_since(ended)),
            shift: now_ms - ms(ended.saturating_duration_since(began)),
        }
    }
}

/// Which expired leases are taken back: those that expired by `now`,
/// except, among those that expired within a stall (after `from`, by `to`),
/// the ones that expired less than the stall's length ago (after `shift`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Lapse {
    /// Now (ms): no lease that expires later is taken back.
    pub(crate) now: i64,
    /// The stall's start (ms).
    pub(crate) from: i64,
    /// The stall's end (ms; now while it goes on).
    pub(crate) to: i64,
    /// Now less the stall's length (ms).
    pub(crate) shift: i64,
}

impl Lapse {
    /// Every lease that expired by `now` (no stall).
    pub(crate) fn exact(now: i64) -> Lapse {
        Lapse { now, from: now, to: now, shift: now }
    }

    /// Whether a lease that expires at `expires` (ms) is taken back; the
    /// same test as the statements' (`statements::EXPIRED`).
    pub(crate) fn takes(&self, expires: i64) -> bool {
        expires <= self.now && (expires <= self.from || expires > self.to || expires <= self.shift)
    }
}

impl State {
    /// The stall whose rule holds at `now`: one going on (its oldest attempt
    /// under way for a second or more, joined with the last stall if that
    /// ended within reach), up to now; else the last one, for its length
    /// after it ended.
    fn window(&self, now: Instant) -> Option<(Instant, Instant)> {
        if let Some(&started) = self.waiting.values().next() {
            if now.saturating_duration_since(started) >= LONG {
                let began = match self.last {
                    Some((began, ended)) if started <= ended + JOINS => began.min(started),
                    _ => started,
                };
                return Some((began, now));
            }
        }
        self.last.filter(|&(began, ended)| now < ended + (ended - began))
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
    fn quick_writes_make_no_stall() {
        let t0 = Instant::now();
        let mut state = State::default();
        state.ended(t0, t0 + Duration::from_millis(900));
        assert_eq!(state.window(t0 + secs(1)), None);
        assert_eq!(state.last, None);
    }

    #[test]
    fn attempts_one_after_the_other_make_one_stall_whose_rule_lasts_its_length() {
        let t0 = Instant::now();
        let mut state = State::default();
        // Writes that gave up after 5 s, one after the other, then one that
        // got through at 12 s: one stall of 12 s.
        state.ended(t0, t0 + secs(5));
        state.ended(t0 + secs(5), t0 + secs(10));
        state.ended(t0 + secs(10), t0 + secs(12));
        assert_eq!(state.last, Some((t0, t0 + secs(12))));
        assert_eq!(state.window(t0 + secs(23)), Some((t0, t0 + secs(12))));
        assert_eq!(state.window(t0 + secs(24)), None, "a stall length after it");
    }

    #[test]
    fn a_stall_going_on_counts_up_to_now() {
        let t0 = Instant::now();
        let mut state = State::default();
        state.waiting.insert(0, t0);
        assert_eq!(state.window(t0 + Duration::from_millis(500)), None, "not long yet");
        assert_eq!(state.window(t0 + secs(3)), Some((t0, t0 + secs(3))));
        // One that ended before it, within reach, began the stall.
        state.ended(t0 - secs(6), t0 - secs(2));
        assert_eq!(state.window(t0 + secs(3)), Some((t0 - secs(6), t0 + secs(3))));
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
    fn a_lease_that_expired_in_a_stall_gets_back_the_time_it_had_left() {
        // A stall from 100 to 112 (s, as ms), now 115: its length is 12.
        let lapse = Lapse { now: 115_000, from: 100_000, to: 112_000, shift: 103_000 };
        assert!(lapse.takes(99_000), "expired before the stall");
        assert!(lapse.takes(100_000));
        assert!(lapse.takes(103_000), "expired 3 s into it: 3 s after it ended");
        assert!(!lapse.takes(103_001));
        assert!(!lapse.takes(112_000), "expired as it ended: not before 124");
        assert!(lapse.takes(112_001), "expired after it, and due: not its business");
        assert!(lapse.takes(115_000));
        assert!(!lapse.takes(115_001), "not expired yet");
        let plain = Lapse::exact(115_000);
        assert!(plain.takes(115_000) && !plain.takes(115_001) && plain.takes(103_001));
    }

    #[test]
    fn a_stall_going_on_holds_every_lease_that_expired_since_it_began() {
        let stalls = Stalls::default();
        let attempt = stalls.attempt();
        assert_eq!(stalls.lapse(50_000), Lapse::exact(50_000), "not long yet");
        {
            let mut state = stalls.0.lock().unwrap();
            let started = state.waiting.values_mut().next().unwrap();
            *started -= secs(4);
        }
        let lapse = stalls.lapse(50_000);
        assert!((45_900..=46_000).contains(&lapse.from) && lapse.to == 50_000, "{lapse:?}");
        assert!(lapse.takes(45_000) && !lapse.takes(47_000) && !lapse.takes(50_000), "{lapse:?}");
        drop(attempt);
        let state = stalls.0.lock().unwrap();
        assert!(state.waiting.is_empty());
        assert!(state.last.is_some(), "a long attempt is a stall");
    }
}
