//! Trying again what a transport or a store refused: a worker's receives,
//! its acknowledgements and releases, the completion of an idempotency
//! claim, an outbox relay's settle. How long to go on, the pauses between
//! tries, and [`tried`], the loop of a single call tried again (the acker
//! and a stop's release keep their own loops: each try there takes back
//! only the part of a batch that was refused).

use std::future::Future;
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

/// A refusal, as [`tried`] tells its caller: how many tries in a row were
/// refused, and when the first of them was.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Refusal {
    /// The tries refused in a row so far, this one included.
    pub(crate) attempt: u32,
    /// When the first of them was refused.
    pub(crate) first: Instant,
}

/// Calls `call` until it succeeds or `again` says to give up a refusal,
/// pausing [`retry_pause`] between tries; a pause ends early once
/// `interrupted` is ready (a stop), so that `again` can decide at once.
/// `again` also says, on the first refusal, that it is tried again (a
/// warning), since only it knows for how long.
pub(crate) async fn tried<T, E, F>(
    mut call: impl FnMut() -> F,
    mut again: impl FnMut(&E, Refusal) -> bool,
    interrupted: impl Future<Output = ()>,
) -> Result<T, E>
where
    F: Future<Output = Result<T, E>>,
{
    tokio::pin!(interrupted);
    let mut ended = false;
    let mut first = None;
    let mut attempt = 0u32;
    loop {
        attempt = attempt.saturating_add(1);
        let e = match call().await {
            Ok(done) => return Ok(done),
            Err(e) => e,
        };
        let first = *first.get_or_insert_with(Instant::now);
        if !again(&e, Refusal { attempt, first }) {
            return Err(e);
        }
        let pause = tokio::time::sleep(retry_pause(attempt));
        if ended {
            pause.await;
        } else {
            tokio::select! {
                () = pause => {}
                () = &mut interrupted => ended = true,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::cell::Cell;

    use super::*;
    use crate::error::TransportError;

    fn refused<T>() -> Result<T, TransportError> {
        Err(TransportError::Backend("refused".into()))
    }

    #[tokio::test(start_paused = true)]
    async fn a_refused_call_is_tried_again_with_growing_pauses_until_it_succeeds() {
        let calls = Cell::new(0u32);
        let start = Instant::now();
        let call = || {
            calls.set(calls.get() + 1);
            std::future::ready(if calls.get() < 4 { refused() } else { Ok(calls.get()) })
        };
        let mut told = Vec::new();
        let again = |_: &TransportError, refusal: Refusal| {
            told.push((refusal.attempt, refusal.first.duration_since(start)));
            true
        };
        assert_eq!(tried(call, again, std::future::pending()).await.expect("the fourth try succeeds"), 4);
        // Pauses of 100, 200 and 300 ms; the first refusal is the start.
        assert_eq!(start.elapsed(), Duration::from_millis(600));
        assert_eq!(told, [(1, Duration::ZERO), (2, Duration::ZERO), (3, Duration::ZERO)]);
    }

    #[tokio::test(start_paused = true)]
    async fn the_refusal_given_up_is_the_one_returned() {
        let calls = Cell::new(0u32);
        let call = || {
            calls.set(calls.get() + 1);
            std::future::ready(Err::<(), _>(TransportError::Backend(format!("refusal {}", calls.get()))))
        };
        let e = tried(call, |_, refusal| refusal.attempt < 3, std::future::pending()).await.expect_err("given up");
        assert_eq!(e.to_string(), TransportError::Backend("refusal 3".into()).to_string());
    }

    #[tokio::test(start_paused = true)]
    async fn an_interruption_ends_the_pause_so_that_again_decides_at_once() {
        let start = Instant::now();
        let stopped = Cell::new(false);
        let interrupted = async {
            tokio::time::sleep(Duration::from_millis(250)).await;
            stopped.set(true);
        };
        let again = |_: &TransportError, _: Refusal| !stopped.get();
        tried(|| std::future::ready(refused::<()>()), again, interrupted).await.expect_err("given up at the stop");
        // Pauses of 100 and 200 ms, the second cut short at 250 ms.
        assert_eq!(start.elapsed(), Duration::from_millis(250));
    }
}
