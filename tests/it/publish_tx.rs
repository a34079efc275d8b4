//! Publishing inside the application's own transaction, on PostgreSQL and
//! SQLite: a rollback publishes nothing, a commit publishes once (single
//! and batch, with the identity rules of any send), the message is invisible
//! until the commit, and on PostgreSQL an idle receiver polling every 10 s
//! wakes at the commit. Other transports and other databases refuse.
#![cfg(all(feature = "postgres", feature = "sqlite"))]

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use messaging::prelude::*;
use messaging::sqlx;

use crate::fixtures;

/// The queue the transactions publish to.
#[messaging::queue("tx-jobs")]
struct TxJobs;

/// What they publish.
#[messaging::message(name = "tx.job", v = 1)]
#[derive(Debug, Clone, Serialize, Deserialize)]
struct TxJob {
    /// Its number.
    n: u32,
}

/// When each job was handled.
#[derive(Default)]
struct Handled {
    jobs: Mutex<Vec<(u32, Instant)>>,
}

#[messaging::handler(queue = TxJobs)]
async fn tx_job(job: TxJob, handled: State<Arc<Handled>>) {
    handled.jobs.lock().unwrap().push((job.n, Instant::now()));
}

/// Rollback, commit, batch and identity, on `url` with the application's
/// own transactions from `begin`.
macro_rules! commit_and_rollback {
    ($url:expr, $pool:expr, $begin:expr, $create:expr) => {{
        let transport = messaging::transport::connect($url).await.expect("connect");
        let mut app = messaging::App::new(transport.clone()).await.expect("app");
        app.only_queues(&["tx-jobs"]);
        let publisher = app.setup().publisher();
        let pool = $pool;
        sqlx::query($create).execute(&pool).await.expect("the application's table");
        let depth = || async { transport.depth("tx-jobs").await.expect("depth") };
        let orders = |pool| async move {
            let n: i64 = sqlx::query_scalar("SELECT count(*) FROM app_orders").fetch_one(pool).await.expect("count");
            n
        };

        // Rolled back: neither the order nor the message.
        let mut tx = $begin(&pool).await;
        sqlx::query("INSERT INTO app_orders (id) VALUES (1)").execute(&mut *tx).await.expect("insert");
        publisher.send::<TxJobs, _>(&TxJob { n: 1 }).in_transaction(&mut tx).await.expect("published in the tx");
        tx.rollback().await.expect("rollback");
        assert_eq!((depth().await, orders(&pool).await), (0, 0), "a rollback publishes nothing");

        // Committed: both, and the message is invisible until then.
        let mut tx = $begin(&pool).await;
        sqlx::query("INSERT INTO app_orders (id) VALUES (2)").execute(&mut *tx).await.expect("insert");
        let id = publisher.send::<TxJobs, _>(&TxJob { n: 2 }).in_transaction(&mut tx).await.expect("published");
        assert_eq!(depth().await, 0, "invisible before the commit");
        tx.commit().await.expect("commit");
        assert_eq!((depth().await, orders(&pool).await), (1, 1), "a commit publishes once");
        assert!(!id.as_str().is_empty());

        // A batch, and one identity published twice in one transaction: one row.
        let mut tx = $begin(&pool).await;
        let jobs = [TxJob { n: 3 }, TxJob { n: 4 }, TxJob { n: 5 }];
        let ids = publisher.send_batch::<TxJobs, _>(&jobs).in_transaction(&mut tx).await.expect("batch");
        assert_eq!(ids.len(), 3);
        publisher.send::<TxJobs, _>(&TxJob { n: 6 }).id("same").in_transaction(&mut tx).await.expect("first");
        publisher.send::<TxJobs, _>(&TxJob { n: 7 }).id("same").in_transaction(&mut tx).await.expect("second");
        tx.commit().await.expect("commit");
        assert_eq!(depth().await, 5, "three of the batch, one row for the identity");
        (transport, app, publisher, pool)
    }};
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_commit_publishes_once_rollback_nothing_and_the_commit_wakes_the_receiver() {
    let db = fixtures::Postgres::new().await;
    // A poll far longer than the wait allowed below: only NOTIFY can wake it.
    let url = format!("{}&migrate=true&poll=10s", db.url);
    let (transport, mut app, publisher, pool) = commit_and_rollback!(
        &url,
        sqlx::PgPool::connect(&db.url).await.expect("the application's pool"),
        |pool: &sqlx::PgPool| {
            let pool = pool.clone();
            async move { pool.begin().await.expect("begin") }
        },
        "CREATE TABLE app_orders (id BIGINT PRIMARY KEY)"
    );
    // Drain what is there, then publish in a transaction to an idle receiver.
    let handled = Arc::new(Handled::default());
    app.setup().provide(handled.clone());
    let running = app.start().expect("start");
    fixtures::eventually(
        Duration::from_secs(10),
        || handled.jobs.lock().unwrap().len() == 5,
        || "the first five".into(),
    )
    .await;
    tokio::time::sleep(Duration::from_millis(300)).await; // the receiver is idle now
    let mut tx = pool.begin().await.expect("begin");
    publisher.send::<TxJobs, _>(&TxJob { n: 100 }).in_transaction(&mut tx).await.expect("published");
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(handled.jobs.lock().unwrap().iter().all(|(n, _)| *n != 100), "handled before the commit");
    let committed = Instant::now();
    tx.commit().await.expect("commit");
    fixtures::eventually(
        Duration::from_secs(5),
        || handled.jobs.lock().unwrap().iter().any(|(n, _)| *n == 100),
        || "not handled within 5 s of the commit (poll is 10 s)".into(),
    )
    .await;
    let at = handled.jobs.lock().unwrap().iter().find(|(n, _)| *n == 100).map(|(_, at)| *at).expect("handled");
    let woke = at.duration_since(committed);
    eprintln!("woken {woke:?} after the commit");
    assert!(woke < Duration::from_secs(2), "woken {woke:?} after the commit: NOTIFY, not the 10 s poll");
    running.stop().await;
    drop(transport);

    // A transaction on another database, and a queue on another transport.
    let lite = fixtures::SqliteFile::new();
    let lite_pool = sqlx::SqlitePool::connect(&lite.url).await.expect("sqlite");
    let mut other = lite_pool.begin().await.expect("begin");
    let err = publisher.send::<TxJobs, _>(&TxJob { n: 9 }).in_transaction(&mut other).await.unwrap_err().to_string();
    assert!(err.contains("the transaction is not on postgresql, where queue `tx-jobs` is"), "{err}");
    // A transaction of the same kind on another database of the server.
    let elsewhere = fixtures::another_postgres_database().await;
    let mut other = elsewhere.begin().await.expect("begin");
    let err = publisher.send::<TxJobs, _>(&TxJob { n: 9 }).in_transaction(&mut other).await.unwrap_err().to_string();
    assert!(err.contains("the transaction is on postgresql database `postgres@"), "{err}");
    assert!(err.contains("queue `tx-jobs` on `test@"), "{err}");
    let memory = messaging::transport::connect("memory://").await.expect("memory");
    let mut on_memory = messaging::App::new(memory).await.expect("app");
    let mut tx = pool.begin().await.expect("begin");
    let err = on_memory
        .setup()
        .publisher()
        .send::<TxJobs, _>(&TxJob { n: 9 })
        .in_transaction(&mut tx)
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("publishing inside a database transaction needs a database queue"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_commit_publishes_once_and_rollback_nothing() {
    let db = fixtures::SqliteFile::new();
    let url = format!("{}&migrate=true&poll=10s", db.url);
    let (_transport, mut app, publisher, pool) = commit_and_rollback!(
        &url,
        sqlx::SqlitePool::connect(&db.url).await.expect("the application's pool"),
        |pool: &sqlx::SqlitePool| {
            let pool = pool.clone();
            // IMMEDIATE: the write lock from the start, so that a statement
            // that reads before it writes never meets a newer snapshot.
            async move { pool.begin_with("BEGIN IMMEDIATE").await.expect("begin") }
        },
        "CREATE TABLE app_orders (id INTEGER PRIMARY KEY)"
    );
    // An idle receiver polling every 10 s in this process: Publisher::commit
    // wakes it; a plain commit leaves the message to the next poll.
    let handled = Arc::new(Handled::default());
    app.setup().provide(handled.clone());
    let running = app.start().expect("start");
    fixtures::eventually(
        Duration::from_secs(20),
        || handled.jobs.lock().unwrap().len() == 5,
        || "the first five".into(),
    )
    .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let job = |n: u32| {
        let handled = handled.clone();
        move || handled.jobs.lock().unwrap().iter().any(|(m, _)| *m == n)
    };
    let mut tx = pool.begin_with("BEGIN IMMEDIATE").await.expect("begin");
    publisher.send::<TxJobs, _>(&TxJob { n: 200 }).in_transaction(&mut tx).await.expect("published");
    tx.commit().await.expect("a plain commit");
    tokio::time::sleep(Duration::from_millis(700)).await;
    assert!(!job(200)(), "a plain commit gave a signal after all: the test cannot tell the two apart");
    let mut tx = pool.begin_with("BEGIN IMMEDIATE").await.expect("begin");
    publisher.send::<TxJobs, _>(&TxJob { n: 201 }).in_transaction(&mut tx).await.expect("published");
    let committed = Instant::now();
    publisher.commit(tx).await.expect("commit and wake");
    fixtures::eventually(Duration::from_secs(5), job(201), || "not handled within 5 s of Publisher::commit".into())
        .await;
    let woke = committed.elapsed();
    eprintln!("woken {woke:?} after Publisher::commit");
    assert!(woke < Duration::from_secs(2), "woken {woke:?} after the commit, not by the 10 s poll");
    running.stop().await;
}
