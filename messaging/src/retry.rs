//! The pauses between tries of what a transport or a store refused: a
//! worker's receives, its acknowledgements and releases, and the
//! completion of an idempotency claim.

use std::time::Duration;

/// The pause before receiving again after `failures` failed receives in a row.
pub(crate) fn backoff(failures: u32) -> Duration {
    Duration::from_millis(100 * u64::from(failures.min(50)))
}

/// The pause before trying again what was refused `attempt` times in a row
/// (acknowledgements, a stop's release, a claim's completion): [`backoff`],
/// a second at most, so that a stop's last tries fall within its deadline.
pub(crate) fn retry_pause(attempt: u32) -> Duration {
    backoff(attempt).min(Duration::from_secs(1))
}
