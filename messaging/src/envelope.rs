//! The wire format: a versioned envelope `{"type": name, "v": n, "data": ...}`
//! for mapped messages, a bare JSON body for unmapped ones.
//!
//! Decoding never panics: every input is either an [`Incoming`] or a
//! [`DecodeError`] that says why the message is left for redelivery.

use std::fmt;

use serde::de::{self, Deserializer, IgnoredAny, MapAccess, Visitor};
use serde::Serialize;
use serde_json::value::RawValue;

use crate::message::Message;

/// Serializes a message: an envelope for mapped types, the bare JSON body otherwise.
pub fn encode<M: Message>(message: &M) -> Result<Vec<u8>, serde_json::Error> {
    match M::NAME {
        Some(name) => encode_envelope(name, M::VERSION, message),
        None => written(|out| serde_json::to_writer(out, message)),
    }
}

/// Serializes `data` in an envelope with the given name and version.
pub fn encode_envelope<T: Serialize + ?Sized>(
    name: &str,
    version: u32,
    data: &T,
) -> Result<Vec<u8>, serde_json::Error> {
    written(|out| {
        out.extend_from_slice(b"{\"type\":");
        serde_json::to_writer(&mut *out, name)?;
        out.extend_from_slice(b",\"v\":");
        // As a JSON number (itoa): `write!` went through `core::fmt`, 2 % of
        // a PostgreSQL `send_batch`'s client time in a profile.
        serde_json::to_writer(&mut *out, &version)?;
        out.extend_from_slice(b",\"data\":");
        serde_json::to_writer(&mut *out, data)?;
        out.push(b'}');
        Ok(())
    })
}

/// The largest scratch buffer a thread keeps between encodes.
const SCRATCH_KEPT: usize = 64 * 1024;

/// What `write` writes, in a vector of exactly its length. It writes into a
/// buffer the thread keeps, then copies: growing a fresh vector cost two
/// reallocations per 190-byte message and left it a quarter empty (the
/// queued message's body took 256 bytes and `Bytes` a second allocation,
/// its shared header, for not owning the whole capacity).
fn written(write: impl FnOnce(&mut Vec<u8>) -> Result<(), serde_json::Error>) -> Result<Vec<u8>, serde_json::Error> {
    thread_local! {
        static SCRATCH: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
    }
    SCRATCH.with(|scratch| {
        // A serializer that encodes while encoding (a `Serialize` impl
        // calling `encode`) finds the buffer taken and gets its own.
        let Ok(mut out) = scratch.try_borrow_mut() else {
            let mut own = Vec::new();
            return write(&mut own).map(|()| own);
        };
        out.clear();
        let result = write(&mut out).map(|()| out.to_vec());
        if out.capacity() > SCRATCH_KEPT {
            *out = Vec::new();
        }
        result
    })
}

/// A body as read off the wire, before it is matched to a handler.
#[derive(Debug)]
pub enum Incoming<'a> {
    /// A well-formed envelope.
    Envelope {
        /// The logical type name.
        name: std::borrow::Cow<'a, str>,
        /// The schema version.
        version: u32,
        /// The raw JSON of the payload.
        data: &'a RawValue,
    },
    /// A body that is not an envelope (valid JSON of any shape).
    Bare(&'a [u8]),
}

/// Why a body could not be turned into a handler's message. Each of these
/// leaves the message un-acknowledged (it is redelivered and, after the
/// queue's receive limit, dead-lettered) and is logged at WARN.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum DecodeError {
    /// The body is not JSON at all.
    #[error("body is not valid JSON: {0}")]
    NotJson(String),
    /// The body looks like an envelope (it has `type` and `v` or `data`) but is
    /// not a valid one.
    #[error("malformed envelope: {0}")]
    MalformedEnvelope(String),
    /// The envelope's version is newer than any this service knows.
    #[error("`{name}` v{version} is newer than the current v{current}; deploy the newer consumer first")]
    TooNew {
        /// The type name.
        name: String,
        /// The version on the wire.
        version: u32,
        /// The newest version this service knows.
        current: u32,
    },
    /// The envelope's version is older than the current one but no type is
    /// registered for it.
    #[error("`{name}` v{version} is not registered (known: v{known})")]
    UnknownVersion {
        /// The type name.
        name: String,
        /// The version on the wire.
        version: u32,
        /// The versions that are registered, e.g. `1-3`.
        known: String,
    },
    /// No handler on this queue takes the envelope's type.
    #[error("no handler on queue `{queue}` takes `{name}`")]
    NoHandler {
        /// The queue.
        queue: String,
        /// The type name on the wire (`<bare body>` for a body without envelope).
        name: String,
    },
    /// The payload does not fit the type it claims to be.
    #[error("payload does not fit `{type_name}`: {reason}")]
    Payload {
        /// The Rust type it was read as.
        type_name: &'static str,
        /// serde's explanation.
        reason: String,
    },
}

