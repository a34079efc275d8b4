//! Handler arguments after the message: [`FromContext`] and the extractors
//! [`MessageContext`], [`State`] and [`Publisher`].

use std::any::{Any, TypeId};

use rustc_hash::FxHashMap as HashMap;
use std::ops::Deref;
use std::sync::Arc;

use crate::context::MessageContext;
use crate::error::HandlerError;
use crate::publish::Publisher;

mod claim;

#[cfg(any(feature = "postgres", feature = "sqlite"))]
pub use claim::ClaimsConnection;
pub use claim::IdempotencyClaim;

/// What handlers can extract: the provided states and a publisher.
pub struct Resources {
    states: HashMap<TypeId, Arc<dyn Any + Send + Sync>>,
    publisher: Publisher,
}

impl std::fmt::Debug for Resources {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Resources").field("states", &self.states.len()).finish_non_exhaustive()
    }
}

impl Resources {
    pub(crate) fn new(states: HashMap<TypeId, Arc<dyn Any + Send + Sync>>, publisher: Publisher) -> Self {
        Resources { states, publisher }
    }

    /// The state of type `T`, if provided.
    pub fn state<T: Send + Sync + 'static>(&self) -> Option<Arc<T>> {
        self.states.get(&TypeId::of::<T>()).cloned().and_then(|s| s.downcast::<T>().ok())
    }

    /// The publisher.
    pub fn publisher(&self) -> &Publisher {
        &self.publisher
    }
}

/// Something a handler needs to have been set up (checked at startup).
#[derive(Debug, Clone, Copy)]
pub struct Requirement {
    /// The type required.
    pub type_id: TypeId,
    /// Its name, for error messages.
    pub type_name: &'static str,
    /// What must be true.
    pub kind: RequirementKind,
}

/// What an extractor needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum RequirementKind {
    /// A state of the type, provided with `setup.provide(..)`.
    State,
    /// The handler is declared `idempotent = ".."`.
    IdempotentHandler,
}

/// A handler argument after the message.
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot be a handler argument",
    label = "not an extractor",
    note = "after the message, a handler takes only `MessageContext`, `State<T>` (provided with `setup.provide(..)`), `Publisher` or `IdempotencyClaim`"
)]
pub trait FromContext: Sized + Send + 'static {
    /// Builds the argument for one delivery.
    fn from_context(ctx: &MessageContext, resources: &Resources) -> Result<Self, HandlerError>;

    /// What must be set up for this extractor to work, checked before anything
    /// is consumed.
    fn requirement() -> Option<Requirement> {
        None
    }
}

impl FromContext for MessageContext {
    fn from_context(ctx: &MessageContext, _: &Resources) -> Result<Self, HandlerError> {
        Ok(ctx.clone())
    }
}

impl FromContext for Publisher {
    fn from_context(_: &MessageContext, resources: &Resources) -> Result<Self, HandlerError> {
        Ok(resources.publisher.clone())
    }
}

/// Shared application state, provided once with `setup.provide(value)` and
/// handed to every handler that takes `State<T>`.
#[derive(Debug)]
pub struct State<T>(pub Arc<T>);

impl<T> Clone for State<T> {
    fn clone(&self) -> Self {
        State(self.0.clone())
    }
}

impl<T> Deref for State<T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.0
    }
}

#[derive(Debug, thiserror::Error)]
#[error("no state of type `{0}` was provided; call `setup.provide(..)` with one")]
struct MissingState(&'static str);

impl<T: Send + Sync + 'static> FromContext for State<T> {
    fn from_context(_: &MessageContext, resources: &Resources) -> Result<Self, HandlerError> {
        resources
            .state::<T>()
            .map(State)
            .ok_or_else(|| HandlerError::permanent(MissingState(std::any::type_name::<T>())))
    }

    fn requirement() -> Option<Requirement> {
        Some(Requirement {
            type_id: TypeId::of::<T>(),
            type_name: std::any::type_name::<T>(),
            kind: RequirementKind::State,
        })
    }
}
