//! The console's pages: the overview of every queue, a queue's messages by
//! status (its dead letters with bulk actions), one message, the login
//! form. Server-rendered with askama, whose templates are checked when the
//! crate compiles and escape every value they print; no JavaScript; the
//! stylesheet is compiled into the binary.

use std::collections::HashMap;
use std::sync::Arc;

use askama::Template;
use axum::body::Bytes;
use axum::extract::{OriginalUri, Path, Query, State};
use axum::http::{header, StatusCode};
use axum::response::{Html, IntoResponse, Redirect, Response};
use axum::routing::{get, post};
use axum::Router;
use serde_json::Value;

use super::api::{default_status, listing_of};
use super::mount::base;
use super::view::{Action, Filter, QueueView};
use super::{Failure, Shared};
use crate::transport::{held_past_lease, rfc3339, MessageId, MessageStatus};

/// The stylesheet, served from the binary.
const STYLESHEET: &str = include_str!("console.css");

pub(super) fn routes() -> Router<Arc<Shared>> {
    Router::new()
        .route("/", get(overview))
        .route("/queues/{queue}", get(queue))
        .route("/queues/{queue}/messages/{id}", get(message))
        .route("/ui/queues/{queue}", post(act))
        .route("/login", get(login_form).post(login))
        .route("/assets/console.css", get(stylesheet))
}

/// What every page shows around its content.
struct Frame {
    base: String,
    title: String,
    transport: &'static str,
    read_only: bool,
    /// Reload the page every this many seconds.
    refresh: Option<u32>,
    form_token: String,
}

impl Frame {
    /// The overview's address: `/` at the root, the mount point itself when
    /// nested (axum serves a nested router's `/` there, not at `/ops/`).
    fn home(&self) -> String {
        if self.base.is_empty() {
            "/".to_owned()
        } else {
            self.base.clone()
        }
    }

    fn new(shared: &Shared, uri: &OriginalUri, inner: &str, title: impl Into<String>) -> Frame {
        Frame {
            base: base(uri.0.path(), inner),
            title: title.into(),
            transport: shared.operations.transport.system(),
            read_only: shared.access.read_only,
            refresh: None,
            form_token: shared.access.form_token.clone(),
        }
    }
}

fn render(page: impl Template) -> Response {
    match page.render() {
        Ok(html) => Html(html).into_response(),
        Err(e) => {
            Failure::new(StatusCode::INTERNAL_SERVER_ERROR, format!("rendering the page failed: {e}")).into_response()
        }
    }
}

#[derive(Template)]
#[template(path = "error.html")]
struct ErrorPage {
    frame: Frame,
    status: u16,
    message: String,
}

/// A failure as a page (the pages answer in HTML, the API in JSON).
fn failed(frame: Frame, failure: Failure) -> Response {
    let status = failure.status;
    let page = ErrorPage { frame, status: status.as_u16(), message: failure.message };
    (status, render(page)).into_response()
}

/// A count for a cell: the number, or a dash where the transport cannot tell.
fn count(value: Option<u64>) -> String {
    value.map_or_else(|| "–".to_owned(), |n| n.to_string())
}

/// A duration in milliseconds, as a person reads it: `850 ms`, `12 s`, `3 min`, `5 h`, `2 d`.
fn age(ms: Option<i64>) -> String {
    let Some(ms) = ms else { return "–".to_owned() };
    match ms {
        ..=999 => format!("{ms} ms"),
        1_000..=119_999 => format!("{} s", ms / 1_000),
        120_000..=7_199_999 => format!("{} min", ms / 60_000),
        7_200_000..=172_799_999 => format!("{} h", ms / 3_600_000),
        _ => format!("{} d", ms / 86_400_000),
    }
}

fn rate(per_min: Option<f64>) -> String {
    per_min.map_or_else(|| "–".to_owned(), |r| if r >= 10.0 { format!("{r:.0}") } else { format!("{r:.1}") })
}

