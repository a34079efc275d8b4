//! Several processes on one PostgreSQL queue: every message is handled, none
//! twice. The test binary runs itself as the worker processes (the ignored
//! `worker_process` entry point, started with `--ignored`).
#![cfg(feature = "postgres")]

use crate::fixtures;

use std::process::Stdio;
use std::sync::Arc;
use std::time::{Duration, Instant};

use messaging::prelude::*;

const MESSAGES: usize = 10_000;

#[messaging::queue("shared-jobs", concurrency = 4, visibility = "30s")]
struct SharedJobs;

#[messaging::message(name = "test.shared", v = 1)]
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Job {
    n: usize,
}

/// Where a worker records what it handled.
struct Sink {
    pool: sqlx::PgPool,
    worker: String,
}

#[messaging::handler(queue = SharedJobs)]
async fn record(job: Job, ctx: MessageContext, sink: State<Sink>) -> Result<(), HandlerError> {
    sqlx::query("INSERT INTO handled (n, message_id, worker) VALUES ($1, $2, $3)")
        .bind(job.n as i64)
        .bind(ctx.message_id())
        .bind(&sink.worker)
        .execute(&sink.pool)
        .await?;
    Ok(())
}

/// One worker process: consumes `shared-jobs` until it is drained.
#[test]
#[ignore = "entry point of the worker processes started by two_processes_share_a_queue"]
fn worker_process() {
    let Ok(url) = std::env::var("MESSAGING_TEST_URL") else { return };
    let worker = std::env::var("MESSAGING_TEST_WORKER").unwrap_or_default();
    fixtures::runtime().block_on(async move {
        let transport = messaging::transport::connect(&url).await.expect("connect");
        let mut app = messaging::App::new(transport).await.expect("app");
        app.only_queues(&["shared-jobs"]);
        let pool = sqlx::PgPool::connect(&url).await.expect("pool");
        app.setup().provide(Sink { pool, worker });
        app.set_run_mode(messaging::RunMode::Drain);
        app.start().expect("start").wait().await;
    });
}

fn spawn_worker(url: &str, name: &str) -> std::process::Child {
    fixtures::entry_process(module_path!(), "worker_process")
        .env("MESSAGING_TEST_URL", url)
        .env("MESSAGING_TEST_WORKER", name)
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .spawn()
        .expect("spawn a worker process")
}

#[test]
fn two_processes_share_a_queue() {
    let runtime = fixtures::runtime();
    let db = runtime.block_on(fixtures::Postgres::new());
    let url = db.url.clone();
    runtime.block_on(async {
        let transport = messaging::transport::connect(&format!("{url}&migrate=true")).await.expect("connect");
        transport.declare(&<SharedJobs as Queue>::SPEC).await.expect("declare");
        let pool = sqlx::PgPool::connect(&url).await.expect("pool");
        sqlx::query("CREATE TABLE handled (n BIGINT NOT NULL, message_id TEXT NOT NULL, worker TEXT NOT NULL)")
            .execute(&pool)
            .await
            .expect("handled table");
        let publisher = Publisher::new(Arc::clone(&transport));
        let jobs: Vec<Job> = (0..MESSAGES).map(|n| Job { n }).collect();
        for chunk in jobs.chunks(1_000) {
            for result in publisher.send_batch::<SharedJobs, _>(chunk).await {
                result.expect("published");
            }
        }
    });
    let started = Instant::now();
    let mut workers = [spawn_worker(&url, "a"), spawn_worker(&url, "b")];
    for worker in &mut workers {
        let status = fixtures::wait_for(worker, Duration::from_secs(120), "a worker process");
        assert!(status.success(), "a worker process failed: {status:?}");
    }
    let elapsed = started.elapsed();
    runtime.block_on(async {
        let pool = sqlx::PgPool::connect(&url).await.expect("pool");
        let (total, distinct, by_a, by_b): (i64, i64, i64, i64) = sqlx::query_as(
            "SELECT count(*), count(DISTINCT n), count(*) FILTER (WHERE worker = 'a'), count(*) FILTER (WHERE worker = 'b') \
             FROM handled",
        )
        .fetch_one(&pool)
        .await
        .expect("count");
        assert_eq!(distinct, MESSAGES as i64, "every message handled");
        assert_eq!(total, MESSAGES as i64, "none handled twice");
        assert!(by_a > 0 && by_b > 0, "both processes took part: a={by_a} b={by_b}");
        let left: i64 = sqlx::query_scalar("SELECT count(*) FROM messaging_messages").fetch_one(&pool).await.expect("left");
        assert_eq!(left, 0, "the queue is empty");
        eprintln!("{MESSAGES} messages by two processes in {elapsed:?} (a={by_a}, b={by_b})");
        pool.close().await;
    });
    runtime.block_on(db.drop());
    assert!(elapsed < Duration::from_secs(120));
}
