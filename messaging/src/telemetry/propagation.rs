//! W3C trace context (`traceparent`, `tracestate`) in message attributes.

use opentelemetry::propagation::{Extractor, Injector, TextMapPropagator};
use opentelemetry::trace::{SpanContext, TraceContextExt};
use opentelemetry_sdk::propagation::TraceContextPropagator;
use tracing_opentelemetry::OpenTelemetrySpanExt;

use crate::transport::Attributes;

struct Inject<'a>(&'a mut Attributes);

impl Injector for Inject<'_> {
    /// Leaves out empty values (an empty `tracestate` means none, and
    /// replaces any older one): Amazon SQS refuses a message with an empty
    /// attribute.
    fn set(&mut self, key: &str, value: String) {
        if value.is_empty() {
            self.0.remove(key);
        } else {
            self.0.insert(key.to_owned(), value);
        }
    }
}

struct Extract<'a>(&'a Attributes);

impl Extractor for Extract<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).map(String::as_str)
    }

    fn keys(&self) -> Vec<&str> {
        self.0.keys().map(String::as_str).collect()
    }
}

/// Writes the trace context of `span` into `attributes`, unless the span is
/// not recorded by OpenTelemetry or the attributes carry a `traceparent`
/// already (one the caller set explicitly).
pub(crate) fn inject(span: &tracing::Span, attributes: &mut Attributes) {
    if span.is_disabled() || attributes.contains_key("traceparent") {
        return;
    }
    let context = span.context();
    if context.span().span_context().is_valid() {
        TraceContextPropagator::new().inject_context(&context, &mut Inject(attributes));
    }
}

/// The producer's context carried by `attributes`, when valid.
pub(crate) fn extract(attributes: &Attributes) -> Option<opentelemetry::Context> {
    if !attributes.contains_key("traceparent") {
        return None;
    }
    let context = TraceContextPropagator::new().extract(&Extract(attributes));
    context.span().span_context().is_valid().then_some(context)
}

/// The producer's span context carried by `attributes`, when valid.
pub(crate) fn extract_span_context(attributes: &Attributes) -> Option<SpanContext> {
    extract(attributes).map(|context| context.span().span_context().clone())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_valid_traceparent_is_read_and_a_broken_one_ignored() {
        let mut attributes = Attributes::new();
        attributes.insert("traceparent".into(), "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01".into());
        attributes.insert("tracestate".into(), "vendor=value".into());
        let context = extract_span_context(&attributes).expect("valid");
        assert_eq!(context.trace_id().to_string(), "4bf92f3577b34da6a3ce929d0e0e4736");
        assert_eq!(context.span_id().to_string(), "00f067aa0ba902b7");
        assert!(context.is_remote() && context.is_sampled());
        assert_eq!(context.trace_state().get("vendor"), Some("value"));

        attributes.insert("traceparent".into(), "not a traceparent".into());
        assert!(extract_span_context(&attributes).is_none());
        assert!(extract_span_context(&Attributes::new()).is_none());
    }

    #[test]
    fn an_empty_trace_state_is_left_out() {
        use opentelemetry::trace::{SpanId, TraceFlags, TraceId, TraceState};
        let parent = SpanContext::new(
            TraceId::from_hex("4bf92f3577b34da6a3ce929d0e0e4736").expect("trace id"),
            SpanId::from_hex("00f067aa0ba902b7").expect("span id"),
            TraceFlags::SAMPLED,
            false,
            TraceState::default(),
        );
        let context = opentelemetry::Context::new().with_remote_span_context(parent);
        let mut attributes = Attributes::new();
        attributes.insert("tracestate".into(), "stale=1".into());
        TraceContextPropagator::new().inject_context(&context, &mut Inject(&mut attributes));
        assert_eq!(
            attributes.get("traceparent").map(String::as_str),
            Some("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")
        );
        assert!(!attributes.contains_key("tracestate"), "{attributes:?}");
    }

    #[test]
    fn nothing_is_injected_without_an_opentelemetry_layer() {
        let mut attributes = Attributes::new();
        inject(&tracing::info_span!("no subscriber"), &mut attributes);
        assert!(attributes.is_empty());
    }
}
