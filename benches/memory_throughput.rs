//! `memory://` end to end beside its peers, one scenario per process (so that
//! each peak RSS is its own), interleaved over rounds, medians printed:
//!
//! - baseline: a tokio mpsc channel carrying each order through a
//!   serde_json round trip;
//! - omniqueue's in-memory backend: `send_serde_json`, `receive_all`, `ack`;
//! - messaging on `memory://`: one `send` per message or `send_batch` of
//!   1,000, concurrency 1 and 8, a no-op handler;
//! - telemetry at concurrency 8 (`without_observability()`, an SDK meter
//!   provider with the Prometheus reader);
//! - 1,000,000 orders queued and not consumed: bytes per queued message
//!   beyond its body.
//!
//! The message is a realistic order of six fields, 119 bytes of JSON.
//!
//! ```text
//! cargo bench -p messaging-suite --bench memory_throughput                 # 1,000,000 messages, 3 rounds
//! MESSAGES=200000 ROUNDS=1 cargo bench -p messaging-suite --bench memory_throughput
//! BENCH_ONLY=messaging-c8 cargo bench -p messaging-suite --bench memory_throughput   # scenarios whose name contains it (and the two peers)
//! ```

use std::collections::BTreeMap;
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

/// The benchmark's message: an order of six fields, 119 bytes of JSON.
#[messaging::message(name = "shop.order", v = 1)]
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Order {
    order_id: String,
    customer_id: String,
    sku: String,
    quantity: u32,
    unit_price_cents: u64,
    placed_at: String,
}

