//! The producer and consumer spans, with the OpenTelemetry messaging
//! attributes. They are `DEBUG` spans of the target `messaging`: a log
//! subscriber at `INFO` skips them at the cost of one check, while an
//! OpenTelemetry layer asks for them (as [`init`](super::init) does). Measured
//! at `INFO`, recording one span per message halved in-memory throughput. `otel.name`, `otel.kind` and `otel.status_code` are the fields
//! `tracing-opentelemetry` maps to the span's name, kind and status.
//!
//! Integers are recorded as `i64` (`tracing-opentelemetry` records `u64`
//! as text). Two attributes are the framework's own (the conventions have none for
//! them): `messaging.message.group_id` (FIFO group) and
//! `messaging.message.receive_count`.

use tracing::field::Empty;
use tracing_opentelemetry::OpenTelemetrySpanExt;

use crate::transport::Delivery;

// `unobserved`: without any subscriber, `tracing` (with its `log` feature,
// which dependencies turn on) still builds every field of a disabled span for
// the `log` crate; nothing would record these spans, so none is made.

/// `{operation} {queue}`, formatted only when a subscriber records it. (With
/// `tracing`'s `log` feature on, which some dependencies turn on, a disabled
/// span still evaluates its field values when no subscriber is installed: a
/// `format!` here cost a quarter of the in-memory throughput.)
struct SpanName(&'static str, &'static str);

impl std::fmt::Display for SpanName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {}", self.0, self.1)
    }
}

/// The span of one publish call (`count` messages to `queue`).
pub(crate) fn producer_span(system: &'static str, queue: &'static str, count: usize) -> tracing::Span {
    if !tracing::dispatcher::has_been_set() {
        return tracing::Span::none(); // see `unobserved`
    }
    tracing::debug_span!(
        target: "messaging",
        "send",
        otel.name = %SpanName("send", queue),
        otel.kind = "producer",
        otel.status_code = Empty,
        messaging.system = system,
        messaging.destination.name = queue,
        messaging.operation.name = "send",
        messaging.operation.type = "send",
        messaging.batch.message_count = (count != 1).then_some(count as i64),
        messaging.message.id = Empty,
        "error.type" = Empty,
    )
}

/// The span of a relay's send of `count` outbox messages to `queue`, linked
/// to the producer span of each (whose trace the consumer continues).
pub(crate) fn relay_span(
    system: &'static str,
    queue: &'static str,
    count: usize,
    producers: impl Iterator<Item = opentelemetry::trace::SpanContext>,
) -> tracing::Span {
    if !tracing::dispatcher::has_been_set() {
        return tracing::Span::none(); // see `unobserved`
    }
    let span = tracing::debug_span!(
        target: "messaging",
        "relay",
        otel.name = %SpanName("relay", queue),
        otel.kind = "producer",
        otel.status_code = Empty,
        messaging.system = system,
        messaging.destination.name = queue,
        messaging.operation.name = "relay",
        messaging.operation.type = "send",
        messaging.batch.message_count = count as i64,
        "error.type" = Empty,
    );
    if !span.is_disabled() {
        for producer in producers {
            span.add_link(producer);
        }
    }
    span
}

/// The span of handling one delivery, continuing the producer's trace when
/// the message carries one.
pub(crate) fn consumer_span(
    system: &'static str,
    queue: &'static str,
    delivery: &Delivery,
    type_name: Option<&'static str>,
) -> tracing::Span {
    if !tracing::dispatcher::has_been_set() {
        return tracing::Span::none(); // see `unobserved`
    }
    let span = tracing::debug_span!(
        target: "messaging",
        "process",
        otel.name = %SpanName("process", queue),
        otel.kind = "consumer",
        otel.status_code = Empty,
        messaging.system = system,
        messaging.destination.name = queue,
        messaging.operation.name = "process",
        messaging.operation.type = "process",
        messaging.message.id = %delivery.message_id,
        messaging.message.group_id = delivery.group_id.as_deref(),
        messaging.message.receive_count = i64::from(delivery.receive_count),
        messaging.message.type = type_name,
        "error.type" = Empty,
    );
    if !span.is_disabled() {
        if let Some(producer) = super::propagation::extract(&delivery.attributes) {
            // Fails only without an OpenTelemetry layer, when there is no trace to join.
            let _ = span.set_parent(producer);
        }
    }
    span
}

/// The span of one tick of a schedule: the claim, the schedule function,
/// and the publish (whose producer span is its child, so the consumer's
/// trace leads back to the tick). A root span: a tick has no cause but the
/// clock. `messaging.schedule.outcome` is recorded when the tick's turn ends
/// (`published`, `skipped`, `failed`, or `elsewhere` when another process
/// had it).
pub(crate) fn schedule_span(schedule: &'static str, queue: &'static str, tick: &str, catch_up: bool) -> tracing::Span {
    if !tracing::dispatcher::has_been_set() {
        return tracing::Span::none(); // see `unobserved`
    }
    tracing::debug_span!(
        target: "messaging",
        parent: None,
        "schedule",
        otel.name = %SpanName("schedule", schedule),
        otel.kind = "internal",
        otel.status_code = Empty,
        messaging.schedule.name = schedule,
        messaging.schedule.tick = tick,
        messaging.schedule.catch_up = catch_up,
        messaging.schedule.outcome = Empty,
        messaging.destination.name = queue,
        "error.type" = Empty,
    )
}

/// Marks a span failed with the failure's kind.
pub(crate) fn record_failure(span: &tracing::Span, kind: &str) {
    span.record("error.type", kind);
    span.record("otel.status_code", "ERROR");
}
