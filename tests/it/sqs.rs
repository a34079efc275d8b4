//! The Amazon SQS transport against a real SQS-compatible server
//! (`moto_server`, started on a free loopback port by each test).
#![cfg(feature = "sqs")]

use crate::fixtures;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use messaging::prelude::*;
use messaging::transport::{Outgoing, RedriveOptions, Transport};

#[messaging::queue("sqs-mail", dlq = "sqs-mail-dlq", max_receives = 2, visibility = "2s")]
struct Mail;

#[messaging::queue("sqs-orders.fifo", fifo, dlq = "sqs-orders-dlq.fifo", default_group = "orders")]
struct Orders;

#[messaging::queue("sqs-slow", visibility = "1s")]
struct Slow;

#[messaging::message(name = "sqs.mail", v = 1)]
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Mailing {
    to: String,
    fail: bool,
}

#[messaging::message(name = "sqs.order", v = 1, group = customer)]
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Order {
    customer: String,
    n: u32,
}

type Log = Arc<Mutex<Vec<String>>>;

#[messaging::handler(queue = Mail, retry(base = "100ms", max = "200ms"))]
async fn mail(m: Mailing, log: State<Log>) -> Result<(), HandlerError> {
    log.lock().unwrap().push(m.to.clone());
    if m.fail {
        return Err(HandlerError::transient(std::io::Error::other("smtp down")));
    }
    Ok(())
}

#[messaging::handler(queue = Orders)]
async fn order(o: Order, log: State<Log>) {
    log.lock().unwrap().push(format!("{}:{}", o.customer, o.n));
}

#[messaging::handler(queue = Slow)]
async fn slow(_m: Mailing, calls: State<Arc<AtomicUsize>>) {
    calls.fetch_add(1, Ordering::SeqCst);
    tokio::time::sleep(Duration::from_millis(2_500)).await;
}

async fn connect(moto: &fixtures::SqsServer) -> Arc<dyn Transport> {
    messaging::transport::connect(&moto.url(true)).await.expect("connect")
}

/// A queue's `MaximumMessageSize` on `server`.
async fn size_limit(server: &fixtures::SqsServer, queue: &str) -> usize {
    use messaging::transport::sqs::aws_sdk_sqs::types::QueueAttributeName;
    let t = messaging::transport::sqs::connect(&server.url(false)).await.expect("connect");
    let url = t.client().get_queue_url().queue_name(queue).send().await.expect("url");
    t.client()
        .get_queue_attributes()
        .queue_url(url.queue_url().unwrap_or_default())
        .attribute_names(QueueAttributeName::MaximumMessageSize)
        .send()
        .await
        .expect("attributes")
        .attributes()
        .and_then(|a| a.get(&QueueAttributeName::MaximumMessageSize)?.parse().ok())
        .expect("a limit")
}

