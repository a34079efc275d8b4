//! Decoding a delivery into the current version of a handler's type:
//! envelope → version → upcast chain → route.

use std::collections::HashMap;
use std::sync::Arc;

use super::{DecodeFn, HandlerEntry, MessageEntry};
use crate::envelope::{DecodeError, Head, Incoming};
use crate::handler::{AnyMessage, ErasedHandler};
use crate::queue::QueueSpec;

/// The versions of one logical name.
#[derive(Debug)]
pub(super) struct Chain {
    pub(super) current: u32,
    pub(super) versions: HashMap<u32, &'static MessageEntry>,
}

impl Chain {
    /// Decodes `data` written at `version` and upcasts it to the current
    /// version. After the payload `data` holds whitespace at most, or with
    /// `closing` exactly the envelope's closing brace.
    fn decode(&self, name: &str, version: u32, data: &[u8], closing: bool) -> Result<AnyMessage, DecodeError> {
        if version > self.current {
            return Err(DecodeError::TooNew { name: name.to_owned(), version, current: self.current });
        }
        let mut entry = self.versions.get(&version).copied().ok_or_else(|| {
            let min = self.versions.keys().min().copied().unwrap_or(self.current);
            DecodeError::UnknownVersion { name: name.to_owned(), version, known: format!("{min}-{}", self.current) }
        })?;
        let mut value = read(entry.decode, data, closing)
            .map_err(|e| DecodeError::Payload { type_name: entry.type_name, reason: e.to_string() })?;
        while let Some(up) = &entry.upcast {
            value = (up.apply)(value).ok_or_else(|| DecodeError::Payload {
                type_name: entry.type_name,
                reason: format!("internal: upcast to `{}` got a value of another type", up.target_name),
            })?;
            let next = entry.version + 1;
            entry = self.versions.get(&next).copied().ok_or_else(|| DecodeError::UnknownVersion {
                name: name.to_owned(),
                version: next,
                known: format!("up to {}", self.current),
            })?;
        }
        Ok(value)
    }
}

/// Reads `bytes` with `decode`: one JSON value, then whitespace at most or,
/// with `closing`, exactly an envelope's closing brace.
fn read(decode: DecodeFn, bytes: &[u8], closing: bool) -> Result<AnyMessage, serde_json::Error> {
    let (message, end) = decode(bytes)?;
    let tail = &bytes[end..];
    let fits = if closing { Head::closes(tail) } else { tail.iter().all(u8::is_ascii_whitespace) };
    if fits {
        Ok(message)
    } else {
        Err(serde::de::Error::custom("trailing characters after the JSON value"))
    }
}

/// One handler of a queue.
pub struct Route {
    pub(crate) entry: &'static HandlerEntry,
    pub(crate) handler: Arc<dyn ErasedHandler>,
}

impl std::fmt::Debug for Route {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Route").field("handler", &self.entry.name).finish()
    }
}

/// The handlers of one queue and how to decode for them.
#[derive(Debug)]
pub struct Routes {
    pub(super) spec: QueueSpec,
    pub(super) routes: Vec<Route>,
    pub(super) chains: Arc<HashMap<&'static str, Chain>>,
}

/// A delivery decoded for a handler.
pub struct Decoded<'r> {
    /// The decoded message, at the handler's (current) version.
    pub message: AnyMessage,
    /// The handler it goes to.
    pub route: &'r Route,
    /// The envelope's name, if it had one.
    pub type_name: Option<&'static str>,
    /// The version on the wire, if enveloped.
    pub version: Option<u32>,
}

impl Decoded<'_> {
    /// The type the route's handler takes (the type of `message`).
    pub fn message_type(&self) -> std::any::TypeId {
        (self.route.entry.message_type)()
    }
}

impl Routes {
    /// The queue.
    pub fn spec(&self) -> &QueueSpec {
        &self.spec
    }

    /// The handlers' function paths.
    pub fn handler_names(&self) -> impl Iterator<Item = &'static str> + '_ {
        self.routes.iter().map(|r| r.entry.name)
    }

    pub(crate) fn routes(&self) -> &[Route] {
        &self.routes
    }

    fn single(&self) -> Option<&Route> {
        match self.routes.as_slice() {
            [only] => Some(only),
            _ => None,
        }
    }

    /// Decodes a body for this queue's handlers.
    ///
    /// A single-type queue reads a bare body (or an envelope of a name this
    /// service does not know) as its handler's type: the legacy fallback. A
    /// multi-type queue routes by the envelope's name only.
    pub fn decode<'r>(&'r self, body: &[u8]) -> Result<Decoded<'r>, DecodeError> {
        let no_handler =
            |name: &str| DecodeError::NoHandler { queue: self.spec.name.to_owned(), name: name.to_owned() };
        if let Some(decoded) = self.decode_canonical(body) {
            return Ok(decoded);
        }
        match Incoming::parse(body)? {
            Incoming::Envelope { name, version, data } => {
                let route = self.routes.iter().find(|r| r.entry.message_name == Some(&*name));
                match (route, self.chains.get(&*name)) {
                    (Some(route), Some(chain)) => {
                        let message = chain.decode(&name, version, data.get().as_bytes(), false)?;
                        Ok(Decoded { message, route, type_name: route.entry.message_name, version: Some(version) })
                    }
                    // A name this service knows, but not handled here: no silent loss.
                    (None, Some(_)) => Err(no_handler(&name)),
                    _ => match self.single() {
                        Some(route) => self.bare(route, body),
                        None => Err(no_handler(&name)),
                    },
                }
            }
            Incoming::Bare(body) => match self.single() {
                Some(route) => self.bare(route, body),
                None => Err(no_handler(crate::envelope::BARE_NAME)),
            },
        }
    }

    /// The fast path of [`Routes::decode`]: an envelope in the form this
    /// crate writes ([`Head`]) of a name handled here, read in one pass.
    /// `None` whenever anything is unusual, failures included: the general
    /// path then reads the body again and says exactly what is wrong.
    fn decode_canonical<'r>(&'r self, body: &[u8]) -> Option<Decoded<'r>> {
        let head = Head::read(body)?;
        let route = self.routes.iter().find(|r| r.entry.message_name == Some(head.name))?;
        let chain = self.chains.get(head.name)?;
        let message = chain.decode(head.name, head.version, &body[head.data_at..], true).ok()?;
        Some(Decoded { message, route, type_name: route.entry.message_name, version: Some(head.version) })
    }

    /// Reads a whole body as the route's type (at its current version).
    fn bare<'r>(&'r self, route: &'r Route, body: &[u8]) -> Result<Decoded<'r>, DecodeError> {
        let entry = route.entry;
        let message = read(entry.decode, body, false)
            .map_err(|e| DecodeError::Payload { type_name: entry.message_type_name, reason: e.to_string() })?;
        Ok(Decoded { message, route, type_name: None, version: None })
    }
}