/// One queue's line of the overview.
struct QueueLine {
    name: String,
    kind: &'static str,
    counts: Vec<(&'static str, String)>,
    error: Option<String>,
    /// What the messages held past their lease mean, when there are any.
    expired: Option<String>,
    oldest: String,
    handled: String,
    failed: String,
    paused: bool,
}

impl QueueLine {
    fn of(view: &QueueView) -> QueueLine {
        let counts = MessageStatus::ALL
            .iter()
            .map(|&s| (s.as_str(), count(view.counts.as_ref().and_then(|c| c.of(s)))))
            .collect();
        QueueLine {
            name: view.name.to_owned(),
            kind: view.kind,
            counts,
            error: view.counts_error.clone(),
            expired: view.counts.as_ref().and_then(|c| c.expired).and_then(held_past_lease),
            oldest: age(view.oldest_age_ms),
            handled: rate(view.rates.handled_per_min),
            failed: rate(view.rates.failed_per_min),
            paused: view.paused,
        }
    }
}

#[derive(Template)]
#[template(path = "overview.html")]
struct Overview {
    frame: Frame,
    statuses: Vec<&'static str>,
    queues: Vec<QueueLine>,
}

async fn overview(State(shared): State<Arc<Shared>>, uri: OriginalUri) -> Response {
    let mut frame = Frame::new(&shared, &uri, "/", "Queues");
    frame.refresh = Some(5);
    let views = shared.operations.queue_views().await;
    let statuses = MessageStatus::ALL.iter().map(|s| s.as_str()).collect();
    render(Overview { frame, statuses, queues: views.iter().map(QueueLine::of).collect() })
}

/// One message's line of a listing.
struct MessageLine {
    id: String,
    type_name: String,
    group: String,
    attempts: String,
    reason: String,
    at: String,
    preview: String,
}

fn text(value: &Value, key: &str) -> Option<String> {
    match value.get(key)? {
        Value::Null => None,
        Value::String(s) => Some(s.clone()),
        other => Some(other.to_string()),
    }
}

impl MessageLine {
    /// A line of a listing: a message's JSON (`show`'s shape) or a dead
    /// letter's (`dlq peek`'s).
    fn of(value: &Value) -> MessageLine {
        let type_name = match (text(value, "type"), text(value, "version")) {
            (Some(t), Some(v)) => format!("{t} v{v}"),
            (Some(t), None) => t,
            _ => "–".to_owned(),
        };
        let at = value
            .get("sent_at_ms")
            .and_then(Value::as_i64)
            .map(rfc3339)
            .or_else(|| text(value, "failed_at"))
            .unwrap_or_else(|| "–".to_owned());
        let body = value.get("body").map(Value::to_string).unwrap_or_default();
        let mut preview: String = body.chars().take(120).collect();
        if body.chars().count() > 120 {
            preview.push('…');
        }
        MessageLine {
            id: text(value, "message_id").unwrap_or_default(),
            type_name,
            group: text(value, "group_id").unwrap_or_else(|| "–".to_owned()),
            attempts: attempts(value).to_string(),
            reason: text(value, "reason").unwrap_or_default(),
            at,
            preview,
        }
    }
}

/// How many attempts a message had: its count, or the last failed attempt's
/// number when that is higher (a FIFO message retried in the process is
/// received once and tried several times).
fn attempts(value: &Value) -> u64 {
    let counted = ["attempts", "receive_count"].iter().find_map(|k| value.get(*k).and_then(Value::as_u64)).unwrap_or(0);
    let last = value
        .get("history")
        .and_then(Value::as_array)
        .and_then(|h| h.last())
        .and_then(|a| a.get("attempt"))
        .and_then(Value::as_u64)
        .unwrap_or(0);
    counted.max(last)
}

/// A status tab of a queue's page.
struct Tab {
    status: &'static str,
    count: String,
    current: bool,
}

#[derive(Template)]
#[template(path = "queue.html")]
struct QueuePage {
    frame: Frame,
    queue: QueueLine,
    dead_letter_queue: String,
    pause_scope: &'static str,
    tabs: Vec<Tab>,
    status: &'static str,
    messages: Vec<MessageLine>,
    next: Option<String>,
    type_filter: String,
    identity_filter: String,
    group_filter: String,
    /// What the last action did, shown once.
    notice: Option<String>,
    can_retry: bool,
    can_delete: bool,
    can_redrive: bool,
    can_purge: bool,
    /// Whether the list can be filtered by identity (database queues).
    by_identity: bool,
}

async fn queue(
    State(shared): State<Arc<Shared>>,
    uri: OriginalUri,
    Path(name): Path<String>,
    Query(mut query): Query<HashMap<String, String>>,
) -> Response {
    let inner = format!("/queues/{name}");
    let mut frame = Frame::new(&shared, &uri, &inner, name.clone());
    let notice = query.remove("notice");
    let spec = match shared.operations.spec(&name) {
        Ok(spec) => spec,
        Err(e) => return failed(frame, e),
    };
    let listing = match listing_of(&query, default_status(&shared, spec)) {
        Ok(listing) => listing,
        Err(e) => return failed(frame, e),
    };
    // Asked together: with the database unreachable, each waits for the
    // pool (5 s), and one after the other they held the page twice as long.
    let (view, listed) = tokio::join!(shared.operations.queue_view(spec), shared.operations.list(spec, &listing));
    // A list with checkboxes is not reloaded under the operator's hand:
    // only the other tabs refresh, unless asked not to.
    let refreshing = query.get("refresh").is_none_or(|r| r != "off");
    if refreshing && listing.status != MessageStatus::Dead {
        frame.refresh = Some(10);
    }
    let caps = &view.capabilities;
    let tabs = caps
        .statuses
        .iter()
        .map(|&s| Tab {
            status: s.as_str(),
            count: count(view.counts.as_ref().and_then(|c| c.of(s))),
            current: s == listing.status,
        })
        .collect();
    let (messages, next) = match listed {
        Ok(listed) => (listed.messages.iter().map(MessageLine::of).collect(), listed.next),
        Err(e) => return failed(frame, e),
    };
    let dead = listing.status == MessageStatus::Dead;
    let page = QueuePage {
        queue: QueueLine::of(&view),
        dead_letter_queue: spec.dlq.unwrap_or("rows in status error").to_owned(),
        pause_scope: match caps.pause {
            crate::transport::PauseScope::AllProcesses => "every process",
            crate::transport::PauseScope::ThisProcess => "this process only",
        },
        tabs,
        status: listing.status.as_str(),
        messages,
        next,
        type_filter: listing.type_name.clone().unwrap_or_default(),
        identity_filter: listing.identity.clone().unwrap_or_default(),
        group_filter: listing.group.clone().unwrap_or_default(),
        notice,
        can_retry: !frame.read_only && caps.retry_now && listing.status == MessageStatus::Sleeping,
        can_delete: !frame.read_only && caps.delete && listing.status != MessageStatus::InFlight,
        can_redrive: !frame.read_only && dead && caps.dead_letters,
        can_purge: !frame.read_only && dead && caps.purge,
        by_identity: caps.identities,
        frame,
    };
    render(page)
}

/// One field of the message page.
struct Field {
    name: &'static str,
    value: String,
}

/// One failed attempt of the message page.
struct Attempt {
    number: String,
    at: String,
    error_type: String,
    message: String,
}

#[derive(Template)]
#[template(path = "message.html")]
struct MessagePage {
    frame: Frame,
    queue: String,
    id: String,
    fields: Vec<Field>,
    attributes: Vec<(String, String)>,
    history: Vec<Attempt>,
    body: String,
    deferred_body: Option<String>,
    dead: bool,
    sleeping: bool,
    can_delete: bool,
    can_redrive: bool,
    can_retry: bool,
}

async fn message(
    State(shared): State<Arc<Shared>>,
    uri: OriginalUri,
    Path((name, id)): Path<(String, String)>,
) -> Response {
    let inner = format!("/queues/{name}/messages/{id}");
    let frame = Frame::new(&shared, &uri, &inner, format!("{name}: {id}"));
    let spec = match shared.operations.spec(&name) {
        Ok(spec) => spec,
        Err(e) => return failed(frame, e),
    };
    let value = match shared.operations.message(spec, &id).await {
        Ok(value) => value,
        Err(e) => return failed(frame, e),
    };
    let status = text(&value, "status").unwrap_or_else(|| "dead_letter".to_owned());
    let mut fields = vec![Field { name: "status", value: status.clone() }];
    let shown = [
        ("type", "type"),
        ("version", "version"),
        ("identity", "identity"),
        ("group", "group_id"),
        ("attempts", "attempts"),
        ("receives", "receive_count"),
        ("reason", "reason"),
        ("failed at", "failed_at"),
    ];
    for (label, key) in shown {
        if let Some(v) = text(&value, key) {
            fields.push(Field { name: label, value: v });
        }
    }
    if value.get("suspect").and_then(Value::as_bool) == Some(true) {
        let value = "leases of it ran out before it was settled: it runs alone when next received".to_owned();
        fields.push(Field { name: "suspect", value });
    }
    let waiting = matches!(status.as_str(), "sleeping" | "pending" | "delayed" | "visible");
    for (label, key) in [("sent", "sent_at_ms"), ("due", "process_at_ms"), ("held until", "held_until_ms")] {
        if key == "process_at_ms" && !waiting {
            continue; // a due time matters only while the message waits for it
        }
        if let Some(ms) = value.get(key).and_then(Value::as_i64) {
            fields.push(Field { name: label, value: rfc3339(ms) });
        }
    }
    if let Some(deferred) = value.get("deferred").filter(|d| !d.is_null()) {
        let id = text(deferred, "message_id").unwrap_or_default();
        fields.push(Field { name: "waiting version", value: id });
    }
    let attributes = value
        .get("attributes")
        .and_then(Value::as_object)
        .map(|a| a.iter().map(|(k, v)| (k.clone(), v.as_str().unwrap_or_default().to_owned())).collect())
        .unwrap_or_default();
    let history = value
        .get("history")
        .and_then(Value::as_array)
        .map(|h| {
            h.iter()
                .map(|a| Attempt {
                    number: text(a, "attempt").unwrap_or_default(),
                    at: a.get("at_ms").and_then(Value::as_i64).map(rfc3339).unwrap_or_default(),
                    // A plain message's `_OTHER` says nothing to an operator.
                    error_type: text(a, "type").filter(|t| t != crate::error::UNTYPED).unwrap_or_default(),
                    message: text(a, "message").unwrap_or_default(),
                })
                .collect()
        })
        .unwrap_or_default();
    let pretty = |v: Option<&Value>| v.map(|b| serde_json::to_string_pretty(b).unwrap_or_default());
    let caps = shared.operations.capabilities(spec);
    let dead = status == "dead_letter";
    let page = MessagePage {
        queue: name.clone(),
        id: text(&value, "message_id").unwrap_or(id),
        fields,
        attributes,
        history,
        body: pretty(value.get("body")).unwrap_or_default(),
        deferred_body: pretty(value.get("deferred").and_then(|d| d.get("body"))),
        dead,
        sleeping: status == "sleeping" || status == "delayed",
        can_delete: !frame.read_only && caps.delete && status != "processing" && status != "in_flight",
        can_redrive: !frame.read_only && dead && caps.dead_letters,
        can_retry: !frame.read_only && caps.retry_now,
        frame,
    };
    render(page)
}

/// A form's fields: `(name, value)` pairs in order (ids repeat).
fn form(bytes: &[u8]) -> Result<Vec<(String, String)>, Failure> {
    serde_urlencoded::from_bytes(bytes).map_err(|e| Failure::bad_request(format!("the form: {e}")))
}

fn field<'a>(fields: &'a [(String, String)], name: &str) -> Option<&'a str> {
    fields.iter().find(|(k, _)| k == name).map(|(_, v)| v.as_str()).filter(|v| !v.is_empty())
}

