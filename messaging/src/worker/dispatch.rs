//! Handling one delivery: decode, run the pipeline, settle (ack, retry with
//! backoff, or dead-letter), report.

use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::FutureExt;

use super::inflight::Batch;
use super::Worker;
use crate::context::MessageContext;
use crate::error::HandlerError;
use crate::handler::RetryPolicy;
use crate::observe::{DispatchEvent, Outcome};
use crate::telemetry;
use crate::transport::Delivery;
use tracing::Instrument as _;

impl Worker {
    /// Handles message `i` of `batch` to the end. Returns whether it succeeded.
    ///
    /// `clock` is when the lane's previous message ended, if it went straight
    /// on to this one: reading the clock once per message instead of twice
    /// is measurable at a million messages a second.
    pub(super) async fn process(&self, batch: &Arc<Batch>, i: usize, clock: &mut Option<Instant>) -> bool {
        let delivery = &batch.deliveries[i];
        let spec = self.routes.spec();
        let system = self.transport.system();
        let decoded = match self.routes.decode(&delivery.body) {
            Ok(decoded) => decoded,
            Err(e) => {
                tracing::warn!(
                    queue = spec.name,
                    message.id = %delivery.message_id,
                    receive_count = delivery.receive_count,
                    "message left for redelivery (and the dead-letter queue after {} receives): {e}",
                    spec.max_receives
                );
                let delay = RetryPolicy::default().backoff(delivery.receive_count);
                self.settle(batch, i);
                self.release(delivery, delay).await;
                self.hooks.telemetry.consumed(system, spec.name, Duration::ZERO, Some("Undecodable"));
                self.report(delivery, Outcome::Undecodable { error: e.to_string() });
                return false;
            }
        };
        let ctx = MessageContext::new(spec.name, system, batch, i, decoded.type_name, decoded.version);
        let span = telemetry::consumer_span(system, spec.name, delivery, decoded.type_name);
        if let Some(hook) = &self.hooks.enrich {
            telemetry::enrich(hook, &span, &ctx);
        }
        let route = decoded.route;
        let started = clock.take().unwrap_or_else(Instant::now);
        let result = AssertUnwindSafe(self.pipeline.dispatch(decoded.message, route, &ctx))
            .catch_unwind()
            .instrument(span.clone())
            .await
            .unwrap_or_else(|panic| Err(HandlerError::transient(Panic(panic_message(&panic)))));
        let ended = Instant::now();
        let took = ended.duration_since(started);
        self.pace.record(took);
        let failure = result.as_ref().err().map(HandlerError::kind);
        if let Some(kind) = failure {
            telemetry::record_failure(&span, kind);
        }
        self.hooks.telemetry.consumed(system, spec.name, took, failure);
        match result {
            Ok(()) => {
                *clock = Some(ended); // acking only queues: the next message starts now
                self.acker.ack(delivery.receipt.clone());
                self.settle(batch, i);
                self.report(delivery, Outcome::Handled);
                true
            }
            Err(error) if error.is_permanent() => {
                span.in_scope(|| {
                    tracing::warn!(queue = spec.name, message.id = %delivery.message_id, handler = route.entry.name,
                        "permanent failure, dead-lettering: {error}");
                });
                self.settle(batch, i);
                self.dead_letter(delivery, &error).await;
                self.report(delivery, Outcome::DeadLettered { error: error.to_string() });
                false
            }
            Err(error) => {
                let policy = route.entry.retry.unwrap_or_default();
                let delay = error.requested_delay().unwrap_or_else(|| policy.backoff(delivery.receive_count));
                span.in_scope(|| {
                    tracing::warn!(queue = spec.name, message.id = %delivery.message_id, handler = route.entry.name,
                        receive_count = delivery.receive_count, retry_in = ?delay, "handler failed: {error}");
                });
                self.settle(batch, i);
                self.release(delivery, delay).await;
                self.report(delivery, Outcome::Retried { error: error.to_string() });
                false
            }
        }
    }

    /// Makes a settled delivery visible again after `delay`.
    pub(super) async fn release(&self, delivery: &Delivery, delay: Duration) {
        if let Err(e) = self.transport.nack(self.routes.spec().name, delivery.receipt.clone(), delay).await {
            tracing::warn!(queue = self.routes.spec().name, message.id = %delivery.message_id,
                "could not schedule the retry ({e}); the message comes back when its visibility times out");
        }
    }

    async fn dead_letter(&self, delivery: &Delivery, error: &HandlerError) {
        let spec = self.routes.spec();
        let moved = match self.transport.dead_letters() {
            Some(dlq) => dlq.dead_letter(spec.name, delivery, error.to_string()).await,
            None => Err(crate::error::TransportError::Rejected("the transport has no dead letters".into())),
        };
        if let Err(e) = moved {
            let policy = RetryPolicy::default();
            tracing::error!(queue = spec.name, message.id = %delivery.message_id,
                "could not dead-letter the message ({e}); it is retried after the longest backoff instead. \
                 Declare `dlq = \"...\"` on the queue to keep failed messages aside");
            self.release(delivery, policy.max).await;
        }
    }

    fn report(&self, delivery: &Delivery, outcome: Outcome) {
        if let Some(observer) = &self.hooks.observer {
            observer.on_dispatch(&DispatchEvent {
                queue: self.routes.spec().name,
                message_id: delivery.message_id.clone(),
                receive_count: delivery.receive_count,
                outcome,
            });
        }
    }
}

#[derive(Debug, thiserror::Error)]
#[error("handler panicked: {0}")]
struct Panic(String);

fn panic_message(panic: &Box<dyn std::any::Any + Send>) -> String {
    panic
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "(no message)".to_owned())
}
