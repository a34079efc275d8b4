//! The exactly-once chain under SIGKILL: handler A makes its side effect,
//! completes its claim and publishes B in one transaction; handler B makes
//! its side effect and completes its claim. A worker is killed at random
//! moments ten times (restarted each time), then one drains. Every A and
//! every B side effect happens exactly once: no B lost, no B published
//! twice, no side effect repeated. On SQLite and PostgreSQL the queues are
//! in the database; on SQS (moto) they are not, and B goes through the
//! outbox in PostgreSQL, whose relay may be killed between SQS's acceptance
//! and its delete (B is a FIFO queue: SQS drops the resend).

use std::process::Stdio;
use std::time::Duration;

use messaging::prelude::*;
use messaging::sqlx;
use messaging::transport::Transport;

use super::{count, effects, fixtures, Effects};

#[messaging::queue("chaos-chain-a", visibility = "3s")]
struct ChainA;

#[messaging::queue("chaos-chain-b.fifo", fifo, visibility = "3s")]
struct ChainB;

#[messaging::message(name = "chaos.chain_a", v = 1)]
#[derive(Debug, Clone, Serialize, Deserialize)]
struct StepA {
    n: i64,
}

#[messaging::message(name = "chaos.chain_b", v = 1, group = group)]
#[derive(Debug, Clone, Serialize, Deserialize)]
struct StepB {
    n: i64,
    group: String,
}

#[messaging::handler(queue = ChainA, idempotent = "chain-a", lease = "3s", retry(base = "100ms", max = "200ms"))]
async fn chain_a(
    step: StepA,
    claim: IdempotencyClaim,
    db: State<Effects>,
    publisher: Publisher,
) -> Result<(), HandlerError> {
    tokio::time::sleep(Duration::from_millis(fastish(step.n) % 20)).await;
    let next = StepB { n: step.n, group: format!("g{}", step.n % 4) };
    match &*db {
        Effects::Postgres(pool) => {
            let mut tx = pool.begin().await?;
            sqlx::query("INSERT INTO chain_a (n) VALUES ($1)").bind(step.n).execute(&mut *tx).await?;
            claim.complete_in(&mut tx).await?;
            publisher.send::<ChainB, _>(&next).in_transaction(&mut tx).await?;
            tx.commit().await?;
        }
        Effects::Sqlite(pool) => {
            let mut tx = pool.begin_with("BEGIN IMMEDIATE").await?;
            sqlx::query("INSERT INTO chain_a (n) VALUES (?1)").bind(step.n).execute(&mut *tx).await?;
            claim.complete_in(&mut tx).await?;
            publisher.send::<ChainB, _>(&next).in_transaction(&mut tx).await?;
            publisher.commit(tx).await?;
        }
    }
    Ok(())
}

#[messaging::handler(queue = ChainB, idempotent = "chain-b", lease = "3s", retry(base = "100ms", max = "200ms"))]
async fn chain_b(step: StepB, claim: IdempotencyClaim, db: State<Effects>) -> Result<(), HandlerError> {
    match &*db {
        Effects::Postgres(pool) => {
            let mut tx = pool.begin().await?;
            sqlx::query("INSERT INTO chain_b (n) VALUES ($1)").bind(step.n).execute(&mut *tx).await?;
            claim.complete_in(&mut tx).await?;
            tx.commit().await?;
        }
        Effects::Sqlite(pool) => {
            let mut tx = pool.begin_with("BEGIN IMMEDIATE").await?;
            sqlx::query("INSERT INTO chain_b (n) VALUES (?1)").bind(step.n).execute(&mut *tx).await?;
            claim.complete_in(&mut tx).await?;
            tx.commit().await?;
        }
    }
    Ok(())
}

/// A number that varies with `n` and the time (a handler's short pause).
fn fastish(n: i64) -> u64 {
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.subsec_nanos());
    (n as u64).wrapping_mul(2_654_435_761) ^ u64::from(nanos)
}

/// The worker process of the chain: `MESSAGING_TEST_URL` the transport,
/// `MESSAGING_TEST_DB` the database of effects, claims (and outbox, given
/// as `MESSAGING_TEST_OUTBOX`).
#[test]
#[ignore = "entry point of the worker processes the chain test starts"]
fn chaos_chain_worker() {
    let (Ok(url), Ok(db)) = (std::env::var("MESSAGING_TEST_URL"), std::env::var("MESSAGING_TEST_DB")) else {
        return;
    };
    fixtures::runtime().block_on(async move {
        let transport = messaging::transport::connect(&url).await.expect("connect");
        let mut app = messaging::App::new(transport).await.expect("app");
        app.only_queues(&["chaos-chain-a", "chaos-chain-b.fifo"]);
        let effects = effects(&db).await;
        if let Ok(outbox) = std::env::var("MESSAGING_TEST_OUTBOX") {
            let outbox = messaging::transport::Outbox::connect(&outbox).await.expect("outbox");
            app.setup().outbox(outbox);
            if let Effects::Postgres(pool) = &effects {
                app.setup().idempotency_store(messaging::idempotency::PostgresIdempotencyStore::new(pool.clone()));
            }
        }
        app.setup().provide(effects);
        app.set_receive_wait(Duration::from_secs(1));
        app.set_run_mode(messaging::RunMode::Drain);
        app.start().expect("start").wait().await;
    });
}

