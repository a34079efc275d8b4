//! Bad input on the database transports: an unreachable database, missing
//! tables, a payload that does not fit the type, an oversized id. Each gives a
//! clear error; nothing is lost; nothing panics.
#![cfg(all(feature = "postgres", feature = "sqlite"))]

use crate::fixtures;

use std::time::{Duration, Instant};

use messaging::prelude::*;
use messaging::transport::{Outgoing, Transport};

#[messaging::queue("errors-jobs", max_receives = 2)]
struct Jobs;

#[messaging::message(name = "test.errors", v = 1, id = key)]
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Job {
    key: String,
    amount: u32,
}

#[messaging::handler(queue = Jobs, retry(base = "50ms", max = "100ms"))]
async fn handle(_job: Job) {}

/// The app's worker on `queue` alone, running.
async fn consuming(transport: &std::sync::Arc<dyn Transport>, queue: &'static str) -> messaging::Running {
    let mut app = messaging::App::new(transport.clone()).await.expect("app");
    app.only_queues(&[queue]);
    app.start().expect("start")
}

/// The first dead letter of `queue`, waited for up to 20 s.
async fn first_dead_letter(transport: &dyn Transport, queue: &str, url: &str) -> messaging::transport::DeadLetter {
    let dead = transport.dead_letters().expect("dead letters");
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if let Some(letter) = dead.peek(queue, 10).await.expect("peek").pop() {
            return letter;
        }
        assert!(Instant::now() < deadline, "{url}: never dead-lettered");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn message(result: Result<std::sync::Arc<dyn Transport>, messaging::Error>) -> String {
    match result {
        Ok(_) => panic!("expected an error"),
        Err(e) => e.to_string(),
    }
}

#[tokio::test]
async fn an_unreachable_database_is_a_clear_error_without_hanging() {
    let started = Instant::now();
    let err = message(messaging::transport::connect("postgres://postgres@127.0.0.1:1/test").await);
    assert!(err.contains("cannot connect to PostgreSQL at postgres://postgres@127.0.0.1:1/test"), "{err}");
    assert!(err.contains("Connection refused"), "says what failed, not only that a pool timed out: {err}");
    assert!(started.elapsed() < Duration::from_secs(2), "a refused port fails at once: {:?}", started.elapsed());
    let err = message(messaging::transport::connect("postgres://postgres:secret@127.0.0.1:1/test").await);
    assert!(!err.contains("secret"), "the password is not printed: {err}");
    let err = message(messaging::transport::connect("sqlite:///nonexistent-dir/sub/app.db").await);
    assert!(err.contains("/nonexistent-dir/sub"), "names the path: {err}");
    let err = message(messaging::transport::connect("sqlite://app.db?retention=soon").await);
    assert!(err.contains("`soon` is not a duration"), "{err}");
}

#[tokio::test]
async fn missing_tables_are_named_with_the_fix() {
    let db = fixtures::Postgres::new().await;
    let transport = messaging::transport::connect(&db.url).await.expect("connects");
    let err = messaging::App::new(transport.clone()).await.expect_err("no tables yet").to_string();
    assert!(err.contains("the postgresql database has none of the framework's tables"), "{err}");
    assert!(err.contains("run the `migrate` command"), "{err}");
    // Said once for every queue of the binary, not once per queue.
    assert_eq!(err.matches("none of the framework's tables").count(), 1, "{err}");
    assert!(err.contains("startup validation found 1 problem(s)") && err.contains("queues `"), "{err}");
    transport.migrate().await.expect("migrate");
    messaging::App::new(transport).await.expect("ready after migrate");
    db.drop().await;

    let file = fixtures::SqliteFile::new();
    let transport = messaging::transport::connect(&file.url).await.expect("connects");
    let err = messaging::App::new(transport.clone()).await.expect_err("no tables yet").to_string();
    assert!(err.contains("the sqlite database has none of the framework's tables") && err.contains("migrate"), "{err}");
    // One table gone of a migrated database: named.
    transport.migrate().await.expect("migrate");
    let pool = messaging::sqlx::SqlitePool::connect(&file.url).await.expect("pool");
    messaging::sqlx::query("DROP TABLE messaging_schedules").execute(&pool).await.expect("drop table");
    let err = messaging::App::new(transport).await.expect_err("a table is missing").to_string();
    assert!(err.contains("table `messaging_schedules` is missing") && err.contains("migrate"), "{err}");
}

#[tokio::test]
async fn a_dropped_table_is_reported_by_validation() {
    let file = fixtures::SqliteFile::new();
    let transport = messaging::transport::connect(&format!("{}&migrate=true", file.url)).await.expect("connects");
    messaging::App::new(transport.clone()).await.expect("ready");
    let pool = messaging::sqlx::SqlitePool::connect(&file.url).await.expect("pool");
    messaging::sqlx::query("ALTER TABLE messaging_messages DROP COLUMN error")
        .execute(&pool)
        .await
        .expect("drop column");
    let err = messaging::App::new(transport).await.expect_err("a column is missing").to_string();
    assert!(err.contains("table `messaging_messages` lacks column(s) error"), "{err}");
}

#[tokio::test]
async fn a_payload_that_does_not_fit_ends_in_the_dead_letters_not_lost() {
    for (url, _guard) in fixtures::both_databases("&migrate=true&poll=50ms").await {
        let transport = messaging::transport::connect(&url).await.expect("connects");
        let mut app = messaging::App::new(transport.clone()).await.expect("app");
        app.only_queues(&["errors-jobs"]);
        let running = app.start().expect("start");
        let bad = Outgoing {
            body: br#"{"type":"test.errors","v":1,"data":{"key":"k","amount":-5}}"#.to_vec().into(),
            ..Outgoing::default()
        };
        let id = transport.send("errors-jobs", bad).await.expect("sent");
        let dead = transport.dead_letters().expect("dead letters");
        let deadline = Instant::now() + Duration::from_secs(20);
        let letters = loop {
            let letters = dead.peek("errors-jobs", 10).await.expect("peek");
            if !letters.is_empty() {
                break letters;
            }
            assert!(Instant::now() < deadline, "{url}: the bad message never reached the dead letters");
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        assert_eq!(letters[0].message_id, id);
        assert_eq!(letters[0].receive_count, 2, "tried max_receives times");
        running.stop().await;
    }
}

#[tokio::test]
async fn an_oversized_id_is_refused_before_sending() {
    let file = fixtures::SqliteFile::new();
    let transport = messaging::transport::connect(&format!("{}&migrate=true", file.url)).await.expect("connects");
    messaging::App::new(transport.clone()).await.expect("declares the queue");
    let publisher = Publisher::new(transport.clone());
    let job = Job { key: "k".repeat(10_000), amount: 1 };
    let err = publisher.send::<Jobs, _>(&job).await.expect_err("too long");
    assert!(matches!(err, PublishError::InvalidId { field: "identity", .. }), "{err}");
    assert!(err.to_string().contains("10000 characters long; the limit is 128"), "{err}");
    let err = publisher.send::<Jobs, _>(&Job { key: "has space".into(), amount: 1 }).await.expect_err("space");
    assert!(err.to_string().contains("printable ASCII"), "{err}");
    assert_eq!(transport.depth("errors-jobs").await.expect("depth"), 0, "nothing was sent");
}

#[messaging::queue("errors-history", max_receives = 3)]
struct Flaky;

#[messaging::message(name = "test.errors.history", v = 1)]
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Attempted {
    n: u32,
}

#[derive(Debug)]
struct Boom(u32);

impl std::fmt::Display for Boom {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "attempt {} failed", self.0)
    }
}

