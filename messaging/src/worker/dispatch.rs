//! Handling one delivery: decode, run the pipeline, settle (ack, retry with
//! backoff, or dead-letter), report.

use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::FutureExt;

use super::acker;
use super::alone::{self, GATE};
use super::inflight::Batch;
use super::Worker;
use crate::claims::{ClaimsUnavailable, MessageInProgress};
use crate::context::MessageContext;
use crate::error::{HandlerError, TransportError};
use crate::handler::RetryPolicy;
use crate::observe::{DispatchEvent, Outcome};
use crate::telemetry;
use crate::transport::{Delivery, FailedAttempt};
use tracing::Instrument as _;

/// The shortest wait before trying a message whose claim is held elsewhere
/// again (a lease that just ended may not have been seen to end yet).
const IN_PROGRESS_PAUSE: Duration = Duration::from_millis(50);

/// How long a suspect waits for the handlers running in the process to end
/// before it runs beside the ones still running (see [`alone`]). While it
/// waits, no other handler starts: this bounds that stall.
///
/// [`alone`]: super::alone
const ALONE_WAIT: Duration = Duration::from_secs(10);

/// How long a suspect waits for the acknowledgements of handled messages (of
/// every queue of the process) to reach their transports before it runs:
/// one that has not is a message the suspect's crash would bring back.
const ACKS_WAIT: Duration = Duration::from_secs(2);

/// When a suspect that could not be marked as running alone is tried again.
const ISOLATE_RETRY: Duration = Duration::from_secs(1);

/// How handling one delivery ended.
#[derive(Debug, Clone, Copy)]
pub(super) enum Step {
    /// The handler succeeded; the message is acknowledged.
    Handled,
    /// The message went to the dead-letter queue (its own failure: a FIFO
    /// chain goes on).
    DeadLettered,
    /// The message was given back to the transport to come again later: a
    /// FIFO chain stops, and gives the rest back too.
    Released,
    /// The message stays held (invisible) and is tried again in this process
    /// after `after`; `counted` says whether this was an attempt (a claim
    /// held elsewhere is not).
    Again { after: Duration, counted: bool },
}