async fn wait_until(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn publishing_rules_batches_and_sizes() {
    let moto = fixtures::SqsServer::start();
    let t = connect(&moto).await;
    messaging::App::new(t.clone()).await.expect("declares (creating the queues)");
    let p = Publisher::new(t.clone());
    // A batch larger than 10 entries, results in order.
    let mails: Vec<Mailing> = (0..23).map(|i| Mailing { to: format!("u{i}"), fail: false }).collect();
    let ids: Vec<MessageId> = p.send_batch::<Mail, _>(&mails).await.into_iter().map(|r| r.expect("sent")).collect();
    assert_eq!(ids.len(), 23);
    assert_eq!(ids.iter().collect::<std::collections::HashSet<_>>().len(), 23, "distinct ids");
    // An oversized message (over the queue's limit: 1 MiB on SQS, LocalStack
    // and moto 5.2) fails alone; the rest of the batch goes through.
    let limit = size_limit(&moto, "sqs-mail").await;
    let big = Mailing { to: "x".repeat(limit), fail: false };
    let small = Mailing { to: "ok".into(), fail: false };
    let results = p.send_batch::<Mail, _>(&[small.clone(), big.clone(), small]).await;
    assert!(results[0].is_ok() && results[2].is_ok());
    let err = results[1].as_ref().unwrap_err().to_string();
    assert!(err.contains(&format!("queue `sqs-mail` accepts at most {limit}")), "{err}");
    assert!(p.send::<Mail, _>(&big).await.is_err());
    // Five messages of 30% of the limit go in requests of at most the limit
    // (the server refuses a larger batch).
    let large: Vec<Mailing> = (0..5).map(|_| Mailing { to: "y".repeat(limit * 3 / 10), fail: false }).collect();
    for result in p.send_batch::<Mail, _>(&large).await {
        result.expect("sent in requests of at most 1 MiB");
    }
    // Delay on a standard queue; FIFO group from the message's field.
    p.send::<Mail, _>(&Mailing { to: "later".into(), fail: false })
        .delay(Duration::from_secs(2))
        .await
        .expect("delayed");
    p.send::<Orders, _>(&Order { customer: "c1".into(), n: 1 }).await.expect("fifo");
    let got = t.receive("sqs-orders.fifo", 10, Duration::from_secs(1)).await.expect("receive");
    assert_eq!(got[0].group_id.as_deref(), Some("c1"));
    assert_eq!(t.depth("sqs-mail").await.expect("depth"), 23 + 2 + 5 + 1);
    // Text SQS refuses in a body (U+FFFF) goes out escaped and comes back as
    // sent; attributes travel with any printable Unicode.
    let odd = Mailing { to: "a\u{FFFF}b\u{0}c\tü😀".into(), fail: false };
    p.send::<Slow, _>(&odd).attribute("note", "é\t😀").await.expect("sent");
    let got = t.receive("sqs-slow", 10, Duration::from_secs(1)).await.expect("receive");
    assert_eq!(got.len(), 1);
    let envelope: serde_json::Value = serde_json::from_slice(&got[0].body).expect("json");
    assert_eq!(envelope["data"]["to"], odd.to);
    assert_eq!(got[0].attributes.get("note").map(String::as_str), Some("é\t😀"));
    // An attribute SQS would refuse is an error naming it, before any request.
    let err = p.send::<Slow, _>(&odd).attribute("note", "").await.unwrap_err();
    assert!(err.to_string().contains("invalid attribute `note`: the value is empty"), "{err}");
}

#[tokio::test]
async fn a_poison_message_and_a_malformed_one_end_in_the_dead_letter_queue() {
    let moto = fixtures::SqsServer::start();
    let t = connect(&moto).await;
    let mut app = messaging::App::new(t.clone()).await.expect("app");
    app.only_queues(&["sqs-mail"]);
    let log: Log = Arc::default();
    app.setup().provide(log.clone());
    app.set_receive_wait(Duration::from_secs(1));
    let running = app.start().expect("start");
    let p = Publisher::new(t.clone());
    p.send::<Mail, _>(&Mailing { to: "poison".into(), fail: true }).await.expect("sent");
    let bad = Outgoing { body: br#"{"type":"sqs.mail","v":"one","data":{}}"#.to_vec().into(), ..Outgoing::default() };
    t.send("sqs-mail", bad).await.expect("sent");
    p.send::<Mail, _>(&Mailing { to: "fine".into(), fail: false }).await.expect("sent");
    let dlq = t.dead_letters().expect("dead letters");
    let deadline = Instant::now() + Duration::from_secs(40);
    loop {
        let depth = dlq.depth("sqs-mail").await.expect("depth");
        if depth == 2 {
            break;
        }
        assert!(Instant::now() < deadline, "dead letters: {depth}, log {:?}", log.lock().unwrap());
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    running.stop().await;
    let tries = log.lock().unwrap().iter().filter(|t| *t == "poison").count();
    assert_eq!(tries, 2, "tried max_receives times");
    assert!(log.lock().unwrap().contains(&"fine".to_owned()));
    // Peek twice: nothing is lost by looking.
    let first = dlq.peek("sqs-mail", 10).await.expect("peek");
    let second = dlq.peek("sqs-mail", 10).await.expect("peek");
    assert_eq!(first.len(), 2);
    assert_eq!(second.len(), 2);
    // The worker dead-lettered both itself, with the reason (SQS's own
    // redrive, at twice max_receives, would give none).
    let mut reasons: Vec<String> = first.iter().map(|l| l.reason.clone().unwrap_or_default()).collect();
    reasons.sort();
    assert!(reasons[0].contains("malformed envelope"), "{reasons:?}");
    assert_eq!(reasons[1], "smtp down (after 2 attempts)", "the last error and the attempts: {reasons:?}");
    // Redrive only the malformed one (it has no envelope type).
    let only_malformed =
        RedriveOptions { filter: Some(Arc::new(|l| l.type_name().is_none())), ..RedriveOptions::default() };
    let outcome = dlq.redrive("sqs-mail", only_malformed).await.expect("redrive");
    assert_eq!((outcome.moved, outcome.skipped), (1, 1));
    assert_eq!(dlq.depth("sqs-mail").await.expect("depth"), 1);
    // (A receive right after a send may come back empty on SQS and on moto; long-poll.)
    let back = t.receive("sqs-mail", 10, Duration::from_secs(10)).await.expect("receive");
    assert_eq!(back.len(), 1);
    assert!(String::from_utf8_lossy(&back[0].body).contains(r#""v":"one""#));
}

#[tokio::test]
async fn redrive_to_a_fifo_queue_keeps_the_group() {
    let moto = fixtures::SqsServer::start();
    let t = connect(&moto).await;
    messaging::App::new(t.clone()).await.expect("declares");
    let p = Publisher::new(t.clone());
    p.send::<Orders, _>(&Order { customer: "c7".into(), n: 1 }).await.expect("sent");
    let d = t.receive("sqs-orders.fifo", 1, Duration::from_secs(1)).await.expect("receive").remove(0);
    t.dead_letters()
        .expect("dlq")
        .dead_letter("sqs-orders.fifo", &d, messaging::transport::FailedAttempt::new(1, "Error", "permanent"))
        .await
        .expect("moved");
    let letters = t.dead_letters().expect("dlq").peek("sqs-orders.fifo", 10).await.expect("peek");
    assert_eq!(letters.len(), 1);
    assert_eq!(letters[0].reason.as_deref(), Some("permanent (after 1 attempt)"));
    assert_eq!(
        t.dead_letters()
            .expect("dlq")
            .redrive("sqs-orders.fifo", RedriveOptions::default())
            .await
            .expect("redrive")
            .moved,
        1
    );
    let back = t.receive("sqs-orders.fifo", 1, Duration::from_secs(1)).await.expect("receive");
    assert_eq!(back[0].group_id.as_deref(), Some("c7"));
}

#[tokio::test]
async fn a_handler_slower_than_the_visibility_timeout_is_not_redelivered() {
    let moto = fixtures::SqsServer::start();
    let t = connect(&moto).await;
    let mut app = messaging::App::new(t.clone()).await.expect("app");
    app.only_queues(&["sqs-slow"]);
    let calls = Arc::new(AtomicUsize::new(0));
    app.setup().provide(calls.clone());
    app.set_receive_wait(Duration::from_secs(1));
    let running = app.start().expect("start");
    Publisher::new(t.clone()).send::<Slow, _>(&Mailing { to: "x".into(), fail: false }).await.expect("sent");
    wait_until("the handler to start", || calls.load(Ordering::SeqCst) == 1).await;
    tokio::time::sleep(Duration::from_millis(4_000)).await;
    assert_eq!(calls.load(Ordering::SeqCst), 1, "the heartbeat kept it invisible");
    running.stop().await;
    assert_eq!(t.depth("sqs-slow").await.expect("depth"), 0, "deleted after success");
}

/// A registry of the queues this file declares (and every message), so that
/// the time startup takes and the errors it lists do not depend on what else
/// the test binary registers.
fn own_queues() -> messaging::registry::Registry {
    use messaging::__private::{inventory, MessageEntry, QueueEntry};
    let queues: Vec<&'static QueueEntry> =
        inventory::iter::<QueueEntry>.into_iter().filter(|q| (q.spec)().name.starts_with("sqs-")).collect();
    let messages: Vec<&'static MessageEntry> = inventory::iter::<MessageEntry>.into_iter().collect();
    messaging::registry::Registry::build(&queues, &messages, &[]).expect("a valid registry")
}

#[tokio::test]
async fn startup_errors_are_clear_and_quick() {
    // (Starting the server sets the credentials the SDK needs: without them
    // the request below would fail on them, before reaching the network.)
    let moto = fixtures::SqsServer::start();
    // Unreachable endpoint: the queue and the request that failed are named.
    let started = Instant::now();
    let t = messaging::transport::connect("sqs://us-east-1?endpoint=http://127.0.0.1:1").await.expect("lazy connect");
    let err = messaging::App::with_registry(own_queues(), t).await.expect_err("unreachable").to_string();
    assert!(err.contains("queue `sqs-mail`: sqs: looking up queue `sqs-mail-dlq` failed: dispatch failure"), "{err}");
    assert!(err.contains("queue `sqs-slow`: sqs: looking up queue `sqs-slow` failed: dispatch failure"), "{err}");
    assert!(started.elapsed() < Duration::from_secs(30), "took {:?}", started.elapsed());
    // Missing queues (no create_queues): each names the queue it lacks and the fix.
    let t = messaging::transport::connect(&moto.url(false)).await.expect("connect");
    let err = messaging::App::with_registry(own_queues(), t.clone()).await.expect_err("missing").to_string();
    let fix = "does not exist; create it (and its redrive policy) with your infrastructure, \
               or connect with `?create_queues=true` in development";
    assert!(err.contains(&format!("queue `sqs-mail`: sqs: queue `sqs-mail-dlq` {fix}")), "{err}");
    assert!(err.contains(&format!("queue `sqs-slow`: sqs: queue `sqs-slow` {fix}")), "{err}");
    // Wrong kind: a standard queue where a FIFO one is declared.
    let admin = messaging::transport::connect(&moto.url(true)).await.expect("connect");
    let mut wrong = <Orders as Queue>::SPEC;
    wrong.name = "sqs-mail";
    wrong.fifo = false;
    wrong.dlq = None;
    admin.declare(&wrong).await.expect("created as standard, without a redrive policy");
    let mut as_fifo = <Mail as Queue>::SPEC;
    as_fifo.fifo = true;
    as_fifo.dlq = None;
    let err = t.declare(&as_fifo).await.expect_err("kind").to_string();
    assert_eq!(err, "queue `sqs-mail` is a standard queue on SQS but is declared FIFO");
    // No redrive policy: the declared DLQ exists, the queue does not send to it.
    admin.declare(&messaging::QueueSpec::standard("sqs-mail-dlq")).await.expect("the DLQ, created");
    let err = t.declare(&<Mail as Queue>::SPEC).await.expect_err("no redrive policy").to_string();
    assert_eq!(
        err,
        "queue `sqs-mail` has no redrive policy, but `sqs-mail-dlq` is declared as its \
         dead-letter queue; set RedrivePolicy deadLetterTargetArn to `sqs-mail-dlq`'s ARN"
    );
    // A redrive policy that would dead-letter before the worker has spent
    // `max_receives` attempts: created for max_receives = 2 (so
    // maxReceiveCount = 4), declared with max_receives = 4.
    let mut short = <Mail as Queue>::SPEC;
    short.name = "sqs-short";
    short.dlq = Some("sqs-short-dlq");
    short.max_receives = 2;
    admin.declare(&short).await.expect("created with maxReceiveCount 4");
    t.declare(&short).await.expect("4 is above 2");
    short.max_receives = 4;
    let err = t.declare(&short).await.expect_err("4 is not above 4").to_string();
    assert!(err.starts_with("queue `sqs-short`: "), "{err}");
    assert!(err.contains("maxReceiveCount is 4, which must be above max_receives = 4"), "{err}");
    assert!(err.contains("Set maxReceiveCount to 8"), "{err}");
    // A redrive policy to another queue than the declared DLQ.
    short.max_receives = 2;
    short.dlq = Some("sqs-mail-dlq");
    let err = t.declare(&short).await.expect_err("another DLQ").to_string();
    assert_eq!(
        err,
        "queue `sqs-short` sends its dead letters to `sqs-short-dlq`, but `sqs-mail-dlq` is \
         declared; fix the redrive policy or the `dlq` option"
    );
}

#[tokio::test]
async fn each_queue_is_held_to_its_own_maximum_message_size() {
    let server = fixtures::SqsServer::start();
    let t = Arc::new(messaging::transport::sqs::connect(&server.url(true)).await.expect("connect"));
    // A queue made with a 2 KiB limit; the others are created with the
    // server's default (1 MiB on SQS, LocalStack and moto 5.2).
    t.client()
        .create_queue()
        .queue_name("sqs-slow")
        .attributes(messaging::transport::sqs::aws_sdk_sqs::types::QueueAttributeName::MaximumMessageSize, "2048")
        .send()
        .await
        .expect("created");
    messaging::App::new(t.clone() as Arc<dyn Transport>).await.expect("declares");
    let p = Publisher::new(t.clone());
    let of = |bytes: usize| Mailing { to: "x".repeat(bytes), fail: false };
    p.send::<Slow, _>(&of(1_500)).await.expect("under the queue's limit");
    let err = p.send::<Slow, _>(&of(3_000)).await.unwrap_err().to_string();
    assert!(err.contains("queue `sqs-slow` accepts at most 2048"), "{err}");
    let results = p.send_batch::<Slow, _>(&[of(10), of(3_000), of(10)]).await;
    assert!(results[0].is_ok() && results[1].is_err() && results[2].is_ok(), "{results:?}");
    // The other queue takes what its server's default allows.
    let limit = size_limit(&server, "sqs-mail").await;
    p.send::<Mail, _>(&of(limit - 1_000)).await.expect("just under the default limit");
    let err = p.send::<Mail, _>(&of(limit + 1)).await.unwrap_err().to_string();
    assert!(err.contains(&format!("accepts at most {limit}")), "{err}");
}

#[messaging::queue("sqs-tight", dlq = "sqs-tight-dlq")]
struct Tight;

/// Fails permanently with a long reason.
#[messaging::handler(queue = Tight)]
async fn tight(_m: Mailing) -> Result<(), HandlerError> {
    Err(HandlerError::permanent(std::io::Error::other(format!("rejected: {}", "why ".repeat(500)))))
}

#[tokio::test]
async fn a_dead_letter_fits_its_queue_with_as_much_reason_as_there_is_room_for() {
    use messaging::transport::sqs::aws_sdk_sqs::types::QueueAttributeName;
    let server = fixtures::SqsServer::start();
    let admin = messaging::transport::sqs::connect(&server.url(true)).await.expect("connect");
    // A dead-letter queue that takes 1 KiB, behind a queue that takes 1 MiB.
    admin
        .client()
        .create_queue()
        .queue_name("sqs-tight-dlq")
        .attributes(QueueAttributeName::MaximumMessageSize, "1024")
        .send()
        .await
        .expect("created");
    let t = connect(&server).await;
    let mut app = messaging::App::new(t.clone()).await.expect("app");
    app.only_queues(&["sqs-tight"]);
    app.set_receive_wait(Duration::from_secs(1));
    let running = app.start().expect("start");
    let p = Publisher::new(t.clone());
    p.send::<Tight, _>(&Mailing { to: "t".repeat(700), fail: true }).await.expect("sent");
    let dlq = t.dead_letters().expect("dead letters");
    let deadline = Instant::now() + Duration::from_secs(20);
    while dlq.depth("sqs-tight").await.expect("depth") == 0 {
        assert!(Instant::now() < deadline, "not dead-lettered");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    running.stop().await;
    let letters = dlq.peek("sqs-tight", 10).await.expect("peek");
    assert_eq!(letters.len(), 1);
    let reason = letters[0].reason.clone().expect("a reason, cut to fit");
    assert!(reason.starts_with("rejected: why why"), "{reason}");
    let size = letters[0].body.len()
        + letters[0].attributes.iter().map(|(k, v)| k.len() + v.len() + "String".len()).sum::<usize>();
    assert!(size <= 1024, "{size} bytes in a 1 KiB queue");
    assert!(reason.len() < 2_000, "the reason was cut: {} bytes", reason.len());
}

#[messaging::queue("sqs-steps.fifo", fifo, concurrency = 8, visibility = "30s")]
struct Steps;

#[messaging::message(name = "sqs.step", v = 1, group = group)]
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Step {
    group: String,
    seq: u32,
}

/// What the FIFO handler saw, and how many ran at once.
#[derive(Default)]
struct Seen {
    order: Mutex<Vec<(String, u32)>>,
    running: AtomicUsize,
    max_running: AtomicUsize,
}

#[messaging::handler(queue = Steps)]
async fn step(s: Step, seen: State<Arc<Seen>>) {
    let now = seen.running.fetch_add(1, Ordering::SeqCst) + 1;
    seen.max_running.fetch_max(now, Ordering::SeqCst);
    tokio::time::sleep(Duration::from_millis(5)).await;
    seen.order.lock().unwrap().push((s.group, s.seq));
    seen.running.fetch_sub(1, Ordering::SeqCst);
}

#[tokio::test]
async fn fifo_order_holds_within_groups_and_groups_overlap() {
    const GROUPS: u32 = 10;
    const PER_GROUP: u32 = 100;
    let moto = fixtures::SqsServer::start();
    let t = connect(&moto).await;
    let mut app = messaging::App::new(t.clone()).await.expect("app");
    app.only_queues(&["sqs-steps.fifo"]);
    let seen = Arc::new(Seen::default());
    app.setup().provide(seen.clone());
    app.set_receive_wait(Duration::from_secs(1));
    let p = Publisher::new(t.clone());
    let running = app.start().expect("start");
    // Publish while consuming, keeping the queue shallow: moto scans the whole
    // queue on every request, so its cost grows with depth.
    let steps: Vec<Step> =
        (0..PER_GROUP).flat_map(|seq| (0..GROUPS).map(move |g| Step { group: format!("g{g}"), seq })).collect();
    let deadline = Instant::now() + Duration::from_secs(180);
    for chunk in steps.chunks(50) {
        while t.depth("sqs-steps.fifo").await.expect("depth") > 100 {
            let handled = seen.order.lock().unwrap().len();
            assert!(Instant::now() < deadline, "the queue stayed deep: handled only {handled}");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        for result in p.send_batch::<Steps, _>(chunk).await {
            result.expect("sent");
        }
    }
    while seen.order.lock().unwrap().len() < (GROUPS * PER_GROUP) as usize {
        assert!(Instant::now() < deadline, "handled only {}", seen.order.lock().unwrap().len());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    running.stop().await;
    let order = seen.order.lock().unwrap().clone();
    for g in 0..GROUPS {
        let seqs: Vec<u32> = order.iter().filter(|(group, _)| *group == format!("g{g}")).map(|(_, s)| *s).collect();
        assert_eq!(seqs, (0..PER_GROUP).collect::<Vec<_>>(), "group g{g} out of order or duplicated");
    }
    let max = seen.max_running.load(Ordering::SeqCst);
    assert!(max > 1 && max <= 8, "groups overlapped up to {max} at once");
}

/// Sends letters straight to the queue `name` (a dead-letter queue), in
/// order, as dead-lettering leaves them there: a body and, on a FIFO queue,
/// its group.
async fn plant(server: &fixtures::SqsServer, name: &str, letters: &[(Option<&str>, String)]) {
    let t = messaging::transport::sqs::connect(&server.url(false)).await.expect("connect");
    let url = t.client().get_queue_url().queue_name(name).send().await.expect("url");
    let url = url.queue_url().unwrap_or_default();
    for (i, (group, body)) in letters.iter().enumerate() {
        let mut send = t.client().send_message().queue_url(url).message_body(body);
        if let Some(group) = group {
            send = send.message_group_id(*group).message_deduplication_id(format!("planted-{i}"));
        }
        send.send().await.expect("planted");
    }
}

/// An envelope of type `name` v`v` with `data`, as text.
fn envelope(name: &str, v: u32, data: serde_json::Value) -> String {
    serde_json::json!({ "type": name, "v": v, "data": data }).to_string()
}

/// Receives (and deletes) `count` orders from `queue`, as (customer, n) in
/// the order they came.
async fn take_orders(t: &Arc<dyn Transport>, queue: &str, count: usize) -> Vec<(String, u64)> {
    let mut got = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(30);
    while got.len() < count {
        assert!(Instant::now() < deadline, "received only {got:?}");
        let batch = t.receive(queue, 10, Duration::from_secs(1)).await.expect("receive");
        for d in &batch {
            let v: serde_json::Value = serde_json::from_slice(&d.body).expect("json");
            got.push((v["data"]["customer"].as_str().unwrap_or_default().to_owned(), v["data"]["n"].as_u64().unwrap()));
        }
        for acked in t.ack(queue, batch.into_iter().map(|d| d.receipt).collect()).await {
            acked.expect("ack");
        }
    }
    assert!(t.receive(queue, 10, Duration::from_secs(1)).await.expect("receive").is_empty(), "more than {count}");
    got
}

/// A dead letter of [`Orders`]: order `n` of `customer`, in the customer's group.
fn order_letter(customer: &'static str, n: u32) -> (Option<&'static str>, String) {
    (Some(customer), envelope("sqs.order", 1, serde_json::json!({ "customer": customer, "n": n })))
}

/// The n of `customer`'s orders in `orders`, in order.
fn ns_of(orders: &[(String, u64)], customer: &str) -> Vec<u64> {
    orders.iter().filter(|(c, _)| c == customer).map(|(_, n)| *n).collect()
}

#[tokio::test]
async fn redrive_moves_every_letter_of_every_fifo_group_in_order() {
    let moto = fixtures::SqsServer::start();
    let t = connect(&moto).await;
    messaging::App::new(t.clone()).await.expect("declares");
    // SQS hands out no more of a FIFO group while letters of it are reserved:
    // 15 letters of one group take more than one receive.
    let mut letters: Vec<_> = (0..15).map(|n| order_letter("big", n)).collect();
    letters.extend((0..3).map(|n| order_letter("small", n)));
    plant(&moto, "sqs-orders-dlq.fifo", &letters).await;
    let dlq = t.dead_letters().expect("dead letters");
    assert_eq!(dlq.depth("sqs-orders.fifo").await.expect("depth"), 18);
    let outcome = dlq.redrive("sqs-orders.fifo", RedriveOptions::default()).await.expect("redrive");
    assert_eq!((outcome.moved, outcome.skipped), (18, 0), "all of them");
    assert_eq!(dlq.depth("sqs-orders.fifo").await.expect("depth"), 0, "nothing left");
    let back = take_orders(&t, "sqs-orders.fifo", 18).await;
    assert_eq!(ns_of(&back, "big"), (0..15).collect::<Vec<_>>(), "in order");
    assert_eq!(ns_of(&back, "small"), [0, 1, 2]);
}

#[tokio::test]
async fn a_fifo_redrive_with_a_filter_leaves_a_group_from_its_first_refused_letter() {
    let moto = fixtures::SqsServer::start();
    let t = connect(&moto).await;
    messaging::App::new(t.clone()).await.expect("declares");
    let mail = (Some("a"), envelope("sqs.mail", 1, serde_json::json!({ "to": "a", "fail": false })));
    // Group a: two orders, a mail the filter refuses, two more orders;
    // group b: twelve orders (more than one receive returns).
    let mut letters =
        vec![order_letter("a", 0), order_letter("a", 1), mail, order_letter("a", 3), order_letter("a", 4)];
    letters.extend((0..12).map(|n| order_letter("b", n)));
    plant(&moto, "sqs-orders-dlq.fifo", &letters).await;
    let dlq = t.dead_letters().expect("dead letters");
    let only_orders = RedriveOptions {
        filter: Some(Arc::new(|l: &messaging::transport::DeadLetter| l.type_name().as_deref() == Some("sqs.order"))),
        ..RedriveOptions::default()
    };
    let outcome = dlq.redrive("sqs-orders.fifo", only_orders).await.expect("redrive");
    // Orders 3 and 4 of group a stay behind the mail: moving them would put
    // them ahead of it.
    assert_eq!(outcome.moved, 14, "{outcome:?}");
    assert!(outcome.skipped >= 1, "{outcome:?}");
    assert_eq!(dlq.depth("sqs-orders.fifo").await.expect("depth"), 3);
    let head = dlq.peek("sqs-orders.fifo", 10).await.expect("peek");
    assert_eq!(head[0].type_name().as_deref(), Some("sqs.mail"), "the group's head is still the mail");
    let back = take_orders(&t, "sqs-orders.fifo", 14).await;
    assert_eq!(ns_of(&back, "a"), [0, 1]);
    assert_eq!(ns_of(&back, "b"), (0..12).collect::<Vec<_>>(), "in order");
}

/// The orders example binary (for its `dlq` commands) on `server`.
fn orders_example(server: &fixtures::SqsServer) -> std::process::Command {
    let bin = fixtures::example_binary("orders");
    let mut cmd = std::process::Command::new(bin);
    cmd.env_remove("MESSAGING_URL")
        .env("RUST_LOG", "warn")
        .env("AWS_ACCESS_KEY_ID", "test")
        .env("AWS_SECRET_ACCESS_KEY", "test")
        .args(["--transport", &server.url(true)])
        .stdin(std::process::Stdio::null());
    cmd
}

/// Runs the orders example with `args`; its stdout, after checking that it succeeded.
fn orders_cli(server: &fixtures::SqsServer, args: &[&str]) -> String {
    let out = orders_example(server).args(args).output().expect("runs");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "{args:?}: {stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    stdout
}

/// A dead letter of the orders example: an order of `customer`.
fn placed(customer: &str, n: u32) -> String {
    envelope("orders.placed", 2, serde_json::json!({ "order_id": format!("{customer}-{n}"), "customer_id": customer }))
}

/// A dead letter of the orders example that is not an order.
fn confirmation(to: &str) -> String {
    envelope("emails.confirmation", 1, serde_json::json!({ "order_id": "x", "email": to }))
}

#[tokio::test]
async fn dlq_peek_on_a_fifo_queue_says_how_many_letters_it_cannot_show() {
    let moto = fixtures::SqsServer::start();
    // `queues` declares (creates) the example's queues.
    orders_cli(&moto, &["queues"]);
    let letters: Vec<_> = (0..15).map(|n| (Some("zoe"), placed("zoe", n))).collect();
    plant(&moto, "orders-dlq.fifo", &letters).await;
    let text = orders_cli(&moto, &["dlq", "peek", "orders.fifo", "--max", "100"]);
    let listed = text.lines().filter(|l| l.contains("type=orders.placed")).count();
    assert!((1..15).contains(&listed), "{text}");
    assert!(
        text.contains(&format!(
            "{} more dead letter(s) of `orders.fifo` are hidden behind the ones shown in their FIFO groups",
            15 - listed
        )),
        "{text}"
    );
    assert!(text.contains("`dlq redrive` moves them all"), "{text}");
    // Peeking keeps them all.
    assert!(orders_cli(&moto, &["queues"]).contains("15 in orders-dlq.fifo"));
    let text = orders_cli(&moto, &["dlq", "redrive", "orders.fifo"]);
    assert!(text.contains("redrove 15 message(s) of `orders.fifo`"), "{text}");
    assert!(orders_cli(&moto, &["dlq", "peek", "orders.fifo"]).contains("no dead letters for `orders.fifo`"));
}

#[tokio::test]
async fn dlq_redrive_with_a_type_goes_through_every_letter_and_says_what_a_fifo_group_keeps() {
    let moto = fixtures::SqsServer::start();
    orders_cli(&moto, &["queues"]);
    // FIFO: zoe's third letter is not an order, and keeps her fourth behind it;
    // ann's twelve orders take more than one receive.
    let mut letters =
        vec![(Some("zoe"), placed("zoe", 0)), (Some("zoe"), placed("zoe", 1)), (Some("zoe"), confirmation("zoe"))];
    letters.push((Some("zoe"), placed("zoe", 3)));
    letters.extend((0..12).map(|n| (Some("ann"), placed("ann", n))));
    plant(&moto, "orders-dlq.fifo", &letters).await;
    let text = orders_cli(&moto, &["dlq", "redrive", "orders.fifo", "--type", "orders.placed"]);
    assert!(text.contains("redrove 14 message(s) of `orders.fifo`"), "{text}");
    assert!(
        text.contains(
            "on a FIFO dead-letter queue a letter that does not match the filter blocks the letters behind it"
        ),
        "{text}"
    );
    assert!(text.contains("2 letter(s) are left in the dead letters of `orders.fifo`"), "{text}");
    // Standard: refused letters between the chosen ones do not end the run.
    let letters: Vec<_> =
        (0..30).map(|n| (None, if n % 2 == 0 { confirmation(&format!("u{n}")) } else { placed("bob", n) })).collect();
    plant(&moto, "emails-dlq", &letters).await;
    let text = orders_cli(&moto, &["dlq", "redrive", "emails", "--type", "orders.placed"]);
    assert!(
        text.contains("redrove 15 message(s) of `emails`; 15 skipped by the filter; 15 left in its dead letters"),
        "{text}"
    );
    assert!(!text.contains("FIFO"), "{text}");
    assert!(orders_cli(&moto, &["queues"]).contains("15 in emails-dlq"));
}

/// Sends 25 messages to `Q` and receives them all: held, as a worker holds
/// them.
async fn hold_25<Q: Queue<Kind = messaging::Standard>>(t: &Arc<dyn Transport>) -> Vec<messaging::transport::Delivery> {
    let mails: Vec<Mailing> = (0..25).map(|i| Mailing { to: format!("u{i}"), fail: false }).collect();
    for result in Publisher::new(t.clone()).send_batch::<Q, _>(&mails).await {
        result.expect("sent");
    }
    let mut held = Vec::new();
    while held.len() < 25 {
        let got = t.receive(Q::SPEC.name, 10, Duration::from_millis(500)).await.expect("receive");
        assert!(!got.is_empty(), "only {} of 25 received", held.len());
        held.extend(got);
    }
    held
}

/// Messages held by hand, with a visibility no test waits out.
#[messaging::queue("sqs-held", visibility = "5m")]
struct Held;

#[tokio::test]
async fn messages_given_back_are_visible_again_at_once_ten_per_request() {
    let moto = fixtures::SqsServer::start();
    let t = connect(&moto).await;
    t.declare(&<Held as Queue>::SPEC).await.expect("declare (creating the queue)");
    let mut held = hold_25::<Held>(&t).await;
    // One of them settled meanwhile: its receipt is stale, the rest go back.
    let acked = held.pop().expect("one");
    t.ack("sqs-held", vec![acked.receipt.clone()]).await.remove(0).expect("acked");
    let mut receipts: Vec<_> = held.iter().map(|d| d.receipt.clone()).collect();
    receipts.push(acked.receipt);
    let sqs = messaging::transport::sqs::connect(&moto.url(false)).await.expect("connect");
    sqs.declare(&<Held as Queue>::SPEC).await.expect("declare");
    let before = sqs.requests();
    let results = sqs.release("sqs-held", receipts).await;
    assert_eq!(sqs.requests() - before, 3, "25 receipts in requests of ten");
    assert!(results[..24].iter().all(Result::is_ok), "{results:?}");
    // moto accepts a deleted message's handle; SQS answers ReceiptHandleIsInvalid.
    assert!(matches!(results[24], Ok(()) | Err(messaging::TransportError::StaleReceipt)), "{:?}", results[24]);
    // Visible again at once, not after the queue's visibility timeout.
    let mut back = std::collections::HashSet::new();
    let deadline = Instant::now() + Duration::from_secs(10);
    while back.len() < 24 && Instant::now() < deadline {
        for d in t.receive("sqs-held", 10, Duration::from_millis(100)).await.expect("receive") {
            back.insert(d.message_id);
        }
    }
    assert_eq!(back.len(), 24, "given back, not left for the 5-minute visibility");
}

#[tokio::test]
async fn a_heartbeat_extends_ten_visibilities_per_request() {
    let moto = fixtures::SqsServer::start();
    let t = connect(&moto).await;
    t.declare(&<Slow as Queue>::SPEC).await.expect("declare (creating the queue)");
    let held = hold_25::<Slow>(&t).await;
    let sqs = messaging::transport::sqs::connect(&moto.url(false)).await.expect("connect");
    sqs.declare(&<Slow as Queue>::SPEC).await.expect("declare");
    let before = sqs.requests();
    let receipts = held.iter().map(|d| d.receipt.clone()).collect();
    let results = sqs.extend_all("sqs-slow", receipts, Duration::from_secs(30)).await;
    assert_eq!(sqs.requests() - before, 3, "25 receipts in requests of ten");
    assert!(results.iter().all(Result::is_ok), "{results:?}");
    // Past the queue's 1 s visibility, none is back.
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    let back = t.receive("sqs-slow", 10, Duration::from_millis(300)).await.expect("receive");
    assert!(back.is_empty(), "{} came back", back.len());
}

// 6 s: with 2 s, a round of the heartbeat on a loaded CI machine (moto
// answers an extension in about 300 ms; 30 batches, 8 at once) came close
// enough to the visibility that 1 of 300 ran twice; with 4 s it did once
// more, in the third full run of a day. One batch after the other, a round
// takes about 10 s: still far past 6 s.
#[messaging::queue("sqs-many-slow", visibility = "6s", concurrency = 300)]
struct ManySlow;

#[messaging::message(name = "sqs.slow_job", v = 1)]
#[derive(Debug, Clone, Serialize, Deserialize)]
struct SlowJob {
    n: usize,
}

/// How many times each message of `sqs-many-slow` was handled.
static SLOW_RUNS: Mutex<Vec<u32>> = Mutex::new(Vec::new());

#[messaging::handler(queue = ManySlow)]
async fn many_slow(job: SlowJob) {
    tokio::time::sleep(Duration::from_millis(7_000)).await;
    if let Some(count) = SLOW_RUNS.lock().unwrap().get_mut(job.n) {
        *count += 1;
    }
}

/// 300 handlers slower than the visibility, in batches of ten: the heartbeat
/// extends 30 batches a round, a request each, several at once. One after the
/// other on moto, a round took longer than the 2 s visibility, and from
/// outside 335 of 600 such messages ran twice (536 one message at a time).
#[tokio::test]
async fn three_hundred_handlers_slower_than_the_visibility_each_run_once() {
    const JOBS: usize = 300;
    *SLOW_RUNS.lock().unwrap() = vec![0; JOBS];
    let moto = fixtures::SqsServer::start();
    let t = connect(&moto).await;
    let mut app = messaging::App::new(t.clone()).await.expect("app");
    app.only_queues(&["sqs-many-slow"]);
    let jobs: Vec<SlowJob> = (0..JOBS).map(|n| SlowJob { n }).collect();
    for result in Publisher::new(t.clone()).send_batch::<ManySlow, _>(&jobs).await {
        result.expect("sent");
    }
    let running = app.start().expect("start");
    let handled = || SLOW_RUNS.lock().unwrap().iter().filter(|&&c| c > 0).count();
    wait_until("every job handled", || handled() == JOBS).await;
    // Long enough for a visibility that ran out to bring a message back.
    tokio::time::sleep(Duration::from_millis(6_500)).await;
    running.stop().await;
    let runs = SLOW_RUNS.lock().unwrap().clone();
    let again = runs.iter().filter(|&&c| c != 1).count();
    assert_eq!(again, 0, "{again} of {JOBS} ran more than once");
}
