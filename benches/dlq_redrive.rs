//! The rate of a dead-letter redrive on PostgreSQL and SQLite, beside a
//! raw-SQL baseline measured in the same run on the same rows:
//!
//! * **messaging**: `DeadLetters::redrive` of every dead letter of a queue
//!   (no filter), which pages through them 500 at a time and moves each page
//!   in one transaction; what `app dlq redrive QUEUE` runs.
//! * **baseline**: one `UPDATE … SET status = 'pending' … WHERE status =
//!   'error'` over the same rows: the least work a database can do to move
//!   them, with nothing read back.
//!
//! The letters are planted with `send_batch` and turned into dead letters by
//! one `UPDATE` (planting is not timed). The PostgreSQL schema and the SQLite
//! file are made for the run and removed at the end.
//!
//! ```text
//! cargo bench -p messaging-suite --bench dlq_redrive                    # 100,000 dead letters
//! LETTERS=20000 BENCH_DB=sqlite cargo bench -p messaging-suite --bench dlq_redrive
//! ```

use std::time::Instant;

use anyhow::Context as _;
use messaging::sqlx;
use messaging::transport::{Outgoing, RedriveOptions, Transport};

const QUEUE: &str = "bench-redrive";

fn letters() -> anyhow::Result<usize> {
    std::env::var("LETTERS").map_or(Ok(100_000), |v| v.parse().context("LETTERS must be a whole number"))
}

fn unique(prefix: &str) -> String {
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default().as_nanos();
    format!("{prefix}_{}_{nanos}", std::process::id())
}

/// Sends `n` small messages and makes them all dead letters.
async fn plant(transport: &dyn Transport, n: usize, fail_all: &(dyn Fn() -> BoxedRun + Sync)) -> anyhow::Result<()> {
    let mut left = n;
    while left > 0 {
        let batch: Vec<Outgoing> = (0..left.min(1_000))
            .map(|i| Outgoing { body: format!("{{\"n\":{i}}}").into_bytes().into(), ..Outgoing::default() })
            .collect();
        left -= batch.len();
        for sent in transport.send_batch(QUEUE, batch).await {
            sent.context("send")?;
        }
    }
    fail_all().await
}

type BoxedRun = std::pin::Pin<Box<dyn std::future::Future<Output = anyhow::Result<()>> + Send>>;

/// Times the baseline and the redrive on one database; returns (baseline, messaging) in letters/s.
async fn measure(
    transport: &dyn Transport,
    n: usize,
    fail_all: &(dyn Fn() -> BoxedRun + Sync),
    raw_redrive: &(dyn Fn() -> BoxedRun + Sync),
) -> anyhow::Result<(f64, f64)> {
    transport.declare(&messaging::QueueSpec::standard(QUEUE)).await?;
    plant(transport, n, fail_all).await?;
    let started = Instant::now();
    raw_redrive().await?;
    let baseline = n as f64 / started.elapsed().as_secs_f64();
    fail_all().await?;
    let dead = transport.dead_letters().context("dead letters")?;
    anyhow::ensure!(dead.depth(QUEUE).await? == n as u64, "planted {n} dead letters");
    let started = Instant::now();
    let outcome = dead.redrive(QUEUE, RedriveOptions::default()).await?;
    let elapsed = started.elapsed();
    anyhow::ensure!(outcome.moved == n, "redrove {} of {n}", outcome.moved);
    Ok((baseline, n as f64 / elapsed.as_secs_f64()))
}

fn print(db: &str, n: usize, (baseline, messaging): (f64, f64)) {
    println!("{db}: {n} dead letters");
    println!("  baseline (one UPDATE … WHERE status = 'error')   {baseline:>10.0} letters/s   1.00 x baseline");
    println!(
        "  messaging redrive (pages of 500)              {messaging:>10.0} letters/s   {:.2} x baseline",
        messaging / baseline
    );
}

async fn postgres(n: usize) -> anyhow::Result<()> {
    let base = std::env::var("TEST_POSTGRES_URL").unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into());
    let admin = sqlx::PgPool::connect(&base).await.context("connect to PostgreSQL")?;
    let schema = unique("bench_redrive");
    sqlx::raw_sql(&format!("CREATE SCHEMA {schema}")).execute(&admin).await?;
    let sep = if base.contains('?') { '&' } else { '?' };
    let url = format!("{base}{sep}options=-c%20search_path%3D{schema}");
    let result = async {
        let transport = messaging::transport::connect(&format!("{url}&migrate=true")).await?;
        let pool = sqlx::PgPool::connect(&url).await?;
        let fail_pool = pool.clone();
        let fail_all = move || -> BoxedRun {
            let pool = fail_pool.clone();
            Box::pin(async move {
                sqlx::query(
                    "UPDATE messaging_messages SET status = 'error', attempts = 1, error = 'bench' WHERE queue = $1",
                )
                .bind(QUEUE)
                .execute(&pool)
                .await?;
                sqlx::raw_sql("VACUUM ANALYZE messaging_messages").execute(&pool).await?;
                Ok(())
            })
        };
        let raw_redrive = move || -> BoxedRun {
            let pool = pool.clone();
            Box::pin(async move {
                sqlx::query(
                    "UPDATE messaging_messages SET status = 'pending', attempts = 0, seq = nextval('messaging_seq') \
                     WHERE queue = $1 AND status = 'error'",
                )
                .bind(QUEUE)
                .execute(&pool)
                .await?;
                Ok(())
            })
        };
        print("postgresql", n, measure(&*transport, n, &fail_all, &raw_redrive).await?);
        anyhow::Ok(())
    }
    .await;
    sqlx::raw_sql(&format!("DROP SCHEMA {schema} CASCADE")).execute(&admin).await?;
    result
}

async fn sqlite(n: usize) -> anyhow::Result<()> {
    let path = std::env::temp_dir().join(format!("{}.db", unique("bench_redrive")));
    let url = format!("sqlite://{}?mode=rwc", path.display());
    let result = async {
        let transport = messaging::transport::connect(&format!("{url}&migrate=true")).await?;
        let pool = sqlx::SqlitePool::connect(&url).await?;
        let fail_pool = pool.clone();
        let fail_all = move || -> BoxedRun {
            let pool = fail_pool.clone();
            Box::pin(async move {
                sqlx::query(
                    "UPDATE messaging_messages SET status = 'error', attempts = 1, error = 'bench' WHERE queue = $1",
                )
                .bind(QUEUE)
                .execute(&pool)
                .await?;
                Ok(())
            })
        };
        let raw_redrive = move || -> BoxedRun {
            let pool = pool.clone();
            Box::pin(async move {
                sqlx::query(
                    "UPDATE messaging_messages SET status = 'pending', attempts = 0, seq = seq + 1000000000 \
                     WHERE queue = $1 AND status = 'error'",
                )
                .bind(QUEUE)
                .execute(&pool)
                .await?;
                Ok(())
            })
        };
        print("sqlite", n, measure(&*transport, n, &fail_all, &raw_redrive).await?);
        anyhow::Ok(())
    }
    .await;
    for suffix in ["", "-wal", "-shm"] {
        let _ = std::fs::remove_file(format!("{}{suffix}", path.display()));
    }
    result
}

fn main() -> anyhow::Result<()> {
    let n = letters()?;
    let which = std::env::var("BENCH_DB").unwrap_or_default();
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    runtime.block_on(async {
        if which.is_empty() || which == "postgres" {
            postgres(n).await?;
        }
        if which.is_empty() || which == "sqlite" {
            sqlite(n).await?;
        }
        anyhow::Ok(())
    })
}
