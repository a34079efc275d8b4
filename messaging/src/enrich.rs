//! The enrichment hook: user code that adds attributes to consumer spans,
//! run best-effort.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;

use crate::context::MessageContext;

/// A hook that adds attributes to the consumer span of every message, set with
/// [`Setup::enrich`](crate::Setup::enrich). It receives the live span and the
/// message's context; use
/// [`OpenTelemetrySpanExt::set_attribute`](tracing_opentelemetry::OpenTelemetrySpanExt::set_attribute)
/// or record a field declared on the span.
pub(crate) type EnrichHook = Arc<dyn Fn(&tracing::Span, &MessageContext) + Send + Sync>;

/// Runs `hook`; a panic is contained and logged, and dispatch goes on.
pub(crate) fn enrich(hook: &EnrichHook, span: &tracing::Span, ctx: &MessageContext) {
    if catch_unwind(AssertUnwindSafe(|| hook(span, ctx))).is_err() {
        tracing::warn!(
            queue = ctx.queue(),
            message.id = %ctx.message_id(),
            "the span enrichment hook panicked; the message is handled without its attributes"
        );
    }
}
