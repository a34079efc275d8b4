//! The framework inside a service you already have, without
//! `#[messaging::main]`: an axum server whose `POST /orders` publishes, and
//! whose own process runs the workers. Ctrl-C (or SIGTERM) stops the server
//! first, then the workers, gracefully.
//!
//! ```text
//! cargo run --example embedded        # listens on 127.0.0.1:3000 (EMBEDDED_ADDR), sqlite://embedded.db
//! curl -d '{"sku":"SKU-1","qty":2}' 127.0.0.1:3000/orders
//! ```

use axum::extract::State as Extract;
use axum::http::StatusCode;
use axum::routing::post;
use axum::Router;
use messaging::prelude::*;

/// The orders the web requests publish.
#[messaging::queue("embedded-orders", dlq = "embedded-orders-dlq")]
struct Orders;

/// One order.
#[messaging::message(name = "embedded.order", v = 1)]
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Order {
    /// What was ordered.
    sku: String,
    /// How many.
    qty: u32,
}

#[messaging::handler(queue = Orders)]
async fn take(order: Order) {
    println!("took {} x {}", order.qty, order.sku);
}

/// `POST /orders`: the body is an order; 202 with its message id once it is
/// queued (the publisher is cheap to clone: one per request is fine).
async fn place(Extract(publisher): Extract<Publisher>, body: String) -> (StatusCode, String) {
    let order: Order = match serde_json::from_str(&body) {
        Ok(order) => order,
        Err(e) => return (StatusCode::BAD_REQUEST, format!("not an order: {e}\n")),
    };
    match publisher.send::<Orders, _>(&order).await {
        Ok(id) => (StatusCode::ACCEPTED, format!("{id}\n")),
        Err(e) => (StatusCode::SERVICE_UNAVAILABLE, format!("could not queue the order: {e}\n")),
    }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    // Logs (RUST_LOG, MESSAGING_LOG_FORMAT), traces and metrics as `run` sets them up.
    let _telemetry = messaging::telemetry::init(messaging::telemetry::TelemetryConfig::from_env());
    let url = std::env::var("MESSAGING_URL").unwrap_or_else(|_| "sqlite://embedded.db?migrate=true".to_owned());
    let transport = messaging::transport::connect(&url).await?;
    // Validates every registration of the binary and declares its queues.
    let mut app = messaging::App::new(transport).await?;
    let publisher = app.setup().publisher();
    let running = app.start()?;

    let addr = std::env::var("EMBEDDED_ADDR").unwrap_or_else(|_| "127.0.0.1:3000".to_owned());
    let listener = tokio::net::TcpListener::bind(&addr).await?;
    println!("listening on {}", listener.local_addr()?);
    let router = Router::new().route("/orders", post(place)).with_state(publisher);
    axum::serve(listener, router).with_graceful_shutdown(signal()).await?;

    // The server is down: no new publishes. Let the workers finish.
    let stopped = running.stop().await;
    println!("stopped: {} message(s) released", stopped.released);
    Ok(())
}

/// Ctrl-C or SIGTERM.
async fn signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        if let Ok(mut term) = signal(SignalKind::terminate()) {
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                _ = term.recv() => {}
            }
            return;
        }
    }
    let _ = tokio::signal::ctrl_c().await;
}
