//! The operator's console (feature `console`): a JSON API under `/api/v1`
//! and server-rendered pages at `/`, over every declared queue of an app, on
//! every transport. `run --http ADDR` serves it beside `/health`; `app
//! console [--http ADDR]` serves it without consuming; [`Console::router`]
//! mounts it in an axum service of your own.
//!
//! ```no_run
//! # async fn demo(running: &messaging::Running) {
//! let console = messaging::console::Console::of_running(running)
//!     .token(std::env::var("MESSAGING_ADMIN_TOKEN").ok())
//!     .read_only(false);
//! let app = axum::Router::new().nest("/ops", console.router());
//! # let _ = app;
//! # }
//! ```
//!
//! Access: with a token set, every request needs it (`Authorization:
//! Bearer TOKEN`, or the cookie the login page sets). Without one, the console
//! answers only when it was told that it listens on loopback
//! ([`Console::listening_on`]); otherwise every request is refused with 403
//! and a message naming the fix. Actions are POSTs: the API's need
//! `Content-Type: application/json`, the pages' forms a per-process token,
//! and both refuse a request from another origin. In read-only mode every
//! action is refused (403) and the pages show none.

mod access;
mod api;
mod mount;
mod pages;
mod view;

use std::net::SocketAddr;
use std::sync::Arc;

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Router;

use crate::app::{App, Operations, Running};

/// The console of one app: build it, then mount its [`Console::router`].
#[derive(Clone)]
pub struct Console {
    operations: Operations,
    token: Option<String>,
    read_only: bool,
    loopback: bool,
}

impl std::fmt::Debug for Console {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Console")
            .field("queues", &self.operations.specs.len())
            .field("token", &self.token.as_ref().map(|_| "(set)"))
            .field("read_only", &self.read_only)
            .field("loopback", &self.loopback)
            .finish()
    }
}

impl Console {
    /// The console of an assembled app that is not consuming (what `app
    /// console` serves). Pausing a queue on a transport without a shared
    /// pause flag (SQS, `memory://`) then pauses nobody: the API says so.
    pub fn of_app(app: &App) -> Console {
        Console::on(app.operations())
    }

    /// The console of a running app: its workers honour pauses and its
    /// counters give the handled and failed rates.
    pub fn of_running(running: &Running) -> Console {
        Console::on(running.operations())
    }

    fn on(operations: Operations) -> Console {
        Console { operations, token: None, read_only: false, loopback: false }
    }

    /// Requires this token of every request (none: see [`Console::listening_on`]).
    /// An empty token counts as none.
    pub fn token(mut self, token: Option<String>) -> Console {
        self.token = token.filter(|t| !t.is_empty());
        self
    }

    /// Refuses every action (403); the pages show none.
    pub fn read_only(mut self, read_only: bool) -> Console {
        self.read_only = read_only;
        self
    }

    /// Says where the console listens: on a loopback address it answers
    /// without a token; beyond loopback (and by default, when this is not
    /// called) every request needs the token.
    pub fn listening_on(mut self, addr: SocketAddr) -> Console {
        self.loopback = addr.ip().is_loopback();
        self
    }

    /// Whether this console refuses every request for want of a token: it
    /// has none and does not listen on loopback.
    pub fn locked(&self) -> bool {
        self.token.is_none() && !self.loopback
    }

    /// The console's routes: `/api/v1/…`, the pages at `/` and their assets.
    pub fn router(&self) -> Router {
        let shared = Arc::new(Shared {
            operations: self.operations.clone(),
            access: access::Access::new(self.token.clone(), self.read_only, self.loopback),
        });
        Router::new()
            .merge(api::routes())
            .merge(pages::routes())
            .fallback(api::not_found)
            .layer(axum::middleware::from_fn_with_state(shared.clone(), access::guard))
            .with_state(shared)
    }
}

/// What every handler of the console shares.
pub(crate) struct Shared {
    pub(crate) operations: Operations,
    pub(crate) access: access::Access,
}

/// A failed request: a status and a message, as JSON (`{"error", "status"}`)
/// from the API and as a page from the pages.
#[derive(Debug, Clone)]
pub(crate) struct Failure {
    pub(crate) status: StatusCode,
    pub(crate) message: String,
}

impl Failure {
    pub(crate) fn new(status: StatusCode, message: impl Into<String>) -> Failure {
        Failure { status, message: message.into() }
    }

    pub(crate) fn bad_request(message: impl Into<String>) -> Failure {
        Failure::new(StatusCode::BAD_REQUEST, message)
    }

    pub(crate) fn not_found(message: impl Into<String>) -> Failure {
        Failure::new(StatusCode::NOT_FOUND, message)
    }

    /// The transport cannot do this.
    pub(crate) fn unsupported(message: impl Into<String>) -> Failure {
        Failure::new(StatusCode::NOT_IMPLEMENTED, message)
    }
}

impl From<crate::error::TransportError> for Failure {
    fn from(e: crate::error::TransportError) -> Failure {
        use crate::error::TransportError as E;
        let status = match &e {
            E::QueueNotFound(_) => StatusCode::NOT_FOUND,
            E::Rejected(_) => StatusCode::BAD_REQUEST,
            E::Unsupported(_) => StatusCode::NOT_IMPLEMENTED,
            _ => StatusCode::BAD_GATEWAY,
        };
        Failure::new(status, e.to_string())
    }
}

impl IntoResponse for Failure {
    fn into_response(self) -> Response {
        let body = serde_json::json!({ "error": self.message, "status": self.status.as_u16() });
        (self.status, [(axum::http::header::CONTENT_TYPE, "application/json")], body.to_string()).into_response()
    }
}
