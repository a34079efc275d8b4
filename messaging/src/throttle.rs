//! Work, or a warning, let through at most once per period.

use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

/// Lets work run at most once per period: housekeeping that many receivers
/// would run at once, a warning that would repeat while its cause lasts.
/// On tokio's clock, so that tests with paused time drive it.
#[derive(Debug, Default)]
pub(crate) struct Throttle(Mutex<Option<Instant>>);

impl Throttle {
    /// A throttle that has said nothing yet (for a `static`).
    pub(crate) const fn new() -> Self {
        Throttle(Mutex::new(None))
    }

    /// Whether `every` has passed since this last said yes (yes the first
    /// time, and when `force`).
    pub(crate) fn due(&self, every: Duration, force: bool) -> bool {
        let mut last = self.0.lock().unwrap_or_else(|p| p.into_inner());
        let due = force || last.is_none_or(|at| at.elapsed() >= every);
        if due {
            *last = Some(Instant::now());
        }
        due
    }
}