/// An action of a page's form: carried out, then back to the queue's page
/// with what it did.
async fn act(State(shared): State<Arc<Shared>>, uri: OriginalUri, Path(name): Path<String>, bytes: Bytes) -> Response {
    let inner = format!("/ui/queues/{name}");
    let frame = Frame::new(&shared, &uri, &inner, name.clone());
    let fields = match form(&bytes) {
        Ok(fields) => fields,
        Err(e) => return failed(frame, e),
    };
    if !field(&fields, "form_token").is_some_and(|t| shared.access.is_form_token(t)) {
        let refused = Failure::new(StatusCode::FORBIDDEN, "the form is stale or from elsewhere: reload the page");
        return failed(frame, refused);
    }
    let spec = match shared.operations.spec(&name) {
        Ok(spec) => spec,
        Err(e) => return failed(frame, e),
    };
    let ids: Vec<MessageId> =
        fields.iter().filter(|(k, _)| k == "id").map(|(_, v)| MessageId::from(v.as_str())).collect();
    let filter = || Filter {
        type_name: field(&fields, "type").map(str::to_owned),
        group: field(&fields, "group").map(str::to_owned),
        older_than: None,
    };
    let action = match field(&fields, "action") {
        Some("redrive") => {
            Action::Redrive { ids: Some(ids.clone()), filter: Filter::default(), max: None, dry_run: false }
        }
        Some("redrive_all") => Action::Redrive { ids: None, filter: filter(), max: None, dry_run: false },
        Some("purge_all") => Action::Purge { filter: filter(), dry_run: false },
        Some("delete") => Action::Delete { ids: ids.clone() },
        Some("retry") => Action::RetryNow { ids: ids.clone() },
        Some("pause") => Action::Pause(true),
        Some("resume") => Action::Pause(false),
        other => {
            let unknown = Failure::bad_request(format!("`{}` is not an action of the console", other.unwrap_or("")));
            return failed(frame, unknown);
        }
    };
    // A purge asks first, with the count a dry run finds (the command line
    // asks for --yes likewise).
    if matches!(action, Action::Purge { .. }) && field(&fields, "confirm") != Some("yes") {
        let counted = shared.operations.act(spec, Action::Purge { filter: filter(), dry_run: true }).await;
        let count = match counted {
            Ok(done) => done.get("deleted").and_then(Value::as_u64).unwrap_or(0),
            Err(e) => return failed(frame, e),
        };
        let (type_filter, group_filter) =
            (field(&fields, "type").unwrap_or("").to_owned(), field(&fields, "group").unwrap_or("").to_owned());
        let filter = [("type", &type_filter), ("group", &group_filter)]
            .iter()
            .filter(|(_, v)| !v.is_empty())
            .map(|(k, v)| format!("{k} {v}"))
            .collect::<Vec<_>>()
            .join(", ");
        return render(ConfirmPage { frame, queue: name, count, filter, type_filter, group_filter });
    }
    let needs_ids =
        matches!(&action, Action::Delete { .. } | Action::RetryNow { .. } | Action::Redrive { ids: Some(_), .. });
    if needs_ids && ids.is_empty() {
        return failed(frame, Failure::bad_request("no message was selected: tick the messages to act on"));
    }
    let done = match shared.operations.act(spec, action).await {
        Ok(done) => done,
        Err(e) => return failed(frame, e),
    };
    let notice = summary(&done);
    let status = field(&fields, "status").unwrap_or("");
    let back =
        format!("{}/queues/{}?status={}&notice={}", frame.base, percent(&name), percent(status), percent(&notice));
    Redirect::to(&back).into_response()
}

