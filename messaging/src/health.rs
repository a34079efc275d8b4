//! Health: probing every declared queue (the `health` command), and the HTTP
//! endpoints `/health`, `/ready` and `/metrics` of
//! [`Running::serve_http`](crate::Running::serve_http) (`run --http ADDR`).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;

use crate::error::Error;
use crate::shutdown::Shutdown;
use crate::transport::{Outbox, Transport};

/// How long one queue's probe may take before it counts as unreachable:
/// longer than a database pool's wait for a connection (5 s on PostgreSQL)
/// and the new connection tried after it to learn why (2 s), so that an
/// unreachable database is reported with its cause, not as no answer.
const PROBE_TIMEOUT: Duration = Duration::from_secs(8);

/// One queue that failed its probe.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Unreachable {
    pub(crate) queue: &'static str,
    pub(crate) error: String,
}

/// Asks the transport for each queue's depth, all at once; returns the
/// queues that failed, in `queues`' order. One after the other, an
/// unreachable database made `/health` answer after five seconds per queue
/// (two queues: 10 s), past a probe's usual timeout.
pub(crate) async fn probe(transport: &Arc<dyn Transport>, queues: &[&'static str]) -> Vec<Unreachable> {
    let probes = queues.iter().map(|&queue| async move {
        let error = match tokio::time::timeout(PROBE_TIMEOUT, transport.depth(queue)).await {
            Ok(Ok(_)) => return None,
            Ok(Err(e)) => e.to_string(),
            Err(_) => format!("no answer within {PROBE_TIMEOUT:?}"),
        };
        Some(Unreachable { queue, error })
    });
    futures_util::future::join_all(probes).await.into_iter().flatten().collect()
}

/// What is wrong with the outbox, if anything: it cannot be read, or its
/// oldest pending row is older than its `max_age` (its relays are stuck or
/// the broker has refused them for that long).
pub(crate) async fn probe_outbox(outbox: &Outbox) -> Option<String> {
    match tokio::time::timeout(PROBE_TIMEOUT, outbox.stats()).await {
        Ok(Ok(rows)) => outbox_problem(outbox, &rows),
        Ok(Err(e)) => Some(format!("the outbox cannot be read: {e}")),
        Err(_) => Some(format!("the outbox gave no answer within {PROBE_TIMEOUT:?}")),
    }
}

/// What `rows` (the outbox's stats) say is wrong: pending rows older than
/// the outbox's `max_age`.
pub(crate) fn outbox_problem(outbox: &Outbox, rows: &[crate::transport::OutboxQueue]) -> Option<String> {
    let limit = outbox.max_age.as_millis() as u64;
    let old: Vec<String> = rows
        .iter()
        .filter_map(|q| {
            let age = q.oldest_pending_ms.filter(|&age| age > limit)?;
            Some(format!("`{}` ({} pending, the oldest {} s old)", q.queue, q.pending, age / 1000))
        })
        .collect();
    (!old.is_empty()).then(|| {
        format!(
            "the outbox holds messages older than {} s for {}: are relays running, and does the transport accept them?",
            limit / 1000,
            old.join(", ")
        )
    })
}

/// Why the process is not ready: each queue whose receives fail, with the
/// last error (empty while every worker receives).
pub(crate) type Readiness = Arc<dyn Fn() -> Vec<Unreachable> + Send + Sync>;

#[derive(Clone)]
struct Endpoints {
    transport: Arc<dyn Transport>,
    queues: Arc<[&'static str]>,
    shutdown: Shutdown,
    readiness: Readiness,
    outbox: Option<Outbox>,
}

/// Binds the endpoints' address, before anything is consumed: a busy port is
/// an error while nothing has been received yet.
pub(crate) async fn bind(addr: SocketAddr) -> Result<tokio::net::TcpListener, Error> {
    tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|e| Error::Telemetry(format!("cannot listen on {addr} for /health, /ready and /metrics: {e}")))
}

/// Serves the endpoints on `listener` until `shutdown`; returns the bound address.
pub(crate) fn serve(
    listener: tokio::net::TcpListener,
    transport: Arc<dyn Transport>,
    queues: Vec<&'static str>,
    shutdown: Shutdown,
    readiness: Readiness,
    outbox: Option<Outbox>,
    extra: Router,
) -> Result<(SocketAddr, tokio::task::JoinHandle<()>), Error> {
    let bound = listener.local_addr().map_err(|e| Error::Telemetry(format!("cannot listen: {e}")))?;
    let endpoints = Endpoints { transport, queues: queues.into(), shutdown: shutdown.clone(), readiness, outbox };
    let router = Router::new()
        .route("/health", get(health))
        .route("/ready", get(ready))
        .route("/metrics", get(metrics))
        .with_state(endpoints)
        .merge(extra);
    let task = tokio::spawn(async move {
        let served = axum::serve(listener, router).with_graceful_shutdown(async move { shutdown.wait().await }).await;
        if let Err(e) = served {
            tracing::warn!("the HTTP endpoint stopped: {e}");
        }
    });
    tracing::info!(address = %bound, "serving /health, /ready and /metrics");
    Ok((bound, task))
}

fn json(status: StatusCode, body: serde_json::Value) -> Response {
    (status, [(header::CONTENT_TYPE, "application/json")], body.to_string()).into_response()
}

/// 200 when every declared queue answers (and the outbox, if any, is
/// readable and relayed in time); 503 listing what is not.
async fn health(State(endpoints): State<Endpoints>) -> Response {
    let failing = probe(&endpoints.transport, &endpoints.queues).await;
    let outbox = match &endpoints.outbox {
        Some(outbox) => probe_outbox(outbox).await,
        None => None,
    };
    if failing.is_empty() && outbox.is_none() {
        json(StatusCode::OK, serde_json::json!({ "status": "healthy", "queues": endpoints.queues.len() }))
    } else {
        let failing: Vec<_> =
            failing.iter().map(|f| serde_json::json!({ "queue": f.queue, "error": f.error })).collect();
        json(
            StatusCode::SERVICE_UNAVAILABLE,
            serde_json::json!({ "status": "unhealthy", "failing": failing, "outbox": outbox }),
        )
    }
}

/// 200 while consuming; 503 while a queue's receives fail (the database or
/// broker is gone: the failing queues with their last error), and once
/// shutdown has begun.
async fn ready(State(endpoints): State<Endpoints>) -> Response {
    if endpoints.shutdown.is_triggered() {
        return json(StatusCode::SERVICE_UNAVAILABLE, serde_json::json!({ "status": "stopping" }));
    }
    let failing = (endpoints.readiness)();
    if failing.is_empty() {
        json(StatusCode::OK, serde_json::json!({ "status": "ready" }))
    } else {
        let failing: Vec<_> =
            failing.iter().map(|f| serde_json::json!({ "queue": f.queue, "error": f.error })).collect();
        json(StatusCode::SERVICE_UNAVAILABLE, serde_json::json!({ "status": "receives failing", "failing": failing }))
    }
}

/// The Prometheus text format of every metric the process records.
async fn metrics() -> Response {
    match crate::telemetry::gather_prometheus() {
        Some(Ok(text)) => (StatusCode::OK, [(header::CONTENT_TYPE, "text/plain; version=0.0.4")], text).into_response(),
        Some(Err(e)) => (StatusCode::INTERNAL_SERVER_ERROR, format!("encoding metrics failed: {e}\n")).into_response(),
        None => (
            StatusCode::NOT_FOUND,
            "no Prometheus reader is installed: run with --http, or add messaging::telemetry::prometheus_reader() \
             to your meter provider\n",
        )
            .into_response(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::transport::stub::{Stub, STALL};

    #[tokio::test(start_paused = true)]
    async fn an_unreachable_database_is_reported_once_for_every_queue_in_one_wait() {
        let transport: Arc<dyn Transport> = Arc::new(Stub::away());
        let started = tokio::time::Instant::now();
        let failing = probe(&transport, &["a", "b", "c"]).await;
        assert_eq!(started.elapsed(), STALL, "the queues are asked at once");
        assert_eq!(failing.iter().map(|f| f.queue).collect::<Vec<_>>(), ["a", "b", "c"]);
        assert!(
            failing.iter().all(|f| f.error.contains("connection refused")),
            "the cause, not a timeout: {failing:?}"
        );
    }
}
