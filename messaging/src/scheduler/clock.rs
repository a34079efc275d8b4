//! The wall clock schedules tick by: the machine's, or in tests one that
//! advances with tokio's clock (which a test can pause and advance).

use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// The longest a schedule sleeps before looking at the clock again: the
/// machine's clock may be set in the meantime (NTP, an operator, a suspend).
pub(crate) const MAX_SLEEP: Duration = Duration::from_secs(60);

/// A wall clock, in milliseconds since the Unix epoch.
#[derive(Debug, Clone, Default)]
pub(crate) enum Clock {
    /// The machine's clock.
    #[default]
    System,
    /// `origin_ms` at tokio's instant `start`, advancing with tokio's
    /// clock: under `#[tokio::test(start_paused = true)]` time jumps to
    /// each timer, so a test runs days of ticks in milliseconds.
    Tokio {
        /// The wall time at `start`.
        origin_ms: i64,
        /// Tokio's instant when the clock was made.
        start: tokio::time::Instant,
    },
}

impl Clock {
    /// A clock at `origin` now, advancing with tokio's (call it inside the runtime).
    pub(crate) fn tokio_at(origin: SystemTime) -> Clock {
        let origin_ms = origin.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as i64);
        Clock::Tokio { origin_ms, start: tokio::time::Instant::now() }
    }

    /// Milliseconds since the Unix epoch, now.
    pub(crate) fn now_ms(&self) -> i64 {
        match self {
            Clock::System => SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as i64),
            Clock::Tokio { origin_ms, start } => origin_ms + start.elapsed().as_millis() as i64,
        }
    }

    /// Sleeps until `at_ms`, or for [`MAX_SLEEP`] on the machine's clock,
    /// whichever comes first (the caller looks at the clock again).
    pub(crate) async fn sleep_until(&self, at_ms: i64) {
        let wait = Duration::from_millis(u64::try_from(at_ms - self.now_ms()).unwrap_or(0));
        match self {
            Clock::System => tokio::time::sleep(wait.min(MAX_SLEEP)).await,
            Clock::Tokio { .. } => tokio::time::sleep(wait).await,
        }
    }
}