#[derive(Template)]
#[template(path = "confirm.html")]
struct ConfirmPage {
    frame: Frame,
    queue: String,
    count: u64,
    filter: String,
    type_filter: String,
    group_filter: String,
}

/// What an action did, in a sentence.
fn summary(done: &Value) -> String {
    let n = |key: &str| done.get(key).and_then(Value::as_u64);
    if let Some(moved) = n("moved") {
        return format!("redrove {moved} message(s)");
    }
    if let Some(deleted) = n("deleted") {
        return format!("deleted {deleted} message(s)");
    }
    if let Some(retried) = n("retried") {
        return format!("{retried} message(s) due now");
    }
    match done.get("paused").and_then(Value::as_bool) {
        Some(true) => "paused".to_owned(),
        Some(false) => "resumed".to_owned(),
        None => "done".to_owned(),
    }
}

/// `text` for a URL's query or path.
fn percent(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for b in text.bytes() {
        match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => out.push(b as char),
            _ => out.push_str(&format!("%{b:02X}")),
        }
    }
    out
}

#[derive(Template)]
#[template(path = "login.html")]
struct LoginPage {
    frame: Frame,
    wrong: bool,
}

async fn login_form(State(shared): State<Arc<Shared>>, uri: OriginalUri) -> Response {
    let frame = Frame::new(&shared, &uri, "/login", "Sign in");
    render(LoginPage { frame, wrong: false })
}

