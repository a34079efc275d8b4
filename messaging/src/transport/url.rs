//! Choosing a backend from a URL (`--transport` / `MESSAGING_URL`).

use std::sync::Arc;

use super::{memory::MemoryTransport, Transport};
use crate::error::Error;

/// The transport used when none is configured.
pub const DEFAULT_URL: &str = "memory://";

/// Opens the backend a URL names. Known schemes: `memory://`.
pub fn connect(url: &str) -> Result<Arc<dyn Transport>, Error> {
    let (scheme, _rest) = url
        .split_once("://")
        .ok_or_else(|| Error::Config { url: url.to_owned(), reason: "expected SCHEME://..., e.g. memory://".into() })?;
    match scheme {
        "memory" => Ok(Arc::new(MemoryTransport::new())),
        "sqlite" | "postgres" | "postgresql" | "sqs" => Err(Error::Config {
            url: url.to_owned(),
            reason: format!("the `{scheme}` transport is not available in this build yet; use memory://"),
        }),
        other => {
            Err(Error::Config { url: url.to_owned(), reason: format!("unknown scheme `{other}`; known: memory://") })
        }
    }
}
