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
    /// An id of a hyphenated UUID's length (36 bytes of UTF-8): every id
    /// made here, and the same ids read back from a database. No
    /// allocation, and no reference count to touch on clone and drop (an
    /// `Arc<str>` was a 64-byte allocation per queued message on
    /// `memory://`, and one per message published or leased on the
    /// database queues).
    Inline([u8; ID_LEN]),
    /// Any other id (SQS's, an application's).
    Shared(Arc<str>),
}

/// The length of every id made here and of an id held inline: a
/// hyphenated UUID's.
pub(crate) const ID_LEN: usize = uuid::fmt::Hyphenated::LENGTH;

impl MessageId {
    /// Wraps an id.
    pub fn new(id: impl Into<Arc<str>>) -> Self {
        MessageId(Repr::Shared(id.into()))
    }

    /// A new random (UUID v4) id.
    pub fn random() -> Self {
        let mut buf = [0u8; ID_LEN];
        uuid::Uuid::new_v4().hyphenated().encode_lower(&mut buf);
        MessageId(Repr::Inline(buf))
    }

    /// A new random id as text, as a database row stores it ([`random`]'s
    /// form, written straight into the string).
    ///
    /// [`random`]: MessageId::random
    #[cfg(any(feature = "postgres", feature = "sqlite"))]
    pub(crate) fn random_text() -> String {
        let mut buf = [0u8; ID_LEN];
        uuid::Uuid::new_v4().hyphenated().encode_lower(&mut buf).to_owned()
    }

    /// The id as a string slice.
    pub fn as_str(&self) -> &str {
        match &self.0 {
            // Always whole UTF-8 (a UUID, or a `str` of this length): the
            // check cannot fail.
            Repr::Inline(buf) => std::str::from_utf8(buf).unwrap_or_default(),
            Repr::Shared(id) => id,
        }
    }

    /// `id` inline when it has a UUID's length, else shared.
    fn of_str(id: &str) -> Option<Self> {
        let buf: [u8; ID_LEN] = id.as_bytes().try_into().ok()?;
        Some(MessageId(Repr::Inline(buf)))
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
        MessageId::of_str(&id).unwrap_or_else(|| MessageId::new(id))
    }
}

impl From<&str> for MessageId {
    fn from(id: &str) -> Self {
        MessageId::of_str(id).unwrap_or_else(|| MessageId::new(id))
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

    #[test]
    fn an_id_of_a_uuids_length_is_held_inline_whatever_its_text() {
        let read_back = MessageId::from(MessageId::random().to_string());
        assert!(matches!(read_back.0, super::Repr::Inline(_)));
        // Any 36 bytes of UTF-8, multi-byte characters included, read back whole.
        for text in ["0123456789abcdef0123456789abcdef0123", "é".repeat(18).as_str(), "x".repeat(35).as_str()] {
            let id = MessageId::from(text);
            assert_eq!(id.as_str(), text);
            assert_eq!(matches!(id.0, super::Repr::Inline(_)), text.len() == 36, "{text}");
            assert_eq!(id, MessageId::new(text));
        }
        assert_eq!(MessageId::from(String::new()).as_str(), "");
    }
}
