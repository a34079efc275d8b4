//! PostgreSQL tells other processes of every enqueue (`NOTIFY`), whichever
//! statement wrote it: a plain batch's insert, identity versions, a send in
//! the application's transaction (at its commit, not before).

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
        let mut tx = sqlx::Postgres::begin(&ours.pool).await.expect("begin");
        ours.enqueue_on(&mut tx, "jobs", START, vec![message("c", None, 0)], false).await.expect("enqueue");
        quiet(&mut changes, "jobs").await;
        tx.commit().await.expect("commit");
        assert!(told(&mut changes, "jobs").await);

        // Rolled back: never.
        let mut tx = sqlx::Postgres::begin(&ours.pool).await.expect("begin");
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
