//! The SQS semantics of `memory://`, checked with tokio's paused clock.

use std::time::Duration;

use super::MemoryTransport;
use crate::error::TransportError;
use crate::queue::QueueSpec;
use crate::transport::{Outgoing, RedriveOptions, Transport};

const SECOND: Duration = Duration::from_secs(1);

fn standard(name: &'static str) -> QueueSpec {
    QueueSpec { visibility: Duration::from_secs(10), dlq: Some("dead"), max_receives: 3, ..QueueSpec::standard(name) }
}

fn fifo(name: &'static str) -> QueueSpec {
    QueueSpec {
        fifo: true,
        visibility: Duration::from_secs(10),
        dlq: Some("dead.fifo"),
        default_group: Some("default"),
        ..QueueSpec::standard(name)
    }
}

fn body(text: &str) -> Outgoing {
    Outgoing { body: text.as_bytes().to_vec().into(), ..Outgoing::default() }
}

fn grouped(text: &str, group: &str) -> Outgoing {
    Outgoing { group_id: Some(group.into()), ..body(text) }
}

async fn setup(spec: QueueSpec) -> MemoryTransport {
    let t = MemoryTransport::new();
    t.declare(&spec).await.unwrap();
    t
}

fn texts(deliveries: &[crate::transport::Delivery]) -> Vec<String> {
    deliveries.iter().map(|d| String::from_utf8_lossy(&d.body).into_owned()).collect()
}

#[tokio::test(start_paused = true)]
async fn a_received_message_is_invisible_until_its_visibility_times_out() {
    let t = setup(standard("q")).await;
    t.send("q", body("a")).await.unwrap();
    let first = t.receive("q", 10, Duration::ZERO).await.unwrap();
    assert_eq!(texts(&first), ["a"]);
    assert_eq!(first[0].receive_count, 1);
    assert!(t.receive("q", 10, Duration::ZERO).await.unwrap().is_empty(), "in flight, so invisible");
    let counts = t.counts("q").await.unwrap();
    assert_eq!((counts.in_flight, counts.expired), (Some(1), Some(0)));
    tokio::time::advance(Duration::from_secs(11)).await;
    // Past its visibility timeout it is counted as held past it, until the
    // next receive takes it back.
    let counts = t.counts("q").await.unwrap();
    assert_eq!((counts.in_flight, counts.expired), (Some(1), Some(1)));
    let again = t.receive("q", 10, Duration::ZERO).await.unwrap();
    let counts = t.counts("q").await.unwrap();
    assert_eq!((counts.in_flight, counts.expired), (Some(1), Some(0)));
    assert_eq!(texts(&again), ["a"]);
    assert_eq!(again[0].receive_count, 2);
    assert_eq!(again[0].message_id, first[0].message_id);
    // The first receipt is stale now: acking with it must not delete the message.
    let stale = t.ack("q", vec![first[0].receipt.clone()]).await;
    assert!(matches!(stale[0], Err(TransportError::StaleReceipt)));
    assert_eq!(t.depth("q").await.unwrap(), 1);
    assert!(t.ack("q", vec![again[0].receipt.clone()]).await[0].is_ok());
    assert_eq!(t.depth("q").await.unwrap(), 0);
}

#[tokio::test(start_paused = true)]
async fn extend_keeps_a_message_invisible() {
    let t = setup(standard("q")).await;
    t.send("q", body("a")).await.unwrap();
    let d = t.receive("q", 1, Duration::ZERO).await.unwrap().remove(0);
    tokio::time::advance(Duration::from_secs(8)).await;
    t.extend("q", &d.receipt, Duration::from_secs(10)).await.unwrap();
    tokio::time::advance(Duration::from_secs(8)).await;
    assert!(t.receive("q", 1, Duration::ZERO).await.unwrap().is_empty(), "16 s after receive, still extended");
    tokio::time::advance(Duration::from_secs(3)).await;
    assert_eq!(t.receive("q", 1, Duration::ZERO).await.unwrap().len(), 1);
}