impl std::error::Error for Boom {}

#[messaging::handler(queue = Flaky, retry(base = "20ms", max = "40ms"))]
async fn always_fails(_m: Attempted, ctx: MessageContext) -> Result<(), HandlerError> {
    Err(HandlerError::transient(Boom(ctx.receive_count())))
}

#[tokio::test]
async fn a_dead_letter_keeps_every_failed_attempt_and_the_last_error_as_its_reason() {
    for (url, _guard) in fixtures::both_databases("&migrate=true&poll=50ms").await {
        let transport = messaging::transport::connect(&url).await.expect("connects");
        let running = consuming(&transport, "errors-history").await;
        let started = std::time::SystemTime::now();
        let id = Publisher::new(transport.clone()).send::<Flaky, _>(&Attempted { n: 1 }).await.expect("sent");
        let letter = first_dead_letter(transport.as_ref(), "errors-history", &url).await;
        running.stop().await;
        assert_eq!(letter.message_id, id);
        assert_eq!(letter.reason.as_deref(), Some("attempt 3 failed (after 3 attempts)"), "{url}");
        let attempts: Vec<(u32, &str, &str)> =
            letter.history.iter().map(|a| (a.attempt, a.error_type.as_str(), a.message.as_str())).collect();
        assert_eq!(
            attempts,
            [(1, "Boom", "attempt 1 failed"), (2, "Boom", "attempt 2 failed"), (3, "Boom", "attempt 3 failed")],
            "{url}"
        );
        let since = started.duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as i64 - 1_000;
        assert!(letter.history.iter().all(|a| a.at_ms >= since), "{url}: times are now-ish: {:?}", letter.history);
        assert!(letter.history.windows(2).all(|w| w[0].at_ms <= w[1].at_ms), "{url}: in order");
    }
}

