//! [`MessageId`]: the transport's id of a message, cheap to clone.

use std::borrow::Borrow;
use std::fmt;
use std::ops::Deref;
use std::sync::Arc;

/// The transport's id of a message: what `send` returns and what a handler
/// sees as `ctx.message_id()`. Derefs to `str`; cheap to clone (a random id
/// is held inline, any other shares one allocation).
#[derive(Clone)]
pub struct MessageId(Repr);

#[derive(Clone)]
enum Repr {
    /// A hyphenated UUID made here: no allocation, and no reference count
    /// to touch on clone and drop (an `Arc<str>` was a 64-byte allocation
    /// per queued message on `memory://`).
    Uuid([u8; uuid::fmt::Hyphenated::LENGTH]),
    /// Any other id (a database's, SQS's).
    Shared(Arc<str>),
}

impl MessageId {
    /// Wraps an id.
    pub fn new(id: impl Into<Arc<str>>) -> Self {
        MessageId(Repr::Shared(id.into()))
    }

    /// A new random (UUID v4) id.
    pub fn random() -> Self {
        let mut buf = [0u8; uuid::fmt::Hyphenated::LENGTH];
        uuid::Uuid::new_v4().hyphenated().encode_lower(&mut buf);
        MessageId(Repr::Uuid(buf))
    }

    /// The id as a string slice.
    pub fn as_str(&self) -> &str {
        match &self.0 {
            // Always ASCII (written by `encode_lower`): the check cannot fail.
            Repr::Uuid(buf) => std::str::from_utf8(buf).unwrap_or_default(),
            Repr::Shared(id) => id,
        }
    }
}

impl PartialEq for MessageId {
    fn eq(&self, other: &Self) -> bool {
        self.as_str() == other.as_str()
    }
}

impl Eq for MessageId {}

impl std::hash::Hash for MessageId {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.as_str().hash(state);
    }
}

impl PartialOrd for MessageId {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for MessageId {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.as_str().cmp(other.as_str())
    }
}

impl Deref for MessageId {
    type Target = str;
    fn deref(&self) -> &str {
        self.as_str()
    }
}

impl AsRef<str> for MessageId {
    fn as_ref(&self) -> &str {
        self.as_str()
    }
}

impl Borrow<str> for MessageId {
    fn borrow(&self) -> &str {
        self.as_str()
    }
}

impl fmt::Display for MessageId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl fmt::Debug for MessageId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self.as_str(), f)
    }
}

impl From<String> for MessageId {
    fn from(id: String) -> Self {
        MessageId::new(id)
    }
}

impl From<&str> for MessageId {
    fn from(id: &str) -> Self {
        MessageId::new(id)
    }
}

impl PartialEq<str> for MessageId {
    fn eq(&self, other: &str) -> bool {
        self.as_str() == other
    }
}

impl PartialEq<&str> for MessageId {
    fn eq(&self, other: &&str) -> bool {
        self.as_str() == *other
    }
}

impl serde::Serialize for MessageId {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::MessageId;
    use std::collections::HashSet;

    #[test]
    fn random_and_given_ids_of_the_same_text_are_the_same_id() {
        let random = MessageId::random();
        assert_eq!(random.len(), 36);
        assert!(uuid::Uuid::parse_str(&random).is_ok());
        let given = MessageId::new(random.to_string());
        assert_eq!(random, given);
        assert_eq!(random.cmp(&given), std::cmp::Ordering::Equal);
        let set: HashSet<MessageId> = [random.clone()].into();
        assert!(set.contains(&given) && set.contains(random.as_str()));
        assert_ne!(MessageId::random(), random);
        assert_eq!(format!("{random:?}"), format!("{:?}", random.as_str()));
    }
}
