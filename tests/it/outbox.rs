//! The outbox, from outside: an app whose queues are on another transport
//! (`memory://`, Amazon SQS on moto) publishes inside its own PostgreSQL or
//! SQLite transaction; a rollback sends nothing, a commit sends once, the
//! relay wakes at the commit, FIFO groups keep their order, a resend of an
//! accepted FIFO message (a relay that died before its delete) is dropped by
//! SQS's deduplication, and `/health` reports rows nobody relays.
#![cfg(all(feature = "postgres", feature = "sqlite"))]

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use messaging::prelude::*;
use messaging::sqlx;
use messaging::transport::Outbox;

use crate::fixtures;

/// The queue the transactions publish to, on another transport.
#[messaging::queue("outbox-events")]
struct Events;

/// A FIFO queue, for the order of groups.
#[messaging::queue("outbox-ledger.fifo", fifo)]
struct Ledger;

#[messaging::message(name = "outbox.event", v = 1)]
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Event {
    n: u32,
}

#[messaging::message(name = "outbox.entry", v = 1, group = account)]
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Entry {
    account: String,
    n: u32,
}

/// What the handlers saw: (n, the message id the relay carried, when).
#[derive(Default)]
struct Seen {
    events: Mutex<Vec<(u32, Option<String>, Instant)>>,
    entries: Mutex<Vec<(String, u32)>>,
}

#[messaging::handler(queue = Events)]
async fn outbox_event(e: Event, ctx: MessageContext, seen: State<Arc<Seen>>) {
    let id = ctx.attribute("messaging.message_id").map(str::to_owned);
    seen.events.lock().unwrap().push((e.n, id, Instant::now()));
}

#[messaging::handler(queue = Ledger)]
async fn outbox_entry(e: Entry, seen: State<Arc<Seen>>) {
    seen.entries.lock().unwrap().push((e.account, e.n));
}

fn handled(seen: &Seen, n: u32) -> usize {
    seen.events.lock().unwrap().iter().filter(|(m, _, _)| *m == n).count()
}

