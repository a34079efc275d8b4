//! [`MessageId`]: the transport's id of a message, cheap to clone.

use std::borrow::Borrow;
use std::fmt;
use std::ops::Deref;
use std::sync::Arc;

/// The transport's id of a message: what `send` returns and what a handler
/// sees as `ctx.message_id()`. Derefs to `str`; clones share one allocation.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct MessageId(Arc<str>);

impl MessageId {
    /// Wraps an id.
    pub fn new(id: impl Into<Arc<str>>) -> Self {
        MessageId(id.into())
    }

    /// A new random (UUID v4) id.
    pub fn random() -> Self {
        let mut buf = [0u8; uuid::fmt::Hyphenated::LENGTH];
        MessageId(Arc::from(&*uuid::Uuid::new_v4().hyphenated().encode_lower(&mut buf)))
    }

    /// The id as a string slice.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl Deref for MessageId {
    type Target = str;
    fn deref(&self) -> &str {
        &self.0
    }
}

impl AsRef<str> for MessageId {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

impl Borrow<str> for MessageId {
    fn borrow(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for MessageId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for MessageId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&*self.0, f)
    }
}

impl From<String> for MessageId {
    fn from(id: String) -> Self {
        MessageId(id.into())
    }
}

impl From<&str> for MessageId {
    fn from(id: &str) -> Self {
        MessageId(id.into())
    }
}

impl PartialEq<str> for MessageId {
    fn eq(&self, other: &str) -> bool {
        &*self.0 == other
    }
}

impl PartialEq<&str> for MessageId {
    fn eq(&self, other: &&str) -> bool {
        &*self.0 == *other
    }
}

impl serde::Serialize for MessageId {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&self.0)
    }
}
