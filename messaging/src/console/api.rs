//! The JSON API under `/api/v1`: queues, messages, one message, actions.
//! Every answer is JSON; every error is `{"error", "status"}` with its
//! status code.

use std::collections::HashMap;
use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::{Path, Query, State};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use serde::de::DeserializeOwned;
use serde_json::{json, Value};

use super::view::{Action, Filter};
use super::{Failure, Shared};
use crate::transport::{Listing, MessageId, MessageStatus};

/// The most messages one page of a listing holds.
pub(crate) const MAX_PAGE: usize = 500;

pub(super) fn routes() -> Router<Arc<Shared>> {
    Router::new()
        .route("/api/v1", get(index))
        .route("/api/v1/queues", get(queues))
        .route("/api/v1/queues/{queue}", get(queue))
        .route("/api/v1/queues/{queue}/messages", get(messages))
        .route("/api/v1/queues/{queue}/messages/{id}", get(message))
        .route("/api/v1/queues/{queue}/{action}", post(act))
}

fn ok(value: Value) -> Response {
    ([(axum::http::header::CONTENT_TYPE, "application/json")], value.to_string()).into_response()
}

pub(super) async fn not_found() -> Failure {
    Failure::not_found("no such console page or API route; the API is under /api/v1 (GET /api/v1/queues)")
}

async fn index(State(shared): State<Arc<Shared>>) -> Response {
    let ops = &shared.operations;
    ok(json!({
        "format": 1,
        "transport": ops.transport.system(),
        "read_only": shared.access.read_only,
        "queues": ops.specs.iter().map(|s| s.name).collect::<Vec<_>>(),
    }))
}

async fn queues(State(shared): State<Arc<Shared>>) -> Response {
    ok(json!({ "queues": shared.operations.queue_views().await }))
}

async fn queue(State(shared): State<Arc<Shared>>, Path(queue): Path<String>) -> Result<Response, Failure> {
    let spec = shared.operations.spec(&queue)?;
    Ok(ok(json!(shared.operations.queue_view(spec).await)))
}

/// A listing from the query string: `status` (default `pending`, or `dead`
/// where only dead letters can be read), `after`, `limit` (1–500, default
/// 50), `type`, `identity`, `group`.
pub(crate) fn listing_of(query: &HashMap<String, String>, default: MessageStatus) -> Result<Listing, Failure> {
    for key in query.keys() {
        if !["status", "after", "limit", "type", "identity", "group", "refresh"].contains(&key.as_str()) {
            return Err(Failure::bad_request(format!(
                "unknown parameter `{key}`; a listing takes status, after, limit, type, identity, group"
            )));
        }
    }
    let status = match query.get("status").map(String::as_str) {
        None | Some("") => default,
        Some(name) => MessageStatus::parse(name).ok_or_else(|| {
            let names: Vec<&str> = MessageStatus::ALL.iter().map(|s| s.as_str()).collect();
            Failure::bad_request(format!("`{name}` is not a status; one of: {}", names.join(", ")))
        })?,
    };
    let limit = match query.get("limit") {
        None => 50,
        Some(text) => match text.parse::<usize>() {
            Ok(n @ 1..=MAX_PAGE) => n,
            _ => {
                return Err(Failure::bad_request(format!("limit must be a number from 1 to {MAX_PAGE}, not `{text}`")))
            }
        },
    };
    let given = |key: &str| query.get(key).filter(|v| !v.is_empty()).cloned();
    Ok(Listing {
        status,
        after: given("after"),
        limit,
        type_name: given("type"),
        identity: given("identity"),
        group: given("group"),
    })
}

/// The status a queue's listing shows when none is asked for: pending where
/// messages can be listed, else its dead letters.
pub(crate) fn default_status(shared: &Shared, spec: &crate::queue::QueueSpec) -> MessageStatus {
    let caps = shared.operations.capabilities(spec);
    caps.statuses.first().copied().unwrap_or(MessageStatus::Pending)
}

async fn messages(
    State(shared): State<Arc<Shared>>,
    Path(queue): Path<String>,
    Query(query): Query<HashMap<String, String>>,
) -> Result<Response, Failure> {
    let spec = shared.operations.spec(&queue)?;
    let listing = listing_of(&query, default_status(&shared, spec))?;
    let listed = shared.operations.list(spec, &listing).await?;
    Ok(ok(json!({
        "queue": spec.name,
        "status": listing.status,
        "messages": listed.messages,
        "next": listed.next,
    })))
}

async fn message(
    State(shared): State<Arc<Shared>>,
    Path((queue, id)): Path<(String, String)>,
) -> Result<Response, Failure> {
    let spec = shared.operations.spec(&queue)?;
    Ok(ok(shared.operations.message(spec, &id).await?))
}

/// A JSON body, or a 400 that says what is wrong with it. An empty body is
/// an empty object.
fn body<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, Failure> {
    let bytes: &[u8] = if bytes.iter().all(u8::is_ascii_whitespace) { b"{}" } else { bytes };
    serde_json::from_slice(bytes).map_err(|e| Failure::bad_request(format!("the request body: {e}")))
}

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct Ids {
    ids: Vec<String>,
}

/// The body of a bulk action on dead letters: `ids`, or a filter (`type`,
/// `group`, `older_than`) with `max` (redrive only) and `dry_run`.
#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct Bulk {
    #[serde(default)]
    ids: Option<Vec<String>>,
    #[serde(rename = "type", default)]
    type_name: Option<String>,
    #[serde(default)]
    group: Option<String>,
    #[serde(default)]
    older_than: Option<String>,
    #[serde(default)]
    max: Option<usize>,
    #[serde(default)]
    dry_run: bool,
}

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct Nothing {}

fn ids(given: Vec<String>) -> Result<Vec<MessageId>, Failure> {
    if given.is_empty() {
        return Err(Failure::bad_request("`ids` is empty: name at least one message id"));
    }
    Ok(given.into_iter().map(MessageId::from).collect())
}

/// An action from its name in the path and its JSON body.
pub(crate) fn action_of(name: &str, bytes: &[u8]) -> Result<Action, Failure> {
    Ok(match name {
        "retry" => Action::RetryNow { ids: ids(body::<Ids>(bytes)?.ids)? },
        "delete" => Action::Delete { ids: ids(body::<Ids>(bytes)?.ids)? },
        "redrive" => {
            let Bulk { ids: given, type_name, group, older_than, max, dry_run } = body(bytes)?;
            let filter = Filter { type_name, group, older_than };
            Action::Redrive { ids: given.map(ids).transpose()?, filter, max, dry_run }
        }
        "purge" => {
            let Bulk { ids: given, type_name, group, older_than, max, dry_run } = body(bytes)?;
            if given.is_some() || max.is_some() {
                return Err(Failure::bad_request(
                    "a purge takes a filter (type, group, older_than) and dry_run; delete takes ids",
                ));
            }
            Action::Purge { filter: Filter { type_name, group, older_than }, dry_run }
        }
        "pause" | "resume" => {
            body::<Nothing>(bytes)?;
            Action::Pause(name == "pause")
        }
        other => {
            return Err(Failure::not_found(format!(
                "`{other}` is not an action; one of: redrive, delete, purge, retry, pause, resume"
            )))
        }
    })
}

async fn act(
    State(shared): State<Arc<Shared>>,
    Path((queue, name)): Path<(String, String)>,
    bytes: Bytes,
) -> Result<Response, Failure> {
    let spec = shared.operations.spec(&queue)?;
    let action = action_of(&name, &bytes)?;
    tracing::info!(queue = spec.name, action = name, "console action");
    Ok(ok(shared.operations.act(spec, action).await?))
}