#[tokio::test(start_paused = true)]
async fn after_twice_max_receives_the_message_moves_to_the_dead_letter_queue() {
    // The worker dead-letters after `max_receives` attempts; the transport's
    // own redrive is the backstop at twice that many receives.
    let t = setup(standard("q")).await;
    let id = t.send("q", body("poison")).await.unwrap();
    for n in 1..=6 {
        let d = t.receive("q", 1, Duration::ZERO).await.unwrap().remove(0);
        assert_eq!(d.receive_count, n);
        t.nack("q", d.receipt, Duration::ZERO).await.unwrap();
    }
    assert!(t.receive("q", 1, Duration::ZERO).await.unwrap().is_empty(), "moved out on the 7th receive");
    let dl = t.dead_letters().unwrap();
    let letters = dl.peek("q", 10).await.unwrap();
    assert_eq!(letters.len(), 1);
    assert_eq!(letters[0].message_id, id);
    assert_eq!(letters[0].receive_count, 6);
    assert_eq!(dl.depth("q").await.unwrap(), 1);
    assert_eq!(dl.peek("q", 10).await.unwrap().len(), 1, "peek leaves it there");
    let outcome = dl.redrive("q", RedriveOptions::default()).await.unwrap();
    assert_eq!((outcome.moved, outcome.skipped), (1, 0));
    let back = t.receive("q", 1, Duration::ZERO).await.unwrap();
    assert_eq!(texts(&back), ["poison"]);
    assert_eq!(back[0].receive_count, 1, "a redriven message starts over");
}

#[tokio::test(start_paused = true)]
async fn delayed_and_backed_off_messages_wait() {
    let t = setup(standard("q")).await;
    t.send("q", Outgoing { delay: Some(Duration::from_secs(30)), ..body("later") }).await.unwrap();
    t.send("q", body("now")).await.unwrap();
    let now = t.receive("q", 10, Duration::ZERO).await.unwrap();
    assert_eq!(texts(&now), ["now"]);
    t.ack("q", vec![now[0].receipt.clone()]).await;
    tokio::time::advance(Duration::from_secs(29)).await;
    assert!(t.receive("q", 10, Duration::ZERO).await.unwrap().is_empty());
    tokio::time::advance(SECOND).await;
    let d = t.receive("q", 10, Duration::ZERO).await.unwrap().remove(0);
    assert_eq!(&*d.body, b"later");
    t.nack("q", d.receipt, Duration::from_secs(5)).await.unwrap();
    assert!(t.receive("q", 10, Duration::ZERO).await.unwrap().is_empty(), "backing off");
    tokio::time::advance(Duration::from_secs(5)).await;
    assert_eq!(t.receive("q", 10, Duration::ZERO).await.unwrap().len(), 1);
}

#[tokio::test(start_paused = true)]
async fn a_long_poll_returns_as_soon_as_a_message_arrives() {
    let t = setup(standard("q")).await;
    let sender = t.clone();
    let start = tokio::time::Instant::now();
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_secs(2)).await;
        sender.send("q", body("x")).await.unwrap();
    });
    let got = t.receive("q", 10, Duration::from_secs(20)).await.unwrap();
    assert_eq!(texts(&got), ["x"]);
    assert!(start.elapsed() < Duration::from_secs(3));
    t.ack("q", vec![got[0].receipt.clone()]).await;
    assert!(t.receive("q", 10, Duration::from_secs(20)).await.unwrap().is_empty(), "times out empty");
}

#[tokio::test(start_paused = true)]
async fn fifo_hands_out_a_group_in_order_and_one_batch_at_a_time() {
    let t = setup(fifo("q.fifo")).await;
    for i in 0..3 {
        t.send("q.fifo", grouped(&format!("a{i}"), "a")).await.unwrap();
    }
    t.send("q.fifo", grouped("b0", "b")).await.unwrap();
    let first = t.receive("q.fifo", 1, Duration::ZERO).await.unwrap();
    assert_eq!(texts(&first), ["a0"]);
    // Group a is locked while a0 is in flight; b is free.
    assert_eq!(texts(&t.receive("q.fifo", 10, Duration::ZERO).await.unwrap()), ["b0"]);
    assert!(t.receive("q.fifo", 10, Duration::ZERO).await.unwrap().is_empty());
    t.ack("q.fifo", vec![first[0].receipt.clone()]).await;
    let rest = t.receive("q.fifo", 10, Duration::ZERO).await.unwrap();
    assert_eq!(texts(&rest), ["a1", "a2"], "order kept within the group");
}

