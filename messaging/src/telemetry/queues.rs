//! The queue gauges ([`Setup::queue_gauges`](crate::Setup::queue_gauges)):
//! what each queue of the app holds, as last observed. An operator's first
//! alerts are here: a backlog that grows (`messaging.queue.depth` of
//! `pending`), consumers falling behind
//! (`messaging.queue.oldest_pending_age`), and messages stuck with a
//! consumer that died or lost the database (`messaging.queue.expired`).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{SystemTime, UNIX_EPOCH};

use opentelemetry::metrics::ObservableGauge;
use opentelemetry::KeyValue;

use super::metrics::meter;
use crate::transport::{MessageStatus, QueueCounts};

/// The statuses `messaging.queue.depth` reports (dead letters have
/// `messaging.dlq.depth`).
const LIVE: [MessageStatus; 4] =
    [MessageStatus::Pending, MessageStatus::Sleeping, MessageStatus::InFlight, MessageStatus::AwaitingRelease];

/// Each queue's counts as last observed, by (system, queue).
pub(crate) type QueueObservations = Arc<Mutex<BTreeMap<(&'static str, &'static str), QueueCounts>>>;

/// The queue gauges of one running app and the counts they report.
/// Registered when the app starts, as the dead-letter gauge is.
pub(crate) struct QueueGauges {
    pub(crate) observed: QueueObservations,
    /// Kept while the app runs.
    _gauges: (ObservableGauge<u64>, ObservableGauge<u64>, ObservableGauge<f64>),
}

/// Calls `observe` with each observed queue's counts and the attributes
/// every point of that queue carries (system, queue): what each gauge's
/// callback reads.
fn each(observed: &QueueObservations, mut observe: impl FnMut([KeyValue; 2], &QueueCounts)) {
    for (&(system, queue), counts) in observed.lock().unwrap_or_else(|p| p.into_inner()).iter() {
        let tags = [KeyValue::new("messaging.system", system), KeyValue::new("messaging.destination.name", queue)];
        observe(tags, counts);
    }
}

impl QueueGauges {
    pub(super) fn register() -> Self {
        let observed = QueueObservations::default();
        let counts = observed.clone();
        let depth = meter()
            .u64_observable_gauge("messaging.queue.depth")
            .with_unit("{message}")
            .with_description("Messages in a queue by status (dead letters apart), as last observed")
            .with_callback(move |gauge| {
                each(&counts, |[system, queue], counts| {
                    for status in LIVE {
                        if let Some(n) = counts.of(status) {
                            let status = KeyValue::new("messaging.message.status", status.as_str());
                            gauge.observe(n, &[system.clone(), queue.clone(), status]);
                        }
                    }
                })
            })
            .build();
        let counts = observed.clone();
        let expired = meter()
            .u64_observable_gauge("messaging.queue.expired")
            .with_unit("{message}")
            .with_description(
                "Messages in flight past their lease: their consumer stopped or lost the queue, as last observed",
            )
            .with_callback(move |gauge| {
                each(&counts, |tags, counts| {
                    if let Some(n) = counts.expired {
                        gauge.observe(n, &tags);
                    }
                })
            })
            .build();
        let counts = observed.clone();
        let age = meter()
            .f64_observable_gauge("messaging.queue.oldest_pending_age")
            .with_unit("s")
            .with_description(
                "How long the message that can be received now and has waited longest has waited, since it was \
                 sent or since its delay or backoff ended (0: none waits), as last observed",
            )
            .with_callback(move |gauge| {
                let now = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as i64);
                each(&counts, |tags, counts| {
                    if let Some(age) = pending_age(counts, now) {
                        gauge.observe(age, &tags);
                    }
                })
            })
            .build();
        QueueGauges { observed, _gauges: (depth, expired, age) }
    }
}

/// How long in seconds at `now_ms` the pending message that has waited
/// longest has waited since it became receivable; 0 when none is known to
/// wait; `None` when the transport cannot tell (SQS and `memory://` say how
/// many, not since when). A message delayed or backing off counts only
/// from when it is due: measured from its send, one message delayed a day
/// made a queue look a day behind. Computed when the gauge is read, so
/// that it grows between observations while the message waits.
fn pending_age(counts: &QueueCounts, now_ms: i64) -> Option<f64> {
    match counts.oldest_pending_since_ms {
        Some(since) => Some(now_ms.saturating_sub(since).max(0) as f64 / 1000.0),
        None => (counts.pending == Some(0)).then_some(0.0),
    }
}

#[cfg(test)]
mod tests {
    use super::pending_age;
    use crate::transport::{MessageStatus, QueueCounts};

    #[test]
    fn the_pending_age_is_known_only_where_the_transport_says_since_when_or_that_none_waits() {
        let mut counts = QueueCounts::zeros();
        assert_eq!(pending_age(&counts, 10_000), Some(0.0), "an empty queue: nothing waits");
        counts.set(MessageStatus::Sleeping, 1);
        counts.oldest_sent_at_ms = Some(1_000);
        assert_eq!(pending_age(&counts, 10_000), Some(0.0), "a delayed message is not waiting yet");
        counts.set(MessageStatus::Pending, 3);
        counts.oldest_pending_since_ms = Some(7_500);
        assert_eq!(pending_age(&counts, 10_000), Some(2.5));
        counts.oldest_pending_since_ms = Some(12_000);
        assert_eq!(pending_age(&counts, 10_000), Some(0.0), "a clock behind the sender's is not a negative age");
        counts.oldest_pending_since_ms = None;
        assert_eq!(pending_age(&counts, 10_000), None, "messages waiting, and no time: SQS, memory://");
    }
}