/// Checks the token of the login form; the right one is kept in a cookie
/// that scripts cannot read and other sites' requests do not carry.
async fn login(State(shared): State<Arc<Shared>>, uri: OriginalUri, bytes: Bytes) -> Response {
    let frame = Frame::new(&shared, &uri, "/login", "Sign in");
    let fields = form(&bytes).unwrap_or_default();
    let given = field(&fields, "token").unwrap_or("");
    if !shared.access.is_token(given) {
        return (StatusCode::UNAUTHORIZED, render(LoginPage { frame, wrong: true })).into_response();
    }
    let path = if frame.base.is_empty() { "/".to_owned() } else { frame.base.clone() };
    let cookie = format!("{}={given}; Path={path}; HttpOnly; SameSite=Strict", super::access::COOKIE);
    let home = frame.home();
    ([(header::SET_COOKIE, cookie)], Redirect::to(&home)).into_response()
}

async fn stylesheet() -> Response {
    ([(header::CONTENT_TYPE, "text/css; charset=utf-8"), (header::CACHE_CONTROL, "max-age=3600")], STYLESHEET)
        .into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ages_read_as_a_person_would() {
        assert_eq!(age(Some(850)), "850 ms");
        assert_eq!(age(Some(12_000)), "12 s");
        assert_eq!(age(Some(180_000)), "3 min");
        assert_eq!(age(Some(5 * 3_600_000)), "5 h");
        assert_eq!(age(Some(3 * 86_400_000)), "3 d");
        assert_eq!(age(None), "–");
    }

    #[test]
    fn hostile_text_is_escaped_in_every_page() {
        let frame = Frame {
            base: String::new(),
            title: "<script>alert(1)</script>".into(),
            transport: "memory",
            read_only: false,
            refresh: None,
            form_token: "t".into(),
        };
        let html =
            ErrorPage { frame, status: 400, message: "\"><img src=x onerror=alert(1)>".into() }.render().unwrap();
        assert!(!html.contains("<script>alert") && !html.contains("<img src=x"), "{html}");
        assert!(html.contains("&#60;script&#62;") && html.contains("&#34;&#62;&#60;img"), "{html}");
    }
}
