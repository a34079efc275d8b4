//! Amazon SQS consumption and publishing against moto_server, in one program:
//! API requests per processed message and msgs/s for
//!
//! * a baseline reproducing the seed's strict-sequential poller (receive 10,
//!   handle, delete one by one), on the raw SDK;
//! * this transport with defaults (concurrency 1) and with concurrency 8, on a
//!   standard queue, and on a FIFO queue with 10 groups;
//! * publishing one by one vs batched;
//! * requests per message draining a backlog of `ACK_MESSAGES` (1,000) at
//!   concurrency 8 with handlers of 0, 1 and 5 ms, on a standard and a FIFO
//!   queue (10 groups): what acknowledgements cost once handlers take time.
//!
//! moto's cost per request grows with queue depth, so compare requests per
//! message first; msgs/s are measured at a depth of `MESSAGES` (200).
//!
//! ```text
//! cargo bench -p messaging-suite --bench sqs_throughput
//! BENCH_SQS_SERVERS=localstack cargo bench -p messaging-suite --bench sqs_throughput   # one server
//! ```

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use messaging::prelude::*;
use messaging::transport::sqs::SqsTransport;
use messaging::transport::Transport;

#[messaging::queue("bench-base")]
struct Base;

#[messaging::queue("bench-one")]
struct One;

#[messaging::queue("bench-eight", concurrency = 8)]
struct Eight;

#[messaging::queue("bench-groups.fifo", fifo, concurrency = 8)]
struct Groups;

/// The payload.
#[messaging::message(name = "bench.sqs", v = 1, group = group)]
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Tick {
    n: usize,
    group: String,
}

#[messaging::handler(queue = One)]
async fn on_one(_t: Tick, n: State<Arc<AtomicUsize>>) {
    n.fetch_add(1, Ordering::SeqCst);
}

#[messaging::handler(queue = Eight)]
async fn on_eight(_t: Tick, n: State<Arc<AtomicUsize>>) {
    n.fetch_add(1, Ordering::SeqCst);
}

#[messaging::handler(queue = Groups)]
async fn on_groups(_t: Tick, n: State<Arc<AtomicUsize>>) {
    n.fetch_add(1, Ordering::SeqCst);
}

#[messaging::queue("bench-work", concurrency = 8)]
struct Work;

#[messaging::queue("bench-work.fifo", fifo, concurrency = 8)]
struct WorkFifo;

/// How long the `Work` handlers take.
#[derive(Clone, Copy)]
struct HandlerTime(Duration);

#[messaging::handler(queue = Work)]
async fn on_work(_t: Tick, n: State<Arc<AtomicUsize>>, time: State<HandlerTime>) {
    let HandlerTime(pause) = *time;
    if !pause.is_zero() {
        tokio::time::sleep(pause).await;
    }
    n.fetch_add(1, Ordering::SeqCst);
}

#[messaging::handler(queue = WorkFifo)]
async fn on_work_fifo(_t: Tick, n: State<Arc<AtomicUsize>>, time: State<HandlerTime>) {
    let HandlerTime(pause) = *time;
    if !pause.is_zero() {
        tokio::time::sleep(pause).await;
    }
    n.fetch_add(1, Ordering::SeqCst);
}

#[path = "../tests/fixtures/sqs_server.rs"]
#[allow(dead_code, unreachable_pub)]
mod sqs_server;
use sqs_server::SqsServer;

fn ticks(count: usize, groups: usize) -> Vec<Tick> {
    (0..count).map(|n| Tick { n, group: format!("g{}", n % groups) }).collect()
}

/// Publishes batched; returns (requests, elapsed).
async fn publish_batched<Q: Queue>(t: &Arc<SqsTransport>, messages: &[Tick]) -> (u64, Duration)
where
    (Q::Kind, messaging::publish::Ungrouped, Q::HasDefaultGroup, messaging::__private::Yes):
        messaging::publish::GroupResolved<Q, Tick>,
{
    let p = Publisher::new(t.clone());
    let before = t.requests();
    let started = Instant::now();
    for r in p.send_batch::<Q, _>(messages).await {
        r.expect("sent");
    }
    (t.requests() - before, started.elapsed())
}

/// The seed's poller: receive 10, handle one by one, delete one by one.
async fn baseline(t: &Arc<SqsTransport>, count: usize) -> (u64, Duration) {
    let url = t
        .client()
        .get_queue_url()
        .queue_name("bench-base")
        .send()
        .await
        .expect("url")
        .queue_url()
        .unwrap_or_default()
        .to_owned();
    let mut requests = 0u64;
    let mut handled = 0;
    let started = Instant::now();
    while handled < count {
        requests += 1;
        let out = t
            .client()
            .receive_message()
            .queue_url(&url)
            .max_number_of_messages(10)
            .wait_time_seconds(1)
            .send()
            .await
            .expect("receive");
        for m in out.messages() {
            let tick: Tick = serde_json::from_str::<serde_json::Value>(m.body().unwrap_or_default())
                .ok()
                .and_then(|v| serde_json::from_value(v["data"].clone()).ok())
                .expect("a tick");
            std::hint::black_box(tick);
            requests += 1;
            t.client()
                .delete_message()
                .queue_url(&url)
                .receipt_handle(m.receipt_handle().unwrap_or_default())
                .send()
                .await
                .expect("delete");
            handled += 1;
        }
    }
    (requests, started.elapsed())
}

