//! Which ticks are due, pure: from a schedule's cadence and catch-up
//! policy, the last tick whose turn is over and the time now, what to
//! publish, what to skip, and when the next tick comes. The scheduler asks
//! this, then the ledger; this knows nothing of either's I/O.

use super::{Cadence, CatchUp};

/// A tick counts as missed once this long has passed since its time (with
/// its jitter), or its next tick is due, whichever is sooner.
pub(crate) const GRACE_MS: i64 = 60_000;

/// Ticks counted one by one before a count is given as "at least".
const COUNT_CAP: u64 = 10_000;

/// How one schedule ticks.
#[derive(Debug, Clone)]
pub(crate) struct Timing {
    pub(crate) name: &'static str,
    pub(crate) cadence: Cadence,
    pub(crate) catch_up: CatchUp,
    /// Each tick is published up to this long after its time, by an amount
    /// of its own that every process computes alike.
    pub(crate) jitter_ms: u64,
}

/// What is due at a time.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Due {
    /// Ticks to publish, oldest first: (tick, published late by a catch-up).
    pub(crate) publish: Vec<(i64, bool)>,
    /// Skip every tick up to this one (they were missed).
    pub(crate) skip_through: Option<i64>,
    /// How many ticks that skip covers (at most [`COUNT_CAP`]).
    pub(crate) skipped: u64,
    /// The first tick after the ones above, and when it is due (with its
    /// jitter): when to look again.
    pub(crate) next: Option<(i64, i64)>,
}

impl Timing {
    /// The delay of tick `tick_ms`: a hash of the schedule's name and the
    /// tick, below the jitter, so that every process waits the same.
    pub(crate) fn jitter(&self, tick_ms: i64) -> i64 {
        if self.jitter_ms == 0 {
            return 0;
        }
        // FNV-1a over the name and the tick: stable across processes and
        // builds (std's hasher is seeded per process).
        let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
        for byte in self.name.bytes().chain(tick_ms.to_le_bytes()) {
            hash ^= u64::from(byte);
            hash = hash.wrapping_mul(0x0100_0000_01b3);
        }
        (hash % (self.jitter_ms + 1)) as i64
    }

    /// When tick `tick_ms` is due: its time plus its jitter.
    pub(crate) fn due_at(&self, tick_ms: i64) -> i64 {
        tick_ms.saturating_add(self.jitter(tick_ms))
    }

    /// How late tick `tick_ms` may be published and still be on time.
    fn grace(&self, tick_ms: i64) -> i64 {
        let until_next = self.cadence.next_after(tick_ms).map_or(GRACE_MS, |next| next - tick_ms);
        GRACE_MS.min(until_next)
    }

    /// The last tick at or before `last` known to be over, then what is due
    /// at `now`.
    pub(crate) fn due(&self, last: i64, now: i64) -> Due {
        let mut due = Due::default();
        // The newest tick whose time, with its jitter, has come.
        let newest = self.cadence.last_at_or_before(now).and_then(|tick| {
            if self.due_at(tick) <= now {
                Some(tick)
            } else {
                self.cadence.last_at_or_before(tick - 1)
            }
        });
        let considered = newest.map_or(last, |t| t.max(last));
        due.next = self.cadence.next_after(considered).map(|tick| (tick, self.due_at(tick)));
        let Some(newest) = newest.filter(|&t| t > last) else { return due };
        let on_time = now - self.due_at(newest) <= self.grace(newest);
        // The oldest tick published; every tick after `last` before it is skipped.
        let oldest_published = match self.catch_up {
            CatchUp::Skip if !on_time => None,
            CatchUp::Skip | CatchUp::Last => {
                due.publish.push((newest, !on_time));
                Some(newest)
            }
            CatchUp::All => {
                let mut ticks = vec![newest];
                while ticks.len() < CatchUp::MAX_TICKS {
                    match self.cadence.last_at_or_before(ticks[ticks.len() - 1] - 1) {
                        Some(tick) if tick > last => ticks.push(tick),
                        _ => break,
                    }
                }
                ticks.reverse();
                due.publish = ticks.iter().map(|&t| (t, !(on_time && t == newest))).collect();
                ticks.first().copied()
            }
        };
        let skip_through = match oldest_published {
            None => Some(newest),
            Some(oldest) => self.cadence.last_at_or_before(oldest - 1).filter(|&t| t > last),
        };
        if let Some(through) = skip_through {
            due.skip_through = Some(through);
            due.skipped = self.count(last, through);
        }
        due
    }