#[messaging::queue("errors-history.fifo", fifo, max_receives = 3, default_group = "g", dlq = "errors-history-dlq.fifo")]
struct FlakyFifo;

#[messaging::message(name = "test.errors.history.fifo", v = 1)]
#[derive(Debug, Clone, Serialize, Deserialize)]
struct AttemptedInOrder {
    n: u32,
}

#[messaging::handler(queue = FlakyFifo, retry(base = "20ms", max = "40ms"))]
async fn always_fails_in_order(_m: AttemptedInOrder) -> Result<(), HandlerError> {
    Err(HandlerError::transient(Boom(0)))
}

/// A FIFO message is tried again by the worker that holds it (its group waits
/// for it): one receive, three attempts. Each attempt is in the history, not
/// only the last one.
#[tokio::test]
async fn a_fifo_dead_letter_keeps_the_attempts_its_worker_retried_itself() {
    let mut urls: Vec<(String, Box<dyn std::any::Any>)> = fixtures::both_databases("&migrate=true&poll=50ms").await;
    urls.push(("memory://".to_owned(), Box::new(())));
    for (url, _guard) in urls {
        let transport = messaging::transport::connect(&url).await.expect("connects");
        let running = consuming(&transport, "errors-history.fifo").await;
        let id =
            Publisher::new(transport.clone()).send::<FlakyFifo, _>(&AttemptedInOrder { n: 1 }).await.expect("sent");
        let letter = first_dead_letter(transport.as_ref(), "errors-history.fifo", &url).await;
        running.stop().await;
        assert_eq!(letter.message_id, id);
        assert_eq!(letter.reason.as_deref(), Some("attempt 0 failed (after 3 attempts)"), "{url}");
        let attempts: Vec<(u32, &str)> = letter.history.iter().map(|a| (a.attempt, a.error_type.as_str())).collect();
        assert_eq!(attempts, [(1, "Boom"), (2, "Boom"), (3, "Boom")], "{url}: {:?}", letter.history);
        assert!(letter.history.windows(2).all(|w| w[0].at_ms <= w[1].at_ms), "{url}: in order");
    }
}

#[messaging::queue("errors-parked.fifo", fifo, max_receives = 3, default_group = "g", dlq = "errors-parked-dlq.fifo")]
struct ParkedFifo;

#[messaging::message(name = "test.errors.parked", v = 1)]
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Parked {
    n: u32,
}

/// Fails; its retry waits long enough for the worker to be stopped first.
#[messaging::handler(queue = ParkedFifo, retry(base = "30s", max = "30s"))]
async fn fails_then_waits(_m: Parked) -> Result<(), HandlerError> {
    Err(HandlerError::transient(Boom(0)))
}

