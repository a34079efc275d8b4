//! Trying again what a transport or a store refused: a worker's receives,
//! its acknowledgements and releases, and the completion of an idempotency
//! claim. How long to go on, and the pauses between tries.

use std::time::Duration;

use tokio::time::Instant;

/// How many times a worker that runs tries at least what the transport or a
/// store refuses (an acknowledgement, a claim's completion).
pub(crate) const TRIES_AT_LEAST: u32 = 3;

/// The longest a worker that runs tries again what is refused, counted from
/// the first refusal, as long as the message stays invisible. Three tries
/// alone gave up within 5 s: a PostgreSQL restart of 20 s, tried from
/// outside with a consumer running, gave up the acks of 68 handled messages
/// a second or more before the database was back, and they were handled
/// again once their leases ran out. Bounded, because what waits behind a
/// refused call (the acks queued after a batch, the handler's lane) waits
/// while it is tried, and a refusal that never ends must not hold it for
/// good.
pub(crate) const TRY_FOR: Duration = Duration::from_secs(60);

/// Whether a worker that runs tries again what was refused `attempt` times
/// in a row, the first time at `first`: [`TRIES_AT_LEAST`] times, then
/// while `invisible` says its message stays invisible (once it may be
/// visible again, a try would most likely find it taken back), for
/// [`TRY_FOR`] at most.
pub(crate) fn again_while_running(attempt: u32, first: Instant, invisible: impl FnOnce() -> bool) -> bool {
    attempt < TRIES_AT_LEAST || (Instant::now() < first + TRY_FOR && invisible())
}

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
