//! A delivery that a newer build of the consumer may read and this one
//! cannot (a rolling deploy): given back uncharged for a newer replica to
//! take, for as long as [`Setup::wait_for_newer`] allows.
//!
//! [`Setup::wait_for_newer`]: crate::Setup::wait_for_newer

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use super::dispatch::{retry_scheduled, Step};
use super::inflight::Batch;
use super::Worker;
use crate::envelope::DecodeError;
use crate::observe::Outcome;

/// The shortest pause before a delivery given back for a newer build comes
/// back.
const SHORTEST: Duration = Duration::from_secs(2);

/// The longest such pause.
const LONGEST: Duration = Duration::from_secs(5 * 60);

/// The pause before a delivery given back for a newer build comes back,
/// after it `waited` since it was sent and was received `receive_count`
/// times: the longer of two rules, at most [`LONGEST`].
///
/// Each receive is a draw among the replicas, so what brings it to a new
/// one is how often it comes back. Where a postponement charges nothing
/// (database queues: the receive count stays), the pause grows by an eighth
/// of the time waited: tried from outside on PostgreSQL with four old
/// replicas and one new, pauses as long as the time waited (doubling)
/// still left 74 of 300 messages waiting after 240 s; an eighth comes back
/// about 13 times in the first minute and 35 times in a quarter of an hour.
/// Where every receive counts toward a redrive policy (SQS), the pause
/// doubles with the receive count instead, so that the ten receives that
/// twice the default `max_receives` allows last some 13 minutes.
pub(super) fn pause(waited: Duration, receive_count: u32) -> Duration {
    let by_time = SHORTEST + waited / 8;
    let by_receives = SHORTEST.saturating_mul(1u32 << receive_count.saturating_sub(1).min(16));
    by_time.max(by_receives).min(LONGEST)
}

impl Worker {
    /// Gives back, uncharged, a delivery that a newer build of the consumer
    /// may read and this one cannot ([`DecodeError::awaits_newer_build`]),
    /// for another consumer to take: during a rolling deploy, the old
    /// build's replicas receive what the new build's publish. It comes back
    /// after [`pause`], until the app's `wait_for_newer` has passed since it
    /// was sent; from then on (and where the transport does not postpone, or
    /// the receive is the last one an SQS redrive policy allows) it fails
    /// like any other attempt. `None`: not given back.
    pub(super) async fn leave_for_newer(
        &self,
        batch: &Arc<Batch>,
        i: usize,
        tries: u32,
        error: &DecodeError,
    ) -> Option<Step> {
        let delivery = &batch.deliveries[i];
        let spec = self.routes.spec();
        if tries > 0 || !error.awaits_newer_build() || !self.transport.postpones(spec) {
            return None;
        }
        let waited = SystemTime::now().duration_since(delivery.sent_at).unwrap_or_default();
        let left = self.newer_wait.checked_sub(waited).filter(|left| !left.is_zero())?;
        if delivery.receive_count >= spec.redrive_after() {
            return None;
        }
        let pause = pause(waited, delivery.receive_count).min(left);
        // INFO: what a rolling deploy does; the failures after the wait say
        // WARN, and the metric counts each postponement (`AwaitingNewer`).
        tracing::info!(queue = spec.name, message.id = %delivery.message_id, retry_in = ?pause,
            "{error}: given back uncharged for a newer build of this consumer to take (a rolling deploy); \
             from {:?} after it was sent it fails like any other attempt", self.newer_wait);
        self.hooks.telemetry.consumed(self.transport.system(), spec.name, Duration::ZERO, Some("AwaitingNewer"));
        self.inflight.settle(batch, i);
        let reason = format!("waiting for a newer build of the consumer: {error}");
        let postponed = self.transport.postpone(spec.name, delivery.receipt.clone(), pause, &reason).await;
        retry_scheduled(spec.name, delivery, postponed);
        self.report(delivery, Outcome::AwaitingNewer { error: error.to_string(), retry_in: pause });
        Some(Step::Released)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// When each return happens for a delivery given back every time, from
    /// its first receive; `charged`: each receive counts (SQS).
    fn returns(charged: bool, until: Duration) -> Vec<Duration> {
        let (mut at, mut receives, mut times) = (Duration::ZERO, 1, Vec::new());
        while at < until {
            times.push(at);
            at += pause(at, receives);
            if charged {
                receives += 1;
            }
        }
        times
    }

    #[test]
    fn uncharged_returns_are_frequent_at_first_and_rarer_later() {
        let minute = returns(false, Duration::from_secs(60)).len();
        let quarter = returns(false, Duration::from_secs(15 * 60)).len();
        assert!((10..=16).contains(&minute), "{minute} returns in the first minute");
        assert!((25..=45).contains(&quarter), "{quarter} returns in a quarter of an hour");
    }

    #[test]
    fn charged_returns_spread_ten_receives_over_minutes() {
        let times = returns(true, Duration::from_secs(3600));
        let tenth = times[9];
        assert!(
            (Duration::from_secs(10 * 60)..=Duration::from_secs(15 * 60)).contains(&tenth),
            "the tenth receive at {tenth:?}"
        );
        assert_eq!(pause(Duration::from_secs(10_000), 40), LONGEST);
    }
}
