//! The chaos suite: two faults at once, on SQLite, PostgreSQL and SQS (moto).
//!
//! - SIGKILL loops: a consumer killed three times while its idempotent
//!   handlers hold claims (visibility 3 s, the default `max_receives`, a
//!   handler slower than a heartbeat period, claims in a store the processes
//!   share); every side effect happens once and nothing is dead-lettered.
//! - A PostgreSQL restart in the middle of a drain: nothing lost, nothing
//!   twice, nothing dead-lettered.
//! - A poison message at the head of a FIFO group: dead-lettered alone with
//!   its reason, its followers run in order, another group is not held up.
//! - A consumer stopped while its receive waits: the next consumer gets
//!   what is published at once, not after the visibility timeout.
//! - The exactly-once chain (`chaos/chain.rs`): a side effect, its claim and
//!   the next message in one transaction, killed at random ten times, on
//!   SQLite, PostgreSQL and SQS through the outbox.
//!
//! It restarts PostgreSQL, so it is not part of `cargo test` (`test = false`
//! in Cargo.toml): `./scripts/test` runs it after the rest of the suite, one
//! test at a time (`cargo test --workspace --test chaos -- --test-threads=1`). The test
//! binary runs itself as the worker process (the ignored `chaos_worker`).
#![cfg(all(feature = "postgres", feature = "sqlite", feature = "sqs", unix))]

#[path = "chaos/chain.rs"]
mod chain;
mod fixtures;

use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use messaging::prelude::*;
use messaging::sqlx;
use messaging::transport::Transport;

// --- the kill loop and the PostgreSQL restart ----------------------------------

#[messaging::queue("chaos-kill", dlq = "chaos-kill-dlq", concurrency = 4, visibility = "3s")]
struct KillJobs;

#[messaging::message(name = "chaos.job", v = 1)]
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Job {
    n: i64,
}

/// Where side effects are written: the database that holds the claims, so
/// that the effect and the claim's completion commit together.
#[derive(Clone)]
enum Effects {
    Postgres(sqlx::PgPool),
    Sqlite(sqlx::SqlitePool),
}

/// Slower than a heartbeat period (a third of the visibility), with the
/// lease as long as the visibility: a claim taken late in a batch would
/// outlive its message's invisibility if the worker did not cap it, and a
/// short retry backoff would spend the attempts of a redelivery that finds it
/// still held.
#[messaging::handler(queue = KillJobs, idempotent = "effect", lease = "3s", retry(base = "100ms", max = "200ms"))]
async fn effect(
    job: Job,
    ctx: MessageContext,
    claim: IdempotencyClaim,
    db: State<Effects>,
) -> Result<(), HandlerError> {
    tokio::time::sleep(Duration::from_millis(1_900)).await;
    let receives = i64::from(ctx.receive_count());
    match &*db {
        Effects::Postgres(pool) => {
            let mut tx = pool.begin().await?;
            sqlx::query("INSERT INTO effects (n, receives) VALUES ($1, $2)")
                .bind(job.n)
                .bind(receives)
                .execute(&mut *tx)
                .await?;
            claim.complete_in(&mut tx).await?;
            tx.commit().await?;
        }
        Effects::Sqlite(pool) => {
            let mut tx = pool.begin().await?;
            sqlx::query("INSERT INTO effects (n, receives) VALUES (?1, ?2)")
                .bind(job.n)
                .bind(receives)
                .execute(&mut *tx)
                .await?;
            claim.complete_in(&mut tx).await?;
            tx.commit().await?;
        }
    }
    Ok(())
}

