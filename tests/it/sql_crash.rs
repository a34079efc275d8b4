//! A worker process killed with SIGKILL in the middle of a batch, then
//! restarted: nothing is lost, and the idempotent handler's side effect (a
//! row insert, committed together with the claim's completion) happens
//! exactly once per message. The test binary runs itself as the worker (the
//! ignored `crash_worker` entry point).
#![cfg(all(feature = "postgres", unix))]

use crate::fixtures;

use std::process::Stdio;
use std::sync::Arc;
use std::time::{Duration, Instant};

use messaging::prelude::*;
use messaging::sqlx;

const MESSAGES: i64 = 300;

#[messaging::queue("crash-jobs", concurrency = 4, visibility = "2s", max_receives = 20)]
struct CrashJobs;

#[messaging::message(name = "test.crash", v = 1)]
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Job {
    n: i64,
}

#[messaging::handler(queue = CrashJobs, idempotent = "effect", lease = "2s", retry(base = "100ms", max = "500ms"))]
async fn effect(job: Job, claim: IdempotencyClaim, db: State<sqlx::PgPool>) -> Result<(), HandlerError> {
    tokio::time::sleep(Duration::from_millis(5)).await;
    let mut tx = db.begin().await?;
    sqlx::query("INSERT INTO effects (n) VALUES ($1)").bind(job.n).execute(&mut *tx).await?;
    claim.complete_in(&mut tx).await?;
    tx.commit().await?;
    Ok(())
}

/// The worker process: consumes `crash-jobs` until it is drained (or killed).
#[test]
#[ignore = "entry point of the worker process started by a_killed_worker_loses_nothing_and_repeats_nothing"]
fn crash_worker() {
    let Ok(url) = std::env::var("MESSAGING_TEST_URL") else { return };
    fixtures::runtime().block_on(async move {
        let transport = messaging::transport::connect(&url).await.expect("connect");
        let mut app = messaging::App::new(transport).await.expect("app");
        app.only_queues(&["crash-jobs"]);
        app.setup().provide(sqlx::PgPool::connect(&url).await.expect("pool"));
        app.set_run_mode(messaging::RunMode::Drain);
        app.start().expect("start").wait().await;
    });
}

fn spawn_worker(url: &str) -> std::process::Child {
    fixtures::entry_process(module_path!(), "crash_worker")
        .env("MESSAGING_TEST_URL", url)
        .env("RUST_LOG", "error")
        .stdout(Stdio::null())
        .spawn()
        .expect("spawn the worker process")
}

async fn count(pool: &sqlx::PgPool, sql: &str) -> i64 {
    sqlx::query_scalar(sql).fetch_one(pool).await.expect("count")
}

#[test]
fn a_killed_worker_loses_nothing_and_repeats_nothing() {
    let runtime = fixtures::runtime();
    let db = runtime.block_on(fixtures::Postgres::new());
    let url = db.url.clone();
    let pool = runtime.block_on(async {
        let transport = messaging::transport::connect(&format!("{url}&migrate=true")).await.expect("connect");
        transport.declare(&<CrashJobs as Queue>::SPEC).await.expect("declare");
        let pool = sqlx::PgPool::connect(&url).await.expect("pool");
        sqlx::query("CREATE TABLE effects (n BIGINT NOT NULL)").execute(&pool).await.expect("effects table");
        let jobs: Vec<Job> = (0..MESSAGES).map(|n| Job { n }).collect();
        for result in Publisher::new(Arc::clone(&transport)).send_batch::<CrashJobs, _>(&jobs).await {
            result.expect("published");
        }
        pool
    });

    // First run: killed once a third of the messages are done, while it
    // holds leased messages whose idempotent handlers have claimed them and
    // not yet completed (their side effects are not committed).
    let leased = "SELECT count(*) FROM messaging_messages WHERE status = 'processing'";
    let held = "SELECT count(*) FROM messaging_idempotency WHERE processor_id IS NOT NULL AND completed_at IS NULL";
    // The kill must land while claims are held: between the look and the
    // kill the handlers may complete them all, so a kill that left none is
    // tried again on a fresh worker (at most three times).
    let mut attempt = 0;
    let (in_flight, claimed, done_at_kill) = loop {
        attempt += 1;
        let mut first = spawn_worker(&url);
        let deadline = Instant::now() + Duration::from_secs(60);
        let target = runtime.block_on(count(&pool, "SELECT count(*) FROM effects")) + MESSAGES / 3;
        loop {
            let done = runtime.block_on(count(&pool, "SELECT count(*) FROM effects"));
            if done >= target.min(MESSAGES - 1)
                && runtime.block_on(count(&pool, held)) > 0
                && runtime.block_on(count(&pool, leased)) > 0
            {
                break;
            }
            assert!(Instant::now() < deadline, "the worker made no progress: {done} side effects");
            assert!(first.try_wait().expect("poll").is_none(), "the worker exited before it was killed");
            std::thread::sleep(Duration::from_millis(10));
        }
        first.kill().expect("SIGKILL");
        first.wait().expect("reaped");
        // What the killed process held stays held until its leases run out.
        let in_flight = runtime.block_on(count(&pool, leased));
        let claimed = runtime.block_on(count(&pool, held));
        let done_at_kill = runtime.block_on(count(&pool, "SELECT count(*) FROM effects"));
        if claimed > 0 || attempt == 3 {
            break (in_flight, claimed, done_at_kill);
        }
        eprintln!("kill {attempt} landed after the handlers completed their claims; killing again");
    };
    assert!(done_at_kill < MESSAGES, "killed before the end");
    assert!(in_flight > 0, "messages were leased to the killed worker");
    assert!(claimed > 0, "handlers of the killed worker held claims they had not completed");
    eprintln!(
        "killed after {done_at_kill} of {MESSAGES} side effects, {in_flight} messages leased, {claimed} claims held"
    );

    // Second run: picks up everything, including what the killed process held.
    let status = fixtures::wait_for(&mut spawn_worker(&url), Duration::from_secs(120), "the restarted worker");
    assert!(status.success(), "the restarted worker failed: {status:?}");

    runtime.block_on(async {
        let total = count(&pool, "SELECT count(*) FROM effects").await;
        let distinct = count(&pool, "SELECT count(DISTINCT n) FROM effects").await;
        assert_eq!(distinct, MESSAGES, "nothing lost");
        assert_eq!(total, MESSAGES, "no side effect twice ({in_flight} messages were in flight at the kill)");
        let completed = count(&pool, "SELECT count(*) FROM messaging_idempotency WHERE completed").await;
        assert_eq!(completed, MESSAGES);
        assert_eq!(count(&pool, "SELECT count(*) FROM messaging_messages").await, 0, "queue drained");
        pool.close().await;
    });
    runtime.block_on(db.drop());
}
