//! Behaviours (middleware) around dispatch, and the idempotency guard.
//!
//! A [`Behaviour`] sees every dispatch of every queue, single- and multi-type
//! alike, and decides whether and how to call the rest of the chain.

use std::sync::Arc;
use std::time::Duration;

use crate::context::MessageContext;
use crate::error::HandlerError;
use crate::extract::Resources;
use crate::handler::{AnyMessage, IdempotencySpec};
use std::sync::atomic::{AtomicBool, Ordering};

use crate::boxed::BoxFuture;
use crate::claims::{Claim, ClaimState, ClaimsUnavailable, IdempotencyStore, MessageInProgress};
use crate::error::TransportError;
use crate::registry::Route;
use crate::retry;

/// Middleware around handler dispatch. Registered with `setup.behaviour(..)`;
/// the first registered is the outermost.
///
/// ```
/// use messaging::prelude::*;
/// use messaging::{Behaviour, Next, BoxFuture};
///
/// struct LogFailures;
///
/// impl Behaviour for LogFailures {
///     fn handle<'a>(&'a self, ctx: &'a MessageContext, next: Next<'a>) -> BoxFuture<'a, Result<(), HandlerError>> {
///         Box::pin(async move {
///             let result = next.run().await;
///             if let Err(e) = &result {
///                 eprintln!("{} failed on {}: {e}", ctx.message_id(), ctx.queue());
///             }
///             result
///         })
///     }
/// }
/// ```
pub trait Behaviour: Send + Sync + 'static {
    /// Handles one dispatch; call `next.run()` to continue the chain.
    fn handle<'a>(&'a self, ctx: &'a MessageContext, next: Next<'a>) -> BoxFuture<'a, Result<(), HandlerError>>;
}

/// The rest of the dispatch chain, handed to a [`Behaviour`].
pub struct Next<'a> {
    chain: &'a [Arc<dyn Behaviour>],
    message: AnyMessage,
    route: &'a Route,
    ctx: &'a MessageContext,
    pipeline: &'a Pipeline,
}

impl<'a> Next<'a> {
    /// Runs the remaining behaviours and the handler.
    pub fn run(self) -> BoxFuture<'a, Result<(), HandlerError>> {
        match self.chain.split_first() {
            Some((behaviour, rest)) => {
                let ctx = self.ctx;
                behaviour.handle(ctx, Next { chain: rest, ..self })
            }
            None => Box::pin(self.pipeline.invoke(self.message, self.route, self.ctx)),
        }
    }

    /// The handler's function path.
    pub fn handler_name(&self) -> &'static str {
        self.route.entry.name
    }
}

/// Everything a dispatch needs besides the message.
pub(crate) struct Pipeline {
    pub(crate) behaviours: Vec<Arc<dyn Behaviour>>,
    pub(crate) resources: Arc<Resources>,
    pub(crate) idempotency: Arc<dyn IdempotencyStore>,
}

impl Pipeline {
    /// Runs behaviours and handler for one decoded message.
    pub(crate) async fn dispatch(
        &self,
        message: AnyMessage,
        route: &Route,
        ctx: &MessageContext,
    ) -> Result<(), HandlerError> {
        if self.behaviours.is_empty() {
            return self.invoke(message, route, ctx).await;
        }
        Next { chain: &self.behaviours, message, route, ctx, pipeline: self }.run().await
    }

    async fn invoke(&self, message: AnyMessage, route: &Route, ctx: &MessageContext) -> Result<(), HandlerError> {
        match &route.entry.idempotency {
            None => within_timeout(route, route.handler.call(message, ctx.clone(), self.resources.clone())).await,
            Some(spec) => self.invoke_idempotent(spec, message, route, ctx).await,
        }
    }