#[tokio::test(start_paused = true)]
async fn fifo_retry_keeps_the_group_locked_and_in_order() {
    let t = setup(fifo("q.fifo")).await;
    for i in 0..3 {
        t.send("q.fifo", grouped(&format!("a{i}"), "a")).await.unwrap();
    }
    let batch = t.receive("q.fifo", 10, Duration::ZERO).await.unwrap();
    assert_eq!(texts(&batch), ["a0", "a1", "a2"]);
    // a0 fails with a 5 s backoff; a1 and a2 are released unprocessed.
    t.nack("q.fifo", batch[0].receipt.clone(), Duration::from_secs(5)).await.unwrap();
    t.nack("q.fifo", batch[1].receipt.clone(), Duration::ZERO).await.unwrap();
    t.nack("q.fifo", batch[2].receipt.clone(), Duration::ZERO).await.unwrap();
    assert!(t.receive("q.fifo", 10, Duration::ZERO).await.unwrap().is_empty(), "a1 must not overtake a0");
    tokio::time::advance(Duration::from_secs(5)).await;
    assert_eq!(texts(&t.receive("q.fifo", 10, Duration::ZERO).await.unwrap()), ["a0", "a1", "a2"]);
}

#[tokio::test(start_paused = true)]
async fn fifo_deduplicates_within_five_minutes() {
    let t = setup(fifo("q.fifo")).await;
    let with_id = |text: &str| Outgoing { dedup_id: Some("order-1".into()), ..grouped(text, "g") };
    let first = t.send("q.fifo", with_id("one")).await.unwrap();
    tokio::time::advance(Duration::from_secs(299)).await;
    assert_eq!(t.send("q.fifo", with_id("two")).await.unwrap(), first, "a duplicate gets the first id");
    assert_eq!(t.depth("q.fifo").await.unwrap(), 1);
    tokio::time::advance(Duration::from_secs(2)).await;
    assert_ne!(t.send("q.fifo", with_id("three")).await.unwrap(), first);
    assert_eq!(t.depth("q.fifo").await.unwrap(), 2);
}

#[tokio::test(start_paused = true)]
async fn fifo_rejects_a_delay_and_a_missing_group() {
    let t = setup(fifo("q.fifo")).await;
    let delayed = Outgoing { delay: Some(SECOND), ..grouped("x", "g") };
    assert!(matches!(t.send("q.fifo", delayed).await, Err(TransportError::Rejected(_))));
    assert!(matches!(t.send("q.fifo", body("x")).await, Err(TransportError::Rejected(_))));
    let batch = t.send_batch("q.fifo", vec![grouped("ok", "g"), body("no group")]).await;
    assert!(batch[0].is_ok() && batch[1].is_err(), "partial failure is per message");
}

#[tokio::test(start_paused = true)]
async fn redrive_is_fifo_correct_and_filters() {
    let t = setup(fifo("q.fifo")).await;
    let dl = t.dead_letters().unwrap();
    for (text, group) in [("keep", "g1"), ("move", "g2")] {
        t.send("q.fifo", grouped(text, group)).await.unwrap();
        let d = t.receive("q.fifo", 1, Duration::ZERO).await.unwrap().remove(0);
        dl.dead_letter("q.fifo", &d, crate::transport::FailedAttempt::new(1, "Error", "permanent")).await.unwrap();
    }
    let letters = dl.peek("q.fifo", 10).await.unwrap();
    assert_eq!(letters.len(), 2);
    assert_eq!(letters[0].reason.as_deref(), Some("permanent (after 1 attempt)"));
    let only_move = RedriveOptions {
        filter: Some(std::sync::Arc::new(|l: &crate::transport::DeadLetter| &*l.body == b"move")),
        ..RedriveOptions::default()
    };
    let outcome = dl.redrive("q.fifo", only_move).await.unwrap();
    assert_eq!((outcome.moved, outcome.skipped), (1, 1));
    let back = t.receive("q.fifo", 10, Duration::ZERO).await.unwrap();
    assert_eq!(texts(&back), ["move"]);
    assert_eq!(back[0].group_id.as_deref(), Some("g2"), "group id kept");
    assert_eq!(dl.depth("q.fifo").await.unwrap(), 1);
}

#[tokio::test]
async fn unknown_queues_and_kind_conflicts_are_errors() {
    let t = MemoryTransport::new();
    assert!(matches!(t.send("nope", body("x")).await, Err(TransportError::QueueNotFound(_))));
    assert!(matches!(t.receive("nope", 1, Duration::ZERO).await, Err(TransportError::QueueNotFound(_))));
    t.declare(&QueueSpec::standard("q")).await.unwrap();
    let as_fifo = QueueSpec { fifo: true, ..QueueSpec::standard("q") };
    assert!(t.declare(&as_fifo).await.is_err());
}