impl Worker {
    /// Handles message `i` of `batch` once; `tries` is how many attempts it
    /// already had in this process since it was received.
    ///
    /// `clock` is when the lane's previous message ended, if it went straight
    /// on to this one: reading the clock once per message instead of twice
    /// is measurable at a million messages a second.
    pub(super) async fn process(&self, batch: &Arc<Batch>, i: usize, tries: u32, clock: &mut Option<Instant>) -> Step {
        let delivery = &batch.deliveries[i];
        let spec = self.routes.spec();
        let system = self.transport.system();
        let decoded = match self.routes.decode(&delivery.body) {
            Ok(decoded) => decoded,
            Err(e) => {
                if let Some(step) = self.leave_for_newer(batch, i, tries, &e).await {
                    return step;
                }
                let error = HandlerError::transient(e);
                self.hooks.telemetry.consumed(system, spec.name, Duration::ZERO, Some("Undecodable"));
                let step = self.failed(batch, i, tries, &error, RetryPolicy::default(), None).await;
                self.report(delivery, Outcome::Undecodable { error: error.to_string() });
                return step;
            }
        };
        let ctx = MessageContext::new(spec.name, system, batch.clone(), i, decoded.type_name, decoded.version);
        let span = telemetry::consumer_span(system, spec.name, delivery, decoded.type_name);
        if let Some(hook) = &self.hooks.enrich {
            crate::enrich::enrich(hook, &span, &ctx);
        }
        let route = decoded.route;
        // A suspect runs alone the first time this process tries it (a try
        // after a failure here already answered: it did not stop us).
        // What the handler holds while it runs: its place among the
        // handlers of the process, or the gate closed around it.
        let (_entered, alone) = if delivery.suspect && tries == 0 {
            match self.run_alone(delivery).await {
                Ok(alone) => (None, Some(alone)),
                Err(step) => return step,
            }
        } else {
            (Some(GATE.enter().await), None)
        };
        let started = clock.take().unwrap_or_else(Instant::now);
        let result = AssertUnwindSafe(self.pipeline.dispatch(decoded.message, route, &ctx))
            .catch_unwind()
            .instrument(span.clone())
            .await
            .unwrap_or_else(|panic| Err(HandlerError::transient(Panic(panic_message(&panic)))));
        // A handler that returned did not stop the process. Its place at the
        // gate (`_entered`) and a suspect's closed gate (`alone`) both live to
        // the end of this call, so that its settlement is queued or made
        // before a suspect waiting for the gate runs: dropped here, a
        // suspect on another thread could find no acknowledgement pending
        // yet, and a crash of its own brought this message back.
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
                if alone.is_some() {
                    // Acknowledged before the gate opens: a lingering ack
                    // of a suspect marked as running alone would count
                    // against it if another message stopped the process.
                    self.acker.ack_now(batch, i).await;
                } else {
                    self.acker.ack(batch, i);
                }
                self.report(delivery, Outcome::Handled);
                Step::Handled
            }
            Err(error) if error.source_error().is::<MessageInProgress>() => {
                // Another delivery holds the claim: wait for its lease to end
                // (it completes, releases, or its process died), holding the
                // message; this is not an attempt of ours.
                if alone.is_some() {
                    // A suspect marked as running alone, about to wait
                    // while other handlers run: unmarked before the gate
                    // opens, or a crash caused by any of them would count
                    // an attempt against it.
                    self.rejoin(delivery).await;
                }
                let after = error.requested_delay().unwrap_or(Duration::ZERO).max(IN_PROGRESS_PAUSE);
                span.in_scope(|| {
                    tracing::info!(queue = spec.name, message.id = %delivery.message_id, handler = route.entry.name,
                        retry_in = ?after, "{error}; trying again when its claim's lease ends");
                });
                self.report(delivery, Outcome::InProgressElsewhere { retry_in: after });
                Step::Again { after, counted: false }
            }
            Err(error) if error.source_error().is::<ClaimsUnavailable>() => {
                // The store, not the message: held and tried again, not an
                // attempt, and this queue receives nothing more meanwhile.
                if alone.is_some() {
                    self.rejoin(delivery).await;
                }
                let (after, say) = self.outage.refused(&error.to_string());
                let (queue, id) = (spec.name, &delivery.message_id);
                match say {
                    Some(lasted) if lasted.is_zero() => span.in_scope(|| {
                        tracing::warn!(queue, message.id = %id, handler = route.entry.name, retry_in = ?after,
                            "{error}; holding the message and trying again (not an attempt), and receiving nothing \
                             more on this queue until the store takes claims again");
                    }),
                    Some(lasted) => tracing::warn!(queue, message.id = %id, refused_for = ?lasted,
                        "the idempotency store has refused claims for {lasted:.0?} ({error}); this queue's messages \
                         are held and it receives nothing more until the store takes claims again"),
                    None => tracing::debug!(queue, message.id = %id, retry_in = ?after, "{error}"),
                }
                self.report(delivery, Outcome::ClaimsUnavailable { error: error.to_string(), retry_in: after });
                Step::Again { after, counted: false }
            }
            Err(error) if error.is_permanent() => {
                span.in_scope(|| {
                    tracing::warn!(queue = spec.name, message.id = %delivery.message_id, handler = route.entry.name,
                        "permanent failure, dead-lettering: {error}");
                });
                let step = self
                    .dead_letter(batch, i, failed_attempt(delivery.receive_count.saturating_add(tries), &error))
                    .await;
                self.report(delivery, Outcome::DeadLettered { error: error.to_string() });
                step
            }
            Err(error) => {
                let policy = route.entry.retry.unwrap_or_default();
                let step = span.in_scope(|| self.failed(batch, i, tries, &error, policy, Some(route.entry.name))).await;
                let outcome = match step {
                    Step::DeadLettered => Outcome::DeadLettered { error: error.to_string() },
                    _ => Outcome::Retried { error: error.to_string() },
                };
                self.report(delivery, outcome);
                step
            }
        }
    }

    /// Closes the process's gate for a suspect: waits for the handlers
    /// running to end (at most [`ALONE_WAIT`]) and for the acknowledgements
    /// of every worker's handled messages to go out, then tells the transport
    /// that it runs alone. A lost lease is given up (as a late settlement
    /// is); a transport that cannot take the mark now is asked again later,
    /// not counted as an attempt.
    async fn run_alone(&self, delivery: &Delivery) -> Result<alone::Alone, Step> {
        let queue = self.routes.spec().name;
        let alone = GATE.alone(ALONE_WAIT).await;
        acker::all_settled(tokio::time::Instant::now() + ACKS_WAIT).await;
        match self.transport.isolate(queue, &delivery.receipt).await {
            Ok(()) => {
                if alone.beside == 0 {
                    // Debug: a consumer killed twice holding a thousand
                    // messages leaves a thousand suspects, and the
                    // take-back has said so once already.
                    tracing::debug!(queue, message.id = %delivery.message_id, receive_count = delivery.receive_count,
                        "running a suspect alone: leases of this message ran out while its consumer held others \
                         too (it may have stopped those processes); if the process stops now, the attempt counts");
                } else {
                    tracing::warn!(queue, message.id = %delivery.message_id, running = alone.beside,
                        "running a suspect beside {} handler(s) that did not end within {ALONE_WAIT:?}; if the \
                         process stops now, the attempt counts against the suspect", alone.beside);
                }
                Ok(alone)
            }
            Err(TransportError::StaleReceipt) => {
                tracing::warn!(queue, message.id = %delivery.message_id,
                    "could not run a suspect alone: its lease ran out while it waited (the heartbeat could not \
                     extend it in time); the message was taken back and comes again");
                Err(Step::Released)
            }
            Err(e) => {
                static HELD: crate::throttle::Throttle = crate::throttle::Throttle::new();
                if super::says(&HELD, &e) {
                    tracing::warn!(queue, message.id = %delivery.message_id, retry_in = ?ISOLATE_RETRY,
                        "could not mark a suspect as running alone ({e}); trying again");
                }
                Err(Step::Again { after: ISOLATE_RETRY, counted: false })
            }
        }
    }

    /// Takes back a suspect's mark of running alone ([`Transport::rejoin`]).
    /// One the transport cannot take back now stays: a crash before the
    /// message is tried again would count an attempt against it.
    ///
    /// [`Transport::rejoin`]: crate::transport::Transport::rejoin
    async fn rejoin(&self, delivery: &Delivery) {
        let queue = self.routes.spec().name;
        match self.transport.rejoin(queue, &delivery.receipt).await {
            // A lost lease: the message was taken back, and comes again.
            Ok(()) | Err(TransportError::StaleReceipt) => {}
            Err(e) => tracing::warn!(queue, message.id = %delivery.message_id,
                "could not take back a suspect's mark of running alone ({e}): if the process stops before it is \
                 tried again, the attempt counts against it"),
        }
    }

    /// A transient failure of attempt `receive_count + tries`: dead-lettered
    /// (with the error as its reason) once the queue's `max_receives`
    /// attempts are spent and the queue can keep dead letters; else retried
    /// after the backoff, in this process for a FIFO message (its group
    /// waits for it either way, and a release would count a receive against
    /// every message of the group we hold), through the transport otherwise.
    fn failed<'a>(
        &'a self,
        batch: &'a Arc<Batch>,
        i: usize,
        tries: u32,
        error: &'a HandlerError,
        policy: RetryPolicy,
        handler: Option<&'static str>,
    ) -> impl std::future::Future<Output = Step> + 'a {
        let delivery = &batch.deliveries[i];
        let spec = self.routes.spec();
        let attempt = delivery.receive_count.saturating_add(tries);
        let spent = attempt >= spec.max_receives;
        let exhausted = spent && self.transport.keeps_dead_letters(spec);
        let delay = error.requested_delay().unwrap_or_else(|| policy.backoff(attempt));
        let (queue, id, max) = (spec.name, &delivery.message_id, spec.max_receives);
        let handler = handler.unwrap_or("(none: the body could not be decoded)");
        if exhausted {
            tracing::warn!(queue, message.id = %id, handler, attempt,
                "failed {attempt} of {max} attempts, dead-lettering: {error}");
        } else {
            tracing::warn!(queue, message.id = %id, handler, attempt, retry_in = ?delay,
                "failed attempt {attempt} of {max}: {error}");
        }
        async move {
            if exhausted {
                self.dead_letter(batch, i, failed_attempt(attempt, error)).await
            } else if spec.fifo && !spent {
                // Held for the next try, the failure is written down now: a
                // dead letter shows every attempt, and one whose process dies
                // in between still shows this one.
                if let Err(e) =
                    self.transport.record_failure(queue, &delivery.receipt, failed_attempt(attempt, error)).await
                {
                    tracing::warn!(queue, message.id = %id, "could not record the failed attempt in its history ({e})");
                }
                Step::Again { after: delay, counted: true }
            } else {
                // (A FIFO message past its attempts with nowhere to go is
                // given back, with its group, rather than held here for as
                // long as it fails: SQS keeps a message invisible 12 hours
                // at most.)
                self.inflight.settle(batch, i);
                self.retry(delivery, delay, failed_attempt(attempt, error)).await;
                Step::Released
            }
        }
    }

    /// Makes a settled delivery visible again after `delay`, recording `failure`.
    async fn retry(&self, delivery: &Delivery, delay: Duration, failure: FailedAttempt) {
        let queue = self.routes.spec().name;
        let scheduled = self.storing(self.transport.fail(queue, delivery.receipt.clone(), delay, failure)).await;
        retry_scheduled(queue, delivery, scheduled);
    }

    /// Makes a settled delivery visible again after `delay`.
    pub(super) async fn release(&self, delivery: &Delivery, delay: Duration) {
        let queue = self.routes.spec().name;
        let scheduled = self.storing(self.transport.nack(queue, delivery.receipt.clone(), delay)).await;
        retry_scheduled(queue, delivery, scheduled);
    }

    /// Awaits `outcome`, a settled message's outcome on its way to the
    /// transport; one that a stop cuts off (its lane stopped at the end of
    /// the grace period, as while the transport waits for a row another
    /// transaction holds) is counted among the messages that come back
    /// after their visibility, which it is in no other count.
    async fn storing<T>(&self, outcome: impl std::future::Future<Output = T>) -> T {
        struct Cut<'a>(Option<&'a std::sync::atomic::AtomicUsize>);
        impl Drop for Cut<'_> {
            fn drop(&mut self) {
                if let Some(cut) = self.0 {
                    cut.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                }
            }
        }
        let mut cut = Cut(Some(&self.outcomes_cut));
        let stored = outcome.await;
        cut.0 = None;
        stored
    }

    /// Moves message `i` of `batch` to the dead-letter queue after `failure`
    /// (its reason: the error and the receives); when that is not possible,
    /// retries it after the longest backoff (and says so).
    ///
    /// The heartbeat keeps the message invisible until the move is done: a
    /// move slower than what was left of its visibility let it be received
    /// and handled again on its way. Not while it is given back instead: an
    /// extension would cut its backoff short.
    async fn dead_letter(&self, batch: &Arc<Batch>, i: usize, failure: FailedAttempt) -> Step {
        let delivery = &batch.deliveries[i];
        batch.settle_later(i);
        let spec = self.routes.spec();
        let moved = match self.transport.dead_letters() {
            Some(dlq) => self.storing(dlq.dead_letter(spec.name, delivery, failure)).await,
            None => Err(crate::error::TransportError::Rejected("the transport has no dead letters".into())),
        };
        self.inflight.settle(batch, i);
        match moved {
            Ok(()) => Step::DeadLettered,
            // Not ours any more: released (given back with a FIFO chain's
            // rest, which must not overtake it) and nothing else to try.
            Err(TransportError::StaleReceipt) => {
                lease_lost(spec.name, delivery, "dead-letter it");
                Step::Released
            }
            Err(e) => {
                let policy = RetryPolicy::default();
                tracing::error!(queue = spec.name, message.id = %delivery.message_id,
                    "could not dead-letter the message ({e}); it is retried after the longest backoff instead");
                self.release(delivery, policy.max).await;
                Step::Released
            }
        }
    }

    pub(super) fn report(&self, delivery: &Delivery, outcome: Outcome) {
        match outcome {
            Outcome::Handled => self.counted.handled(),
            // Not attempts: the message is tried again, here or elsewhere.
            Outcome::InProgressElsewhere { .. } => {}
            Outcome::AwaitingNewer { .. } | Outcome::ClaimsUnavailable { .. } => {}
            Outcome::Retried { .. } | Outcome::DeadLettered { .. } | Outcome::Undecodable { .. } => {
                self.counted.failed()
            }
        }
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

/// Says so when the retry of `delivery` could not be scheduled (`result`,
/// of a `fail` or a `nack`).
pub(super) fn retry_scheduled(queue: &str, delivery: &Delivery, result: Result<(), TransportError>) {
    match result {
        Ok(()) => {}
        Err(TransportError::StaleReceipt) => lease_lost(queue, delivery, "schedule its retry"),
        Err(e) => tracing::warn!(queue, message.id = %delivery.message_id,
            "could not schedule the retry ({e}); the message comes back when its visibility times out"),
    }
}

/// Says that the outcome of `delivery`'s handler (`what` it was to do) came
/// after its lease was lost, so the transport refused it. A lease runs out
/// when its heartbeat cannot extend it in time (a stalled process, or a
/// database locked by another connection for longer than the visibility),
/// and the message is then taken back: received again, or dead-lettered by
/// the queue when out of attempts. Trying another settlement (the longest
/// backoff instead of a dead letter) would only be refused again.
fn lease_lost(queue: &str, delivery: &Delivery, what: &str) {
    tracing::warn!(queue, message.id = %delivery.message_id,
        "could not {what}: its lease was lost before the handler returned (it ran out and the message was taken \
         back: it is received again, or dead-lettered if out of attempts); its history lacks this attempt's error, \
         logged just before");
}

/// Attempt `attempt` failed with `error`, for the message's history.
fn failed_attempt(attempt: u32, error: &HandlerError) -> FailedAttempt {
    FailedAttempt::new(attempt, error.kind(), &error.to_string())
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
