//! PostgreSQL tells other processes of every enqueue (`NOTIFY`), whichever
//! statement wrote it: a plain batch's insert, identity versions, a send in
//! the application's transaction (at its commit, not before). A LISTEN
//! connection that could not be made is made again later.

use std::time::Duration;

use tokio::sync::broadcast::error::TryRecvError;
use tokio::sync::broadcast::Receiver;

use crate::transport::sql::machine::Enqueue;
use crate::transport::sql::postgres::PostgresStore;
use crate::transport::sql::Dialect;

const START: i64 = 1_800_000_000_000;

fn message(id: &str, identity: Option<&str>, priority: i32) -> Enqueue {
    Enqueue { priority, ..Enqueue::test(id, identity, id) }
}

/// Whether another process was told of `queue` within 5 s. The channel is
/// the database's: other tests' queues (in other schemas) pass by too.
async fn told(changes: &mut Receiver<String>, queue: &str) -> bool {
    let heard = async {
        while let Ok(name) = changes.recv().await {
            if name == queue {
                return true;
            }
        }
        false
    };
    tokio::time::timeout(Duration::from_secs(5), heard).await.unwrap_or(false)
}

/// `queue` is not told of again within 300 ms.
async fn quiet(changes: &mut Receiver<String>, queue: &str) {
    tokio::time::sleep(Duration::from_millis(300)).await;
    loop {
        match changes.try_recv() {
            Ok(name) => assert_ne!(name, queue, "told again"),
            Err(TryRecvError::Empty) => return,
            Err(e) => panic!("{e}"),
        }
    }
}

#[test]
fn postgres_every_enqueue_tells_the_other_processes_once_it_commits() {
    let runtime = super::runtime();
    let db = super::Postgres::new();
    runtime.block_on(async {
        let ours = PostgresStore::connect(&db.url).await.expect("connect");
        ours.migrate().await.expect("migrate");
        ours.declare("jobs", false, START).await.expect("declare");
        let theirs = PostgresStore::connect(&db.url).await.expect("connect");
        let mut changes = sqlx::Postgres::changes(&theirs.state).expect("PostgreSQL listens");
        // Their LISTEN starts in the background: wait until it hears.
        tokio::time::timeout(Duration::from_secs(10), async {
            loop {
                sqlx::Postgres::notify(&ours.pool, "warm-up").await;
                if let Ok(Ok(name)) = tokio::time::timeout(Duration::from_millis(100), changes.recv()).await {
                    if name == "warm-up" {
                        break;
                    }
                }
            }
        })
        .await
        .expect("the other store listens");
        quiet(&mut changes, "jobs").await;

        // A plain batch whose rows differ in a column (one insert statement).
        let batch = vec![message("a", None, 0), message("b", None, 5)];
        assert!(ours.enqueue("jobs", START, batch, false).await.iter().all(Result::is_ok));
        assert!(told(&mut changes, "jobs").await);
        quiet(&mut changes, "jobs").await;

        // Identities: new rows, then new versions of them.
        for round in ["1", "2"] {
            let batch = vec![message(&format!("x{round}"), Some("x"), 0), message(&format!("y{round}"), Some("y"), 0)];
            assert!(ours.enqueue("jobs", START, batch, false).await.iter().all(Result::is_ok));
            assert!(told(&mut changes, "jobs").await, "round {round}");
            quiet(&mut changes, "jobs").await; // once per batch
        }

        // In the application's transaction: at its commit, not before.
        let mut tx = ours.pool.begin().await.expect("begin");
        ours.enqueue_on(&mut tx, "jobs", START, vec![message("c", None, 0)], false).await.expect("enqueue");
        quiet(&mut changes, "jobs").await;
        tx.commit().await.expect("commit");
        assert!(told(&mut changes, "jobs").await);

        // Rolled back: never.
        let mut tx = ours.pool.begin().await.expect("begin");
        ours.enqueue_on(&mut tx, "jobs", START, vec![message("d", None, 0)], false).await.expect("enqueue");
        tx.rollback().await.expect("rollback");
        quiet(&mut changes, "jobs").await;

        let rows = ours.rows("jobs").await.expect("rows");
        let mut stored: Vec<(&str, i32)> = rows.iter().map(|r| (r.message_id.as_str(), r.priority)).collect();
        stored.sort_unstable();
        assert_eq!(stored, [("a", 0), ("b", 5), ("c", 0), ("x2", 0), ("y2", 0)]);
    });
    drop(db);
}

/// Whether `changes` hears a probe that `other` notifies (every 200 ms)
/// within `within`.
async fn heard(other: &PostgresStore, changes: &mut Receiver<String>, within: Duration) -> bool {
    let deadline = tokio::time::Instant::now() + within;
    while tokio::time::Instant::now() < deadline {
        sqlx::Postgres::notify(&other.pool, "probe").await;
        if let Ok(Ok(name)) = tokio::time::timeout(Duration::from_millis(200), changes.recv()).await {
            if name == "probe" {
                return true;
            }
        }
    }
    false
}

/// A LISTEN connection that cannot be made at startup (the pool it comes
/// from has no connection to give, as when the server allows no more) is
/// made again on a later tick of the background task; meanwhile nothing is
/// heard, and idle receivers poll.
#[test]
fn postgres_a_listen_connection_refused_at_startup_is_made_again_later() {
    let runtime = super::runtime();
    let db = super::Postgres::new();
    runtime.block_on(async {
        let pool = sqlx::postgres::PgPoolOptions::new()
            .max_connections(1)
            .acquire_timeout(Duration::from_secs(1))
            .connect(&db.url)
            .await
            .expect("connect");
        // The pool's one connection is busy: LISTEN cannot have it.
        let held = pool.acquire().await.expect("the pool's connection");
        let state = <sqlx::Postgres as Dialect>::adopt(&pool);
        let mut changes = sqlx::Postgres::changes(&state).expect("PostgreSQL listens");
        let other = PostgresStore::connect(&db.url).await.expect("connect");
        // Held for longer than the task's attempts at startup take (the
        // LISTEN, then the first tick's clock sample, horizon check and
        // LISTEN again, each waiting out the pool's 1 s).
        assert!(!heard(&other, &mut changes, Duration::from_secs(8)).await, "no LISTEN connection to be had");
        drop(held);
        // The next tick of the background task (`clock::EVERY`) makes it
        // (heard 23 s after the connection was free; without the retry, never).
        let retry = crate::transport::sql::clock::EVERY + Duration::from_secs(10);
        assert!(heard(&other, &mut changes, retry).await, "the LISTEN connection made again within {retry:?}");
        drop(state);
        pool.close().await;
        other.pool.close().await;
    });
    drop(db);
}
