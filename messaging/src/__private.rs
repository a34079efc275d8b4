//! Support for the code the macros generate. Not a public API: it may change
//! in any release.

use std::any::TypeId;

pub use inventory;
pub use std::time::Duration;

pub use crate::app::Setup;
pub use crate::boxed::BoxFuture;
pub use crate::cli::{run_app, run_main, SetupHook, SetupResult};
pub use crate::context::MessageContext;
pub use crate::envelope::Encoded;
pub use crate::error::HandlerError;
pub use crate::extract::{FromContext, Requirement, Resources};
pub use crate::handler::{AnyMessage, ErasedHandler, IdempotencySpec, IntoHandlerResult, RetryPolicy};
pub use crate::message::Message;
pub use crate::message::{const_name_is, const_str_eq, Flag, IdentityField, No, Yes};
pub use crate::publish::{Grouped, ScheduleGroupResolved, Ungrouped};
pub use crate::queue::{Fifo, Queue, QueueKind, QueueSpec, Standard};
pub use crate::registry::{HandlerEntry, MessageEntry, QueueEntry, ScheduleEntry, Upcast};
pub use crate::schedule::{BoxError, CatchUp, FromTick, ScheduleOutput, Tick};

/// The `TypeId` of `T`, as a `fn` pointer for registry entries.
pub fn type_id<T: 'static>() -> TypeId {
    TypeId::of::<T>()
}

/// Reads the JSON value at the start of `bytes` as `M`: the message, and
/// where the value ended (what follows is the caller's to check). One pass
/// over the data, also when it sits inside an envelope.
pub fn decode<M: Message>(bytes: &[u8]) -> Result<(AnyMessage, usize), serde_json::Error> {
    let mut values = serde_json::Deserializer::from_slice(bytes).into_iter::<M>();
    match values.next() {
        Some(Ok(message)) => Ok((Box::new(message) as AnyMessage, values.byte_offset())),
        Some(Err(e)) => Err(e),
        // Nothing but whitespace: serde's own error for it.
        None => serde_json::from_slice::<M>(bytes).map(|m| (Box::new(m) as AnyMessage, bytes.len())),
    }
}

/// Reads JSON data as `M` and writes it as it travels.
pub fn encode<M: Message>(data: &[u8]) -> Result<Encoded, serde_json::Error> {
    let given: serde_json::Value = serde_json::from_slice(data)?;
    let message = <M as serde::Deserialize>::deserialize(&given)?;
    let written = serde_json::to_value(&message)?;
    let ignored = match (&given, &written) {
        (serde_json::Value::Object(given), serde_json::Value::Object(written)) => {
            given.iter().filter(|(k, v)| !v.is_null() && !written.contains_key(*k)).map(|(k, _)| k.clone()).collect()
        }
        _ => Vec::new(),
    };
    Ok(Encoded {
        body: crate::envelope::encode(&message)?,
        group: message.group_id(),
        identity: message.message_id(),
        ignored,
    })
}

/// Encodes what a schedule function returned: the message as it travels,
/// with its group and identity; `None` when it returned none.
pub fn encode_scheduled<R: ScheduleOutput>(output: R) -> Result<Option<Encoded>, BoxError> {
    let Some(message) = output.into_message()? else { return Ok(None) };
    Ok(Some(Encoded {
        body: crate::envelope::encode(&message)?,
        group: message.group_id(),
        identity: message.message_id(),
        ignored: Vec::new(),
    }))
}

/// Converts a decoded `A` into the next version `B`.
pub fn upcast<A: Message, B: Message + From<A>>(message: AnyMessage) -> Option<AnyMessage> {
    message.downcast::<A>().ok().map(|a| Box::new(B::from(*a)) as AnyMessage)
}

/// Takes the handler's message out of the erased box.
pub fn downcast<M: Message>(message: AnyMessage) -> Result<M, HandlerError> {
    message.downcast::<M>().map(|m| *m).map_err(|_| HandlerError::permanent(WrongType(std::any::type_name::<M>())))
}

#[derive(Debug, thiserror::Error)]
#[error("internal: the decoded message is not a `{0}`")]
struct WrongType(&'static str);

/// What a `#[messaging::main]` body returns.
pub trait IntoSetupResult {
    /// Converts it.
    fn into_setup_result(self) -> SetupResult;
}

impl IntoSetupResult for () {
    fn into_setup_result(self) -> SetupResult {
        Ok(())
    }
}

impl<E: Into<Box<dyn std::error::Error + Send + Sync>>> IntoSetupResult for Result<(), E> {
    fn into_setup_result(self) -> SetupResult {
        self.map_err(Into::into)
    }
}
