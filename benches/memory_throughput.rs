//! End-to-end throughput on `memory://`: 1,000,000 small messages published in
//! batches and handled by a no-op handler, with concurrency 1 and 8, beside a
//! baseline measured in the same run: a tokio mpsc channel carrying the same
//! payload through a serde_json round trip.
//!
//! Then the cost of telemetry, at concurrency 8, against the same app with
//! `without_observability()`: metrics on without a collector (no meter
//! provider: the default), metrics collected by an SDK meter provider with the
//! Prometheus reader of `/metrics`, and with the log subscriber at `INFO`
//! that `#[messaging::main]` installs.
//!
//! ```text
//! cargo bench -p messaging-suite --bench memory_throughput            # 1,000,000 messages
//! MESSAGES=200000 cargo bench -p messaging-suite --bench memory_throughput
//! ```

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use messaging::prelude::*;
use messaging::transport::memory::MemoryTransport;
use messaging::transport::Transport;
use tokio::sync::Notify;

#[messaging::queue("bench-sequential")]
struct Sequential;

#[messaging::queue("bench-parallel", concurrency = 8)]
struct Parallel;

/// The benchmark's payload.
#[messaging::message(name = "bench.tick", v = 1)]
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Tick {
    n: u64,
    label: String,
}

/// Counts handled messages and wakes the benchmark at the target.
struct Counter {
    handled: AtomicU64,
    target: u64,
    done: Notify,
}

impl Counter {
    fn hit(&self) {
        if self.handled.fetch_add(1, Ordering::Relaxed) + 1 == self.target {
            self.done.notify_one();
        }
    }
}

#[messaging::handler(queue = Sequential)]
async fn on_sequential(tick: Tick, counter: State<Arc<Counter>>) {
    std::hint::black_box(tick);
    counter.hit();
}

#[messaging::handler(queue = Parallel)]
async fn on_parallel(tick: Tick, counter: State<Arc<Counter>>) {
    std::hint::black_box(tick);
    counter.hit();
}

fn tick(n: u64) -> Tick {
    Tick { n, label: "bench".to_owned() }
}

const CHUNK: usize = 1_000;
const MAX_BACKLOG: u64 = 100_000;

async fn framework<Q: Queue<Kind = messaging::Standard>>(messages: u64) -> Duration {
    run::<Q>(messages, false).await
}

async fn run<Q: Queue<Kind = messaging::Standard>>(messages: u64, quiet: bool) -> Duration {
    let transport = Arc::new(MemoryTransport::new());
    let mut app = messaging::App::new(transport.clone()).await.expect("valid app");
    app.only_queues(&[Q::SPEC.name]);
    if quiet {
        app.setup().without_observability();
    }
    let counter = Arc::new(Counter { handled: AtomicU64::new(0), target: messages, done: Notify::new() });
    app.setup().provide(counter.clone());
    let publisher = app.setup().publisher();
    let running = app.start().expect("starts");
    let started = Instant::now();
    let producer = tokio::spawn(async move {
        let chunk: Vec<Tick> = (0..CHUNK as u64).map(tick).collect();
        let mut sent = 0;
        while sent < messages {
            let n = (messages - sent).min(CHUNK as u64) as usize;
            for result in publisher.send_batch::<Q, _>(&chunk[..n]).await {
                result.expect("published");
            }
            sent += n as u64;
            // Keep the backlog bounded, as a real producer would be.
            while transport.depth(Q::SPEC.name).await.unwrap_or(0) > MAX_BACKLOG {
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
        }
    });
    counter.done.notified().await;
    let elapsed = started.elapsed();
    producer.await.expect("producer");
    running.stop().await;
    elapsed
}

async fn baseline(messages: u64) -> Duration {
    let (tx, mut rx) = tokio::sync::mpsc::channel::<Vec<u8>>(CHUNK);
    let started = Instant::now();
    let producer = tokio::spawn(async move {
        for n in 0..messages {
            let body = serde_json::to_vec(&tick(n)).expect("serializes");
            tx.send(body).await.expect("open");
        }
    });
    let mut handled = 0;
    while let Some(body) = rx.recv().await {
        let tick: Tick = serde_json::from_slice(&body).expect("deserializes");
        std::hint::black_box(tick);
        handled += 1;
    }
    assert_eq!(handled, messages);
    producer.await.expect("producer");
    started.elapsed()
}

fn rate(messages: u64, elapsed: Duration) -> f64 {
    messages as f64 / elapsed.as_secs_f64()
}

fn main() {
    let messages: u64 = std::env::var("MESSAGES").ok().and_then(|v| v.parse().ok()).unwrap_or(1_000_000);
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().expect("runtime");
    runtime.block_on(async {
        println!(
            "memory:// end to end, {messages} messages, {} worker threads",
            std::thread::available_parallelism().map_or(0, |n| n.get())
        );
        let base = rate(messages, baseline(messages).await);
        println!("{:<36} {:>12.0} msgs/s   1.00 x baseline", "baseline (mpsc + serde_json)", base);
        let seq = rate(messages, framework::<Sequential>(messages).await);
        println!("{:<36} {:>12.0} msgs/s   {:.2} x baseline", "messaging, concurrency 1", seq, seq / base);
        let par = rate(messages, framework::<Parallel>(messages).await);
        println!("{:<36} {:>12.0} msgs/s   {:.2} x baseline", "messaging, concurrency 8", par, par / base);

        println!("\ntelemetry, concurrency 8 (ratio to without_observability() in the same run)");
        let quiet = rate(messages, run::<Parallel>(messages, true).await);
        let line = |what: &str, value: f64| println!("{what:<44} {value:>12.0} msgs/s   {:.2} x", value / quiet);
        line("without_observability()", quiet);
        line("metrics on, no collector (default)", rate(messages, run::<Parallel>(messages, false).await));
        // A collector: the SDK aggregates every recording for /metrics.
        let provider = opentelemetry_sdk::metrics::SdkMeterProvider::builder()
            .with_reader(messaging::telemetry::prometheus_reader().expect("reader"))
            .build();
        opentelemetry::global::set_meter_provider(provider.clone());
        line("metrics on, SDK + Prometheus reader", rate(messages, run::<Parallel>(messages, false).await));
        // The log subscriber `#[messaging::main]` installs (RUST_LOG=info),
        // writing to a sink. Last: a global subscriber cannot be removed.
        let subscriber =
            tracing_subscriber::fmt().with_max_level(tracing::Level::INFO).with_writer(std::io::sink).finish();
        tracing::subscriber::set_global_default(subscriber).expect("no subscriber yet");
        line("SDK metrics + the default log subscriber", rate(messages, run::<Parallel>(messages, false).await));
        let _ = provider.shutdown();
    });
}