impl DecodeError {
    /// Whether a newer build of the consumer may read what this one cannot:
    /// a version newer than any known here, or an envelope whose type no
    /// handler here takes (a type a newer build may handle). What a rolling
    /// deploy meets while the old and new builds consume side by side.
    pub(crate) fn awaits_newer_build(&self) -> bool {
        match self {
            DecodeError::TooNew { .. } => true,
            DecodeError::NoHandler { name, .. } => name != BARE_NAME,
            _ => false,
        }
    }
}

/// What [`DecodeError::NoHandler`] names for a body without an envelope.
pub(crate) const BARE_NAME: &str = "<bare body>";

impl<'a> Incoming<'a> {
    /// Classifies a body. A JSON object with a `type` key and a `v` or `data`
    /// key is an envelope and must be a valid one; any other JSON is bare.
    pub fn parse(body: &'a [u8]) -> Result<Incoming<'a>, DecodeError> {
        let mut de = serde_json::Deserializer::from_slice(body);
        let probe = de.deserialize_any(ProbeVisitor).map_err(|e| DecodeError::NotJson(e.to_string()))?;
        de.end().map_err(|e| DecodeError::NotJson(e.to_string()))?;
        let Some(probe) = probe else { return Ok(Incoming::Bare(body)) };
        let Some(ty) = probe.ty else { return Ok(Incoming::Bare(body)) };
        if probe.v.is_none() && probe.data.is_none() {
            return Ok(Incoming::Bare(body));
        }
        let name: std::borrow::Cow<'a, str> = serde_json::from_str::<std::borrow::Cow<'a, str>>(ty.get())
            .map_err(|_| DecodeError::MalformedEnvelope(format!("`type` must be a string, found {}", ty.get())))?;
        if name.is_empty() {
            return Err(DecodeError::MalformedEnvelope("`type` is empty".into()));
        }
        let v = probe.v.ok_or_else(|| DecodeError::MalformedEnvelope(format!("`{name}` has no `v`")))?;
        let version: u32 = serde_json::from_str(v.get())
            .ok()
            .filter(|v: &u32| *v >= 1)
            .ok_or_else(|| DecodeError::MalformedEnvelope(format!("`v` must be an integer ≥ 1, found {}", v.get())))?;
        let data =
            probe.data.ok_or_else(|| DecodeError::MalformedEnvelope(format!("`{name}` v{version} has no `data`")))?;
        Ok(Incoming::Envelope { name, version, data })
    }
}

/// The head of an envelope exactly as [`encode_envelope`] writes it,
/// `{"type":"NAME","v":N,"data":`, read without a JSON parser so that the
/// data can be deserialized straight from the body in the same pass: the
/// general [`Incoming::parse`] first skips over the data to find where it
/// ends, then the data is parsed again, and that skip measured as much as
/// the decode itself (11.7 % and 10.2 % of a profile of the memory
/// benchmark at concurrency 8). Any other shape (whitespace, other key
/// order, escapes in the name, a version with a leading zero) is `None`,
/// and the general path decides.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Head<'a> {
    /// The logical type name (printable ASCII, no escapes).
    pub(crate) name: &'a str,
    /// The schema version (≥ 1).
    pub(crate) version: u32,
    /// Where the data begins in the body.
    pub(crate) data_at: usize,
}

impl<'a> Head<'a> {
    /// Reads the head of `body`, if it is in the canonical form.
    pub(crate) fn read(body: &'a [u8]) -> Option<Head<'a>> {
        let rest = body.strip_prefix(b"{\"type\":\"")?;
        let end = rest.iter().position(|&b| b == b'"')?;
        let name = &rest[..end];
        if name.is_empty() || !name.iter().all(|&b| (0x20..0x7f).contains(&b) && b != b'\\') {
            return None;
        }
        let rest = rest[end..].strip_prefix(b"\",\"v\":")?;
        let digits = rest.iter().take_while(|b| b.is_ascii_digit()).count();
        if digits == 0 || digits > 9 || rest[0] == b'0' {
            return None;
        }
        let version = std::str::from_utf8(&rest[..digits]).ok()?.parse().ok()?;
        let rest = rest[digits..].strip_prefix(b",\"data\":")?;
        let name = std::str::from_utf8(name).ok()?;
        Some(Head { name, version, data_at: body.len() - rest.len() })
    }

    /// Whether `tail`, what follows the data, closes the envelope (and
    /// nothing else follows): only then is the fast read the whole story.
    pub(crate) fn closes(tail: &[u8]) -> bool {
        tail == b"}"
    }
}

/// The three envelope keys, if the body is an object.
struct Probe<'a> {
    ty: Option<&'a RawValue>,
    v: Option<&'a RawValue>,
    data: Option<&'a RawValue>,
}

struct ProbeVisitor;

