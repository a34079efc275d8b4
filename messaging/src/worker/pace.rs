//! How many messages to ask for per receive: enough to keep the lanes busy
//! for a short while, and no more, so that a process with slow handlers does
//! not lease messages that another process could start at once.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// The work one receive should bring: about this much handling time per lane.
const AHEAD: Duration = Duration::from_millis(200);

/// A moving average of handler durations.
#[derive(Debug, Default)]
pub(crate) struct Pace {
    /// Nanoseconds, or 0 before the first handler has finished.
    average_ns: AtomicU64,
}

impl Pace {
    /// Records one handler's duration (a racy update is harmless: it is an estimate).
    pub(crate) fn record(&self, took: Duration) {
        let took = took.as_nanos().min(u128::from(u64::MAX)) as u64;
        let old = self.average_ns.load(Ordering::Relaxed);
        let new = if old == 0 { took.max(1) } else { (old - old / 16 + took / 16).max(1) };
        self.average_ns.store(new, Ordering::Relaxed);
    }

    /// Messages to receive: about [`AHEAD`] of work per lane, at least one per
    /// lane and at most `max` (before any handler has finished: one per lane,
    /// and at least 10).
    pub(crate) fn batch(&self, concurrency: usize, max: usize) -> usize {
        let lanes = concurrency.max(1) as u64;
        let wanted = match self.average_ns.load(Ordering::Relaxed) {
            0 => lanes.max(10),
            average => lanes.saturating_mul((AHEAD.as_nanos() as u64 / average).max(1)),
        };
        wanted.clamp(1, max.max(1) as u64) as usize
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
}
