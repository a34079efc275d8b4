//! The [`Message`] trait: a type that travels on a queue, with its stable
//! logical name and schema version.

use serde::{de::DeserializeOwned, Serialize};

/// A type-level yes/no, used by the publisher's typestate.
pub trait Flag: Send + Sync + 'static {
    /// The value of the flag.
    const VALUE: bool;
}

/// Type-level `true`.
#[derive(Debug, Clone, Copy)]
pub struct Yes;
/// Type-level `false`.
#[derive(Debug, Clone, Copy)]
pub struct No;

impl Flag for Yes {
    const VALUE: bool = true;
}
impl Flag for No {
    const VALUE: bool = false;
}

/// A message: something that is published to and consumed from queues.
///
/// Implemented by `#[messaging::message]`. With a `name` the message travels in
/// a versioned envelope `{"type": name, "v": n, "data": ...}`; without one it
/// travels as a bare JSON body (an *unmapped* type).
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not a message",
    label = "not annotated with `#[messaging::message]`",
    note = "add `#[messaging::message(name = \"...\", v = 1)]` to `{Self}` (or `#[messaging::message]` for a bare JSON body)"
)]
pub trait Message: Serialize + DeserializeOwned + Send + Sync + 'static {
    /// The stable logical name on the wire, or `None` for a bare body.
    const NAME: Option<&'static str>;
    /// The schema version (≥ 1). Always 1 for unmapped types.
    const VERSION: u32;
    /// `Yes` when the type declares `group = field`, so that publishing it to a
    /// FIFO queue needs no explicit group id.
    type HasGroup: Flag;

    /// The FIFO message group id carried by the message itself
    /// (`#[message(group = field)]`).
    fn group_id(&self) -> Option<String> {
        None
    }

    /// The message's identity (`#[message(id = field)]`): the deduplication id on
    /// FIFO queues, the row identity on database queues.
    fn message_id(&self) -> Option<String> {
        None
    }
}

/// Converts a field used as `#[message(group = ..)]` or `#[message(id = ..)]` to
/// the string the transport needs. Implemented for string-like and integer types.
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot be a message group id or identity",
    label = "`group = ..` and `id = ..` name a string or integer field, not a `{Self}`",
    note = "name a field of type `String`, `&'static str`, `Cow<str>`, an integer or an `Option` of one; or remove the option and pass the value at the call: `.group(..)` / `.dedup_id(..)`"
)]
pub trait IdentityField {
    /// The value as a string, `None` when absent or empty.
    fn identity(&self) -> Option<String>;
}

impl IdentityField for String {
    fn identity(&self) -> Option<String> {
        (!self.is_empty()).then(|| self.clone())
    }
}
impl IdentityField for &str {
    fn identity(&self) -> Option<String> {
        (!self.is_empty()).then(|| (*self).to_owned())
    }
}
impl IdentityField for std::borrow::Cow<'_, str> {
    fn identity(&self) -> Option<String> {
        (!self.is_empty()).then(|| self.to_string())
    }
}
impl<T: IdentityField> IdentityField for Option<T> {
    fn identity(&self) -> Option<String> {
        self.as_ref().and_then(IdentityField::identity)
    }
}
macro_rules! int_identity {
    ($($t:ty),*) => {$(
        impl IdentityField for $t {
            fn identity(&self) -> Option<String> {
                Some(self.to_string())
            }
        }
    )*};
}
int_identity!(u8, u16, u32, u64, u128, usize, i8, i16, i32, i64, i128, isize);

/// Compile-time string equality, used by the checks `#[messaging::message]`
/// generates for `upcast = T`.
#[doc(hidden)]
pub const fn const_str_eq(a: &str, b: &str) -> bool {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    if a.len() != b.len() {
        return false;
    }
    let mut i = 0;
    while i < a.len() {
        if a[i] != b[i] {
            return false;
        }
        i += 1;
    }
    true
}

/// Compile-time check that an optional name equals `expected`.
#[doc(hidden)]
pub const fn const_name_is(name: Option<&str>, expected: &str) -> bool {
    match name {
        Some(n) => const_str_eq(n, expected),
        None => false,
    }
}