impl<'de> Visitor<'de> for ProbeVisitor {
    type Value = Option<Probe<'de>>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut probe = Probe { ty: None, v: None, data: None };
        while let Some(key) = map.next_key::<std::borrow::Cow<'de, str>>()? {
            let slot = match &*key {
                "type" => &mut probe.ty,
                "v" => &mut probe.v,
                "data" => &mut probe.data,
                _ => {
                    map.next_value::<IgnoredAny>()?;
                    continue;
                }
            };
            if slot.is_some() {
                return Err(de::Error::custom(format_args!("duplicate key `{key}`")));
            }
            *slot = Some(map.next_value::<&'de RawValue>()?);
        }
        Ok(Some(probe))
    }

    fn visit_seq<A: de::SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        while seq.next_element::<IgnoredAny>()?.is_some() {}
        Ok(None)
    }
    fn visit_bool<E>(self, _: bool) -> Result<Self::Value, E> {
        Ok(None)
    }
    fn visit_i64<E>(self, _: i64) -> Result<Self::Value, E> {
        Ok(None)
    }
    fn visit_u64<E>(self, _: u64) -> Result<Self::Value, E> {
        Ok(None)
    }
    fn visit_f64<E>(self, _: f64) -> Result<Self::Value, E> {
        Ok(None)
    }
    fn visit_str<E>(self, _: &str) -> Result<Self::Value, E> {
        Ok(None)
    }
    fn visit_unit<E>(self) -> Result<Self::Value, E> {
        Ok(None)
    }
}

/// A message written as it travels, with what it says about itself.
#[derive(Debug, Clone)]
pub struct Encoded {
    /// The body: the versioned envelope, or bare JSON for an unmapped type.
    pub body: Vec<u8>,
    /// The group id of `#[message(group = field)]`.
    pub group: Option<String>,
    /// The identity of `#[message(id = field)]`.
    pub identity: Option<String>,
    /// Top-level fields of the JSON data that the type does not write back
    /// (usually a misspelt optional field, which serde ignores).
    pub ignored: Vec<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classifies_bodies() {
        let env = br#"{"type":"orders.placed","v":2,"data":{"order_id":"A1"}}"#;
        match Incoming::parse(env) {
            Ok(Incoming::Envelope { name, version, data }) => {
                assert_eq!(&*name, "orders.placed");
                assert_eq!(version, 2);
                assert_eq!(data.get(), r#"{"order_id":"A1"}"#);
            }
            other => panic!("unexpected {other:?}"),
        }
        assert!(matches!(Incoming::parse(br#"{"order_id":"A1"}"#), Ok(Incoming::Bare(_))));
        assert!(matches!(Incoming::parse(br#"{"type":"premium","id":1}"#), Ok(Incoming::Bare(_))));
        assert!(matches!(Incoming::parse(b"[1,2]"), Ok(Incoming::Bare(_))));
        assert!(matches!(Incoming::parse(b"not json"), Err(DecodeError::NotJson(_))));
        assert!(matches!(Incoming::parse(br#"{"a":1} trailing"#), Err(DecodeError::NotJson(_))));
        for bad in [
            &br#"{"type":7,"v":1,"data":{}}"#[..],
            br#"{"type":"x","v":0,"data":{}}"#,
            br#"{"type":"x","v":"1","data":{}}"#,
            br#"{"type":"x","data":{}}"#,
            br#"{"type":"x","v":1}"#,
            br#"{"type":"","v":1,"data":{}}"#,
        ] {
            assert!(
                matches!(Incoming::parse(bad), Err(DecodeError::MalformedEnvelope(_))),
                "{}",
                String::from_utf8_lossy(bad)
            );
        }
        assert!(matches!(Incoming::parse(br#"{"type":"x","type":"y","v":1,"data":{}}"#), Err(DecodeError::NotJson(_))));
    }

    #[test]
    fn reads_the_canonical_head_and_nothing_else() {
        let body = encode_envelope("orders.placed", 12, &serde_json::json!({"a": 1})).unwrap();
        let head = Head::read(&body).unwrap();
        assert_eq!((head.name, head.version), ("orders.placed", 12));
        assert_eq!(&body[head.data_at..], br#"{"a":1}}"#);
        for other in [
            &br#"{ "type":"x","v":1,"data":{}}"#[..],
            br#"{"type":"","v":1,"data":{}}"#,
            br#"{"type":"a\"b","v":1,"data":{}}"#,
            br#"{"type":"x","v":0,"data":{}}"#,
            br#"{"type":"x","v":01,"data":{}}"#,
            br#"{"type":"x","v":1234567890,"data":{}}"#,
            br#"{"type":"x","v":1.5,"data":{}}"#,
            br#"{"type":"x","data":{},"v":1}"#,
            br#"{"type":"x","v":1,"data""#,
            b"{\"type\":\"\xc3\xa9\",\"v\":1,\"data\":{}}",
            br#"{"type":"x"#,
            b"",
        ] {
            assert_eq!(Head::read(other), None, "{}", String::from_utf8_lossy(other));
        }
        assert!(Head::closes(b"}"));
        assert!(!Head::closes(b"} ") && !Head::closes(b"}}") && !Head::closes(b""));
    }

    #[test]
    fn envelope_round_trip() {
        let body = encode_envelope("a\"b", 3, &serde_json::json!({"k": [1, 2]})).unwrap();
        match Incoming::parse(&body).unwrap() {
            Incoming::Envelope { name, version, data } => {
                assert_eq!((&*name, version), ("a\"b", 3));
                assert_eq!(data.get(), r#"{"k":[1,2]}"#);
            }
            other => panic!("unexpected {other:?}"),
        }
    }
}
