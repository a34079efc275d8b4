//! How much one receive of the worker's takes on the database queues: up to
//! 1,000 messages (the transport's `max_batch`, what the worker asks for when
//! handlers are fast) from a standard queue, and no more than 300 heads from
//! a FIFO queue, whose lease reads four times as many rows as it may take;
//! and, for large bodies, about 8 MiB of them.
#![cfg(all(feature = "postgres", feature = "sqlite"))]

use crate::fixtures;

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use messaging::prelude::*;

#[messaging::queue("batches-plain")]
struct Plain;

#[messaging::queue("batches-heads.fifo", fifo)]
struct Heads;

#[messaging::message(name = "test.batches", v = 1)]
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Item {
    n: u32,
}

#[tokio::test]
async fn a_receive_takes_up_to_1000_messages_and_300_fifo_heads() {
    for (url, _guard) in fixtures::both_databases("&migrate=true").await {
        let transport = messaging::transport::connect(&url).await.expect("connect");
        let mut app = messaging::App::new(transport.clone()).await.expect("app");
        let publisher = app.setup().publisher();
        // Enough for a full receive in either of PostgreSQL's two partitions
        // (a receive leases from one of them, rows by `id % 2`).
        let items: Vec<Item> = (0..2_400).map(|n| Item { n }).collect();
        for result in publisher.send_batch::<Plain, _>(&items).await {
            result.expect("published");
        }
        // A group per message: every message is a head.
        for n in 0..400 {
            publisher.send::<Heads, _>(&Item { n }).group(format!("g{n}")).await.expect("published");
        }
        let max = transport.max_batch();
        assert_eq!(max, 1_000, "{url}");
        let plain = transport.receive("batches-plain", max, Duration::from_secs(1)).await.expect("receive");
        assert_eq!(plain.len(), 1_000, "{url}: a standard queue's receive");
        let heads = transport.receive("batches-heads.fifo", max, Duration::from_secs(1)).await.expect("receive");
        assert_eq!(heads.len(), 300, "{url}: a FIFO queue's receive");
        let rest = transport.receive("batches-heads.fifo", max, Duration::from_secs(1)).await.expect("receive");
        assert_eq!(rest.len(), 100, "{url}: the other heads");
        let acks = transport.ack("batches-plain", plain.into_iter().map(|d| d.receipt).collect()).await;
        assert!(acks.iter().all(Result::is_ok), "{url}: {acks:?}");
        drop(app);
    }
}

#[messaging::queue("batches-large", concurrency = 8)]
struct Large;

#[messaging::message(name = "test.batches_large", v = 1)]
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Blob {
    n: u32,
    data: String,
}

/// Handlers started; once `HOLD` is set, they wait until it is cleared.
static STARTED: AtomicU32 = AtomicU32::new(0);
static HOLD: AtomicBool = AtomicBool::new(false);
/// Handled quickly first, then held.
const QUICK: u32 = 40;
const HELD: u32 = 260;
const WAKES: u32 = 6;