    /// The ticks after `after` up to and including `through` (at most [`COUNT_CAP`]).
    fn count(&self, after: i64, through: i64) -> u64 {
        if let Cadence::Every { period_ms } = self.cadence {
            let n = through.div_euclid(period_ms) - after.div_euclid(period_ms);
            return u64::try_from(n).unwrap_or(0).min(COUNT_CAP);
        }
        let mut n = 0;
        let mut at = after;
        while n < COUNT_CAP {
            match self.cadence.next_after(at) {
                Some(tick) if tick <= through => {
                    n += 1;
                    at = tick;
                }
                _ => break,
            }
        }
        n
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIN: i64 = 60_000;

    fn every_minute(catch_up: CatchUp) -> Timing {
        Timing { name: "t", cadence: Cadence::every(60_000).unwrap(), catch_up, jitter_ms: 0 }
    }

    #[test]
    fn a_tick_on_time_is_published_with_every_policy() {
        for catch_up in [CatchUp::Skip, CatchUp::Last, CatchUp::All] {
            let due = every_minute(catch_up).due(10 * MIN, 11 * MIN + 500);
            assert_eq!(due.publish, [(11 * MIN, false)], "{catch_up:?}");
            assert_eq!((due.skip_through, due.skipped), (None, 0));
            assert_eq!(due.next, Some((12 * MIN, 12 * MIN)));
        }
    }

    #[test]
    fn nothing_is_due_before_the_next_tick() {
        let due = every_minute(CatchUp::All).due(11 * MIN, 11 * MIN + 59_999);
        assert_eq!(due, Due { next: Some((12 * MIN, 12 * MIN)), ..Due::default() });
    }

    #[test]
    fn after_an_outage_each_policy_does_its_own_thing() {
        const HOUR: i64 = 60 * MIN;
        let hourly =
            |catch_up| Timing { name: "t", cadence: Cadence::every(HOUR as u64).unwrap(), catch_up, jitter_ms: 0 };
        // Last published 05:00; the process comes back at 10:30: 06:00 to
        // 10:00 were missed (10:00 by half an hour, over the minute of grace).
        let (last, now) = (5 * HOUR, 10 * HOUR + 30 * MIN);
        let skip = hourly(CatchUp::Skip).due(last, now);
        assert_eq!(skip.publish, []);
        assert_eq!((skip.skip_through, skip.skipped), (Some(10 * HOUR), 5));
        assert_eq!(skip.next, Some((11 * HOUR, 11 * HOUR)));

        let last_policy = hourly(CatchUp::Last).due(last, now);
        assert_eq!(last_policy.publish, [(10 * HOUR, true)]);
        assert_eq!((last_policy.skip_through, last_policy.skipped), (Some(9 * HOUR), 4));

        let all = hourly(CatchUp::All).due(last, now);
        let expected: Vec<(i64, bool)> = (6..=10).map(|h| (h * HOUR, true)).collect();
        assert_eq!(all.publish, expected);
        assert_eq!((all.skip_through, all.skipped), (None, 0));

        // Back at 10:00:30 instead: 10:00 is on time, the rest was missed.
        let skip = hourly(CatchUp::Skip).due(last, 10 * HOUR + 30_000);
        assert_eq!(skip.publish, [(10 * HOUR, false)]);
        assert_eq!((skip.skip_through, skip.skipped), (Some(9 * HOUR), 4));
    }

    #[test]
    fn catching_up_everything_stops_at_a_hundred_ticks() {
        let (last, now) = (0, 1_000 * MIN + 1);
        let all = every_minute(CatchUp::All).due(last, now);
        assert_eq!(all.publish.len(), 100);
        assert_eq!(all.publish[0], (901 * MIN, true));
        assert_eq!(all.publish[99], (1_000 * MIN, false), "the newest is on time");
        assert_eq!((all.skip_through, all.skipped), (Some(900 * MIN), 900));
    }

    #[test]
    fn jitter_delays_a_tick_alike_everywhere_and_within_bounds() {
        let timing = Timing { jitter_ms: 30_000, ..every_minute(CatchUp::Skip) };
        let delays: Vec<i64> = (0..200).map(|i| timing.jitter(i * MIN)).collect();
        assert!(delays.iter().all(|d| (0..=30_000).contains(d)));
        assert!(delays.iter().any(|&d| d > 15_000) && delays.iter().any(|&d| d < 15_000), "spread: {delays:?}");
        let tick = 11 * MIN;
        let at = timing.due_at(tick);
        assert_eq!(timing.due(10 * MIN, at - 1).publish, [], "not before its jitter");
        assert_eq!(timing.due(10 * MIN, at - 1).next, Some((tick, at)));
        assert_eq!(timing.due(10 * MIN, at).publish, [(tick, false)]);
    }

    #[test]
    fn a_fast_cadence_publishes_its_newest_tick_and_skips_the_rest() {
        // Grace is the gap to the next tick when that is under a minute: the
        // newest tick is on time until the next one is due.
        let fast =
            Timing { name: "t", cadence: Cadence::every(10_000).unwrap(), catch_up: CatchUp::Skip, jitter_ms: 0 };
        let due = fast.due(0, 35_000);
        assert_eq!(due.publish, [(30_000, false)]);
        assert_eq!((due.skip_through, due.skipped), (Some(20_000), 2));
    }
}
