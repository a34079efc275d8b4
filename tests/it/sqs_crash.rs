//! An SQS consumer killed with SIGKILL in the middle of its handlers: the
//! messages come back after their visibility timeout, and the idempotent
//! handler's side effect (a row committed together with its claim) happens
//! once per message. The test binary runs itself as the consumer.
#![cfg(all(feature = "sqs", feature = "sqlite", unix))]

use crate::fixtures;

use std::process::Stdio;
use std::time::{Duration, Instant};

use messaging::prelude::*;
use messaging::sqlx;

const MESSAGES: i64 = 60;

#[messaging::queue("sqs-crash", concurrency = 4, visibility = "2s", max_receives = 20)]
struct CrashJobs;

#[messaging::message(name = "test.sqs_crash", v = 1)]
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Job {
    n: i64,
}

#[messaging::handler(queue = CrashJobs, idempotent = "effect", lease = "2s", retry(base = "100ms", max = "500ms"))]
async fn effect(job: Job, claim: IdempotencyClaim, db: State<sqlx::SqlitePool>) -> Result<(), HandlerError> {
    tokio::time::sleep(Duration::from_millis(50)).await;
    let mut tx = db.begin().await?;
    sqlx::query("INSERT INTO effects (n) VALUES (?1)").bind(job.n).execute(&mut *tx).await?;
    claim.complete_in(&mut tx).await?;
    tx.commit().await?;
    Ok(())
}

/// The consumer: SQS for messages, a SQLite file for claims and side effects.
#[test]
#[ignore = "entry point of the consumer process started by a_killed_sqs_consumer_repeats_nothing"]
fn sqs_consumer() {
    let (Ok(sqs), Ok(db)) = (std::env::var("MESSAGING_TEST_URL"), std::env::var("MESSAGING_TEST_DB")) else { return };
    fixtures::runtime().block_on(async move {
        let transport = messaging::transport::connect(&sqs).await.expect("connect");
        let mut app = messaging::App::new(transport).await.expect("app");
        app.only_queues(&["sqs-crash"]);
        let pool = sqlx::SqlitePool::connect(&db).await.expect("pool");
        app.setup().provide(pool.clone()).idempotency_store(messaging::idempotency::SqliteIdempotencyStore::new(pool));
        app.set_receive_wait(Duration::from_secs(1));
        app.set_run_mode(messaging::RunMode::Drain);
        app.start().expect("start").wait().await;
    });
}

fn spawn(sqs: &str, db: &str) -> std::process::Child {
    fixtures::entry_process(module_path!(), "sqs_consumer")
        .env("MESSAGING_TEST_URL", sqs)
        .env("MESSAGING_TEST_DB", db)
        .env("RUST_LOG", "error")
        .stdout(Stdio::null())
        .spawn()
        .expect("spawn the consumer")
}

#[test]
fn a_killed_sqs_consumer_repeats_nothing() {
    let moto = fixtures::SqsServer::start();
    let file = fixtures::SqliteFile::new();
    let sqs = moto.url(true);
    let runtime = fixtures::runtime();
    let pool = runtime.block_on(async {
        // The claims' tables, and the table of side effects.
        let store = messaging::transport::connect(&format!("{}&migrate=true", file.url)).await.expect("sqlite");
        drop(store);
        let pool = sqlx::SqlitePool::connect(&file.url).await.expect("pool");
        sqlx::query("CREATE TABLE effects (n INTEGER NOT NULL)").execute(&pool).await.expect("effects");
        let transport = messaging::transport::connect(&sqs).await.expect("sqs");
        messaging::transport::Transport::declare(&*transport, &<CrashJobs as Queue>::SPEC).await.expect("declare");
        let jobs: Vec<Job> = (0..MESSAGES).map(|n| Job { n }).collect();
        for result in Publisher::new(transport).send_batch::<CrashJobs, _>(&jobs).await {
            result.expect("sent");
        }
        pool
    });
    let count = |sql: &str| {
        runtime.block_on(async { sqlx::query_scalar::<_, i64>(sql).fetch_one(&pool).await.expect("count") })
    };

    let mut first = spawn(&sqs, &file.url);
    let deadline = Instant::now() + Duration::from_secs(60);
    while count("SELECT count(*) FROM effects") < MESSAGES / 4 {
        assert!(Instant::now() < deadline, "the consumer made no progress");
        assert!(first.try_wait().expect("poll").is_none(), "the consumer exited before it was killed");
        std::thread::sleep(Duration::from_millis(10));
    }
    first.kill().expect("SIGKILL");
    first.wait().expect("reaped");
    let at_kill = count("SELECT count(*) FROM effects");
    assert!(at_kill < MESSAGES, "killed before the end");

    let status = fixtures::wait_for(&mut spawn(&sqs, &file.url), Duration::from_secs(120), "the restarted consumer");
    assert!(status.success(), "the restarted consumer failed: {status:?}");
    assert_eq!(count("SELECT count(DISTINCT n) FROM effects"), MESSAGES, "nothing lost");
    assert_eq!(count("SELECT count(*) FROM effects"), MESSAGES, "no side effect twice (killed after {at_kill})");
}
