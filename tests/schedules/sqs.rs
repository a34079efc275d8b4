//! Two processes of one app on SQS (moto), each running the same schedules
//! to a standard and a FIFO queue. With an outbox in PostgreSQL (a database
//! the processes share), each tick is written once, with its ledger row, and
//! relayed: once on both queues. Without one, each process keeps its own
//! ledger: a FIFO queue still gets each tick once (its deduplication id is
//! the tick's key, within SQS's five minutes), a standard queue gets it from
//! every process.
#![cfg(all(feature = "sqs", feature = "postgres"))]

use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use messaging::schedule::{Tick, TICK_ATTRIBUTE};
use messaging::transport::Transport;

use super::processes::once_each_without_gaps;
use super::Beat;
use crate::fixtures;

#[messaging::queue("sched-sqs-beats")]
struct StandardBeats;

#[messaging::queue("sched-sqs-beats.fifo", fifo)]
struct FifoBeats;

fn beat(tick: &Tick) -> Beat {
    Beat { local: tick.local_time().to_owned(), catch_up: tick.is_catch_up() }
}

#[messaging::schedule(every = "300ms", queue = StandardBeats, name = "sqs-standard-beat", catch_up = "all")]
fn standard_beat(tick: Tick) -> Beat {
    beat(&tick)
}

#[messaging::schedule(every = "300ms", queue = FifoBeats, name = "sqs-fifo-beat", group = "beats", catch_up = "all")]
fn fifo_beat(tick: Tick) -> Beat {
    beat(&tick)
}

/// One process: the two schedules on SQS, with the outbox
/// `MESSAGING_TEST_OUTBOX` when set, for `MESSAGING_TEST_RUN_MS`.
#[test]
#[ignore = "entry point of the processes started by the tests of this module"]
fn sqs_schedule_process() {
    let Ok(url) = std::env::var("MESSAGING_TEST_URL") else { return };
    let outbox = std::env::var("MESSAGING_TEST_OUTBOX").ok();
    let run: u64 = std::env::var("MESSAGING_TEST_RUN_MS").ok().and_then(|v| v.parse().ok()).unwrap_or(3_000);
    fixtures::runtime().block_on(async move {
        let transport = messaging::transport::connect(&url).await.expect("connect");
        let mut app = messaging::App::new(transport).await.expect("app");
        app.only_queues(&["sched-sqs-beats", "sched-sqs-beats.fifo"]);
        if let Some(outbox) = outbox {
            let outbox = messaging::transport::Outbox::connect(&outbox).await.expect("outbox");
            app.setup().outbox(outbox.poll(Duration::from_millis(50)));
        }
        let running = app.start().expect("start");
        tokio::time::sleep(Duration::from_millis(run)).await;
        running.stop().await;
    });
}

fn spawn(url: &str, outbox: Option<&str>) -> std::process::Child {
    let mut command = fixtures::entry_process(module_path!(), "sqs_schedule_process");
    command
        .env("MESSAGING_TEST_URL", url)
        .env("MESSAGING_TEST_RUN_MS", "3000")
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null());
    if let Some(outbox) = outbox {
        command.env("MESSAGING_TEST_OUTBOX", outbox);
    }
    command.spawn().expect("spawn an app process")
}

/// Runs two processes 500 ms apart and waits for them.
fn run_two(url: &str, outbox: Option<&str>) {
    let mut first = spawn(url, outbox);
    std::thread::sleep(Duration::from_millis(500));
    let mut second = spawn(url, outbox);
    for process in [&mut first, &mut second] {
        let status = fixtures::wait_for(process, Duration::from_secs(60), "an app process");
        assert!(status.success(), "an app process failed: {status:?}");
    }
}

/// A transport on `url` with the two queues declared.
async fn declared(url: &str) -> Arc<dyn Transport> {
    let transport = messaging::transport::connect(url).await.expect("sqs");
    for spec in [<StandardBeats as messaging::Queue>::SPEC, <FifoBeats as messaging::Queue>::SPEC] {
        transport.declare(&spec).await.expect("declare");
    }
    transport
}

/// Receives everything `queue` holds; the tick of each message.
async fn drain(transport: &Arc<dyn Transport>, queue: &str) -> Vec<i64> {
    let mut ticks = Vec::new();
    loop {
        let batch = transport.receive(queue, 10, Duration::from_millis(500)).await.expect("receive");
        if batch.is_empty() {
            return ticks;
        }
        let receipts = batch.iter().map(|d| d.receipt.clone()).collect();
        for delivery in &batch {
            ticks.push(delivery.attributes[TICK_ATTRIBUTE].parse().expect("a tick"));
        }
        for acked in transport.ack(queue, receipts).await {
            acked.expect("ack");
        }
    }
}

#[test]
fn two_processes_on_sqs_with_an_outbox_publish_each_tick_once() {
    let moto = fixtures::SqsServer::start();
    let url = moto.url(true);
    let runtime = fixtures::runtime();
    let db = runtime.block_on(fixtures::Postgres::new());
    let outbox = format!("{}&migrate=true", db.url);
    runtime.block_on(async {
        messaging::transport::Outbox::connect(&outbox).await.expect("the outbox's tables");
    });
    run_two(&url, Some(&db.url));
    runtime.block_on(async {
        let transport = declared(&url).await;
        once_each_without_gaps(drain(&transport, "sched-sqs-beats").await, 300);
        once_each_without_gaps(drain(&transport, "sched-sqs-beats.fifo").await, 300);
    });
    runtime.block_on(db.drop());
}

#[test]
fn without_a_shared_database_fifo_deduplicates_and_standard_repeats() {
    let moto = fixtures::SqsServer::start();
    let url = moto.url(true);
    run_two(&url, None);
    fixtures::runtime().block_on(async {
        let transport = declared(&url).await;
        // Each process publishes each tick; the FIFO queue drops the repeats
        // by the tick's deduplication id.
        let fifo = drain(&transport, "sched-sqs-beats.fifo").await;
        once_each_without_gaps(fifo, 300);
        let standard = drain(&transport, "sched-sqs-beats").await;
        let mut distinct = standard.clone();
        distinct.sort_unstable();
        distinct.dedup();
        assert!(standard.len() > distinct.len(), "both processes published the ticks they shared: {standard:?}");
    });
}
