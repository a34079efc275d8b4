//! The outbox relay to Amazon SQS (moto_server), against publishing the same
//! messages straight to SQS in the same run:
//!
//! * **baseline**: `send_batch` of all the messages on the SQS transport
//!   (one `SendMessageBatch` of 10 per request);
//! * **outbox write**: the same messages published `in_transaction` into the
//!   PostgreSQL outbox, 100 per transaction (what a request handler pays);
//! * **relay**: one process relaying them from the outbox to SQS, from the
//!   start until the outbox is empty: msgs/s and SQS requests per message.
//!
//! On a standard queue and on a FIFO queue with 10 groups. The queue is
//! purged before each phase (moto's cost per request grows with depth).
//!
//! ```text
//! cargo bench -p messaging-suite --bench outbox_relay
//! MESSAGES=5000 cargo bench -p messaging-suite --bench outbox_relay
//! ```

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use messaging::prelude::*;
use messaging::sqlx;
use messaging::transport::sqs::SqsTransport;
use messaging::transport::{Outbox, Transport};

#[messaging::queue("bench-relay")]
struct Plain;

#[messaging::queue("bench-relay.fifo", fifo)]
struct Grouped;

/// The payload.
#[messaging::message(name = "bench.relay", v = 1, group = group)]
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Tick {
    n: usize,
    group: String,
}

#[path = "../tests/fixtures/sqs_server.rs"]
#[allow(dead_code, unreachable_pub)]
mod sqs_server;
use sqs_server::SqsServer;

fn ticks(count: usize) -> Vec<Tick> {
    (0..count).map(|n| Tick { n, group: format!("g{}", n % 10) }).collect()
}

/// Empties `queue` on SQS.
async fn purge(t: &SqsTransport, queue: &str) -> anyhow::Result<()> {
    let url = t.client().get_queue_url().queue_name(queue).send().await?;
    t.client().purge_queue().queue_url(url.queue_url().unwrap_or_default()).send().await?;
    Ok(())
}

fn line(what: &str, count: usize, took: Duration, requests: Option<u64>, baseline: Option<f64>) -> f64 {
    let rate = count as f64 / took.as_secs_f64();
    let requests = requests.map_or_else(String::new, |r| format!("{:>6.3} requests/msg", r as f64 / count as f64));
    let ratio = baseline.map_or_else(String::new, |b| format!("{:>6.2} x baseline", rate / b));
    println!("  {what:<44} {rate:>9.0} msgs/s  {requests:>20}  {ratio}");
    rate
}

/// One queue kind: baseline, outbox write, relay.
async fn measure<Q: Queue>(
    t: &Arc<SqsTransport>,
    outbox: &Outbox,
    pool: &sqlx::PgPool,
    count: usize,
) -> anyhow::Result<()>
where
    (Q::Kind, messaging::publish::Ungrouped, Q::HasDefaultGroup, messaging::__private::Yes):
        messaging::publish::GroupResolved<Q, Tick>,
{
    let name = Q::SPEC.name;
    println!("{name} ({}):", if Q::SPEC.fifo { "FIFO, 10 groups" } else { "standard" });
    let messages = ticks(count);

    purge(t, name).await?;
    let publisher = Publisher::new(t.clone() as Arc<dyn Transport>);
    let (before, started) = (t.requests(), Instant::now());
    for sent in publisher.send_batch::<Q, _>(&messages).await {
        sent.context("the baseline's send")?;
    }
    let base = line("baseline: send_batch to SQS", count, started.elapsed(), Some(t.requests() - before), None);

    purge(t, name).await?;
    let publisher = Publisher::new(t.clone() as Arc<dyn Transport>).with_outbox(outbox.clone());
    let started = Instant::now();
    for chunk in messages.chunks(100) {
        let mut tx = pool.begin().await?;
        publisher.send_batch::<Q, _>(chunk).in_transaction(&mut tx).await.context("the outbox write")?;
        tx.commit().await?;
    }
    line("outbox write: in_transaction, 100 per tx", count, started.elapsed(), None, Some(base));

    let mut app = messaging::App::new(t.clone() as Arc<dyn Transport>).await?;
    app.only_queues(&[]);
    app.setup().outbox(outbox.clone());
    let (before, started) = (t.requests(), Instant::now());
    let running = app.start()?;
    let deadline = Instant::now() + Duration::from_secs(300);
    loop {
        let pending: u64 = outbox.stats().await?.iter().map(|q| q.pending).sum();
        if pending == 0 {
            break;
        }
        anyhow::ensure!(Instant::now() < deadline, "{pending} rows left after 300 s");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let took = started.elapsed();
    let requests = t.requests() - before;
    running.stop().await;
    line("relay: outbox to SQS, one process", count, took, Some(requests), Some(base));
    let depth = t.depth(name).await?;
    anyhow::ensure!(depth as usize == count, "{depth} messages in the queue, {count} expected");
    Ok(())
}

async fn run(server: &SqsServer, count: usize) -> anyhow::Result<()> {
    let postgres =
        std::env::var("TEST_POSTGRES_URL").unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into());
    let schema = format!("relaybench_{}", std::process::id());
    let admin = sqlx::PgPool::connect(&postgres).await.context("PostgreSQL (TEST_POSTGRES_URL)")?;
    sqlx::query(&format!("CREATE SCHEMA {schema}")).execute(&admin).await?;
    let url = format!("{postgres}?options=-c%20search_path%3D{schema}");
    let measured = async {
        let outbox = Outbox::connect(&format!("{url}&migrate=true")).await?;
        let pool = sqlx::PgPool::connect(&url).await?;
        let t = Arc::new(messaging::transport::sqs::connect(&server.url(true)).await?);
        messaging::App::new(t.clone() as Arc<dyn Transport>).await?;
        println!("outbox relay on {} and PostgreSQL, {count} messages per phase", server.name);
        measure::<Plain>(&t, &outbox, &pool, count).await?;
        measure::<Grouped>(&t, &outbox, &pool, count).await
    }
    .await;
    sqlx::query(&format!("DROP SCHEMA {schema} CASCADE")).execute(&admin).await?;
    measured
}

fn main() -> std::process::ExitCode {
    let count: usize = std::env::var("MESSAGES").ok().and_then(|v| v.parse().ok()).unwrap_or(1000);
    std::env::set_var("AWS_ACCESS_KEY_ID", "test");
    std::env::set_var("AWS_SECRET_ACCESS_KEY", "test");
    let Ok(runtime) = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build() else {
        return std::process::ExitCode::FAILURE;
    };
    let server = match SqsServer::moto() {
        Ok(server) => server,
        Err(why) => {
            eprintln!("not measured: {why}");
            return std::process::ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(&server, count)) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("FAILED: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
