//! Publishing: group and dedup rules, delays, attributes, batches with
//! per-message results, and failures as values.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use messaging::prelude::*;
use messaging::transport::memory::MemoryTransport;
use messaging::transport::{Delivery, Transport};

#[messaging::queue("pub-orders.fifo", fifo, default_group = "fallback")]
struct Orders;

#[messaging::queue("pub-events.fifo", fifo)]
struct Events;

#[messaging::queue("pub-mail")]
struct Mail;

#[messaging::message(name = "pub.order", v = 1, group = customer, id = order_id)]
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Order {
    order_id: String,
    customer: String,
}

#[messaging::message(name = "pub.event", v = 1)]
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Event {
    n: u32,
}

/// Serializing fails when the map is not empty (JSON keys must be strings).
#[messaging::message(name = "pub.weird", v = 1)]
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Weird {
    map: BTreeMap<(u8, u8), u32>,
}

async fn transport() -> (Arc<dyn Transport>, Publisher) {
    let t: Arc<dyn Transport> = Arc::new(MemoryTransport::new());
    for spec in [<Orders as Queue>::SPEC, <Events as Queue>::SPEC, <Mail as Queue>::SPEC] {
        t.declare(&spec).await.unwrap();
    }
    let p = Publisher::new(t.clone());
    (t, p)
}

async fn take(t: &Arc<dyn Transport>, queue: &str) -> Vec<Delivery> {
    let all = t.receive(queue, 1000, Duration::from_millis(50)).await.unwrap();
    t.ack(queue, all.iter().map(|d| d.receipt.clone()).collect()).await;
    all
}

#[tokio::test]
async fn the_group_id_comes_from_the_call_then_the_message_then_the_queue() {
    let (t, p) = transport().await;
    let order = Order { order_id: "o1".into(), customer: "c1".into() };
    p.send::<Orders, _>(&order).group("explicit").dedup_id("d1").await.unwrap();
    p.send::<Orders, _>(&order).dedup_id("d2").await.unwrap();
    p.send::<Orders, _>(&Event { n: 1 }).await.unwrap();
    p.send::<Events, _>(&Event { n: 2 }).group("g").await.unwrap();
    let groups: Vec<_> = take(&t, "pub-orders.fifo").await.into_iter().map(|d| d.group_id.unwrap()).collect();
    let mut groups = groups;
    groups.sort();
    assert_eq!(groups, ["c1", "explicit", "fallback"]);
    assert_eq!(take(&t, "pub-events.fifo").await[0].group_id.as_deref(), Some("g"));
}

#[tokio::test]
async fn message_identity_deduplicates_on_fifo_queues() {
    let (t, p) = transport().await;
    let order = Order { order_id: "same".into(), customer: "c".into() };
    let first = p.send::<Orders, _>(&order).await.unwrap();
    let second = p.send::<Orders, _>(&order).await.unwrap();
    assert_eq!(first, second, "the id field is the deduplication id");
    let third = p.send::<Orders, _>(&order).dedup_id("explicit").await.unwrap();
    assert_ne!(first, third, "an explicit dedup id wins");
    assert_eq!(t.depth("pub-orders.fifo").await.unwrap(), 2);
}

#[tokio::test]
async fn an_empty_group_is_an_error_not_a_panic() {
    let (t, p) = transport().await;
    let err = p.send::<Events, _>(&Event { n: 1 }).group("").await.unwrap_err();
    assert!(matches!(err, PublishError::EmptyGroup { queue: "pub-events.fifo" }), "{err}");
    assert_eq!(t.depth("pub-events.fifo").await.unwrap(), 0);
}

