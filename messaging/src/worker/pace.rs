//! How many messages to ask for per receive: enough to keep the lanes busy
//! for a short while, and no more, so that a process with slow handlers does
//! not lease messages that another process could start at once; and no more
//! bodies than [`RECEIVE_BODIES`] by their average size, so that large
//! messages do not take the process's memory.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use crate::transport::RECEIVE_BODIES;

/// The work one receive should bring: about this much handling time per lane.
const AHEAD: Duration = Duration::from_millis(200);

/// A moving average of handler durations, and one of body sizes.
#[derive(Debug, Default)]
pub(crate) struct Pace {
    /// Nanoseconds, or 0 before the first handler has finished.
    average_ns: AtomicU64,
    /// Bytes per body, or 0 before the first receive brought any.
    body_bytes: AtomicU64,
}

impl Pace {
    /// Records one handler's duration (a racy update is harmless: it is an estimate).
    pub(crate) fn record(&self, took: Duration) {
        let took = took.as_nanos().min(u128::from(u64::MAX)) as u64;
        let old = self.average_ns.load(Ordering::Relaxed);
        let new = if old == 0 { took.max(1) } else { (old - old / 16 + took / 16).max(1) };
        self.average_ns.store(new, Ordering::Relaxed);
    }

    /// Records the body sizes of one receive. A larger average counts at
    /// once (the next receive must not bring as many of the larger bodies);
    /// a smaller one an eighth of the way per receive.
    pub(crate) fn received(&self, bodies: impl Iterator<Item = usize>) {
        let (count, sum) = bodies.fold((0u64, 0u64), |(n, sum), b| (n + 1, sum.saturating_add(b as u64)));
        if count == 0 {
            return;
        }
        let mean = (sum / count).max(1);
        let old = self.body_bytes.load(Ordering::Relaxed);
        let new = if mean >= old { mean } else { old - (old - mean) / 8 };
        self.body_bytes.store(new, Ordering::Relaxed);
    }

    /// Messages to receive: about [`AHEAD`] of work per lane, and bodies of
    /// [`RECEIVE_BODIES`] at most by their average size; at least one per
    /// lane and at most `max` (before any handler has finished: one per lane,
    /// and at least 10).
    pub(crate) fn batch(&self, concurrency: usize, max: usize) -> usize {
        let lanes = concurrency.max(1) as u64;
        let by_time = match self.average_ns.load(Ordering::Relaxed) {
            0 => lanes.max(10),
            average => lanes.saturating_mul((AHEAD.as_nanos() as u64 / average).max(1)),
        };
        let by_size = match self.body_bytes.load(Ordering::Relaxed) {
            0 => u64::MAX,
            bytes => (RECEIVE_BODIES / bytes).max(lanes),
        };
        by_time.min(by_size).clamp(1, max.max(1) as u64) as usize
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fast_handlers_get_full_batches_and_slow_ones_one_per_lane() {
        let pace = Pace::default();
        assert_eq!(pace.batch(1, 300), 10, "before any measurement");
        assert_eq!(pace.batch(8, 300), 10);
        for _ in 0..100 {
            pace.record(Duration::from_micros(2));
        }
        assert_eq!(pace.batch(1, 300), 300);
        for _ in 0..200 {
            pace.record(Duration::from_secs(1));
        }
        assert_eq!(pace.batch(8, 300), 8);
        assert_eq!(pace.batch(8, 5), 5, "never more than the transport takes");
        for _ in 0..200 {
            pace.record(Duration::from_millis(10));
        }
        let batch = pace.batch(4, 300);
        assert!((72..=80).contains(&batch), "about 20 per lane: {batch}");
    }

    /// Fast handlers of large bodies: as many as fit in [`RECEIVE_BODIES`], at
    /// least one per lane; small bodies leave the batch to the handlers' pace.
    #[test]
    fn large_bodies_bound_the_batch_and_small_ones_do_not() {
        let pace = Pace::default();
        for _ in 0..100 {
            pace.record(Duration::from_micros(2));
        }
        pace.received(std::iter::repeat_n(200, 1_000));
        assert_eq!(pace.batch(8, 1_000), 1_000, "200-byte bodies");
        pace.received(std::iter::repeat_n(512 * 1024, 10));
        assert_eq!(pace.batch(8, 1_000), 16, "8 MiB of 512 KiB bodies, at once");
        assert_eq!(pace.batch(32, 1_000), 32, "but one per lane");
        pace.received(std::iter::repeat_n(64 * 1024 * 1024, 1));
        assert_eq!(pace.batch(1, 1_000), 1, "a body larger than the budget: one");
        // Back to small bodies: the average comes down an eighth of the way
        // per receive, and the batch grows back to the handlers' pace.
        for _ in 0..200 {
            pace.received(std::iter::repeat_n(200, 1_000));
        }
        assert_eq!(pace.batch(8, 1_000), 1_000);
    }

    #[test]
    fn a_receive_of_nothing_changes_nothing() {
        let pace = Pace::default();
        pace.received(std::iter::empty());
        assert_eq!(pace.batch(1, 300), 10);
        pace.received(std::iter::repeat_n(4 * 1024 * 1024, 2));
        pace.received(std::iter::empty());
        assert_eq!(pace.batch(1, 300), 2);
    }
}