/// Rollback, commit (one and a batch), the id carried, the wake-up at the
/// commit and FIFO order, on an app over `memory://` whose outbox is
/// `outbox` in the database of `pool`; `commit` commits as the app would.
macro_rules! relays_what_commits {
    ($outbox:expr, $pool:expr, $begin:expr, $commit:expr) => {{
        let transport = messaging::transport::connect("memory://").await.expect("memory");
        let mut app = messaging::App::new(transport.clone()).await.expect("app");
        app.only_queues(&["outbox-events", "outbox-ledger.fifo"]);
        let outbox: Outbox = $outbox;
        let pool = $pool;
        let seen = Arc::new(Seen::default());
        app.setup().provide(seen.clone());
        let publisher = app.setup().publisher(); // made before the outbox is set: it still uses it
        app.setup().outbox(outbox.clone());
        assert!(publisher.outbox().is_some());

        // Before the relay runs: rolled back leaves nothing, committed waits in the outbox.
        let mut tx = $begin(&pool).await;
        publisher.send::<Events, _>(&Event { n: 1 }).in_transaction(&mut tx).await.expect("in the tx");
        tx.rollback().await.expect("rollback");
        assert!(outbox.stats().await.expect("stats").is_empty(), "a rollback leaves nothing");
        let mut tx = $begin(&pool).await;
        let id = publisher.send::<Events, _>(&Event { n: 2 }).in_transaction(&mut tx).await.expect("in the tx");
        let ids = publisher
            .send_batch::<Events, _>(&[Event { n: 3 }, Event { n: 4 }])
            .in_transaction(&mut tx)
            .await
            .expect("a batch in the tx");
        for (i, account) in ["a", "b", "a", "b", "a", "a", "b"].iter().enumerate() {
            let entry = Entry { account: (*account).to_owned(), n: i as u32 };
            publisher.send::<Ledger, _>(&entry).in_transaction(&mut tx).await.expect("a FIFO entry");
        }
        $commit(&publisher, tx).await;
        let stats = outbox.stats().await.expect("stats");
        let events = stats.iter().find(|q| q.queue == "outbox-events").expect("the queue's rows");
        assert_eq!((events.pending, events.failed), (3, 0), "{stats:?}");
        assert!(events.oldest_pending_ms.is_some());
        assert_eq!(transport.depth("outbox-events").await.expect("depth"), 0, "not sent before a relay runs");

        let running = app.start().expect("start");
        fixtures::eventually(
            Duration::from_secs(10),
            || (2..=4).all(|n| handled(&seen, n) == 1) && seen.entries.lock().unwrap().len() == 7,
            || format!("relayed: {:?}", seen.events.lock().unwrap()),
        )
        .await;
        assert_eq!(handled(&seen, 1), 0, "the rolled-back message was sent");
        let carried: Vec<Option<String>> = [2, 3, 4]
            .iter()
            .map(|n| seen.events.lock().unwrap().iter().find(|e| e.0 == *n).and_then(|e| e.1.clone()))
            .collect();
        let returned: Vec<Option<String>> = std::iter::once(&id).chain(&ids).map(|id| Some(id.to_string())).collect();
        assert_eq!(carried, returned, "each carries the id its publish returned");
        for account in ["a", "b"] {
            let ns: Vec<u32> =
                seen.entries.lock().unwrap().iter().filter(|(a, _)| a == account).map(|(_, n)| *n).collect();
            let mut sorted = ns.clone();
            sorted.sort_unstable();
            assert_eq!(ns, sorted, "group {account} in order");
        }
        // An idle relay wakes at the commit (the outbox polls every 10 s).
        tokio::time::sleep(Duration::from_millis(300)).await;
        let mut tx = $begin(&pool).await;
        publisher.send::<Events, _>(&Event { n: 100 }).in_transaction(&mut tx).await.expect("in the tx");
        let committed = Instant::now();
        $commit(&publisher, tx).await;
        fixtures::eventually(Duration::from_secs(5), || handled(&seen, 100) == 1, || "not relayed within 5 s".into())
            .await;
        let at = seen.events.lock().unwrap().iter().find(|e| e.0 == 100).map(|e| e.2).expect("handled");
        let woke = at.duration_since(committed);
        eprintln!("relayed and handled {woke:?} after the commit");
        assert!(woke < Duration::from_secs(2), "{woke:?} after the commit: the 10 s poll, not a wake-up");
        let stopped = running.stop().await;
        assert_eq!(stopped.not_released, 0);
        let left: u64 = outbox.stats().await.expect("stats").iter().map(|q| q.pending + q.failed).sum();
        assert_eq!(left, 0, "the outbox is empty once relayed");
        (publisher, pool)
    }};
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_postgres_outbox_relays_what_commits_to_another_transport() {
    let db = fixtures::Postgres::new().await;
    let outbox =
        Outbox::connect(&format!("{}&migrate=true", db.url)).await.expect("outbox").poll(Duration::from_secs(10));
    let (publisher, pool) = relays_what_commits!(
        outbox,
        sqlx::PgPool::connect(&db.url).await.expect("the application's pool"),
        |pool: &sqlx::PgPool| {
            let pool = pool.clone();
            async move { pool.begin().await.expect("begin") }
        },
        // PostgreSQL wakes the relays at the commit itself (NOTIFY).
        |_: &Publisher, tx: sqlx::Transaction<'static, sqlx::Postgres>| async move { tx.commit().await.expect("commit") }
    );

    // A transaction on another database is refused with a sentence.
    let lite = fixtures::SqliteFile::new();
    let lite_pool = sqlx::SqlitePool::connect(&lite.url).await.expect("sqlite");
    let mut other = lite_pool.begin().await.expect("begin");
    let err = publisher.send::<Events, _>(&Event { n: 9 }).in_transaction(&mut other).await.unwrap_err().to_string();
    assert!(err.contains("the transaction is not on postgresql, where the outbox is"), "{err}");
    // One on another database of the same server.
    let elsewhere = fixtures::another_postgres_database().await;
    let mut other = elsewhere.begin().await.expect("begin");
    let err = publisher.send::<Events, _>(&Event { n: 9 }).in_transaction(&mut other).await.unwrap_err().to_string();
    assert!(err.contains("the transaction is on postgresql database `postgres@"), "{err}");
    assert!(err.contains("the outbox on `test@"), "{err}");
    drop(pool);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sqlite_outbox_relays_what_commits_and_publisher_commit_wakes_the_relay() {
    let db = fixtures::SqliteFile::new();
    let outbox =
        Outbox::connect(&format!("{}&migrate=true", db.url)).await.expect("outbox").poll(Duration::from_secs(10));
    relays_what_commits!(
        outbox,
        sqlx::SqlitePool::connect(&db.url).await.expect("the application's pool"),
        |pool: &sqlx::SqlitePool| {
            let pool = pool.clone();
            async move { pool.begin_with("BEGIN IMMEDIATE").await.expect("begin") }
        },
        // SQLite gives no signal at a commit: Publisher::commit wakes this process's relay.
        |publisher: &Publisher, tx: sqlx::Transaction<'static, sqlx::Sqlite>| {
            let publisher = publisher.clone();
            async move { publisher.commit(tx).await.expect("commit") }
        }
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_reports_outbox_rows_that_no_relay_sends() {
    let db = fixtures::Postgres::new().await;
    let outbox =
        Outbox::connect(&format!("{}&migrate=true", db.url)).await.expect("outbox").max_age(Duration::from_millis(200));
    // A row for a queue this app does not declare: another service's, whose relays are down.
    fixtures::psql(&format!(
        "INSERT INTO {}.messaging_outbox (queue, message_id, fifo, payload, created_at, next_at) \
         VALUES ('another-service-queue', 'm-1', FALSE, '\\x7b7d', 0, 0)",
        db.schema
    ));
    let transport = messaging::transport::connect("memory://").await.expect("memory");
    let mut app = messaging::App::new(transport).await.expect("app");
    app.only_queues(&["outbox-events"]);
    app.setup().provide(Arc::new(Seen::default()));
    app.setup().outbox(outbox.clone());
    let mut running = app.start().expect("start");
    let addr = running.serve_http("127.0.0.1:0".parse().unwrap()).await.expect("http");
    let (status, body) =
        tokio::task::spawn_blocking(move || fixtures::http_get(&addr.to_string(), "/health")).await.unwrap();
    assert_eq!(status, 503, "{body}");
    assert!(body.contains("another-service-queue") && body.contains("are relays running"), "{body}");
    let stats = outbox.stats().await.expect("stats");
    assert_eq!(stats.len(), 1, "left to the app that declares it: {stats:?}");
    running.stop().await;
}

#[cfg(feature = "sqs")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resent_fifo_message_is_dropped_by_sqs_and_groups_keep_their_order() {
    let moto = fixtures::SqsServer::start();
    let db = fixtures::Postgres::new().await;
    let outbox = Outbox::connect(&format!("{}&migrate=true", db.url)).await.expect("outbox");
    let transport = messaging::transport::connect(&moto.url(true)).await.expect("sqs");
    // A process that only relays (no handlers): the messages stay in the queue.
    let mut relaying = messaging::App::new(transport.clone()).await.expect("app");
    relaying.only_queues(&[]);
    relaying.setup().outbox(outbox.clone());
    let publisher = relaying.setup().publisher();
    let pool = sqlx::PgPool::connect(&db.url).await.expect("pool");
    let mut tx = pool.begin().await.expect("begin");
    for n in 0..24u32 {
        let entry = Entry { account: format!("acct-{}", n % 3), n };
        publisher.send::<Ledger, _>(&entry).in_transaction(&mut tx).await.expect("in the tx");
    }
    tx.commit().await.expect("commit");
    // What a relay that dies between SQS's acceptance and its delete leaves:
    // the rows as they were, for the next relay to send again.
    sqlx::query("CREATE TABLE kept AS SELECT * FROM messaging_outbox").execute(&pool).await.expect("keep the rows");
    let running = relaying.start().expect("start");
    outbox_drained(&outbox).await;
    assert_eq!(transport.depth("outbox-ledger.fifo").await.expect("depth"), 24);
    sqlx::query("INSERT INTO messaging_outbox SELECT * FROM kept").execute(&pool).await.expect("the rows again");
    outbox_drained(&outbox).await;
    // Amazon SQS drops a repeated deduplication id for five minutes after
    // the first send; moto only while the first copy is still in the queue,
    // which is why nothing is consumed before the resend here.
    let depth = transport.depth("outbox-ledger.fifo").await.expect("depth");
    assert_eq!(depth, 24, "the resent messages were dropped (same deduplication id)");
    running.stop().await;

    let mut consuming = messaging::App::new(transport.clone()).await.expect("app");
    consuming.only_queues(&["outbox-ledger.fifo"]);
    let seen = Arc::new(Seen::default());
    consuming.setup().provide(seen.clone());
    let running = consuming.start().expect("start");
    let all = || seen.entries.lock().unwrap().len() >= 24;
    fixtures::eventually(Duration::from_secs(30), all, || format!("handled {:?}", seen.entries.lock().unwrap())).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let entries = seen.entries.lock().unwrap().clone();
    assert_eq!(entries.len(), 24, "each once: {entries:?}");
    for account in ["acct-0", "acct-1", "acct-2"] {
        let ns: Vec<u32> = entries.iter().filter(|(a, _)| a == account).map(|(_, n)| *n).collect();
        let mut sorted = ns.clone();
        sorted.sort_unstable();
        assert_eq!(ns, sorted, "group {account} in order");
    }
    running.stop().await;
}

/// Waits until the outbox has no pending row.
async fn outbox_drained(outbox: &Outbox) {
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let pending: u64 = outbox.stats().await.expect("stats").iter().map(|q| q.pending).sum();
        if pending == 0 {
            return;
        }
        assert!(Instant::now() < deadline, "{pending} rows still pending");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Runs the chain example with `run --drain` on the transport `transport`,
/// the application's database (and outbox) at `db_url`, placing `orders`;
/// it must succeed within a minute.
fn run_chain_example(db_url: &str, transport: &str, orders: u32) {
    let mut child = std::process::Command::new(fixtures::example_binary("chain"))
        .args(["--transport", transport, "run", "--drain"])
        .env("CHAIN_DATABASE_URL", db_url)
        .env("CHAIN_PLACE", orders.to_string())
        .env("RUST_LOG", "warn")
        .stdout(std::process::Stdio::null())
        .spawn()
        .expect("the chain example starts");
    let status = fixtures::wait_for(&mut child, Duration::from_secs(60), "the chain example");
    assert!(status.success(), "{status:?}");
}

/// Each order's charge and notification, counted.
async fn chain_counts(db: &fixtures::Postgres) -> (i64, i64, i64, i64) {
    let pool = sqlx::PgPool::connect(&db.url).await.expect("pool");
    let count = |sql: &'static str| {
        let pool = pool.clone();
        async move { sqlx::query_scalar::<_, i64>(sql).fetch_one(&pool).await.expect(sql) }
    };
    (
        count("SELECT count(*) FROM chain_charges").await,
        count("SELECT count(DISTINCT order_id) FROM chain_charges").await,
        count("SELECT count(*) FROM chain_notifications").await,
        count("SELECT count(*) FROM messaging_outbox").await,
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_chain_example_charges_and_notifies_each_order_once_on_postgres() {
    let db = fixtures::Postgres::new().await;
    let transport = format!("{}&migrate=true", db.url);
    let db_url = db.url.clone();
    let blocking = move || {
        run_chain_example(&db_url, &transport, 12);
        // A second run places nothing again and charges nothing twice.
        run_chain_example(&db_url, &transport, 12);
    };
    tokio::task::spawn_blocking(blocking).await.expect("ran");
    assert_eq!(chain_counts(&db).await, (12, 12, 12, 0));
}

#[cfg(feature = "sqs")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_chain_example_goes_through_the_outbox_with_its_queues_on_sqs() {
    let moto = fixtures::SqsServer::start();
    let db = fixtures::Postgres::new().await;
    let transport = moto.url(true);
    let db_url = db.url.clone();
    let blocking = move || run_chain_example(&db_url, &transport, 9);
    tokio::task::spawn_blocking(blocking).await.expect("ran");
    assert_eq!(chain_counts(&db).await, (9, 9, 9, 0));
}

/// A process that only relays: `MESSAGING_TEST_URL` (SQS), `MESSAGING_TEST_OUTBOX`;
/// it drains the outbox, then prints how many SQS requests it made after starting.
#[cfg(feature = "sqs")]
#[test]
#[ignore = "entry point of the relay processes started by two_relay_processes_send_each_row_once_in_group_order"]
fn outbox_relay_worker() {
    let (Ok(url), Ok(outbox)) = (std::env::var("MESSAGING_TEST_URL"), std::env::var("MESSAGING_TEST_OUTBOX")) else {
        return;
    };
    fixtures::runtime().block_on(async move {
        let sqs = Arc::new(messaging::transport::sqs::connect(&url).await.expect("sqs"));
        let mut app = messaging::App::new(sqs.clone() as Arc<dyn messaging::transport::Transport>).await.expect("app");
        app.only_queues(&[]);
        app.setup().outbox(Outbox::connect(&outbox).await.expect("outbox"));
        app.set_run_mode(messaging::RunMode::Drain);
        let before = sqs.requests();
        app.start().expect("start").wait().await;
        println!("requests: {}", sqs.requests() - before);
    });
}

#[cfg(feature = "sqs")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_relay_processes_send_each_row_once_in_group_order() {
    let moto = fixtures::SqsServer::start();
    let db = fixtures::Postgres::new().await;
    let outbox = Outbox::connect(&format!("{}&migrate=true", db.url)).await.expect("outbox");
    let transport = messaging::transport::connect(&moto.url(true)).await.expect("sqs");
    let mut app = messaging::App::new(transport.clone()).await.expect("declare the queues");
    app.only_queues(&[]);
    app.setup().outbox(outbox.clone());
    let publisher = app.setup().publisher();
    let pool = sqlx::PgPool::connect(&db.url).await.expect("pool");
    for t in 0..4u32 {
        let mut tx = pool.begin().await.expect("begin");
        for i in 0..50u32 {
            let n = t * 50 + i;
            let entry = Entry { account: format!("acct-{}", n % 4), n };
            publisher.send::<Ledger, _>(&entry).in_transaction(&mut tx).await.expect("a FIFO entry");
            publisher.send::<Events, _>(&Event { n }).in_transaction(&mut tx).await.expect("a standard one");
        }
        tx.commit().await.expect("commit");
    }
    let spawn = || {
        crate::fixtures::entry_process(module_path!(), "outbox_relay_worker")
            .env("MESSAGING_TEST_URL", moto.url(false))
            .env("MESSAGING_TEST_OUTBOX", &db.url)
            .env("RUST_LOG", "error")
            .stdout(std::process::Stdio::piped())
            .spawn()
            .expect("a relay process")
    };
    let (a, b) = (spawn(), spawn());
    let requests = tokio::task::spawn_blocking(move || {
        [a, b].map(|child| {
            let out = child.wait_with_output().expect("the relay process");
            assert!(out.status.success(), "{out:?}");
            let text = String::from_utf8_lossy(&out.stdout).into_owned();
            // The harness prints the test's name on the same line first.
            let count = text.lines().find_map(|l| l.split("requests: ").nth(1)?.trim().parse::<u64>().ok());
            count.unwrap_or_else(|| panic!("no count in {text:?}"))
        })
    })
    .await
    .expect("both ran");
    eprintln!("SQS requests of the two relay processes: {requests:?}");
    assert!(requests.iter().all(|&r| r > 0), "both processes relayed: {requests:?}");
    assert!(outbox.stats().await.expect("stats").is_empty(), "the outbox is empty");
    // What the relays sent, counted before anything is received: each row once.
    for queue in ["outbox-events", "outbox-ledger.fifo"] {
        let depth = transport.depth(queue).await.expect("depth");
        assert_eq!(depth, 200, "{queue}: every row sent once by the two relay processes");
    }

    let mut consuming = messaging::App::new(transport.clone()).await.expect("app");
    consuming.only_queues(&["outbox-events", "outbox-ledger.fifo"]);
    let seen = Arc::new(Seen::default());
    consuming.setup().provide(seen.clone());
    let running = consuming.start().expect("start");
    let all = || seen.entries.lock().unwrap().len() >= 200 && seen.events.lock().unwrap().len() >= 200;
    fixtures::eventually(Duration::from_secs(60), all, || {
        format!("{} entries, {} events", seen.entries.lock().unwrap().len(), seen.events.lock().unwrap().len())
    })
    .await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    running.stop().await;
    // A standard queue delivers at least once (moto, like SQS, may hand a
    // message to two concurrent receives): each arrived, under one id.
    let events: std::collections::BTreeSet<(u32, Option<String>)> =
        seen.events.lock().unwrap().iter().map(|e| (e.0, e.1.clone())).collect();
    assert_eq!(events.len(), 200, "each standard message arrived, each under one id");
    let entries = seen.entries.lock().unwrap().clone();
    assert_eq!(entries.len(), 200, "each FIFO message once");
    for account in ["acct-0", "acct-1", "acct-2", "acct-3"] {
        let ns: Vec<u32> = entries.iter().filter(|(a, _)| a == account).map(|(_, n)| *n).collect();
        let mut sorted = ns.clone();
        sorted.sort_unstable();
        assert_eq!(ns, sorted, "group {account} in order across two relay processes");
    }
}
