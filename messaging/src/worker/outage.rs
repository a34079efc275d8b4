//! The idempotency store refusing claims: its database restarting, failing
//! over, or out of reach. That is not the messages' fault, so no attempt is
//! charged: a message whose claim was refused is held (the heartbeat keeps
//! it invisible) and tried again, and the worker receives nothing more
//! while refusals go on, so that it does not take the whole queue in to
//! hold it. Tried from outside, a SQLite queue whose claims live on a
//! PostgreSQL stopped for 150 s mid-drain: charged as attempts, 12 of 40
//! messages spent their five and were dead-lettered, for an operator to
//! redrive; held instead, all 40 were handled once after the outage.

use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

use crate::retry;
use crate::shutdown::Shutdown;
use crate::throttle::Throttle;

/// How much longer than the pause of the last refusal receives wait: a
/// held message tried again at its pause needs time to meet the store
/// (which may take the pool's acquire timeout to refuse), and a receive
/// let through before that brings in messages only to hold them.
const SLACK: Duration = Duration::from_secs(1);

/// How often an outage that goes on is said again at WARN: one that never
/// ends (a claims table missing, a store pointed at the wrong database)
/// stops the queue, and one line at its start is easily missed.
const SAY_EVERY: Duration = Duration::from_secs(60);

/// The refusals of one worker's idempotency claims.
#[derive(Debug, Default)]
pub(super) struct ClaimOutage {
    state: Mutex<Option<Refusals>>,
}

#[derive(Debug)]
struct Refusals {
    /// In a row, since the outage began.
    count: u32,
    /// When the first was.
    first: Instant,
    /// Receives wait until then.
    until: Instant,
    /// When it is said at WARN.
    said: Throttle,
    /// What the store said last.
    error: String,
}

impl ClaimOutage {
    /// A claim was refused with `error`: returns the pause before its
    /// message is tried again ([`retry::backoff`] of the refusals in a row,
    /// 5 s at most) and, when it is to be said at WARN, how long the outage
    /// has lasted: zero when this refusal began it, then every
    /// [`SAY_EVERY`].
    pub(super) fn refused(&self, error: &str) -> (Duration, Option<Duration>) {
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let now = Instant::now();
        let began = state.is_none();
        let refusals = state.get_or_insert_with(|| Refusals {
            count: 0,
            first: now,
            until: now,
            said: Throttle::default(),
            error: String::new(),
        });
        refusals.count = refusals.count.saturating_add(1);
        refusals.error = error.to_owned();
        let pause = retry::backoff(refusals.count);
        refusals.until = refusals.until.max(now + pause * 2 + SLACK);
        let say = refusals.said.due(SAY_EVERY, began);
        (pause, say.then(|| now.duration_since(refusals.first)))
    }

    /// Waits while claims are refused: until the last refusal's pause has
    /// passed (with its slack) without another, or `shutdown` begins. An
    /// outage that ends here is said at INFO, with how long it lasted.
    pub(super) async fn passed(&self, queue: &str, shutdown: &Shutdown) {
        loop {
            let until = {
                let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
                match &*state {
                    None => return,
                    Some(refusals) if refusals.until <= Instant::now() => {
                        tracing::info!(queue, refused_for = ?refusals.first.elapsed(),
                            "the idempotency store refuses no more claims; receiving again");
                        *state = None;
                        return;
                    }
                    Some(refusals) => refusals.until,
                }
            };
            tokio::select! {
                () = tokio::time::sleep_until(until) => {}
                () = shutdown.wait() => return,
            }
        }
    }

    /// What the store said, while it refuses (for `/ready`).
    pub(super) fn error(&self) -> Option<String> {
        let state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        state.as_ref().map(|refusals| format!("the idempotency store refuses claims: {}", refusals.error))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn receives_wait_while_refusals_go_on_and_not_after() {
        let outage = ClaimOutage::default();
        let shutdown = Shutdown::new();
        let started = Instant::now();
        outage.passed("q", &shutdown).await;
        assert_eq!(started.elapsed(), Duration::ZERO, "no outage: no wait");

        let (pause, say) = outage.refused("connection refused");
        assert_eq!(say, Some(Duration::ZERO), "said when it begins");
        assert_eq!(pause, retry::backoff(1));
        assert_eq!(outage.error().as_deref(), Some("the idempotency store refuses claims: connection refused"));
        // Refused again while the first pause runs: the wait grows.
        tokio::time::advance(Duration::from_millis(500)).await;
        let (second, say) = outage.refused("pool timed out");
        assert_eq!(say, None);
        assert_eq!(second, retry::backoff(2));
        let waiting = Instant::now();
        outage.passed("q", &shutdown).await;
        assert_eq!(waiting.elapsed(), second * 2 + SLACK);
        assert_eq!(outage.error(), None, "over once a pause passed without a refusal");
        let (_, say) = outage.refused("again");
        assert_eq!(say, Some(Duration::ZERO), "a later refusal begins another outage");
    }

    #[tokio::test(start_paused = true)]
    async fn an_outage_that_goes_on_is_said_again_each_minute() {
        let outage = ClaimOutage::default();
        let mut said = Vec::new();
        for _ in 0..150 {
            if let (_, Some(lasted)) = outage.refused("down") {
                said.push(lasted.as_secs());
            }
            tokio::time::advance(Duration::from_secs(1)).await;
        }
        assert_eq!(said, [0, 60, 120]);
    }

    #[tokio::test(start_paused = true)]
    async fn a_shutdown_ends_the_wait() {
        let outage = ClaimOutage::default();
        let shutdown = Shutdown::new();
        outage.refused("down");
        shutdown.trigger();
        let started = Instant::now();
        outage.passed("q", &shutdown).await;
        assert_eq!(started.elapsed(), Duration::ZERO);
        assert!(outage.error().is_some(), "still refusing: nothing said it ended");
    }
}