#[tokio::test(start_paused = true)]
async fn dead_letters_are_counted_deleted_and_purged() {
    use crate::transport::{FailedAttempt, MessageId, RedriveOptions};
    let t = setup(fifo("q.fifo")).await;
    let dl = t.dead_letters().unwrap();
    let mut ids = Vec::new();
    for text in ["a", "b", "c", "d"] {
        t.send("q.fifo", grouped(text, text)).await.unwrap();
        let d = t.receive("q.fifo", 1, Duration::ZERO).await.unwrap().remove(0);
        ids.push(d.message_id.clone());
        dl.dead_letter("q.fifo", &d, FailedAttempt::new(2, "Error", "bad")).await.unwrap();
    }
    assert_eq!(dl.peek("q.fifo", 1).await.unwrap()[0].history[0].attempt, 2, "the history is kept");
    let dry = RedriveOptions { max: Some(3), dry_run: true, ..RedriveOptions::default() };
    assert_eq!(dl.redrive("q.fifo", dry).await.unwrap().moved, 3);
    assert_eq!(dl.depth("q.fifo").await.unwrap(), 4, "a dry run moves nothing");
    assert_eq!(dl.delete("q.fifo", &[ids[0].clone(), MessageId::from("nope".to_owned())]).await.unwrap(), 1);
    let not_b = RedriveOptions {
        filter: Some(std::sync::Arc::new(|l: &crate::transport::DeadLetter| &*l.body != b"b")),
        ..RedriveOptions::default()
    };
    let counted = dl.purge("q.fifo", RedriveOptions { dry_run: true, ..not_b.clone() }).await.unwrap();
    assert_eq!((counted.deleted, counted.skipped), (2, 1));
    assert_eq!(dl.depth("q.fifo").await.unwrap(), 3);
    let purged = dl.purge("q.fifo", not_b).await.unwrap();
    assert_eq!((purged.deleted, purged.skipped), (2, 1));
    assert_eq!(&*dl.peek("q.fifo", 10).await.unwrap()[0].body, b"b");
}

#[tokio::test(start_paused = true)]
async fn a_message_is_found_in_its_queue_or_its_dead_letters() {
    use crate::transport::{FailedAttempt, MessageId};
    let t = setup(fifo("q.fifo")).await;
    let waiting = t.send("q.fifo", grouped("waiting", "g1")).await.unwrap();
    t.send("q.fifo", grouped("dead", "g2")).await.unwrap();
    let d = t.receive("q.fifo", 10, Duration::ZERO).await.unwrap().into_iter().find(|d| &*d.body == b"dead").unwrap();
    t.dead_letters().unwrap().dead_letter("q.fifo", &d, FailedAttempt::new(1, "Boom", "no")).await.unwrap();
    let dead = t.inspect("q.fifo", &d.message_id).await.unwrap().expect("found in the dead letters");
    assert_eq!((dead.status.as_str(), dead.reason.as_deref()), ("dead_letter", Some("no (after 1 attempt)")));
    assert_eq!(dead.history[0].error_type, "Boom");
    let shown = t.inspect("q.fifo", &waiting).await.unwrap().expect("found in the queue");
    assert_eq!((shown.status.as_str(), &*shown.body), ("in_flight", &b"waiting"[..]));
    assert!(t.inspect("q.fifo", &MessageId::from("nope")).await.unwrap().is_none());
}

#[tokio::test(start_paused = true)]
async fn a_bounded_queue_makes_a_publish_wait_for_room_then_fails_it_clearly() {
    let t = MemoryTransport::bounded(2, Duration::from_millis(100));
    t.declare(&standard("b")).await.unwrap();
    t.send("b", body("a")).await.unwrap();
    t.send("b", body("b")).await.unwrap();
    let started = tokio::time::Instant::now();
    let error = t.send("b", body("c")).await.unwrap_err();
    assert!(started.elapsed() >= Duration::from_millis(100), "it waited for room");
    assert!(matches!(error, TransportError::Full { capacity: 2, .. }), "{error:?}");
    assert!(error.to_string().contains("queue `b` is full (2 messages) and had no room within"), "{error}");

    // A consumer that acknowledges makes room for a waiting publish.
    let consumer = {
        let t = t.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(30)).await;
            let got = t.receive("b", 1, Duration::ZERO).await.unwrap();
            for result in t.ack("b", got.into_iter().map(|d| d.receipt).collect()).await {
                result.unwrap();
            }
        })
    };
    t.send("b", body("c")).await.expect("room once one was acknowledged");
    consumer.await.unwrap();
    assert_eq!(t.depth("b").await.unwrap(), 2);

    // A batch takes what fits and says which did not.
    let results = t.send_batch("b", vec![body("d"), body("e")]).await;
    assert!(results.iter().all(|r| matches!(r, Err(TransportError::Full { .. }))), "{results:?}");
}

