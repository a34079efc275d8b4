//! How fast a database FIFO queue drains a backlog, beside a standard queue
//! draining the same backlog in the same run (the baseline: what the
//! framework does without FIFO's one-message-per-group rule), on PostgreSQL
//! and on SQLite.
//!
//! 20,000 messages are published (`send_batch`, 1,000 per call, not timed),
//! then a no-op handler drains them at concurrency 8 until the queue is
//! empty. The FIFO backlogs: 10 long groups (the messages dealt round-robin),
//! 600 groups, and a group per message (a group per customer). Three rounds
//! of the four drains in turn; medians.
//!
//! Each FIFO message waits for the one before it in its group, so with 10
//! groups at most 10 are in flight, and each takes a lease and a completion
//! of its own: that drain is bounded by round trips, not by the handler.
//! With many groups a lease takes up to the worker's batch at once, as the
//! standard queue's does.
//!
//! ```text
//! cargo bench -p messaging-suite --bench fifo_drain                    # 20,000 messages
//! MESSAGES=5000 BENCH_DB=sqlite cargo bench -p messaging-suite --bench fifo_drain
//! ```

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context as _};
use messaging::prelude::*;
use messaging::sqlx;
use messaging::transport::Transport;
use tokio::sync::Notify;

/// The baseline: a standard queue.
#[messaging::queue("bench-fifo-standard", concurrency = 8)]
struct Standard;

/// The FIFO queue.
#[messaging::queue("bench-fifo.fifo", fifo, concurrency = 8)]
struct Fifo;

/// A message of the standard queue.
#[messaging::message(name = "bench.plain", v = 1)]
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Plain {
    /// Sequence number.
    n: u64,
}

/// A message of the FIFO queue, in its group.
#[messaging::message(name = "bench.grouped", v = 1, group = group)]
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Grouped {
    /// The message group.
    group: String,
    /// Sequence number.
    n: u64,
}

/// Counts handled messages and says when all are.
struct Counter {
    handled: AtomicU64,
    target: AtomicU64,
    done: Notify,
}

impl Counter {
    fn hit(&self) {
        let handled = self.handled.fetch_add(1, Ordering::Relaxed) + 1;
        if handled == self.target.load(Ordering::Relaxed) {
            self.done.notify_one();
        }
    }
}

#[messaging::handler(queue = Standard)]
async fn on_plain(plain: Plain, counter: State<Arc<Counter>>) {
    std::hint::black_box(plain);
    counter.hit();
}

#[messaging::handler(queue = Fifo)]
async fn on_grouped(grouped: Grouped, counter: State<Arc<Counter>>) {
    std::hint::black_box(grouped);
    counter.hit();
}

/// A `send_batch` of one chunk, boxed.
type Sending = std::pin::Pin<Box<dyn std::future::Future<Output = anyhow::Result<()>> + Send>>;

/// The longest a publish or a drain may take.
const PHASE_TIMEOUT: Duration = Duration::from_secs(300);

fn messages() -> anyhow::Result<u64> {
    std::env::var("MESSAGES").map_or(Ok(20_000), |v| v.trim().parse().context("MESSAGES must be a whole number"))
}

fn unique(prefix: &str) -> String {
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default().as_nanos();
    format!("{prefix}_{}_{nanos}", std::process::id())
}

async fn within<T>(what: &str, future: impl std::future::Future<Output = T>) -> anyhow::Result<T> {
    tokio::time::timeout(PHASE_TIMEOUT, future).await.map_err(|_| anyhow!("{what} took longer than {PHASE_TIMEOUT:?}"))
}

