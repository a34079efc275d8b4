//! How much one receive of the worker's takes on the database queues: up to
//! 1,000 messages (the transport's `max_batch`, what the worker asks for when
//! handlers are fast) from a standard queue, and no more than 300 heads from
//! a FIFO queue, whose lease reads four times as many rows as it may take.
#![cfg(all(feature = "postgres", feature = "sqlite"))]

use crate::fixtures;

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