/// Drains `queue` with the framework; returns (requests, elapsed).
async fn framework(t: &Arc<SqsTransport>, queue: &'static str, count: usize) -> (u64, Duration) {
    drain(t, queue, count, Duration::ZERO).await
}

/// Drains `queue` with handlers taking `time`; returns (requests, elapsed).
async fn drain(t: &Arc<SqsTransport>, queue: &'static str, count: usize, time: Duration) -> (u64, Duration) {
    let mut app = messaging::App::new(t.clone() as Arc<dyn Transport>).await.expect("app");
    app.only_queues(&[queue]);
    let handled = Arc::new(AtomicUsize::new(0));
    app.setup().provide(handled.clone()).provide(HandlerTime(time));
    app.set_receive_wait(Duration::from_secs(1));
    let before = t.requests();
    let started = Instant::now();
    let running = app.start().expect("start");
    let deadline = Instant::now() + Duration::from_secs(300);
    while handled.load(Ordering::SeqCst) < count {
        assert!(Instant::now() < deadline, "{queue}: drained only {} in 5 minutes", handled.load(Ordering::SeqCst));
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let elapsed = started.elapsed();
    // Let the last deletes go out before counting.
    tokio::time::sleep(Duration::from_millis(100)).await;
    let requests = t.requests() - before;
    running.stop().await;
    (requests, elapsed)
}

fn line(label: &str, count: usize, (requests, elapsed): (u64, Duration), base_rate: Option<f64>) -> f64 {
    let rate = count as f64 / elapsed.as_secs_f64();
    let ratio = base_rate.map(|b| format!("{:.2} x baseline", rate / b)).unwrap_or_else(|| "1.00 x baseline".into());
    println!("{label:<44} {:>6.3} req/msg {:>9.0} msgs/s   {ratio}", requests as f64 / count as f64, rate);
    rate
}

fn main() {
    let count: usize = std::env::var("MESSAGES").ok().and_then(|v| v.parse().ok()).unwrap_or(200);
    let servers = std::env::var("BENCH_SQS_SERVERS").unwrap_or_else(|_| "moto,localstack".into());
    std::env::set_var("AWS_ACCESS_KEY_ID", "test");
    std::env::set_var("AWS_SECRET_ACCESS_KEY", "test");
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().expect("runtime");
    for name in servers.split(',').map(str::trim) {
        let server = match name {
            "moto" => SqsServer::moto(),
            "localstack" => SqsServer::localstack(),
            other => Err(format!("unknown server {other:?} in BENCH_SQS_SERVERS (moto, localstack)")),
        };
        match server {
            Ok(server) => runtime.block_on(measure(&server, count)),
            Err(why) => println!("{name}: not measured: {why}\n"),
        }
    }
}

/// Publishing and consuming on one server.
async fn measure(server: &SqsServer, count: usize) {
    let t = Arc::new(messaging::transport::sqs::connect(&server.url(true)).await.expect("connect"));
    messaging::App::new(t.clone() as Arc<dyn Transport>).await.expect("declare the queues");
    println!("Amazon SQS on {}, {count} messages per run (queue depth {count} at the start)", server.name);

    // Publishing.
    let p = Publisher::new(t.clone());
    let one_by_one = {
        let before = t.requests();
        let started = Instant::now();
        for tick in ticks(count, 1) {
            p.send::<Base, _>(&tick).await.expect("sent");
        }
        (t.requests() - before, started.elapsed())
    };
    let base_publish = line("publish one by one (SendMessage)", count, one_by_one, None);
    line(
        "publish batched (SendMessageBatch)",
        count,
        publish_batched::<One>(&t, &ticks(count, 1)).await,
        Some(base_publish),
    );
    publish_batched::<Eight>(&t, &ticks(count, 1)).await;
    publish_batched::<Groups>(&t, &ticks(count, 10)).await;
    println!();

    // Consuming, each queue holding `count` messages.
    let base = line("baseline: sequential poller (seed design)", count, baseline(&t, count).await, None);
    line("messaging, defaults (concurrency 1)", count, framework(&t, "bench-one", count).await, Some(base));
    line("messaging, concurrency 8", count, framework(&t, "bench-eight", count).await, Some(base));
    line(
        "messaging, FIFO, 10 groups, concurrency 8",
        count,
        framework(&t, "bench-groups.fifo", count).await,
        Some(base),
    );
    println!();

    // What acknowledging costs once handlers take time.
    let backlog: usize = std::env::var("ACK_MESSAGES").ok().and_then(|v| v.parse().ok()).unwrap_or(1000);
    println!("draining {backlog} messages at concurrency 8 (aims: standard <= 0.25, FIFO <= 0.3 requests/message)");
    for ms in [0u64, 1, 5] {
        let time = Duration::from_millis(ms);
        publish_batched::<Work>(&t, &ticks(backlog, 1)).await;
        let standard = drain(&t, "bench-work", backlog, time).await;
        publish_batched::<WorkFifo>(&t, &ticks(backlog, 10)).await;
        let fifo = drain(&t, "bench-work.fifo", backlog, time).await;
        let per = |(requests, _): (u64, Duration)| requests as f64 / backlog as f64;
        println!(
            "  {ms} ms handlers: standard {:.3} req/msg ({:.0} msgs/s), FIFO 10 groups {:.3} req/msg ({:.0} msgs/s)",
            per(standard),
            backlog as f64 / standard.1.as_secs_f64(),
            per(fifo),
            backlog as f64 / fifo.1.as_secs_f64()
        );
    }
    println!();
}
