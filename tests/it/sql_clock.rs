//! Two consumers of one PostgreSQL queue whose machines' clocks disagree by
//! 10 s: every message is handled once, and no consumer takes over a lease
//! the other still holds. The test binary runs itself as the consumers (the
//! ignored `clock_worker` entry point); one of them runs under libfaketime
//! with its wall clock 10 s ahead (its monotonic clock is left alone, as NTP
//! would leave it).
//!
//! SQLite has no such test: its processes share one machine and one clock.

use crate::fixtures;

use std::path::Path;
use std::process::Stdio;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use messaging::prelude::*;
use messaging::sqlx;

const MESSAGES: i64 = 12;

/// Where Debian's `libfaketime` package puts the library.
const LIBFAKETIME: &str = "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1";

#[messaging::queue("clock-jobs", concurrency = 2, visibility = "3s", max_receives = 20)]
struct ClockJobs;

#[messaging::message(name = "test.clock", v = 1)]
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Job {
    n: i64,
}

/// Slow enough that a lease taken over by the fast clock would be live.
#[messaging::handler(queue = ClockJobs)]
async fn slow(job: Job, db: State<sqlx::PgPool>) -> Result<(), HandlerError> {
    tokio::time::sleep(Duration::from_millis(1500)).await;
    sqlx::query("INSERT INTO clock_effects (n, worker) VALUES ($1, $2)")
        .bind(job.n)
        .bind(std::env::var("MESSAGING_TEST_WORKER").unwrap_or_default())
        .execute(&*db)
        .await?;
    Ok(())
}

fn wall_ms() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as i64)
}

/// A consumer process: records its wall clock, then drains `clock-jobs`.
#[test]
#[ignore = "entry point of the consumer processes started by consumers_with_skewed_clocks_handle_each_message_once"]
fn clock_worker() {
    let (Ok(url), Ok(name)) = (std::env::var("MESSAGING_TEST_URL"), std::env::var("MESSAGING_TEST_WORKER")) else {
        return;
    };
    fixtures::runtime().block_on(async move {
        let pool = sqlx::PgPool::connect(&url).await.expect("pool");
        sqlx::query(
            "INSERT INTO clock_workers (worker, wall_ms, db_ms) VALUES ($1, $2, \
                     (extract(epoch FROM clock_timestamp()) * 1000)::bigint)",
        )
        .bind(&name)
        .bind(wall_ms())
        .execute(&pool)
        .await
        .expect("record the clock");
        let transport = messaging::transport::connect(&url).await.expect("connect");
        let mut app = messaging::App::new(transport).await.expect("app");
        app.only_queues(&["clock-jobs"]);
        app.setup().provide(pool);
        app.set_receive_wait(Duration::from_secs(1));
        app.set_run_mode(messaging::RunMode::Drain);
        app.start().expect("start").wait().await;
    });
}

fn spawn_worker(url: &str, name: &str, ahead: Option<&str>) -> std::process::Child {
    let mut command = fixtures::entry_process(module_path!(), "clock_worker");
    command
        .env("MESSAGING_TEST_URL", url)
        .env("MESSAGING_TEST_WORKER", name)
        .env("RUST_LOG", "error")
        .stdout(Stdio::null());
    if let Some(offset) = ahead {
        command
            .env("LD_PRELOAD", LIBFAKETIME)
            .env("FAKETIME", offset)
            .env("FAKETIME_DONT_FAKE_MONOTONIC", "1")
            .env("FAKETIME_NO_CACHE", "1");
    }
    command.spawn().expect("spawn a consumer process")
}

async fn scalar(pool: &sqlx::PgPool, sql: &str) -> i64 {
    sqlx::query_scalar(sql).fetch_one(pool).await.expect(sql)
}

#[test]
fn consumers_with_skewed_clocks_handle_each_message_once() {
    assert!(
        Path::new(LIBFAKETIME).exists(),
        "{LIBFAKETIME} is missing: install the libfaketime package (apt-get install libfaketime)"
    );
    let runtime = fixtures::runtime();
    let db = runtime.block_on(fixtures::Postgres::new());
    let url = db.url.clone();
    let pool = runtime.block_on(async {
        let transport = messaging::transport::connect(&format!("{url}&migrate=true")).await.expect("connect");
        transport.declare(&<ClockJobs as Queue>::SPEC).await.expect("declare");
        let pool = sqlx::PgPool::connect(&url).await.expect("pool");
        sqlx::raw_sql(
            "CREATE TABLE clock_effects (n BIGINT NOT NULL, worker TEXT NOT NULL); \
             CREATE TABLE clock_workers (worker TEXT NOT NULL, wall_ms BIGINT NOT NULL, db_ms BIGINT NOT NULL)",
        )
        .execute(&pool)
        .await
        .expect("tables");
        let jobs: Vec<Job> = (0..MESSAGES).map(|n| Job { n }).collect();
        for result in Publisher::new(Arc::clone(&transport)).send_batch::<ClockJobs, _>(&jobs).await {
            result.expect("published");
        }
        pool
    });

    // The true clock leases first; the fast one starts while those leases are
    // live (it would see them as expired 7 s ago).
    let first = spawn_worker(&url, "true-clock", None);
    let deadline = Instant::now() + Duration::from_secs(90);
    let processing = "SELECT count(*) FROM messaging_messages WHERE status = 'processing'";
    while runtime.block_on(scalar(&pool, processing)) == 0 {
        assert!(Instant::now() < deadline, "the first consumer leased nothing within 90 s");
        std::thread::sleep(Duration::from_millis(10));
    }
    let mut workers = [first, spawn_worker(&url, "fast-clock", Some("+10s"))];
    for worker in &mut workers {
        let status = fixtures::wait_for(worker, Duration::from_secs(90), "a consumer");
        assert!(status.success(), "a consumer failed: {status:?}");
    }

    runtime.block_on(async {
        // The fault was there: the fast consumer's wall clock ran ~10 s ahead of the database's.
        let skew = scalar(&pool, "SELECT (wall_ms - db_ms) FROM clock_workers WHERE worker = 'fast-clock'").await;
        let normal = scalar(&pool, "SELECT (wall_ms - db_ms) FROM clock_workers WHERE worker = 'true-clock'").await;
        assert!((9_000..11_000).contains(&(skew - normal)), "the clocks differ by {} ms, not ~10 s", skew - normal);
        let handled = scalar(&pool, "SELECT count(*) FROM clock_effects").await;
        let distinct = scalar(&pool, "SELECT count(DISTINCT n) FROM clock_effects").await;
        let by_fast = scalar(&pool, "SELECT count(*) FROM clock_effects WHERE worker = 'fast-clock'").await;
        assert_eq!(distinct, MESSAGES, "every message handled");
        assert_eq!(handled, MESSAGES, "no message handled twice ({by_fast} by the fast clock)");
        assert_eq!(scalar(&pool, "SELECT count(*) FROM messaging_messages").await, 0, "queue drained");
        pool.close().await;
    });
    runtime.block_on(db.drop());
}