/// The worker process: consumes `chaos-kill` until it is drained (or killed).
/// `MESSAGING_TEST_URL` is the transport, `MESSAGING_TEST_DB` the database of
/// claims and effects.
#[test]
#[ignore = "entry point of the worker processes the chaos tests start"]
fn chaos_worker() {
    let (Ok(url), Ok(db)) = (std::env::var("MESSAGING_TEST_URL"), std::env::var("MESSAGING_TEST_DB")) else {
        return;
    };
    fixtures::runtime().block_on(async move {
        let transport = messaging::transport::connect(&url).await.expect("connect");
        let mut app = messaging::App::new(transport).await.expect("app");
        app.only_queues(&["chaos-kill"]);
        let effects = effects(&db).await;
        if let (Effects::Sqlite(pool), false) = (&effects, url.starts_with("sqlite")) {
            // Claims in the shared SQLite file (SQS has no store of its own).
            app.setup().idempotency_store(messaging::idempotency::SqliteIdempotencyStore::new(pool.clone()));
        }
        app.setup().provide(effects);
        app.set_receive_wait(Duration::from_secs(1));
        app.set_run_mode(messaging::RunMode::Drain);
        app.start().expect("start").wait().await;
    });
}

async fn effects(db: &str) -> Effects {
    if db.starts_with("postgres") {
        Effects::Postgres(sqlx::PgPool::connect(db).await.expect("pool"))
    } else {
        Effects::Sqlite(sqlx::SqlitePool::connect(db).await.expect("pool"))
    }
}

fn spawn_worker(url: &str, db: &str) -> std::process::Child {
    fixtures::entry_process(module_path!(), "chaos_worker")
        .env("MESSAGING_TEST_URL", url)
        .env("MESSAGING_TEST_DB", db)
        .env("RUST_LOG", "messaging=warn")
        .stdout(Stdio::null())
        .spawn()
        .expect("spawn the worker process")
}

/// Counts with one SQL query on the database of effects and claims.
async fn count(db: &Effects, sql: &str) -> i64 {
    match db {
        Effects::Postgres(pool) => sqlx::query_scalar(sql).fetch_one(pool).await.expect("count"),
        Effects::Sqlite(pool) => sqlx::query_scalar(sql).fetch_one(pool).await.expect("count"),
    }
}

/// Publishes `jobs` messages to `chaos-kill` on `url` and creates the table of
/// effects (and the claims' table) in `db`.
async fn prepare(url: &str, db: &str, jobs: i64) -> (Arc<dyn Transport>, Effects) {
    // The database's tables (on SQS the claims live in the SQLite file).
    drop(messaging::transport::connect(&format!("{db}&migrate=true")).await.expect("claims database"));
    let transport = messaging::transport::connect(url).await.expect("connect");
    transport.declare(&<KillJobs as Queue>::SPEC).await.expect("declare");
    let effects = effects(db).await;
    let create = "CREATE TABLE effects (n BIGINT NOT NULL, receives BIGINT NOT NULL)";
    match &effects {
        Effects::Postgres(pool) => drop(sqlx::query(create).execute(pool).await.expect("effects table")),
        Effects::Sqlite(pool) => drop(sqlx::query(create).execute(pool).await.expect("effects table")),
    }
    let batch: Vec<Job> = (0..jobs).map(|n| Job { n }).collect();
    for result in Publisher::new(Arc::clone(&transport)).send_batch::<KillJobs, _>(&batch).await {
        result.expect("published");
    }
    (transport, effects)
}

/// Checks the end state: each side effect once, no dead letter, an empty
/// queue, and no message received more than `receives` times.
async fn assert_once_each(transport: &Arc<dyn Transport>, db: &Effects, jobs: i64, receives: i64, what: &str) {
    let most = count(db, "SELECT COALESCE(max(receives), 0) FROM effects").await;
    assert!(most <= receives, "{what}: a message was received {most} times, more than {receives}");
    assert_eq!(count(db, "SELECT count(DISTINCT n) FROM effects").await, jobs, "{what}: nothing lost");
    assert_eq!(count(db, "SELECT count(*) FROM effects").await, jobs, "{what}: no side effect twice");
    let dead = transport.dead_letters().expect("dead letters").depth("chaos-kill").await.expect("depth");
    assert_eq!(dead, 0, "{what}: nothing dead-lettered");
    assert_eq!(transport.depth("chaos-kill").await.expect("depth"), 0, "{what}: the queue is drained");
}