#[messaging::handler(queue = Large)]
async fn take_blob(blob: Blob) {
    STARTED.fetch_add(1, Ordering::SeqCst);
    std::hint::black_box(blob.data.len() + blob.n as usize);
    while HOLD.load(Ordering::SeqCst) {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Publishes `count` blobs of `size` bytes numbered from `from`, `per_call`
/// in a call.
async fn publish_blobs(publisher: &Publisher, from: u32, count: u32, per_call: usize, size: usize) {
    let data = "x".repeat(size);
    for chunk in (from..from + count).collect::<Vec<_>>().chunks(per_call) {
        let blobs: Vec<Blob> = chunk.iter().map(|&n| Blob { n, data: data.clone() }).collect();
        for result in publisher.send_batch::<Large, _>(&blobs).await {
            result.expect("published");
        }
    }
}

/// The bodies the held messages have.
const LARGE: usize = 256 * 1024;

/// Fast handlers of 256 KiB bodies: the worker's receives ask for what
/// fits in about 8 MiB (32 of them), not for the 1,000 the handlers' pace
/// alone would ask for. Before the bound, a worker held every message of
/// the queue here (each of its receives ahead took up to 1,000), and a
/// consumer of 2,000 bodies of 512 KiB peaked at 2 GB of memory.
///
/// Then the same after handlers of bodies of 200 bytes: the receives
/// waiting were asked for 1,000 by those, and the lease itself bounds what
/// they bring by the bodies' lengths. Before the lease did, the worker held
/// all 260 messages of 256 KiB that arrived.
#[tokio::test]
async fn large_bodies_are_received_about_8_mib_at_a_time() {
    for quick in [LARGE, 200] {
        received_about_8_mib_at_a_time(quick).await;
    }
}

/// [`large_bodies_are_received_about_8_mib_at_a_time`], after handlers of
/// bodies of `quick` bytes.
async fn received_about_8_mib_at_a_time(quick: usize) {
    for (url, _guard) in fixtures::both_databases("&migrate=true").await {
        STARTED.store(0, Ordering::SeqCst);
        HOLD.store(false, Ordering::SeqCst);
        let transport = messaging::transport::connect(&url).await.expect("connect");
        let mut app = messaging::App::new(Arc::clone(&transport)).await.expect("app");
        app.only_queues(&["batches-large"]);
        let publisher = app.setup().publisher();
        // Quick handlers first, which makes the handlers' pace ask for
        // full batches.
        publish_blobs(&publisher, 0, QUICK, 20, quick).await;
        let running = app.start().expect("start");
        fixtures::eventually(
            Duration::from_secs(30),
            || STARTED.load(Ordering::SeqCst) >= QUICK,
            || format!("{url}: {} of {QUICK} handled", STARTED.load(Ordering::SeqCst)),
        )
        .await;
        // The receives waiting now were asked before the pace was known:
        // one message at a time ends each, and the next is asked with it.
        for n in QUICK..QUICK + WAKES {
            publish_blobs(&publisher, n, 1, 1, quick).await;
            fixtures::eventually(
                Duration::from_secs(30),
                || STARTED.load(Ordering::SeqCst) > n,
                || format!("{url}: {} of {} handled", STARTED.load(Ordering::SeqCst), n + 1),
            )
            .await;
        }
        // Then the lanes wait, and the receives ahead take what they ask
        // for: the held ones come in one call, all at once.
        HOLD.store(true, Ordering::SeqCst);
        publish_blobs(&publisher, QUICK + WAKES, HELD, HELD as usize, LARGE).await;
        fixtures::eventually(
            Duration::from_secs(30),
            || STARTED.load(Ordering::SeqCst) >= QUICK + WAKES + 8,
            || format!("{url}: {} handlers started", STARTED.load(Ordering::SeqCst)),
        )
        .await;
        tokio::time::sleep(Duration::from_millis(1_500)).await;
        let counts = transport.counts("batches-large").await.expect("counts");
        let held = counts.in_flight.expect("in flight");
        assert!(
            held <= 8 + 3 * 32,
            "{url}: the worker holds {held} messages of 256 KiB after bodies of {quick} bytes (eight lanes, and \
             receives of 32 at most)"
        );
        HOLD.store(false, Ordering::SeqCst);
        fixtures::eventually(
            Duration::from_secs(60),
            || STARTED.load(Ordering::SeqCst) >= QUICK + WAKES + HELD,
            || format!("{url}: {} of {} handled", STARTED.load(Ordering::SeqCst), QUICK + WAKES + HELD),
        )
        .await;
        let stopped = running.stop().await;
        assert_eq!(stopped.not_acknowledged, 0, "{url}: {stopped:?}");
        // A statement cut off by the stop closes its connection in a task
        // of the pool's: let it run before the schema is dropped (this
        // test's runtime has one thread, which the drop blocks).
        drop(transport);
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}
