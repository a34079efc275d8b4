//! Telemetry across the queue hop: OpenTelemetry spans, propagation, metrics
//! and logs.
//!
//! * **Spans.** Publishing opens a `send {queue}` span (kind producer) and
//!   handling a message a `process {queue}` span (kind consumer), both
//!   `tracing` spans at level `DEBUG` under the target `messaging`, with the
//!   OpenTelemetry messaging attributes. With the `tracing-opentelemetry`
//!   layer installed (as [`init`] does when an exporter is configured) they
//!   become OpenTelemetry spans; give your own OpenTelemetry layer a filter
//!   that lets `messaging=debug` through.
//! * **Propagation.** The producer span's W3C `traceparent` (and `tracestate`)
//!   travel in the message attributes on every transport; the consumer span
//!   continues the producer's trace, and handlers see the producer's context
//!   as [`MessageContext::producer_context`](crate::MessageContext::producer_context).
//! * **Metrics** (OpenTelemetry semantic conventions, meter `messaging`):
//!   `messaging.client.sent.messages`, `messaging.client.consumed.messages`
//!   (with `error.type` on failure), `messaging.process.duration` (seconds)
//!   and `messaging.dlq.depth` (per queue); with an outbox,
//!   `messaging.outbox.depth`, `messaging.outbox.failed` and
//!   `messaging.outbox.oldest_age` (seconds) per destination queue; when
//!   asked for ([`Setup::queue_gauges`](crate::Setup::queue_gauges)),
//!   `messaging.queue.depth` (by status), `messaging.queue.expired` and
//!   `messaging.queue.oldest_pending_age` (seconds) per queue. They are recorded through the
//!   global meter provider: without one (no collector) recording is a no-op.
//!   [`Setup::without_observability`](crate::Setup::without_observability)
//!   turns them off.
//! * **Enrichment.** [`Setup::enrich`](crate::Setup::enrich) adds attributes
//!   to every consumer span; a hook that panics is contained and logged.
//! * **Logs and export.** [`init`] sets up `tracing-subscriber` (`RUST_LOG`,
//!   text or JSON), the Prometheus reader behind `/metrics`, and OTLP export
//!   when `OTEL_EXPORTER_OTLP_ENDPOINT` is set (feature `otlp`).
//!   `#[messaging::main]` calls it.

mod logging;
mod metrics;
mod propagation;
mod queues;
mod spans;

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

pub(crate) use logging::gather_prometheus;
pub use logging::{init, init_logging, prometheus_reader, LogFormat, TelemetryConfig, TelemetryGuard};
pub(crate) use metrics::{DlqGauge, OutboxGauge};
pub(crate) use propagation::{extract_span_context, inject};
pub(crate) use queues::QueueGauges;
pub(crate) use spans::{consumer_span, producer_span, record_failure, relay_span, schedule_span};

/// The OpenTelemetry API crate this framework records with (the same version
/// your own instrumentation must use to share traces and metrics).
pub use opentelemetry;

use crate::error::PublishError;
use crate::transport::MessageId;
use metrics::Metrics;

/// Metrics of one app (its publishers and workers), which
/// [`Setup::without_observability`](crate::Setup::without_observability) can
/// turn off.
pub(crate) struct Telemetry {
    metrics: Metrics,
    enabled: AtomicBool,
}

impl std::fmt::Debug for Telemetry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Telemetry").field("metrics", &self.enabled.load(Ordering::Relaxed)).finish()
    }
}

impl Default for Telemetry {
    fn default() -> Self {
        Telemetry { metrics: Metrics::from_global(), enabled: AtomicBool::new(true) }
    }
}

impl Telemetry {
    /// Turns the metrics off (spans stay).
    pub(crate) fn disable_metrics(&self) {
        self.enabled.store(false, Ordering::Relaxed);
    }

    fn metrics(&self) -> Option<&Metrics> {
        self.enabled.load(Ordering::Relaxed).then_some(&self.metrics)
    }

    /// Records the outcome of one publish call on its producer span and in
    /// `messaging.client.sent.messages`: the message id of a single send, the
    /// count of successes, each failure with its `error.type`.
    pub(crate) fn published(
        &self,
        span: &tracing::Span,
        system: &'static str,
        queue: &'static str,
        results: &[Result<MessageId, PublishError>],
    ) {
        if let [Ok(id)] = results {
            span.record("messaging.message.id", tracing::field::display(id));
        }
        let metrics = self.metrics();
        let mut succeeded = 0;
        let mut first_failure = None;
        for result in results {
            match result {
                Ok(_) => succeeded += 1,
                Err(e) => {
                    first_failure.get_or_insert(e.kind());
                    if let Some(m) = metrics {
                        m.sent(system, queue, 1, Some(e.kind()));
                    }
                }
            }
        }
        if let (Some(m), true) = (metrics, succeeded > 0) {
            m.sent(system, queue, succeeded, None);
        }
        if let Some(kind) = first_failure {
            record_failure(span, kind);
        }
    }

    /// Counts `count` ticks of `schedule` whose turn ended with `outcome`
    /// (`published`, `skipped`, `failed`) in `messaging.schedule.ticks`.
    pub(crate) fn ticked(&self, schedule: &'static str, queue: &'static str, outcome: &'static str, count: u64) {
        if let (Some(m), true) = (self.metrics(), count > 0) {
            m.ticked(schedule, queue, outcome, count);
        }
    }

    /// Records one dispatch: its duration, and its failure kind if it failed.
    pub(crate) fn consumed(
        &self,
        system: &'static str,
        queue: &'static str,
        took: Duration,
        error: Option<&'static str>,
    ) {
        if let Some(m) = self.metrics() {
            m.consumed(system, queue, took, error);
        }
    }

    /// Registers the `messaging.dlq.depth` gauge of a starting app, or
    /// `None` when metrics are off.
    pub(crate) fn dlq_gauge(&self) -> Option<DlqGauge> {
        self.metrics().map(|_| DlqGauge::register())
    }

    /// Registers the outbox gauges of a starting app, or `None` when metrics
    /// are off.
    pub(crate) fn outbox_gauge(&self) -> Option<OutboxGauge> {
        self.metrics().map(|_| OutboxGauge::register())
    }

    /// Registers the queue gauges of a starting app
    /// ([`Setup::queue_gauges`](crate::Setup::queue_gauges)), or `None` when
    /// metrics are off.
    pub(crate) fn queue_gauges(&self) -> Option<QueueGauges> {
        self.metrics().map(|_| QueueGauges::register())
    }
}