/// Publishes `items` to `Q` (not timed), then drains the queue with the
/// worker; returns the drain time.
async fn drain<Q: Queue, M: messaging::Message + Clone>(
    transport: &Arc<dyn Transport>,
    items: &[M],
    send: impl Fn(Publisher, Vec<M>) -> Sending,
) -> anyhow::Result<Duration> {
    let mut app = messaging::App::new(transport.clone()).await.context("assembling the app")?;
    app.only_queues(&[Q::SPEC.name]);
    let counter = Arc::new(Counter {
        handled: AtomicU64::new(0),
        target: AtomicU64::new(items.len() as u64),
        done: Notify::new(),
    });
    app.setup().provide(counter.clone());
    let publisher = app.setup().publisher();
    within("publishing", async {
        for chunk in items.chunks(1_000) {
            send(publisher.clone(), chunk.to_vec()).await?;
        }
        anyhow::Ok(())
    })
    .await??;
    let depth = transport.depth(Q::SPEC.name).await?;
    if depth != items.len() as u64 {
        bail!("queue `{}` holds {depth} messages after publishing {}", Q::SPEC.name, items.len());
    }
    let started = Instant::now();
    let running = app.start().context("starting the worker")?;
    let drained = within("draining", async {
        counter.done.notified().await;
        while transport.depth(Q::SPEC.name).await? > 0 {
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        anyhow::Ok(started.elapsed())
    })
    .await;
    within("stopping the worker", running.stop()).await?;
    drained?
}

async fn standard(transport: &Arc<dyn Transport>, n: u64) -> anyhow::Result<Duration> {
    let items: Vec<Plain> = (0..n).map(|n| Plain { n }).collect();
    drain::<Standard, _>(transport, &items, |publisher, chunk| {
        Box::pin(async move {
            for sent in publisher.send_batch::<Standard, _>(&chunk).await {
                sent.context("publishing")?;
            }
            Ok(())
        })
    })
    .await
}

async fn fifo(transport: &Arc<dyn Transport>, n: u64, groups: u64) -> anyhow::Result<Duration> {
    let items: Vec<Grouped> = (0..n).map(|n| Grouped { group: format!("g{}", n % groups), n }).collect();
    drain::<Fifo, _>(transport, &items, |publisher, chunk| {
        Box::pin(async move {
            for sent in publisher.send_batch::<Fifo, _>(&chunk).await {
                sent.context("publishing")?;
            }
            Ok(())
        })
    })
    .await
}

fn median(mut times: Vec<Duration>) -> Duration {
    times.sort();
    times[times.len() / 2]
}

/// The drains on one database, printed with their ratios to the standard queue's.
async fn measure(db: &str, transport: Arc<dyn Transport>, n: u64) -> anyhow::Result<()> {
    let shapes: [(&str, u64); 3] = [("10 groups", 10), ("600 groups", 600), ("a group per message", n)];
    let mut base = Vec::new();
    let mut fifos: Vec<Vec<Duration>> = vec![Vec::new(); shapes.len()];
    for _ in 0..3 {
        base.push(standard(&transport, n).await.context("the standard drain")?);
        for (times, (name, groups)) in fifos.iter_mut().zip(shapes) {
            times.push(fifo(&transport, n, groups).await.with_context(|| format!("the FIFO drain, {name}"))?);
        }
    }
    let rate = |d: Duration| n as f64 / d.as_secs_f64();
    let base = rate(median(base));
    println!("{db}: {n} messages, concurrency 8, medians of three");
    println!("  {:<44} {base:>10.0} msgs/s   1.00 x baseline", "baseline: standard queue");
    for (times, (name, _)) in fifos.into_iter().zip(shapes) {
        let fifo = rate(median(times));
        println!("  {:<44} {fifo:>10.0} msgs/s   {:.2} x baseline", format!("FIFO queue, {name}"), fifo / base);
    }
    Ok(())
}

async fn postgres(n: u64) -> anyhow::Result<()> {
    let base = std::env::var("TEST_POSTGRES_URL").unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into());
    let admin = sqlx::PgPool::connect(&base).await.context("connect to PostgreSQL")?;
    let schema = unique("bench_fifo");
    sqlx::raw_sql(&format!("CREATE SCHEMA {schema}")).execute(&admin).await?;
    let sep = if base.contains('?') { '&' } else { '?' };
    let url = format!("{base}{sep}schema={schema}&migrate=true");
    let result = async { measure("postgresql", messaging::transport::connect(&url).await?, n).await }.await;
    sqlx::raw_sql(&format!("DROP SCHEMA {schema} CASCADE")).execute(&admin).await?;
    result
}

async fn sqlite(n: u64) -> anyhow::Result<()> {
    let path = std::env::temp_dir().join(format!("{}.db", unique("bench_fifo")));
    let url = format!("sqlite://{}?mode=rwc&migrate=true", path.display());
    let result = async { measure("sqlite", messaging::transport::connect(&url).await?, n).await }.await;
    for suffix in ["", "-wal", "-shm"] {
        let _ = std::fs::remove_file(format!("{}{suffix}", path.display()));
    }
    result
}

fn main() -> anyhow::Result<()> {
    let filter = std::env::var("RUST_LOG").unwrap_or_else(|_| "warn".to_owned());
    tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).init();
    let n = messages()?;
    let which = std::env::var("BENCH_DB").unwrap_or_default();
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
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
