//! A rolling deploy: the old build's replicas receive what the new build's
//! publish, a version newer than any they know or a type no handler of
//! theirs takes. Such a message is given back uncharged for a newer build
//! to take, until `Setup::wait_for_newer` has passed since it was sent; then
//! it fails like any other, and its dead letter says why; at a FIFO group's
//! head, the group waits behind it in order. On both databases and on SQS
//! (moto) standard queues, whose receives all count.

use crate::fixtures;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use messaging::observe::{DispatchEvent, Observer, Outcome};
use messaging::prelude::*;
use messaging::transport::{Listing, MessageStatus, Outgoing, Transport};

/// What this (old) build's handlers read: two types, so that a type only a
/// newer build handles meets "no handler".
#[messaging::queue("rolling-jobs", dlq = "rolling-jobs-dlq", max_receives = 2)]
struct RollingJobs;

#[messaging::message(name = "test.rolling.job", v = 1)]
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Job {
    n: u32,
}

#[messaging::message(name = "test.rolling.note", v = 1)]
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Note {
    text: String,
}

#[messaging::handler(queue = RollingJobs, retry(base = "200ms", max = "200ms"))]
async fn on_job(_job: Job) {}

#[messaging::handler(queue = RollingJobs)]
async fn on_note(_note: Note) {}

/// A FIFO queue: a head the old build cannot read holds its group back.
#[messaging::queue("rolling-ledger.fifo", fifo, dlq = "rolling-ledger-dlq.fifo", max_receives = 2)]
struct RollingLedger;

#[messaging::message(name = "test.rolling.entry", v = 1)]
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Entry {
    n: u32,
}

type Booked = Arc<Mutex<Vec<u32>>>;

#[messaging::handler(queue = RollingLedger, retry(base = "200ms", max = "200ms"))]
async fn on_entry(entry: Entry, booked: State<Booked>) {
    booked.lock().unwrap().push(entry.n);
}

/// Each delivery's outcome, with when it was reported.
#[derive(Clone, Default)]
struct Outcomes(Arc<Mutex<Vec<(String, Instant, Outcome)>>>);

impl Observer for Outcomes {
    fn on_dispatch(&self, event: &DispatchEvent) {
        self.0.lock().unwrap().push((event.message_id.to_string(), Instant::now(), event.outcome.clone()));
    }
}

impl Outcomes {
    fn of(&self, id: &str) -> Vec<(Instant, Outcome)> {
        self.0.lock().unwrap().iter().filter(|(m, ..)| m == id).map(|(_, at, o)| (*at, o.clone())).collect()
    }
}

const NEWER_VERSION: &[u8] = br#"{"type":"test.rolling.job","v":2,"data":{"n":1,"note":"v2"}}"#;
const NEWER_TYPE: &[u8] = br#"{"type":"test.rolling.refund","v":1,"data":{"n":1}}"#;
/// Neither a newer build nor any other reads this: it fails at once, as before.
const MALFORMED: &[u8] = br#"{"type":"test.rolling.job","v":"two","data":{}}"#;

const WAIT: Duration = Duration::from_secs(3);

async fn consume(transport: &Arc<dyn Transport>, wait: Duration) -> (messaging::Running, Outcomes) {
    consume_queue(transport, "rolling-jobs", wait, Booked::default()).await
}

async fn consume_queue(
    transport: &Arc<dyn Transport>,
    queue: &str,
    wait: Duration,
    booked: Booked,
) -> (messaging::Running, Outcomes) {
    let outcomes = Outcomes::default();
    let mut app = messaging::App::new(transport.clone()).await.expect("app");
    app.only_queues(&[queue]);
    app.set_receive_wait(Duration::from_millis(500));
    app.setup().observer(outcomes.clone()).wait_for_newer(wait).provide(booked);
    (app.start().expect("start"), outcomes)
}

async fn send(transport: &Arc<dyn Transport>, body: &[u8]) -> String {
    let message = Outgoing { body: body.to_vec().into(), ..Outgoing::default() };
    transport.send("rolling-jobs", message).await.expect("sent").to_string()
}