#[tokio::test]
async fn delays_and_attributes_on_standard_queues() {
    let (t, p) = transport().await;
    p.send::<Mail, _>(&Event { n: 1 }).delay(Duration::from_millis(300)).attribute("tenant", "acme").await.unwrap();
    assert!(t.receive("pub-mail", 10, Duration::ZERO).await.unwrap().is_empty(), "delayed");
    let got = t.receive("pub-mail", 10, Duration::from_secs(5)).await.unwrap();
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].attributes.get("tenant").map(String::as_str), Some("acme"));
    let too_long = p.send::<Mail, _>(&Event { n: 2 }).delay(Duration::from_secs(16 * 60)).await.unwrap_err();
    assert!(matches!(too_long, PublishError::DelayTooLong { .. }), "{too_long}");
}

#[tokio::test]
async fn attributes_follow_the_sqs_rules_on_every_transport() {
    let (t, p) = transport().await;
    let mut eight = p.send::<Mail, _>(&Event { n: 1 });
    for i in 0..8 {
        eight = eight.attribute(format!("k{i}"), "v");
    }
    eight.await.expect("eight attributes are fine");
    let mut nine = p.send::<Mail, _>(&Event { n: 2 });
    for i in 0..9 {
        nine = nine.attribute(format!("k{i}"), "v");
    }
    let err = nine.await.unwrap_err();
    assert!(matches!(err, PublishError::TooManyAttributes { count: 9, max: 8 }), "{err}");
    let err = p.send::<Mail, _>(&Event { n: 3 }).attribute("tenant", "").await.unwrap_err();
    assert!(matches!(&err, PublishError::InvalidAttribute { name, .. } if name == "tenant"), "{err}");
    assert!(err.to_string().contains("leave the attribute out"), "{err}");
    let err = p.send::<Mail, _>(&Event { n: 4 }).attribute("AWS.trace", "x").await.unwrap_err();
    assert!(err.to_string().contains("reserved by SQS"), "{err}");
    let results = p.send_batch::<Mail, _>(&[Event { n: 5 }]).attribute("bad name", "x").await;
    assert!(matches!(&results[0], Err(PublishError::InvalidAttribute { .. })), "{:?}", results[0]);
    assert_eq!(t.depth("pub-mail").await.unwrap(), 1, "only the valid message was sent");
}

#[tokio::test]
async fn a_batch_gives_one_result_per_message_in_order() {
    let (t, p) = transport().await;
    // More than one transport batch (memory sends 100 per call).
    let events: Vec<Event> = (0..250).map(|n| Event { n }).collect();
    let results = p.send_batch::<Mail, _>(&events).await;
    assert_eq!(results.len(), 250);
    let ids: Vec<_> = results.into_iter().map(Result::unwrap).collect();
    let got = take(&t, "pub-mail").await;
    assert_eq!(got.iter().map(|d| d.message_id.clone()).collect::<Vec<_>>(), ids, "sent in input order");
}

#[tokio::test]
async fn a_batch_with_bad_messages_fails_only_those() {
    let (t, p) = transport().await;
    let good = Weird { map: BTreeMap::new() };
    let bad = Weird { map: BTreeMap::from([((1, 2), 3)]) };
    let results = p.send_batch::<Mail, _>(&[good.clone(), bad, good]).await;
    assert!(results[0].is_ok());
    assert!(matches!(results[1], Err(PublishError::Serialize(_))), "{:?}", results[1]);
    assert!(results[2].is_ok());
    assert_eq!(t.depth("pub-mail").await.unwrap(), 2);
    // A FIFO batch with one explicit group.
    let results = p.send_batch::<Events, _>(&[Event { n: 1 }, Event { n: 2 }]).group("g").await;
    assert!(results.iter().all(Result::is_ok));
}

#[tokio::test]
async fn publishing_to_an_undeclared_queue_is_an_error() {
    let p = Publisher::new(Arc::new(MemoryTransport::new()));
    let err = p.send::<Mail, _>(&Event { n: 1 }).await.unwrap_err();
    assert!(matches!(err, PublishError::Transport(messaging::TransportError::QueueNotFound(_))), "{err}");
    let batch = p.send_batch::<Mail, _>(&[Event { n: 1 }, Event { n: 2 }]).await;
    assert!(batch.iter().all(Result::is_err));
}