/// Kills a worker three times while it holds claims, then lets one drain.
fn kill_loop(url: &str, db: &str) {
    const JOBS: i64 = 40;
    let runtime = fixtures::runtime();
    let (transport, effects) = runtime.block_on(prepare(url, db, JOBS));
    let held = "SELECT count(*) FROM messaging_idempotency WHERE processor_id IS NOT NULL AND completed_at IS NULL";
    for kill in 1..=3 {
        let before = runtime.block_on(count(&effects, "SELECT count(*) FROM effects"));
        let mut worker = spawn_worker(url, db);
        let deadline = Instant::now() + Duration::from_secs(60);
        // Once the first handlers are done, the next ones run on messages
        // that waited in a batch received ahead: their claims start well
        // after their messages were leased.
        loop {
            let done = runtime.block_on(count(&effects, "SELECT count(*) FROM effects"));
            if done >= before + 4 && runtime.block_on(count(&effects, held)) > 0 {
                break;
            }
            assert!(Instant::now() < deadline, "kill {kill}: the worker made no progress");
            assert!(worker.try_wait().expect("poll").is_none(), "kill {kill}: the worker exited before it was killed");
            std::thread::sleep(Duration::from_millis(20));
        }
        // Just after they start, before the next heartbeat (every second)
        // pushes their messages' visibility out: without the cap, their
        // claims would outlive it by most of a heartbeat period.
        worker.kill().expect("SIGKILL");
        worker.wait().expect("reaped");
        let done = runtime.block_on(count(&effects, "SELECT count(*) FROM effects"));
        eprintln!("{url}: kill {kill} after {done} of {JOBS} side effects");
        assert!(done < JOBS, "kill {kill} came after the end");
    }
    let mut last = spawn_worker(url, db);
    let deadline = Instant::now() + Duration::from_secs(120);
    let status = loop {
        if let Some(status) = last.try_wait().expect("poll") {
            break status;
        }
        if Instant::now() > deadline {
            let _ = last.kill();
            panic!("{url}: the last worker did not drain the queue in 120 s");
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(status.success(), "the last worker failed: {status:?}");
    // Three kills, then the run that finishes: a claim held by a killed
    // process must not cost a receive.
    runtime.block_on(assert_once_each(&transport, &effects, JOBS, 4, url));
}

#[test]
fn kill_loop_on_sqlite() {
    let file = fixtures::SqliteFile::new();
    kill_loop(&file.url, &file.url);
}

#[test]
fn kill_loop_on_postgres() {
    let runtime = fixtures::runtime();
    let db = runtime.block_on(fixtures::Postgres::new());
    kill_loop(&db.url, &db.url);
}

#[test]
fn kill_loop_on_sqs() {
    let moto = fixtures::SqsServer::start();
    let file = fixtures::SqliteFile::new();
    kill_loop(&moto.url(true), &file.url);
}

/// The command that restarts the PostgreSQL server the tests use:
/// `MESSAGING_TEST_PG_RESTART`, or `pg_ctlcluster` on the local cluster.
fn restart_postgres() {
    let command = std::env::var("MESSAGING_TEST_PG_RESTART").unwrap_or_else(|_| {
        let version = std::fs::read_dir("/etc/postgresql")
            .ok()
            .and_then(|mut d| d.next())
            .and_then(Result::ok)
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .unwrap_or_else(|| {
                panic!(
                    "no local PostgreSQL cluster under /etc/postgresql to restart; \
                     set MESSAGING_TEST_PG_RESTART to a command that restarts the server at TEST_POSTGRES_URL"
                )
            });
        format!("pg_ctlcluster --skip-systemctl-redirect {version} main restart")
    });
    let status = Command::new("sh").args(["-c", &command]).status().expect("run the restart command");
    assert!(status.success(), "`{command}` failed: {status:?}");
}

#[test]
fn a_postgres_restart_during_a_drain_loses_nothing_and_repeats_nothing() {
    const JOBS: i64 = 60;
    let runtime = fixtures::runtime();
    let db = runtime.block_on(fixtures::Postgres::new());
    let (transport, effects) = runtime.block_on(prepare(&db.url, &db.url, JOBS));
    let mut worker = spawn_worker(&db.url, &db.url);
    let deadline = Instant::now() + Duration::from_secs(60);
    while runtime.block_on(count(&effects, "SELECT count(*) FROM effects")) < 8 {
        assert!(Instant::now() < deadline, "the worker made no progress");
        std::thread::sleep(Duration::from_millis(20));
    }
    restart_postgres();
    let deadline = Instant::now() + Duration::from_secs(120);
    let status = loop {
        if let Some(status) = worker.try_wait().expect("poll") {
            break status;
        }
        if Instant::now() > deadline {
            let _ = worker.kill();
            panic!("the worker did not drain the queue within 120 s of the restart");
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(status.success(), "the worker failed across the restart: {status:?}");
    // The pools of this process saw the restart too: reconnect.
    let (transport, effects) = runtime.block_on(async {
        drop((transport, effects));
        (messaging::transport::connect(&db.url).await.expect("connect"), self::effects(&db.url).await)
    });
    runtime.block_on(async {
        transport.declare(&<KillJobs as Queue>::SPEC).await.expect("declare");
        assert_once_each(&transport, &effects, JOBS, i64::from(KillJobs::SPEC.max_receives), "postgres restart").await;
    });
}

// --- a poison message at the head of a FIFO group -------------------------------

#[messaging::queue("chaos-poison.fifo", fifo, dlq = "chaos-poison-dlq.fifo", max_receives = 2, concurrency = 1)]
struct Poisoned;

#[messaging::message(name = "chaos.step", v = 1, group = group)]
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Step {
    group: String,
    seq: u32,
}

type Seen = Arc<Mutex<Vec<String>>>;

#[messaging::handler(queue = Poisoned, retry(base = "400ms", max = "400ms"))]
async fn poisoned(step: Step, ctx: MessageContext, seen: State<Seen>) -> Result<(), HandlerError> {
    seen.lock().unwrap().push(format!("{}:{}@{}", step.group, step.seq, ctx.receive_count()));
    if step.group == "a" && step.seq == 0 {
        return Err(HandlerError::transient(std::io::Error::other("the head always fails")));
    }
    Ok(())
}

async fn until(what: &str, timeout: Duration, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + timeout;
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn fifo_poison(url: &str) {
    let transport = messaging::transport::connect(url).await.expect("connect");
    let mut app = messaging::App::new(transport.clone()).await.expect("app");
    app.only_queues(&["chaos-poison.fifo"]);
    let seen: Seen = Arc::default();
    app.setup().provide(seen.clone());
    // A long poll: the head's retry must not wait for it to end.
    app.set_receive_wait(Duration::from_secs(5));
    let publisher = Publisher::new(transport.clone());
    let mut steps: Vec<Step> = (0..10).map(|seq| Step { group: "a".into(), seq }).collect();
    steps.push(Step { group: "b".into(), seq: 0 });
    for result in publisher.send_batch::<Poisoned, _>(&steps).await {
        result.expect("published");
    }
    let running = app.start().expect("start");
    let started = Instant::now();
    let dead = transport.dead_letters().expect("dead letters");
    until("the group to finish", Duration::from_secs(60), || seen.lock().unwrap().len() >= 12).await;
    let took = started.elapsed();
    assert!(took < Duration::from_secs(4), "{url}: took {took:?}; the retry waited for a receive");
    let deadline = Instant::now() + Duration::from_secs(30);
    while dead.depth("chaos-poison.fifo").await.expect("depth") < 1 {
        assert!(Instant::now() < deadline, "{url}: the head was not dead-lettered");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    running.stop().await;
    let seen = seen.lock().unwrap().clone();
    let head: Vec<&String> = seen.iter().filter(|l| l.starts_with("a:0@")).collect();
    assert_eq!(head, ["a:0@1", "a:0@1"], "{url}: two attempts in process, one receive: {seen:?}");
    let followers: Vec<&String> = seen.iter().filter(|l| l.starts_with("a:") && !l.starts_with("a:0@")).collect();
    let expected: Vec<String> = (1..10).map(|n| format!("a:{n}@1")).collect();
    assert_eq!(followers, expected.iter().collect::<Vec<_>>(), "{url}: followers once each, in order");
    let b = seen.iter().position(|l| l == "b:0@1").expect("group b ran");
    let retry = seen.iter().rposition(|l| l.starts_with("a:0@")).expect("the head ran");
    assert!(b < retry, "{url}: group b waited for group a's retry: {seen:?}");
    let letters = dead.peek("chaos-poison.fifo", 10).await.expect("peek");
    assert_eq!(letters.len(), 1, "{url}: only the head is a dead letter");
    assert_eq!(letters[0].reason.as_deref(), Some("the head always fails (after 2 attempts)"), "{url}");
    assert_eq!(transport.depth("chaos-poison.fifo").await.expect("depth"), 0, "{url}: the queue is drained");
}

#[tokio::test]
async fn a_poison_fifo_head_on_sqlite() {
    let file = fixtures::SqliteFile::new();
    fifo_poison(&format!("{}&migrate=true", file.url)).await;
}

#[tokio::test]
async fn a_poison_fifo_head_on_postgres() {
    let db = fixtures::Postgres::new().await;
    fifo_poison(&format!("{}&migrate=true", db.url)).await;
}

#[tokio::test]
async fn a_poison_fifo_head_on_sqs() {
    let moto = fixtures::SqsServer::start();
    fifo_poison(&moto.url(true)).await;
}

// --- a consumer stopped while its receive waits ---------------------------------

#[messaging::queue("chaos-restart.fifo", fifo, concurrency = 4, visibility = "10s")]
struct Restart;

#[messaging::handler(queue = Restart)]
async fn restarted(step: Step, seen: State<Seen>) {
    seen.lock().unwrap().push(step.group);
}

async fn consumer(url: &str, seen: &Seen) -> messaging::Running {
    let transport = messaging::transport::connect(url).await.expect("connect");
    let mut app = messaging::App::new(transport).await.expect("app");
    app.only_queues(&["chaos-restart.fifo"]);
    app.setup().provide(seen.clone()).grace_period(Duration::from_secs(2));
    // Longer than the grace period: the worker caps it.
    app.set_receive_wait(Duration::from_secs(20));
    app.start().expect("start")
}

/// Stops a FIFO consumer while its long poll waits, then starts another that
/// publishes one message to each of ten groups: they are handled at once,
/// not after the visibility timeout (10 s), because no receive of the first
/// consumer outlived it.
async fn restart(url: &str) {
    let first = consumer(url, &Seen::default()).await;
    tokio::time::sleep(Duration::from_millis(700)).await; // its receive is waiting now
    let stopping = Instant::now();
    first.stop().await;
    // A database's or memory's wait ends at once; an SQS long poll is waited
    // for, and never outlasts the grace period (2 s).
    let limit = Duration::from_millis(if url.starts_with("sqs") { 3_000 } else { 1_000 });
    let took = stopping.elapsed();
    assert!(took < limit, "{url}: stopping took {took:?}");
    let seen = Seen::default();
    let second = consumer(url, &seen).await;
    let transport = messaging::transport::connect(url).await.expect("connect");
    transport.declare(&<Restart as Queue>::SPEC).await.expect("declare");
    let started = Instant::now();
    let steps: Vec<Step> = (0..10).map(|g| Step { group: format!("g{g}"), seq: 0 }).collect();
    for result in Publisher::new(transport).send_batch::<Restart, _>(&steps).await {
        result.expect("published");
    }
    until("ten groups", Duration::from_secs(30), || seen.lock().unwrap().len() >= 10).await;
    let took = started.elapsed();
    second.stop().await;
    assert!(took < Duration::from_secs(4), "{url}: took {took:?}; a receive of the stopped consumer held messages");
}

#[tokio::test]
async fn a_stopped_consumer_holds_no_message_on_sqlite() {
    let file = fixtures::SqliteFile::new();
    restart(&format!("{}&migrate=true", file.url)).await;
}

#[tokio::test]
async fn a_stopped_consumer_holds_no_message_on_postgres() {
    let db = fixtures::Postgres::new().await;
    restart(&format!("{}&migrate=true", db.url)).await;
}

#[tokio::test]
async fn a_stopped_consumer_holds_no_message_on_sqs() {
    let moto = fixtures::SqsServer::start();
    restart(&moto.url(true)).await;
}

// --- a claim left held by a process that died -----------------------------------

#[messaging::queue("chaos-held", dlq = "chaos-held-dlq", max_receives = 1, visibility = "10s")]
struct Held;

#[messaging::handler(queue = Held, idempotent = "held", lease = "10s", retry(base = "50ms", max = "50ms"))]
async fn held(_job: Job, ctx: MessageContext, seen: State<Seen>) {
    seen.lock().unwrap().push(format!("@{}", ctx.receive_count()));
}

/// A message whose idempotency claim a dead process still holds (for two
/// more seconds) waits for that claim's lease to end and then runs, on its
/// first receive: with `max_receives = 1`, a receive spent on the held claim
/// would have dead-lettered it.
async fn claim_held_by_the_dead(url: &str, db: &str) {
    let transport = messaging::transport::connect(url).await.expect("connect");
    transport.declare(&<Held as Queue>::SPEC).await.expect("declare");
    let id = Publisher::new(transport.clone()).send::<Held, _>(&Job { n: 1 }).await.expect("published");
    let effects = effects(db).await;
    let expires =
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).expect("clock").as_millis() as i64 + 2_000;
    match &effects {
        Effects::Postgres(pool) => drop(
            sqlx::query(
                "INSERT INTO messaging_idempotency (message_id, scope, processor_id, lease_expires_at, completed) \
                 VALUES ($1, 'held', 'a-dead-process', $2, FALSE)",
            )
            .bind(id.as_str())
            .bind(expires)
            .execute(pool)
            .await
            .expect("the dead process's claim"),
        ),
        Effects::Sqlite(pool) => drop(
            sqlx::query(
                "INSERT INTO messaging_idempotency (message_id, scope, processor_id, lease_expires_at, completed) \
                 VALUES (?1, 'held', 'a-dead-process', ?2, 0)",
            )
            .bind(id.as_str())
            .bind(expires)
            .execute(pool)
            .await
            .expect("the dead process's claim"),
        ),
    }
    let mut app = messaging::App::new(transport.clone()).await.expect("app");
    app.only_queues(&["chaos-held"]);
    let seen: Seen = Arc::default();
    app.setup().provide(seen.clone());
    if let (Effects::Sqlite(pool), false) = (&effects, url.starts_with("sqlite")) {
        app.setup().idempotency_store(messaging::idempotency::SqliteIdempotencyStore::new(pool.clone()));
    }
    app.set_receive_wait(Duration::from_secs(1));
    let started = Instant::now();
    let running = app.start().expect("start");
    until("the handler", Duration::from_secs(20), || !seen.lock().unwrap().is_empty()).await;
    let took = started.elapsed();
    tokio::time::sleep(Duration::from_millis(300)).await;
    running.stop().await;
    assert_eq!(*seen.lock().unwrap(), ["@1"], "{url}: ran once, on its first receive");
    assert!(took >= Duration::from_millis(1_500), "{url}: ran after {took:?}, before the claim's lease ended");
    let dead = transport.dead_letters().expect("dead letters").depth("chaos-held").await.expect("depth");
    assert_eq!(dead, 0, "{url}: not dead-lettered");
}

#[tokio::test]
async fn a_claim_held_by_a_dead_process_costs_no_attempt_on_sqlite() {
    let file = fixtures::SqliteFile::new();
    claim_held_by_the_dead(&format!("{}&migrate=true", file.url), &file.url).await;
}

#[tokio::test]
async fn a_claim_held_by_a_dead_process_costs_no_attempt_on_postgres() {
    let db = fixtures::Postgres::new().await;
    claim_held_by_the_dead(&format!("{}&migrate=true", db.url), &db.url).await;
}

#[tokio::test]
async fn a_claim_held_by_a_dead_process_costs_no_attempt_on_sqs() {
    let moto = fixtures::SqsServer::start();
    let file = fixtures::SqliteFile::new();
    drop(messaging::transport::connect(&format!("{}&migrate=true", file.url)).await.expect("claims database"));
    claim_held_by_the_dead(&moto.url(true), &file.url).await;
}
