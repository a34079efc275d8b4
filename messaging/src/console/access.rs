//! Who may use the console, and how actions are protected: the token (a
//! bearer header or the login cookie), the loopback rule, read-only mode, and
//! the checks that keep another site from acting through an operator's
//! browser (same origin, JSON content type, a form token).

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Redirect, Response};

use super::{Failure, Shared};

/// The cookie the login page sets.
pub(crate) const COOKIE: &str = "messaging_console";

/// The console's access rules.
pub(crate) struct Access {
    token: Option<String>,
    pub(crate) read_only: bool,
    loopback: bool,
    /// The token every form of the pages carries, random per process: a page
    /// of another site cannot read it, so it cannot post a form that has it.
    pub(crate) form_token: String,
}

impl Access {
    pub(crate) fn new(token: Option<String>, read_only: bool, loopback: bool) -> Access {
        Access { token, read_only, loopback, form_token: uuid::Uuid::new_v4().simple().to_string() }
    }

    /// Whether the console asks for a token (and so has a login page).
    pub(crate) fn has_token(&self) -> bool {
        self.token.is_some()
    }

    /// Whether `given` is the token (compared in constant time).
    pub(crate) fn is_token(&self, given: &str) -> bool {
        self.token.as_deref().is_some_and(|token| same(token.as_bytes(), given.as_bytes()))
    }

    /// Whether the request carries the token, as a bearer header or a cookie.
    fn authorized(&self, headers: &HeaderMap) -> bool {
        let bearer = headers
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "))
            .is_some_and(|t| self.is_token(t.trim()));
        bearer || cookie(headers, COOKIE).is_some_and(|t| self.is_token(&t))
    }

    /// Whether a form's token is this process's.
    pub(crate) fn is_form_token(&self, given: &str) -> bool {
        same(self.form_token.as_bytes(), given.as_bytes())
    }
}

/// Equal, in time that does not depend on where they differ.
fn same(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// The value of cookie `name`, if the request has it.
fn cookie(headers: &HeaderMap, name: &str) -> Option<String> {
    headers.get_all(header::COOKIE).iter().filter_map(|v| v.to_str().ok()).flat_map(|v| v.split(';')).find_map(|pair| {
        let (key, value) = pair.trim().split_once('=')?;
        (key == name).then(|| value.to_owned())
    })
}

/// Whether the request comes from a page of another origin: its `Origin`
/// names another host than the one it was sent to, or the browser says it
/// is cross-site (`Sec-Fetch-Site`).
fn cross_origin(headers: &HeaderMap) -> bool {
    let text = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
    if text("sec-fetch-site").is_some_and(|site| site == "cross-site" || site == "same-site") {
        return true;
    }
    match (text("origin"), text("host")) {
        (Some("null"), _) => true,
        (Some(origin), Some(host)) => {
            let origin_host = origin.split_once("://").map_or(origin, |(_, rest)| rest);
            origin_host != host
        }
        (Some(_), None) => true,
        (None, _) => false,
    }
}

/// Whether a path is one of the pages (not the API): those answer a missing
/// token with the login page rather than a 401.
fn is_page(path: &str) -> bool {
    !path.starts_with("/api/")
}

/// Applies the access rules to every request of the console.
pub(crate) async fn guard(State(shared): State<Arc<Shared>>, request: Request, next: Next) -> Response {
    let access = &shared.access;
    let path = request.uri().path().to_owned();
    let headers = request.headers();
    if !access.has_token() && !access.loopback {
        return Failure::new(
            StatusCode::FORBIDDEN,
            "the console listens beyond loopback and has no token: set MESSAGING_ADMIN_TOKEN (or --admin-token), \
             or listen on a loopback address",
        )
        .into_response();
    }
    let public = path == "/login" || path.starts_with("/assets/");
    if access.has_token() && !public && !access.authorized(headers) {
        if is_page(&path) && request.method() == Method::GET {
            let login = format!("{}/login", super::mount::base_of(&request));
            return Redirect::to(&login).into_response();
        }
        return Failure::new(
            StatusCode::UNAUTHORIZED,
            "this console needs its token: send `Authorization: Bearer TOKEN` (MESSAGING_ADMIN_TOKEN)",
        )
        .into_response();
    }
    if request.method() != Method::GET && request.method() != Method::HEAD {
        if cross_origin(headers) {
            return Failure::new(StatusCode::FORBIDDEN, "a request from another site may not act on the console")
                .into_response();
        }
        if access.read_only && path != "/login" {
            return Failure::new(StatusCode::FORBIDDEN, "the console is read-only (MESSAGING_ADMIN_READ_ONLY)")
                .into_response();
        }
        let json = headers
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.starts_with("application/json"));
        if !is_page(&path) && !json {
            return Failure::new(
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                "actions of the API take a JSON body: send `Content-Type: application/json`",
            )
            .into_response();
        }
    }
    next.run(request).await
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (name, value) in pairs {
            map.append(*name, value.parse().unwrap());
        }
        map
    }

    #[test]
    fn the_token_comes_as_a_bearer_header_or_the_login_cookie() {
        let access = Access::new(Some("s3cret".into()), false, false);
        assert!(access.authorized(&headers(&[("authorization", "Bearer s3cret")])));
        assert!(access.authorized(&headers(&[("cookie", "a=b; messaging_console=s3cret")])));
        assert!(!access.authorized(&headers(&[("authorization", "Bearer s3cre")])));
        assert!(!access.authorized(&headers(&[("cookie", "messaging_console=")])));
        assert!(!access.authorized(&headers(&[])));
    }

    #[test]
    fn requests_from_other_origins_are_told_apart() {
        assert!(!cross_origin(&headers(&[("host", "127.0.0.1:9090")])));
        assert!(!cross_origin(&headers(&[("host", "127.0.0.1:9090"), ("origin", "http://127.0.0.1:9090")])));
        assert!(cross_origin(&headers(&[("host", "127.0.0.1:9090"), ("origin", "http://evil.example")])));
        assert!(cross_origin(&headers(&[("host", "127.0.0.1:9090"), ("origin", "null")])));
        assert!(cross_origin(&headers(&[("host", "127.0.0.1:9090"), ("sec-fetch-site", "cross-site")])));
        assert!(!cross_origin(&headers(&[("sec-fetch-site", "same-origin")])));
    }
}