fn spawn(url: &str, db: &str, outbox: Option<&str>) -> std::process::Child {
    let mut command = fixtures::entry_process(module_path!(), "chaos_chain_worker");
    command
        .env("MESSAGING_TEST_URL", url)
        .env("MESSAGING_TEST_DB", db)
        .env("RUST_LOG", "messaging=warn")
        .stdout(Stdio::null());
    if let Some(outbox) = outbox {
        command.env("MESSAGING_TEST_OUTBOX", outbox);
    }
    command.spawn().expect("spawn the worker process")
}

/// Publishes the A messages and creates the effect tables.
async fn prepare(url: &str, db: &str, outbox: Option<&str>, jobs: i64) -> (std::sync::Arc<dyn Transport>, Effects) {
    drop(messaging::transport::connect(&format!("{db}&migrate=true")).await.expect("the database's tables"));
    if let Some(outbox) = outbox {
        drop(messaging::transport::Outbox::connect(outbox).await.expect("the outbox"));
    }
    let transport = messaging::transport::connect(url).await.expect("connect");
    transport.declare(&<ChainA as Queue>::SPEC).await.expect("declare");
    transport.declare(&<ChainB as Queue>::SPEC).await.expect("declare");
    let effects = effects(db).await;
    for create in ["CREATE TABLE chain_a (n BIGINT NOT NULL)", "CREATE TABLE chain_b (n BIGINT NOT NULL)"] {
        match &effects {
            Effects::Postgres(pool) => drop(sqlx::query(create).execute(pool).await.expect("table")),
            Effects::Sqlite(pool) => drop(sqlx::query(create).execute(pool).await.expect("table")),
        }
    }
    let batch: Vec<StepA> = (0..jobs).map(|n| StepA { n }).collect();
    for result in Publisher::new(transport.clone()).send_batch::<ChainA, _>(&batch).await {
        result.expect("published");
    }
    (transport, effects)
}

fn chain_under_kills(url: &str, db: &str, outbox: Option<&str>) {
    const JOBS: i64 = 150;
    const KILLS: usize = 10;
    let runtime = fixtures::runtime();
    let (transport, effects) = runtime.block_on(prepare(url, db, outbox, JOBS));
    let mut seed = fastish(7);
    let mut mid_relay = 0;
    for kill in 1..=KILLS {
        let mut worker = spawn(url, db, outbox);
        seed = seed.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
        // At a random moment: during startup, mid-batch, mid-relay.
        std::thread::sleep(Duration::from_millis(200 + (seed >> 33) % 700));
        worker.kill().expect("SIGKILL");
        worker.wait().expect("reaped");
        let (a, b) = runtime.block_on(async {
            (
                count(&effects, "SELECT count(*) FROM chain_a").await,
                count(&effects, "SELECT count(*) FROM chain_b").await,
            )
        });
        if outbox.is_some() {
            let claimed = "SELECT count(*) FROM messaging_outbox WHERE lease_token IS NOT NULL";
            if runtime.block_on(count(&effects, claimed)) > 0 {
                mid_relay += 1;
            }
        }
        eprintln!("{url}: kill {kill}: {a} A and {b} B side effects of {JOBS}");
    }
    if outbox.is_some() {
        eprintln!("{url}: {mid_relay} of {KILLS} kills left outbox rows claimed by the killed relay");
    }
    let mut last = spawn(url, db, outbox);
    let status = fixtures::wait_for(&mut last, Duration::from_secs(120), "the last worker draining the chain");
    assert!(status.success(), "the last worker failed: {status:?}");
    runtime.block_on(async {
        for table in ["chain_a", "chain_b"] {
            let distinct = count(&effects, &format!("SELECT count(DISTINCT n) FROM {table}")).await;
            let all = count(&effects, &format!("SELECT count(*) FROM {table}")).await;
            assert_eq!((distinct, all), (JOBS, JOBS), "{url}: {table}: every side effect exactly once");
        }
        if outbox.is_some() {
            assert_eq!(count(&effects, "SELECT count(*) FROM messaging_outbox").await, 0, "the outbox is empty");
        }
        for queue in ["chaos-chain-a", "chaos-chain-b.fifo"] {
            assert_eq!(transport.depth(queue).await.expect("depth"), 0, "{url}: {queue} is drained");
        }
    });
}

#[test]
fn the_chain_is_exactly_once_under_kills_on_sqlite() {
    let file = fixtures::SqliteFile::new();
    chain_under_kills(&file.url, &file.url, None);
}

#[test]
fn the_chain_is_exactly_once_under_kills_on_postgres() {
    let db = fixtures::runtime().block_on(fixtures::Postgres::new());
    chain_under_kills(&db.url, &db.url, None);
}

#[test]
fn the_chain_is_exactly_once_under_kills_through_the_outbox_to_sqs() {
    let moto = fixtures::SqsServer::start();
    let db = fixtures::runtime().block_on(fixtures::Postgres::new());
    let outbox = format!("{}&migrate=true", db.url);
    chain_under_kills(&moto.url(true), &db.url, Some(&outbox));
}