/// Waits for `ids` to be dead letters; returns them.
async fn dead_letters(
    transport: &Arc<dyn Transport>,
    ids: &[&str],
    what: &str,
) -> Vec<messaging::transport::DeadLetter> {
    let dlq = transport.dead_letters().expect("dead letters");
    let deadline = Instant::now() + Duration::from_secs(40);
    loop {
        let letters = dlq.peek("rolling-jobs", 10).await.expect("peek");
        if ids.iter().all(|id| letters.iter().any(|l| l.message_id.as_str() == *id)) {
            return letters;
        }
        assert!(Instant::now() < deadline, "{what}: {} of {} dead letters in 40 s", letters.len(), ids.len());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// What the database queues and SQS share: each of the two bodies is given
/// back uncharged (at least once, for a pause no longer than the wait), and
/// fails like any other once the wait has passed since it was sent, with the
/// decode error as its dead letter's reason; a malformed envelope is not
/// waited for. Returns each given-back body's dead letter, by body.
async fn waits_then_fails(transport: Arc<dyn Transport>, what: &str) -> Vec<messaging::transport::DeadLetter> {
    let (running, outcomes) = consume(&transport, WAIT).await;
    let sent = Instant::now();
    let newer = send(&transport, NEWER_VERSION).await;
    let other = send(&transport, NEWER_TYPE).await;
    let malformed = send(&transport, MALFORMED).await;
    if let Some(browse) = transport.browse() {
        // While it waits, the queue says why (what `show` and the console print).
        let listing = Listing::of(MessageStatus::Sleeping);
        let deadline = Instant::now() + WAIT;
        let reason = loop {
            let page = browse.list("rolling-jobs", &listing).await.expect("list");
            let found = page.messages.into_iter().find(|m| m.message_id.as_str() == newer);
            if let Some(reason) = found.and_then(|m| m.reason) {
                break reason;
            }
            assert!(Instant::now() < deadline, "{what}: never seen sleeping with its reason");
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        assert!(reason.starts_with("waiting for a newer build of the consumer: `test.rolling.job` v2"), "{reason}");
    }
    let letters = dead_letters(&transport, &[&newer, &other, &malformed], what).await;
    running.stop().await;
    for (id, why) in [(&newer, "newer than the current v1"), (&other, "no handler on queue `rolling-jobs` takes")] {
        let seen = outcomes.of(id);
        let waited: Vec<&(Instant, Outcome)> =
            seen.iter().filter(|(_, o)| matches!(o, Outcome::AwaitingNewer { .. })).collect();
        assert!(!waited.is_empty(), "{what}: {why}: given back for a newer build first: {seen:?}");
        for (at, outcome) in &waited {
            let Outcome::AwaitingNewer { error, retry_in } = outcome else { unreachable!() };
            assert!(error.contains(why), "{what}: {error}");
            assert!(*retry_in <= WAIT && *at < sent + WAIT, "{what}: {why}: waited within the wait: {seen:?}");
        }
        let failed: Vec<&(Instant, Outcome)> =
            seen.iter().filter(|(_, o)| !matches!(o, Outcome::AwaitingNewer { .. })).collect();
        assert!(
            failed.iter().all(|(at, o)| *at >= sent + WAIT && matches!(o, Outcome::Undecodable { .. })),
            "{what}: {why}: failures only once the wait had passed: {seen:?}"
        );
        let letter = letters.iter().find(|l| l.message_id.as_str() == id.as_str()).unwrap();
        assert!(letter.reason.as_deref().is_some_and(|r| r.contains(why)), "{what}: reason {:?}", letter.reason);
    }
    let seen = outcomes.of(&malformed);
    assert!(
        seen.iter().all(|(_, o)| matches!(o, Outcome::Undecodable { error } if error.contains("malformed envelope"))),
        "{what}: a malformed envelope fails at once: {seen:?}"
    );
    letters
}

#[cfg(all(feature = "postgres", feature = "sqlite"))]
#[tokio::test]
async fn a_message_for_a_newer_build_waits_uncharged_then_fails_with_its_reason_on_both_databases() {
    for (url, _guard) in fixtures::both_databases("&migrate=true&poll=50ms").await {
        let transport = messaging::transport::connect(&url).await.expect("connects");
        let letters = waits_then_fails(transport.clone(), &url).await;
        for letter in letters.iter().filter(|l| !l.reason.as_deref().unwrap_or("").contains("malformed")) {
            // Given back uncharged: its attempts are the two made after the wait.
            assert_eq!(letter.receive_count, 2, "{url}: {letter:?}");
            assert_eq!(letter.history.len(), 2, "{url}: only attempts in its history: {:?}", letter.history);
        }
        // At a FIFO group's head it holds the group back, in order, while
        // it waits and while it fails; once dead-lettered the group goes on.
        let booked = Booked::default();
        let (running, outcomes) = consume_queue(&transport, "rolling-ledger.fifo", WAIT, booked.clone()).await;
        let sent = Instant::now();
        let mut ids = Vec::new();
        for body in [
            &br#"{"type":"test.rolling.entry","v":2,"data":{"n":0}}"#[..],
            br#"{"type":"test.rolling.entry","v":1,"data":{"n":1}}"#,
            br#"{"type":"test.rolling.entry","v":1,"data":{"n":2}}"#,
        ] {
            let message = Outgoing { body: body.to_vec().into(), group_id: Some("g".into()), ..Outgoing::default() };
            ids.push(transport.send("rolling-ledger.fifo", message).await.expect("sent").to_string());
        }
        let dlq = transport.dead_letters().expect("dead letters");
        fixtures::eventually(
            Duration::from_secs(30),
            || booked.lock().unwrap().len() == 2,
            || format!("{url}: booked {:?}", booked.lock().unwrap()),
        )
        .await;
        running.stop().await;
        assert_eq!(*booked.lock().unwrap(), [1, 2], "{url}: the rest of the group, in order");
        let letters = dlq.peek("rolling-ledger.fifo", 10).await.expect("peek");
        assert_eq!(letters.iter().map(|l| l.message_id.to_string()).collect::<Vec<_>>(), [ids[0].clone()], "{url}");
        assert_eq!(letters[0].receive_count, 2, "{url}: given back uncharged: {:?}", letters[0]);
        let head = outcomes.of(&ids[0]);
        assert!(
            matches!(head.first(), Some((at, Outcome::AwaitingNewer { .. })) if *at < sent + WAIT),
            "{url}: {head:?}"
        );
        for id in &ids[1..] {
            let (handled_at, _) = outcomes.of(id).into_iter().find(|(_, o)| *o == Outcome::Handled).expect("handled");
            assert!(handled_at >= sent + WAIT, "{url}: the group waited for its head");
        }

        // Turned off, it fails at once, as it did before the wait existed.
        let (running, outcomes) = consume(&transport, Duration::ZERO).await;
        let newer = send(&transport, NEWER_VERSION).await;
        dead_letters(&transport, &[&newer], &url).await;
        running.stop().await;
        let seen = outcomes.of(&newer);
        assert!(seen.iter().all(|(_, o)| matches!(o, Outcome::Undecodable { .. })), "{url}: {seen:?}");
    }
}

#[cfg(feature = "sqs")]
#[tokio::test]
async fn a_message_for_a_newer_build_waits_on_a_standard_sqs_queue_then_fails_with_its_reason() {
    let moto = fixtures::SqsServer::start();
    let transport = messaging::transport::connect(&moto.url(true)).await.expect("connect");
    waits_then_fails(transport, "sqs").await;
}

/// `cargo run --example rolling`, as the README's tour shows it: the newer
/// version waits, then reaches the dead letters with its reason.
#[cfg(feature = "sqlite")]
#[test]
fn the_rolling_example_shows_the_wait_and_the_dead_letter() {
    let file = fixtures::SqliteFile::new();
    let output = std::process::Command::new(fixtures::example_binary("rolling"))
        .args(["--transport", &format!("{}&migrate=true", file.url), "run"])
        .env("ROLLING_WAIT_SECS", "2")
        .env("RUST_LOG", "info")
        .output()
        .expect("the rolling example runs");
    let (out, err) = (String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr));
    assert!(output.status.success(), "{out}\n{err}");
    assert!(out.contains("handled order 1"), "{out}");
    assert!(err.contains("given back uncharged for a newer build"), "{err}");
    assert!(out.contains("went to the dead letters: `rolling.order` v2 is newer than the current v1"), "{out}\n{err}");
}
