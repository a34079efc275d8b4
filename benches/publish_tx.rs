//! Publishing inside the application's own transaction against `send_batch`,
//! on PostgreSQL and on SQLite, measured in the same run on the same table:
//!
//! * **baseline**: `send_batch` of 1,000 messages per call (the framework's
//!   own transaction);
//! * `send_batch(..).in_transaction(&mut tx)`, 1,000 per transaction of the
//!   application's, then its commit;
//! * one message per transaction: `send(..).in_transaction(&mut tx)` and a
//!   commit, a tenth as many messages.
//!
//! ```text
//! cargo bench -p messaging-suite --bench publish_tx            # 20,000 messages
//! MESSAGES=5000 BENCH_DB=sqlite cargo bench -p messaging-suite --bench publish_tx
//! ```

use std::str::FromStr;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::Context as _;
use messaging::prelude::*;
use messaging::sqlx;

/// The queue published to (nobody consumes it).
#[messaging::queue("bench-publish-tx")]
struct Bench;

/// The payload (the same shape as the other benchmarks').
#[messaging::message(name = "bench.tx", v = 1)]
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Tick {
    /// Sequence number.
    n: u64,
    /// A short string.
    label: String,
}

/// Messages per call and per transaction.
const CHUNK: usize = 1_000;

fn ticks(n: usize) -> Vec<Tick> {
    (0..n as u64).map(|n| Tick { n, label: format!("tick-{n}") }).collect()
}

fn rate(n: usize, took: Duration) -> f64 {
    n as f64 / took.as_secs_f64().max(1e-9)
}

fn print(what: &str, value: f64, base: f64) {
    println!("  {what:<58} {value:>9.0} msgs/s   {:.2} x baseline", value / base);
}

/// The three runs, on `transport` and the application's `pool`, with its
/// transactions begun by `begin` and the queue emptied by `clear`.
macro_rules! measure {
    ($system:expr, $transport:expr, $pool:expr, $begin:expr, $messages:expr) => {{
        let transport = $transport;
        let pool = $pool;
        let app = messaging::App::new(transport.clone()).await?;
        let mut app = app;
        let publisher = app.setup().publisher();
        let clear = || async {
            sqlx::query("DELETE FROM messaging_messages").execute(&pool).await.map(drop).context("clearing")
        };
        let all = ticks($messages);
        println!("{}: {} messages, {CHUNK} per call or transaction", $system, all.len());

        clear().await?;
        let started = Instant::now();
        for chunk in all.chunks(CHUNK) {
            for sent in publisher.send_batch::<Bench, _>(chunk).await {
                sent?;
            }
        }
        let base = rate(all.len(), started.elapsed());
        print("baseline: send_batch, 1,000 per call", base, base);

        clear().await?;
        let started = Instant::now();
        for chunk in all.chunks(CHUNK) {
            let mut tx = $begin(&pool).await?;
            publisher.send_batch::<Bench, _>(chunk).in_transaction(&mut tx).await?;
            tx.commit().await?;
        }
        print("send_batch in the application's transaction, 1,000 per tx", rate(all.len(), started.elapsed()), base);

        clear().await?;
        let one = &all[..(all.len() / 10).max(1)];
        let started = Instant::now();
        for tick in one {
            let mut tx = $begin(&pool).await?;
            publisher.send::<Bench, _>(tick).in_transaction(&mut tx).await?;
            tx.commit().await?;
        }
        print("send in the application's transaction, 1 per tx", rate(one.len(), started.elapsed()), base);
        anyhow::Ok(())
    }};
}

fn messages() -> usize {
    std::env::var("MESSAGES").ok().and_then(|v| v.parse().ok()).unwrap_or(20_000)
}

async fn postgres() -> anyhow::Result<()> {
    let base = std::env::var("TEST_POSTGRES_URL").unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into());
    let nanos = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.subsec_nanos());
    let schema = format!("msgbench_tx_{}_{nanos}", std::process::id());
    let admin = sqlx::PgPool::connect(&base).await.context("connecting to PostgreSQL")?;
    sqlx::query(&format!("CREATE SCHEMA {schema}")).execute(&admin).await?;
    let sep = if base.contains('?') { '&' } else { '?' };
    let url = format!("{base}{sep}options=-c%20search_path%3D{schema}");
    let run = async {
        let transport = messaging::transport::connect(&format!("{url}&migrate=true")).await?;
        let pool = sqlx::PgPool::connect(&url).await?;
        let begin = |pool: &sqlx::PgPool| {
            let pool = pool.clone();
            async move { pool.begin().await }
        };
        measure!("postgresql", transport, pool, begin, messages())
    }
    .await;
    sqlx::query(&format!("DROP SCHEMA {schema} CASCADE")).execute(&admin).await?;
    run
}

async fn sqlite() -> anyhow::Result<()> {
    let path = std::env::temp_dir().join(format!("msgbench-tx-{}.db", std::process::id()));
    let url = format!("sqlite://{}?mode=rwc", path.display());
    let run = async {
        let transport = messaging::transport::connect(&format!("{url}&migrate=true")).await?;
        let options = sqlx::sqlite::SqliteConnectOptions::from_str(&url)?
            .journal_mode(sqlx::sqlite::SqliteJournalMode::Wal)
            .busy_timeout(Duration::from_secs(5));
        let pool = sqlx::SqlitePool::connect_with(options).await?;
        let begin = |pool: &sqlx::SqlitePool| {
            let pool = pool.clone();
            async move { pool.begin_with("BEGIN IMMEDIATE").await }
        };
        measure!("sqlite", transport, pool, begin, messages())
    }
    .await;
    for suffix in ["", "-wal", "-shm"] {
        let _ = std::fs::remove_file(format!("{}{suffix}", path.display()));
    }
    run
}

fn main() -> std::process::ExitCode {
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build();
    let Ok(runtime) = runtime else { return std::process::ExitCode::FAILURE };
    let only = std::env::var("BENCH_DB").unwrap_or_default();
    let mut failed = false;
    if only != "sqlite" {
        if let Err(e) = runtime.block_on(postgres()) {
            eprintln!("postgresql: FAILED: {e:#}");
            failed = true;
        }
        println!();
    }
    if only != "postgres" {
        if let Err(e) = runtime.block_on(sqlite()) {
            eprintln!("sqlite: FAILED: {e:#}");
            failed = true;
        }
    }
    if failed {
        std::process::ExitCode::FAILURE
    } else {
        std::process::ExitCode::SUCCESS
    }
}