    async fn invoke_idempotent(
        &self,
        spec: &IdempotencySpec,
        message: AnyMessage,
        route: &Route,
        ctx: &MessageContext,
    ) -> Result<(), HandlerError> {
        let id = ctx.message_id();
        let processor = uuid::Uuid::new_v4().to_string();
        // The claim ends no later than the message's invisibility (the
        // heartbeat extends both): a redelivery after a crash then finds it
        // expired instead of waiting on a dead process.
        let lease = spec.lease.min(ctx.visible_for()).max(Duration::from_millis(1));
        match self.idempotency.claim(id, spec.scope, &processor, lease).await {
            Err(error) => Err(HandlerError::transient(ClaimsUnavailable {
                message_id: id.to_owned(),
                scope: spec.scope.to_owned(),
                error,
            })),
            Ok(Claim::Completed) => {
                tracing::debug!(
                    message.id = id,
                    scope = spec.scope,
                    "already completed; acknowledging without running"
                );
                Ok(())
            }
            Ok(Claim::InProgress { remaining }) => Err(HandlerError::retry_after(
                MessageInProgress { message_id: id.to_owned(), scope: spec.scope.to_owned() },
                remaining,
            )),
            Ok(Claim::Claimed) => {
                let claim = Arc::new(ClaimState {
                    sql: self.idempotency.sql_claims(),
                    message_id: id.to_owned(),
                    scope: spec.scope,
                    processor: processor.clone(),
                    completed: AtomicBool::new(false),
                });
                let held = HeldClaim::new(ctx, &claim, spec.lease);
                let run = route.handler.call(message, ctx.with_claim(claim.clone()), self.resources.clone());
                let result = within_timeout(route, run).await;
                // The claim stays extended while its completion is tried.
                let settle = match &result {
                    // The handler completed it in its own transaction.
                    Ok(()) if claim.completed.load(Ordering::Acquire) => Ok(()),
                    Ok(()) => complete(&*self.idempotency, id, spec.scope, &processor, ctx).await,
                    Err(_) => self.idempotency.release(id, spec.scope, &processor).await,
                };
                drop(held);
                if let Err(e) = settle {
                    tracing::warn!(message.id = id, scope = spec.scope, "could not settle the idempotency claim: {e}");
                }
                result
            }
        }
    }
}

/// The handler's run `run`, stopped after the handler's `timeout`: its
/// future is dropped where it waits (a statement on a database gone from
/// the network, a call that never answers), and the attempt fails like any
/// other. Without one a handler that waits for good holds its message, kept
/// invisible by the heartbeat, and its lane, for good.
async fn within_timeout(
    route: &Route,
    run: crate::boxed::BoxFuture<'static, Result<(), HandlerError>>,
) -> Result<(), HandlerError> {
    let Some(limit) = route.entry.timeout else { return run.await };
    match tokio::time::timeout(limit, run).await {
        Ok(result) => result,
        Err(_) => Err(HandlerError::transient(format!(
            "the handler did not finish within its `timeout` of {} and was stopped (raise `timeout` on \
             `#[messaging::handler]` if it needs longer)",
            crate::duration::format_duration(u64::try_from(limit.as_millis()).unwrap_or(u64::MAX))
        ))),
    }
}

/// Records the claim `processor` holds completed, tried again as long as
/// [`retry::again_while_running`] says when the store refuses (its database
/// restarting): the message is acknowledged afterwards either way, but a
/// claim left open runs the handler again for any later delivery of the
/// message (a crash before the acknowledgement, a duplicate) once its lease
/// has run out. Not when the claim is no longer `processor`'s
/// ([`TransportError::StaleReceipt`]).
async fn complete(
    store: &dyn IdempotencyStore,
    id: &str,
    scope: &str,
    processor: &str,
    ctx: &MessageContext,
) -> Result<(), TransportError> {
    let again = |e: &TransportError, refused: retry::Refusal| {
        let again = !matches!(e, TransportError::StaleReceipt)
            && retry::again_while_running(refused.attempt, refused.first, || !ctx.visible_for().is_zero());
        if again && refused.attempt == 1 {
            tracing::warn!(
                message.id = id,
                scope,
                "completing the idempotency claim failed ({e}); trying again while the message stays invisible"
            );
        }
        again
    };
    retry::tried(|| store.complete(id, scope, processor), again, std::future::pending()).await
}

/// A claim the heartbeat extends while its handler runs; it stops when this
/// is dropped, also when the handler panics (the worker's `catch_unwind`
/// drops the dispatch future, and this with it).
struct HeldClaim<'a> {
    ctx: &'a MessageContext,
    claim: Arc<ClaimState>,
}

impl<'a> HeldClaim<'a> {
    fn new(ctx: &'a MessageContext, claim: &Arc<ClaimState>, cap: Duration) -> Self {
        ctx.hold_claim(claim.clone(), cap);
        HeldClaim { ctx, claim: claim.clone() }
    }
}

impl Drop for HeldClaim<'_> {
    fn drop(&mut self) {
        self.ctx.drop_claim(&self.claim);
    }
}