#[tokio::test]
async fn memory_urls_take_a_capacity_and_a_wait() {
    let t = crate::transport::connect("memory://?capacity=1&full_wait=10ms").await.unwrap();
    t.declare(&standard("u")).await.unwrap();
    t.send("u", body("a")).await.unwrap();
    assert!(matches!(t.send("u", body("b")).await, Err(TransportError::Full { .. })));
    for (url, expected) in [
        ("memory://?capacity=0", "above 0"),
        ("memory://?capacity=ten", "above 0"),
        ("memory://?full_wait=1s", "add `capacity=N`"),
        ("memory://?capacity=5&full_wait=5", "has no unit"),
        ("memory://?depth=5", "unknown option `depth`"),
    ] {
        let error = crate::transport::connect(url).await.err().map(|e| e.to_string()).unwrap_or_default();
        assert!(error.contains(expected), "{url}: {error}");
    }
}

#[test]
fn a_queued_message_stays_small() {
    // What a queued message costs beside its body (the memory benchmark's
    // "queued" scenario measures the whole): the slot, with the id inline.
    let slot = std::mem::size_of::<Option<super::state::Stored>>();
    eprintln!("slot {slot} bytes, id {}", std::mem::size_of::<crate::transport::MessageId>());
    assert!(slot <= 176, "a queue slot grew to {slot} bytes");
}

#[tokio::test]
async fn single_sends_and_batches_keep_their_order_and_are_seen_at_once() {
    // Single sends wait in the queue's inbox until the next look at it; a
    // batch goes straight in. Every reader sees both, in publish order.
    let t = setup(standard("q")).await;
    let first = t.send("q", body("1")).await.unwrap();
    assert_eq!(t.depth("q").await.unwrap(), 1, "a depth counts what is in the inbox");
    assert!(t.inspect("q", &first).await.unwrap().is_some(), "and so does a look for one message");
    for result in t.send_batch("q", vec![body("2"), body("3")]).await {
        result.unwrap();
    }
    t.send("q", body("4")).await.unwrap();
    for result in t.send_batch("q", vec![body("5")]).await {
        result.unwrap();
    }
    t.send("q", body("6")).await.unwrap();
    let got = t.receive("q", 10, Duration::ZERO).await.unwrap();
    assert_eq!(texts(&got), ["1", "2", "3", "4", "5", "6"]);
    assert_eq!(got[0].message_id, first);
}

/// A send needs no future where no queue can be full: `send_now` sends it
/// (or refuses it) at once; a bounded transport, whose send may wait for
/// room, gives the message back for `send`.
#[tokio::test(start_paused = true)]
async fn send_now_sends_at_once_unless_the_queue_may_be_full() {
    use crate::transport::SendNow;
    let t = setup(standard("q")).await;
    let SendNow::Done(Ok(id)) = t.send_now("q", body("a")) else { panic!("not sent at once") };
    let got = t.receive("q", 10, SECOND).await.unwrap();
    assert_eq!((got.len(), &got[0].message_id), (1, &id));
    let fifo_t = setup(fifo("q.fifo")).await;
    assert!(matches!(fifo_t.send_now("q.fifo", grouped("b", "g")), SendNow::Done(Ok(_))));
    assert!(matches!(t.send_now("nowhere", body("c")), SendNow::Done(Err(TransportError::QueueNotFound(_)))));
    let bounded = MemoryTransport::bounded(1, SECOND);
    bounded.declare(&standard("q")).await.unwrap();
    let SendNow::Later(back) = bounded.send_now("q", body("d")) else { panic!("a bounded queue sent at once") };
    assert_eq!(&back.body[..], b"d");
}