fn order(n: u64) -> Order {
    Order {
        order_id: format!("ord-{n:010}"),
        customer_id: format!("cus-{:08}", n % 100_000),
        sku: "SKU-2231-BLUE-M".to_owned(),
        quantity: 1 + (n % 5) as u32,
        unit_price_cents: 1_999,
        placed_at: "2026-12-02T17:37:09Z".to_owned(),
    }
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
async fn on_sequential(order: Order, counter: State<Arc<Counter>>) {
    std::hint::black_box(order);
    counter.hit();
}

#[messaging::handler(queue = Parallel)]
async fn on_parallel(order: Order, counter: State<Arc<Counter>>) {
    std::hint::black_box(order);
    counter.hit();
}

const CHUNK: usize = 1_000;
const MAX_BACKLOG: u64 = 100_000;

/// How a messaging scenario publishes and what it observes.
#[derive(Clone, Copy)]
struct Setup {
    batch: bool,
    quiet: bool,
    collector: bool,
}

async fn messaging<Q: Queue<Kind = messaging::Standard>>(messages: u64, how: Setup) -> Duration {
    if how.collector {
        let provider = opentelemetry_sdk::metrics::SdkMeterProvider::builder()
            .with_reader(messaging::telemetry::prometheus_reader().expect("reader"))
            .build();
        opentelemetry::global::set_meter_provider(provider);
    }
    let transport = Arc::new(MemoryTransport::new());
    let mut app = messaging::App::new(transport.clone()).await.expect("valid app");
    app.only_queues(&[Q::SPEC.name]);
    if how.quiet {
        app.setup().without_observability();
    }
    let counter = Arc::new(Counter { handled: AtomicU64::new(0), target: messages, done: Notify::new() });
    app.setup().provide(counter.clone());
    let publisher = app.setup().publisher();
    let running = app.start().expect("starts");
    let started = Instant::now();
    let producer = tokio::spawn(async move {
        let chunk: Vec<Order> = (0..CHUNK as u64).map(order).collect();
        let mut sent = 0;
        while sent < messages {
            let n = (messages - sent).min(CHUNK as u64) as usize;
            if how.batch {
                for result in publisher.send_batch::<Q, _>(&chunk[..n]).await {
                    result.expect("published");
                }
            } else {
                for one in &chunk[..n] {
                    publisher.send::<Q, _>(one).await.expect("published");
                }
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

async fn mpsc(messages: u64) -> Duration {
    let (tx, mut rx) = tokio::sync::mpsc::channel::<Vec<u8>>(CHUNK);
    let started = Instant::now();
    let producer = tokio::spawn(async move {
        for n in 0..messages {
            let body = serde_json::to_vec(&order(n)).expect("serializes");
            tx.send(body).await.expect("open");
        }
    });
    let mut handled = 0;
    while let Some(body) = rx.recv().await {
        let order: Order = serde_json::from_slice(&body).expect("deserializes");
        std::hint::black_box(order);
        handled += 1;
    }
    assert_eq!(handled, messages);
    producer.await.expect("producer");
    started.elapsed()
}

async fn omniqueue(messages: u64) -> Duration {
    let (producer, mut consumer) =
        omniqueue::backends::InMemoryBackend::builder().build_pair().await.expect("in-memory queue");
    let started = Instant::now();
    let sending = tokio::spawn(async move {
        for n in 0..messages {
            producer.send_serde_json(&order(n)).await.expect("sent");
        }
    });
    let mut handled = 0;
    while handled < messages {
        for delivery in consumer.receive_all(100, Duration::from_secs(1)).await.expect("received") {
            let order: Option<Order> = delivery.payload_serde_json().expect("deserializes");
            std::hint::black_box(order);
            delivery.ack().await.map_err(|(e, _)| e).expect("acked");
            handled += 1;
        }
    }
    sending.await.expect("producer");
    started.elapsed()
}

/// Publishes `messages` orders to `memory://` and consumes none: bytes of
/// memory per queued message, and the body's length.
async fn queued(messages: u64) -> (f64, usize) {
    let transport: Arc<dyn Transport> = Arc::new(MemoryTransport::new());
    transport.declare(&<Sequential as Queue>::SPEC).await.expect("declare");
    let publisher = Publisher::new(transport.clone());
    let chunk: Vec<Order> = (0..CHUNK as u64).map(order).collect();
    // Warm up the allocator and the runtime, then measure from here.
    for result in publisher.send_batch::<Sequential, _>(&chunk).await {
        result.expect("published");
    }
    let before = current_rss_kb();
    let mut sent = CHUNK as u64;
    while sent < messages + CHUNK as u64 {
        for result in publisher.send_batch::<Sequential, _>(&chunk).await {
            result.expect("published");
        }
        sent += CHUNK as u64;
    }
    let after = current_rss_kb();
    let body = messaging::envelope::encode(&order(0)).expect("encodes").len();
    std::hint::black_box(&transport);
    ((after - before) as f64 * 1024.0 / messages as f64, body)
}

/// A line of `/proc/self/status`, in kB.
fn status_kb(field: &str) -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find(|l| l.starts_with(field))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

fn current_rss_kb() -> u64 {
    status_kb("VmRSS:")
}

fn rate(messages: u64, elapsed: Duration) -> f64 {
    messages as f64 / elapsed.as_secs_f64()
}

/// The scenarios, in the order they run in each round.
const SCENARIOS: &[&str] = &[
    "mpsc",
    "omniqueue",
    "messaging-c1-send",
    "messaging-c8-send",
    "messaging-c1-batch",
    "messaging-c8-batch",
    "telemetry-c8-quiet",
    "telemetry-c8-collector",
];

/// CPU time this process has used (user and system), from `/proc/self/stat`
/// in clock ticks of 10 ms: beside the rate, a figure that the machine's
/// other load moves much less.
fn cpu_time() -> Duration {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    // The fields after the command name (which may hold spaces), from the 3rd on.
    let after = stat.rsplit_once(')').map_or("", |(_, rest)| rest);
    let ticks: u64 = after.split_whitespace().skip(11).take(2).filter_map(|v| v.parse::<u64>().ok()).sum();
    Duration::from_millis(ticks * 10)
}

/// Runs one scenario in this process; prints `RESULT name value peak_kb cpu_ns_per_message`.
fn scenario(name: &str, messages: u64) {
    let cpu = cpu_time();
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().expect("runtime");
    let send = Setup { batch: false, quiet: false, collector: false };
    let batch = Setup { batch: true, ..send };
    let value = runtime.block_on(async {
        match name {
            "mpsc" => rate(messages, mpsc(messages).await),
            "omniqueue" => rate(messages, omniqueue(messages).await),
            "messaging-c1-send" => rate(messages, messaging::<Sequential>(messages, send).await),
            "messaging-c8-send" => rate(messages, messaging::<Parallel>(messages, send).await),
            "messaging-c1-batch" => rate(messages, messaging::<Sequential>(messages, batch).await),
            "messaging-c8-batch" => rate(messages, messaging::<Parallel>(messages, batch).await),
            "telemetry-c8-quiet" => {
                rate(messages, messaging::<Parallel>(messages, Setup { quiet: true, ..batch }).await)
            }
            "telemetry-c8-collector" => {
                rate(messages, messaging::<Parallel>(messages, Setup { collector: true, ..batch }).await)
            }
            "queued" => {
                let (per_message, body) = queued(messages).await;
                println!("BODY {body}");
                per_message
            }
            other => panic!("unknown scenario {other}"),
        }
    });
    let cpu_ns = (cpu_time() - cpu).as_nanos() as f64 / messages as f64;
    println!("RESULT {name} {value} {} {cpu_ns}", status_kb("VmHWM:"));
}

/// Runs `name` in a fresh process of this program: (value, peak RSS in kB,
/// CPU nanoseconds per message, the body's length for "queued").
fn in_process(name: &str, messages: u64) -> (f64, u64, f64, Option<usize>) {
    let out = std::process::Command::new(std::env::current_exe().expect("this program"))
        .env("BENCH_SCENARIO", name)
        .env("MESSAGES", messages.to_string())
        .output()
        .expect("runs");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{name} failed: {}", String::from_utf8_lossy(&out.stderr));
    let body = text.lines().find_map(|l| l.strip_prefix("BODY ")).and_then(|b| b.parse().ok());
    let line = text.lines().find_map(|l| l.strip_prefix("RESULT ")).expect("a result line");
    let mut fields = line.split_whitespace().skip(1);
    let value = fields.next().and_then(|v| v.parse().ok()).expect("a value");
    let peak = fields.next().and_then(|v| v.parse().ok()).expect("a peak");
    let cpu = fields.next().and_then(|v| v.parse().ok()).expect("a CPU time");
    (value, peak, cpu, body)
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(|a, b| a.total_cmp(b));
    values[values.len() / 2]
}

fn main() {
    let messages: u64 = std::env::var("MESSAGES").ok().and_then(|v| v.parse().ok()).unwrap_or(1_000_000);
    if let Ok(name) = std::env::var("BENCH_SCENARIO") {
        scenario(&name, messages);
        return;
    }
    let rounds: usize = std::env::var("ROUNDS").ok().and_then(|v| v.parse().ok()).unwrap_or(3);
    let only = std::env::var("BENCH_ONLY").unwrap_or_default();
    let chosen: Vec<&str> = SCENARIOS
        .iter()
        .copied()
        .filter(|s| only.is_empty() || s.contains(&only) || ["mpsc", "omniqueue"].contains(s))
        .collect();
    println!(
        "memory:// end to end, {messages} orders of 119 bytes, {rounds} round(s), {} cores; one process per scenario",
        std::thread::available_parallelism().map_or(0, |n| n.get())
    );
    let mut rates: BTreeMap<&str, Vec<f64>> = BTreeMap::new();
    let mut peaks: BTreeMap<&str, Vec<f64>> = BTreeMap::new();
    let mut to_mpsc: BTreeMap<&str, Vec<f64>> = BTreeMap::new();
    let mut to_omniqueue: BTreeMap<&str, Vec<f64>> = BTreeMap::new();
    let mut to_quiet: BTreeMap<&str, Vec<f64>> = BTreeMap::new();
    let mut cpus: BTreeMap<&str, Vec<f64>> = BTreeMap::new();
    for round in 0..rounds {
        let mut this = BTreeMap::new();
        for &name in &chosen {
            let (value, peak, cpu, _) = in_process(name, messages);
            eprintln!(
                "round {}: {name:<24} {value:>12.0} msgs/s  peak {:>6} MB  CPU {cpu:>6.0} ns/msg",
                round + 1,
                peak / 1024
            );
            cpus.entry(name).or_default().push(cpu);
            this.insert(name, value);
            rates.entry(name).or_default().push(value);
            peaks.entry(name).or_default().push(peak as f64 / 1024.0);
        }
        for (&name, &value) in &this {
            if let Some(base) = this.get("mpsc") {
                to_mpsc.entry(name).or_default().push(value / base);
            }
            if let Some(peer) = this.get("omniqueue") {
                to_omniqueue.entry(name).or_default().push(value / peer);
            }
            if let Some(quiet) = this.get("telemetry-c8-quiet") {
                to_quiet.entry(name).or_default().push(value / quiet);
            }
        }
    }
    println!(
        "\n{:<24} {:>12} {:>9} {:>12} {:>9} {:>12}",
        "scenario", "msgs/s", "× mpsc", "× omniqueue", "peak MB", "CPU ns/msg"
    );
    for &name in &chosen {
        let ratio =
            |m: &BTreeMap<&str, Vec<f64>>| m.get(name).map_or("-".to_owned(), |v| format!("{:.2}", median(v.clone())));
        println!(
            "{name:<24} {:>12.0} {:>9} {:>12} {:>9.0} {:>12.0}",
            median(rates[name].clone()),
            ratio(&to_mpsc),
            ratio(&to_omniqueue),
            median(peaks[name].clone()),
            median(cpus[name].clone())
        );
    }
    if to_quiet.contains_key("telemetry-c8-collector") {
        println!(
            "\ntelemetry at concurrency 8 (send_batch), × without_observability(): metrics without a collector {:.2}, \
             an SDK meter provider with the Prometheus reader {:.2}",
            median(to_quiet["messaging-c8-batch"].clone()),
            median(to_quiet["telemetry-c8-collector"].clone())
        );
    }
    if only.is_empty() || "queued".contains(&only) {
        let (per_message, _, _, body) = in_process("queued", messages);
        let body = body.unwrap_or(0);
        println!(
            "\n{messages} orders queued, none consumed: {per_message:.0} bytes of memory per message, of which the \
             body is {body}: {:.0} beyond it",
            per_message - body as f64
        );
    }
}
