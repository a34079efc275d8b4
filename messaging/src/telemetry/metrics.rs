//! The instruments, named and tagged per the OpenTelemetry messaging semantic
//! conventions.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use opentelemetry::metrics::{Counter, Histogram, ObservableGauge};
use opentelemetry::{InstrumentationScope, KeyValue};

/// Bucket boundaries (seconds) of `messaging.process.duration`, as the
/// semantic conventions advise for messaging durations.
const DURATION_BUCKETS: [f64; 14] = [0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0];

/// The last observed dead-letter depth per (system, queue).
pub(crate) type DlqDepths = Arc<Mutex<BTreeMap<(&'static str, &'static str), u64>>>;

/// The framework's meter, from the global meter provider (a no-op without one).
pub(super) fn meter() -> opentelemetry::metrics::Meter {
    let scope = InstrumentationScope::builder("messaging").with_version(env!("CARGO_PKG_VERSION")).build();
    opentelemetry::global::meter_with_scope(scope)
}

pub(super) struct Metrics {
    ticks: Counter<u64>,
    sent: Counter<u64>,
    consumed: Counter<u64>,
    duration: Histogram<f64>,
}

/// The `messaging.dlq.depth` gauge of one running app and the depths it
/// reports. Registered when the app starts (not per publisher: the SDK keeps
/// every registered callback).
pub(crate) struct DlqGauge {
    pub(crate) depths: DlqDepths,
    /// Kept while the app runs.
    _gauge: ObservableGauge<u64>,
}

impl DlqGauge {
    pub(super) fn register() -> Self {
        let depths = DlqDepths::default();
        let observed = depths.clone();
        let gauge = meter()
            .u64_observable_gauge("messaging.dlq.depth")
            .with_unit("{message}")
            .with_description("Messages in a queue's dead letters, as last observed")
            .with_callback(move |gauge| {
                let depths = observed.lock().unwrap_or_else(|p| p.into_inner());
                for ((system, queue), depth) in depths.iter() {
                    gauge.observe(
                        *depth,
                        &[
                            KeyValue::new("messaging.system", *system),
                            KeyValue::new("messaging.destination.name", *queue),
                        ],
                    );
                }
            })
            .build();
        DlqGauge { depths, _gauge: gauge }
    }
}

/// The outbox's rows per queue, as last observed.
pub(crate) type OutboxRows = Arc<Mutex<Vec<crate::transport::OutboxQueue>>>;

/// The outbox gauges of one running app: `messaging.outbox.depth` (pending
/// rows), `messaging.outbox.failed` (rows refused for good) and
/// `messaging.outbox.oldest_age` (seconds, the oldest pending row), per
/// destination queue.
pub(crate) struct OutboxGauge {
    pub(crate) rows: OutboxRows,
    _gauges: (ObservableGauge<u64>, ObservableGauge<u64>, ObservableGauge<f64>),
}

impl OutboxGauge {
    pub(super) fn register() -> Self {
        let rows = OutboxRows::default();
        let observe = |of: fn(&crate::transport::OutboxQueue) -> u64| {
            let rows = rows.clone();
            move |gauge: &dyn opentelemetry::metrics::AsyncInstrument<u64>| {
                for q in rows.lock().unwrap_or_else(|p| p.into_inner()).iter() {
                    gauge.observe(of(q), &[KeyValue::new("messaging.destination.name", q.queue.clone())]);
                }
            }
        };
        let depth = meter()
            .u64_observable_gauge("messaging.outbox.depth")
            .with_unit("{message}")
            .with_description("Messages in the outbox waiting to be relayed, as last observed")
            .with_callback(observe(|q| q.pending))
            .build();
        let failed = meter()
            .u64_observable_gauge("messaging.outbox.failed")
            .with_unit("{message}")
            .with_description("Messages in the outbox that the transport refused for good, as last observed")
            .with_callback(observe(|q| q.failed))
            .build();
        let aged = rows.clone();
        let age = meter()
            .f64_observable_gauge("messaging.outbox.oldest_age")
            .with_unit("s")
            .with_description("Age of the oldest message in the outbox waiting to be relayed, as last observed")
            .with_callback(move |gauge| {
                for q in aged.lock().unwrap_or_else(|p| p.into_inner()).iter() {
                    let age = q.oldest_pending_ms.unwrap_or(0) as f64 / 1000.0;
                    gauge.observe(age, &[KeyValue::new("messaging.destination.name", q.queue.clone())]);
                }
            })
            .build();
        OutboxGauge { rows, _gauges: (depth, failed, age) }
    }
}

impl Metrics {
    /// Instruments of the global meter provider (no-ops without one).
    pub(super) fn from_global() -> Self {
        let meter = meter();
        Metrics {
            ticks: meter
                .u64_counter("messaging.schedule.ticks")
                .with_unit("{tick}")
                .with_description(
                    "Ticks of a schedule whose turn this process ended: published, skipped (missed, paused, or \
                     nothing to publish) or failed (the schedule function failed)",
                )
                .build(),
            sent: meter
                .u64_counter("messaging.client.sent.messages")
                .with_unit("{message}")
                .with_description("Messages a producer attempted to send")
                .build(),
            consumed: meter
                .u64_counter("messaging.client.consumed.messages")
                .with_unit("{message}")
                .with_description("Messages handed to a handler (error.type set when handling failed)")
                .build(),
            duration: meter
                .f64_histogram("messaging.process.duration")
                .with_unit("s")
                .with_description("Duration of handling one message, behaviours included")
                .with_boundaries(DURATION_BUCKETS.to_vec())
                .build(),
        }
    }

    pub(super) fn sent(&self, system: &'static str, queue: &'static str, count: u64, error: Option<&'static str>) {
        let base = [
            KeyValue::new("messaging.system", system),
            KeyValue::new("messaging.destination.name", queue),
            KeyValue::new("messaging.operation.name", "send"),
        ];
        match error {
            None => self.sent.add(count, &base),
            Some(kind) => {
                let [a, b, c] = base;
                self.sent.add(count, &[a, b, c, KeyValue::new("error.type", kind)]);
            }
        }
    }

    pub(super) fn ticked(&self, schedule: &'static str, queue: &'static str, outcome: &'static str, count: u64) {
        self.ticks.add(
            count,
            &[
                KeyValue::new("messaging.schedule.name", schedule),
                KeyValue::new("messaging.destination.name", queue),
                KeyValue::new("messaging.schedule.outcome", outcome),
            ],
        );
    }

    pub(super) fn consumed(
        &self,
        system: &'static str,
        queue: &'static str,
        took: Duration,
        error: Option<&'static str>,
    ) {
        let base = [
            KeyValue::new("messaging.system", system),
            KeyValue::new("messaging.destination.name", queue),
            KeyValue::new("messaging.operation.name", "process"),
        ];
        match error {
            None => {
                self.consumed.add(1, &base);
                self.duration.record(took.as_secs_f64(), &base);
            }
            Some(kind) => {
                let [a, b, c] = base;
                let tags = [a, b, c, KeyValue::new("error.type", kind)];
                self.consumed.add(1, &tags);
                self.duration.record(took.as_secs_f64(), &tags);
            }
        }
    }
}
