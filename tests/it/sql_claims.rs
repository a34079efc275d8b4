//! On database transports, idempotency claims live in the same database by
//! default, and completed claims are purged after `claims_retention`.
#![cfg(feature = "sqlite")]

use crate::fixtures;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use messaging::prelude::*;
use messaging::sqlx;

#[messaging::queue("claims-jobs")]
struct Jobs;

#[messaging::message(name = "test.claims", v = 1)]
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Job {
    n: u32,
}

#[messaging::handler(queue = Jobs, idempotent = "charge", lease = "10s")]
async fn charge(_job: Job, count: State<Arc<AtomicUsize>>) {
    count.fetch_add(1, Ordering::SeqCst);
}

async fn claims(pool: &sqlx::SqlitePool) -> (i64, i64) {
    sqlx::query_as("SELECT count(*), coalesce(sum(completed), 0) FROM messaging_idempotency")
        .fetch_one(pool)
        .await
        .expect("claims")
}

async fn run_one(url: &str) -> (sqlx::SqlitePool, messaging::Running, Arc<AtomicUsize>) {
    let transport = messaging::transport::connect(url).await.expect("connect");
    let mut app = messaging::App::new(transport.clone()).await.expect("app");
    app.only_queues(&["claims-jobs"]);
    let count = Arc::new(AtomicUsize::new(0));
    app.setup().provide(count.clone());
    let publisher = app.setup().publisher();
    let running = app.start().expect("start");
    publisher.send::<Jobs, _>(&Job { n: 1 }).await.expect("sent");
    let deadline = Instant::now() + Duration::from_secs(10);
    while count.load(Ordering::SeqCst) == 0 {
        assert!(Instant::now() < deadline, "not handled");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let pool = sqlx::SqlitePool::connect(url.split('?').next().unwrap_or(url)).await.expect("pool");
    (pool, running, count)
}

/// Waits until `claims` (claims, completed ones) is `expected`.
async fn until_claims(pool: &sqlx::SqlitePool, expected: (i64, i64), what: &str) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while claims(pool).await != expected {
        assert!(Instant::now() < deadline, "{what}: expected {expected:?}, found {:?}", claims(pool).await);
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn claims_live_in_the_database_and_are_kept_for_the_retention() {
    let file = fixtures::SqliteFile::new();
    let url = format!("{}&migrate=true&poll=50ms", file.url);
    let (pool, running, _) = run_one(&url).await;
    until_claims(&pool, (1, 1), "the completed claim is in messaging_idempotency").await;
    running.stop().await;
    // A new transport purges completed claims on its first housekeeping,
    // which comes before its first lease: by the time the second message is
    // handled, a purge has run over the first claim. It is kept (the default
    // retention is 7 days).
    let (pool, running, _) = run_one(&url).await;
    until_claims(&pool, (2, 2), "both claims are kept after a purge").await;
    running.stop().await;
}

#[tokio::test]
async fn completed_claims_are_purged_after_the_retention() {
    let file = fixtures::SqliteFile::new();
    let (pool, running, _) = run_one(&format!("{}&migrate=true&poll=50ms&claims_retention=1s", file.url)).await;
    until_claims(&pool, (1, 1), "the completed claim is in messaging_idempotency").await;
    let seen = Instant::now();
    until_claims(&pool, (0, 0), "the completed claim is purged").await;
    // Purged no earlier than the retention after it completed (it completed
    // before it was seen, by at most one poll).
    assert!(seen.elapsed() >= Duration::from_millis(800), "purged {:?} after it was seen", seen.elapsed());
    running.stop().await;
}

#[tokio::test]
async fn an_in_memory_sqlite_database_has_the_database_semantics() {
    let transport = messaging::transport::connect("sqlite::memory:?migrate=true&poll=50ms").await.expect("connect");
    messaging::App::new(transport.clone()).await.expect("declares");
    let publisher = Publisher::new(transport.clone());
    // One row per identity: the second publish updates the first.
    let first = publisher.send::<Jobs, _>(&Job { n: 1 }).id("same").await.expect("sent");
    let second = publisher.send::<Jobs, _>(&Job { n: 2 }).id("same").await.expect("sent");
    assert_ne!(first, second, "each version has its own id");
    assert_eq!(messaging::transport::Transport::depth(&*transport, "claims-jobs").await.expect("depth"), 1);
}
