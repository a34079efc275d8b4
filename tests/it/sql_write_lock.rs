//! An application holding an SQLite database's write lock for longer than
//! the queue's visibility while messages are being handled: their leases
//! run out meanwhile (no heartbeat can extend them), yet nothing took them
//! over, so once the lock is let go their acknowledgements go through and
//! each message runs once.
//!
//! Tried from outside before: with the lock held 12 s on a 10 s visibility,
//! the receive's housekeeping got the lock before the heartbeat and the
//! acknowledgements, took the leases back, and 15 messages of 600 ran twice.
//! (Before the change, this test ran every message twice: the worker had
//! leased all twelve at once.)
#![cfg(feature = "sqlite")]

use crate::fixtures;

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use messaging::prelude::*;
use messaging::sqlx::{self, Connection as _};
use messaging::transport::Outgoing;

#[messaging::queue("lite-locked", visibility = "2s", concurrency = 4)]
struct LiteLocked;

#[messaging::message(name = "test.lite_locked", v = 1)]
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Job {
    n: u32,
}

/// Each message's runs, by number.
static RUNS: Mutex<Vec<u32>> = Mutex::new(Vec::new());
/// Handlers running; they end once `HELD` is set.
static RUNNING: AtomicU32 = AtomicU32::new(0);
static HELD: AtomicBool = AtomicBool::new(false);

#[messaging::handler(queue = LiteLocked)]
async fn take(job: Job) {
    RUNNING.fetch_add(1, Ordering::SeqCst);
    while !HELD.load(Ordering::SeqCst) {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    RUNS.lock().unwrap()[job.n as usize] += 1;
}

const JOBS: u32 = 12;

async fn rows(pool: &sqlx::SqlitePool, queue: &str) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM messaging_messages WHERE queue = $1")
        .bind(queue)
        .fetch_one(pool)
        .await
        .unwrap()
}

/// Once `running` says the handlers are under way, holds the write lock
/// of `url` for over three times the visibility (and past the busy timeout,
/// so that the framework's writes give up and try again), with nothing
/// acknowledged meanwhile; `held` is set once it is taken. Then waits until every message of `queue` is acknowledged,
/// and a visibility more.
async fn hold_the_lock(url: &str, queue: &str, running: impl Fn() -> bool, held: &AtomicBool) {
    let pool = sqlx::SqlitePool::connect(url).await.expect("pool");
    let stored = rows(&pool, queue).await;
    fixtures::eventually(Duration::from_secs(20), running, || "handlers running".into()).await;
    let mut application = sqlx::SqliteConnection::connect(url).await.expect("connect");
    sqlx::query("BEGIN IMMEDIATE").execute(&mut application).await.expect("the write lock");
    held.store(true, Ordering::SeqCst);
    tokio::time::sleep(Duration::from_secs(7)).await;
    assert_eq!(rows(&pool, queue).await, stored, "nothing was acknowledged while the lock was held");
    sqlx::query("COMMIT").execute(&mut application).await.expect("let go");

    // Let go, every message is handled and acknowledged.
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let left = rows(&pool, queue).await;
        if left == 0 {
            break;
        }
        assert!(Instant::now() < deadline, "{left} messages left 20 s after the lock was let go");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // A visibility and more: nothing comes back.
    tokio::time::sleep(Duration::from_secs(3)).await;
}

#[tokio::test]
async fn sqlite_messages_whose_leases_ran_out_while_an_application_held_the_write_lock_run_once() {
    let db = fixtures::SqliteFile::new();
    *RUNS.lock().unwrap() = vec![0; JOBS as usize];
    let transport = messaging::transport::connect(&format!("{}&migrate=true", db.url)).await.expect("connect");
    let mut app = messaging::App::new(Arc::clone(&transport)).await.expect("app");
    app.only_queues(&["lite-locked"]);
    let jobs: Vec<Job> = (0..JOBS).map(|n| Job { n }).collect();
    for id in app.setup().publisher().send_batch::<LiteLocked, _>(&jobs).await {
        id.expect("published");
    }
    let running = app.start().expect("start");
    hold_the_lock(&db.url, "lite-locked", || RUNNING.load(Ordering::SeqCst) >= 4, &HELD).await;
    let stopped = running.stop().await;
    let runs = RUNS.lock().unwrap().clone();
    assert!(runs.iter().all(|&r| r == 1), "each job once: {runs:?}");
    assert_eq!(stopped.not_acknowledged, 0, "{stopped:?}");
}

/// The allowance is for leases that ran out during the stall only: a
/// consumer that dies after the database was locked for 4 s has its
/// message taken back once its 1 s lease runs out, not 4 s later.
#[tokio::test]
async fn sqlite_a_lease_that_runs_out_after_a_stall_is_taken_back_on_time() {
    let db = fixtures::SqliteFile::new();
    let transport = messaging::transport::connect(&format!("{}&migrate=true", db.url)).await.expect("connect");
    let mut spec = messaging::QueueSpec::standard("lite-after-stall");
    spec.visibility = Duration::from_secs(1);
    transport.declare(&spec).await.expect("declare");

    // The stall: a send waits 4 s (less than the busy timeout) for the
    // write lock an application holds.
    let mut application = sqlx::SqliteConnection::connect(&db.url).await.expect("connect");
    sqlx::query("BEGIN IMMEDIATE").execute(&mut application).await.expect("the write lock");
    let sending = Arc::clone(&transport);
    let send = tokio::spawn(async move {
        let message = Outgoing { body: b"{}".to_vec().into(), ..Outgoing::default() };
        sending.send("lite-after-stall", message).await
    });
    tokio::time::sleep(Duration::from_secs(4)).await;
    sqlx::query("COMMIT").execute(&mut application).await.expect("let go");
    send.await.expect("the send's task").expect("sent once let go");

    // Received by a consumer that dies holding it.
    let first = transport.receive("lite-after-stall", 1, Duration::from_secs(5)).await.expect("receive");
    assert_eq!(first.len(), 1);
    let received = Instant::now();
    let again = transport.receive("lite-after-stall", 1, Duration::from_secs(10)).await.expect("receive");
    let after = received.elapsed();
    assert_eq!(again.len(), 1, "it came back");
    assert!(
        after < Duration::from_millis(2_500),
        "it came back {after:?} after it was received, on a 1 s lease: held back by the stall before it"
    );
}