/// The worker stops while a FIFO head waits for its retry in process: the
/// message is given back, its failed attempt stays spent, and the next
/// process's attempt is the second, not the first again.
#[tokio::test]
async fn a_fifo_head_given_back_at_shutdown_keeps_its_failed_attempt() {
    for (url, _guard) in fixtures::both_databases("&migrate=true&poll=50ms").await {
        let transport = messaging::transport::connect(&url).await.expect("connects");
        messaging::App::new(transport.clone()).await.expect("declares the queues");
        let id = Publisher::new(transport.clone()).send::<ParkedFifo, _>(&Parked { n: 1 }).await.expect("sent");
        let history = |transport: std::sync::Arc<dyn Transport>, id: MessageId| async move {
            let report = transport.inspect("errors-parked.fifo", &id).await.expect("inspect").expect("found");
            (report.status, report.attempts, report.history.iter().map(|a| a.attempt).collect::<Vec<_>>())
        };
        for round in 1..=2u32 {
            let running = consuming(&transport, "errors-parked.fifo").await;
            let deadline = Instant::now() + Duration::from_secs(20);
            while history(transport.clone(), id.clone()).await.2.len() < round as usize {
                assert!(Instant::now() < deadline, "{url}: attempt {round} never failed");
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            running.stop().await;
            let expected: Vec<u32> = (1..=round).collect();
            assert_eq!(history(transport.clone(), id.clone()).await, ("pending".to_owned(), round, expected), "{url}");
        }
    }
}

#[tokio::test]
async fn dead_letters_are_paged_through_with_exact_counts() {
    use messaging::transport::{FailedAttempt, RedriveOptions};
    for (url, _guard) in fixtures::both_databases("&migrate=true").await {
        let transport = messaging::transport::connect(&url).await.expect("connects");
        let spec = messaging::QueueSpec::standard("errors-paged");
        transport.declare(&spec).await.expect("declare");
        // 1,100 dead letters (more than two pages), even and odd by attribute.
        let letters: Vec<Outgoing> = (0..1_100)
            .map(|i| Outgoing {
                body: format!("{i}").into_bytes().into(),
                attributes: [("kind".to_owned(), if i % 2 == 0 { "even" } else { "odd" }.to_owned())].into(),
                ..Outgoing::default()
            })
            .collect();
        for r in transport.send_batch("errors-paged", letters).await {
            r.expect("sent");
        }
        let dead = transport.dead_letters().expect("dead letters");
        // Message ids by body: receives come in no order the test relies on
        // (on the database queues, a partition of the rows at a time).
        let mut ids = std::collections::HashMap::new();
        while ids.len() < 1_100 {
            for d in transport.receive("errors-paged", 300, Duration::from_millis(100)).await.expect("receive") {
                dead.dead_letter("errors-paged", &d, FailedAttempt::new(1, "Error", "bad")).await.expect("dead");
                ids.insert(String::from_utf8(d.body.to_vec()).expect("a number"), d.message_id);
            }
        }
        let kind = |k: &'static str| -> messaging::transport::DeadLetterFilter {
            std::sync::Arc::new(move |l| l.attributes.get("kind").map(String::as_str) == Some(k))
        };
        let even = RedriveOptions { max: Some(520), filter: Some(kind("even")), dry_run: true };
        let outcome = dead.redrive("errors-paged", even.clone()).await.expect("dry run");
        assert_eq!((outcome.moved, outcome.skipped), (520, 519), "{url}: the 520th even letter is the 1,039th");
        assert_eq!(dead.depth("errors-paged").await.expect("depth"), 1_100, "{url}: a dry run moves nothing");
        let outcome = dead.redrive("errors-paged", RedriveOptions { dry_run: false, ..even }).await.expect("redrive");
        assert_eq!((outcome.moved, outcome.skipped), (520, 519), "{url}");
        assert_eq!(dead.depth("errors-paged").await.expect("depth"), 580, "{url}");
        assert_eq!(transport.depth("errors-paged").await.expect("depth"), 520, "{url}: back in the queue");
        let all = dead.purge("errors-paged", RedriveOptions { dry_run: true, ..RedriveOptions::default() });
        assert_eq!(all.await.expect("dry purge").deleted, 580, "{url}");
        let odd = RedriveOptions { filter: Some(kind("odd")), ..RedriveOptions::default() };
        let outcome = dead.purge("errors-paged", odd).await.expect("purge");
        assert_eq!((outcome.deleted, outcome.skipped), (550, 30), "{url}");
        let last_even = ids["1098"].clone();
        assert_eq!(dead.delete("errors-paged", std::slice::from_ref(&last_even)).await.expect("delete"), 1, "{url}");
        assert_eq!(dead.delete("errors-paged", &[last_even]).await.expect("delete"), 0, "{url}: gone already");
        assert_eq!(dead.depth("errors-paged").await.expect("depth"), 29, "{url}");
    }
}

/// A redrive while the letters' bug is not fixed yet: a worker fails every
/// redriven letter again at once, and it goes back to the dead letters,
/// behind the others. The redrive moves each letter it found once and stops,
/// rather than meeting the ones it moved again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redrive_ends_at_the_letters_it_found_while_they_fail_again() {
    use messaging::transport::{DeadLetterFilter, FailedAttempt, RedriveOptions};
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    for (url, _guard) in fixtures::both_databases("&migrate=true").await {
        let transport = messaging::transport::connect(&url).await.expect("connects");
        transport.declare(&messaging::QueueSpec::standard("errors-again")).await.expect("declare");
        let letters: Vec<Outgoing> =
            (0..1_100).map(|i| Outgoing { body: format!("{i}").into_bytes().into(), ..Outgoing::default() }).collect();
        for r in transport.send_batch("errors-again", letters).await {
            r.expect("sent");
        }
        let mut dead_lettered = 0;
        while dead_lettered < 1_100 {
            for d in transport.receive("errors-again", 300, Duration::from_millis(100)).await.expect("receive") {
                let dead = transport.dead_letters().expect("dead letters");
                dead.dead_letter("errors-again", &d, FailedAttempt::new(1, "Error", "bad")).await.expect("dead");
                dead_lettered += 1;
            }
        }
        let again = Arc::new(AtomicUsize::new(0));
        let worker = tokio::spawn({
            let (transport, again) = (transport.clone(), again.clone());
            async move {
                loop {
                    for d in transport.receive("errors-again", 100, Duration::from_millis(20)).await.expect("receive") {
                        let dead = transport.dead_letters().expect("dead letters");
                        dead.dead_letter("errors-again", &d, FailedAttempt::new(2, "Error", "bad"))
                            .await
                            .expect("dead");
                        again.fetch_add(1, Ordering::SeqCst);
                    }
                }
            }
        });
        let seen = Arc::new(AtomicUsize::new(0));
        let filter: DeadLetterFilter = Arc::new({
            let again = again.clone();
            move |_| {
                // The first page of 500 is back in the queue: let the worker
                // fail some of it again before the walk reads its third page.
                if seen.fetch_add(1, Ordering::SeqCst) == 500 {
                    let deadline = Instant::now() + Duration::from_secs(10);
                    while again.load(Ordering::SeqCst) < 100 && Instant::now() < deadline {
                        std::thread::sleep(Duration::from_millis(5));
                    }
                }
                true
            }
        });
        let dead = transport.dead_letters().expect("dead letters");
        let outcome =
            dead.redrive("errors-again", RedriveOptions { filter: Some(filter), ..RedriveOptions::default() });
        let outcome = outcome.await.expect("redrive");
        worker.abort();
        assert!(again.load(Ordering::SeqCst) >= 100, "{url}: the worker failed letters again meanwhile");
        assert_eq!((outcome.moved, outcome.skipped), (1_100, 0), "{url}: each letter found, once");
    }
}

/// `?` on the database's own error in a handler: a failure whose reason is
/// the database's message. (A compile-time case of the macros' before; here
/// so that trybuild's own build of the dependencies needs no sqlx.)
#[messaging::queue("errors-sqlx", dlq = "errors-sqlx-dlq", max_receives = 1)]
struct SqlxJobs;

#[messaging::handler(queue = SqlxJobs)]
async fn not_found(_job: Job) -> Result<(), HandlerError> {
    Err(messaging::sqlx::Error::RowNotFound)?;
    Ok(())
}

#[tokio::test]
async fn a_question_mark_on_a_database_error_fails_the_message_with_its_words() {
    let app = messaging::testing::TestApp::builder().only::<SqlxJobs>().start().await.expect("start");
    let sent = app.publisher().send::<SqlxJobs, _>(&Job { key: "k".into(), amount: 1 }).await.expect("sent");
    app.dead_lettered(&sent).await.expect("dead-lettered");
    let letters = app.transport().dead_letters().expect("dead letters").peek("errors-sqlx", 10).await.expect("peek");
    let reason = letters[0].reason.as_deref().unwrap_or_default();
    assert!(reason.starts_with("no rows returned by a query that expected to return at least one row"), "{reason}");
    app.stop().await;
}
