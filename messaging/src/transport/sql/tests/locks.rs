//! A row of ours that another transaction holds (an application's, sharing
//! the database): the heartbeat extends every other row at once and fails
//! that one alone after a brief wait, instead of waiting for it with the
//! whole round while every other lease runs out; a completion does the same
//! instead of holding up every acknowledgement of the queue.

use std::time::{Duration, Instant};

use sqlx::Connection as _;

use super::tuples::{store_with, LEASE, START};
use crate::error::TransportError;
use crate::transport::sql::machine::{Enqueue, QueueRules, RowId};
use crate::transport::sql::postgres::PostgresStore;
use crate::transport::sql::RowOp;

async fn lease_expires(store: &PostgresStore, id: RowId) -> i64 {
    sqlx::query_scalar("SELECT lease_expires FROM messaging_messages WHERE id = $1")
        .bind(id as i64)
        .fetch_one(&store.pool)
        .await
        .unwrap()
}

/// An application's session on `url`, left in a transaction that holds
/// the rows of `messaging_messages` matching `filter`; `COMMIT` on it
/// lets them go.
async fn holding(url: &str, filter: &str) -> sqlx::PgConnection {
    let mut app = sqlx::PgConnection::connect(url).await.unwrap();
    sqlx::query("BEGIN").execute(&mut app).await.unwrap();
    let held = sqlx::query(&format!("SELECT id FROM messaging_messages WHERE {filter} FOR UPDATE"))
        .fetch_all(&mut app)
        .await
        .unwrap();
    assert_eq!(held.len(), 1, "{filter}");
    app
}

async fn let_go(mut app: sqlx::PgConnection) {
    sqlx::query("COMMIT").execute(&mut app).await.unwrap();
}

#[test]
fn postgres_an_extension_skips_a_row_another_transaction_holds_and_fails_it_alone() {
    // A database of its own: the open transaction below would hold back
    // the vacuums that tests in the shared one rely on.
    let db = super::Database::new("msgtest_locks");
    super::runtime().block_on(async {
        let store = store_with(&db.url, &["a", "b", "c"]).await;
        let leased = store.lease("q", START, 3, LEASE, false).await.unwrap();
        assert_eq!(leased.len(), 3);
        let items: Vec<(RowId, u64)> = leased.iter().map(|r| (r.id, r.token)).collect();
        // The application's transaction, left open with the second row locked.
        let app = holding(&db.url, &format!("id = {}", leased[1].id)).await;

        let extend = RowOp::Extend { lease_ms: LEASE };
        let started = Instant::now();
        let results = tokio::time::timeout(Duration::from_secs(10), store.apply_all("q", START + 500, &items, &extend))
            .await
            .expect("the extension waits for the held row a moment, not until its transaction ends")
            .unwrap();
        assert!(started.elapsed() < Duration::from_secs(5), "took {:?}", started.elapsed());
        assert!(results[0].is_ok() && results[2].is_ok(), "{results:?}");
        match &results[1] {
            Err(TransportError::Held(e)) => {
                assert!(e.contains("another transaction holds the message's row"), "{e}")
            }
            other => panic!("the held row fails alone, as a transient error: {other:?}"),
        }
        assert_eq!(lease_expires(&store, leased[0].id).await, START + 500 + LEASE);
        assert_eq!(lease_expires(&store, leased[2].id).await, START + 500 + LEASE);

        // Once the application's transaction ends, the row is extended too;
        // a row completed meanwhile is stale, as before.
        let_go(app).await;
        let done = store.complete("q", START + 600, vec![leased[0].held()], 0).await;
        assert!(matches!(done[..], [Ok(())]), "{done:?}");
        let results = store.apply_all("q", START + 700, &items, &extend).await.unwrap();
        assert!(matches!(results[0], Err(TransportError::StaleReceipt)), "{results:?}");
        assert!(results[1].is_ok() && results[2].is_ok(), "{results:?}");
        assert_eq!(lease_expires(&store, leased[1].id).await, START + 700 + LEASE);
        store.close().await;
    });
}

async fn rows_left(store: &PostgresStore) -> Vec<i64> {
    sqlx::query_scalar("SELECT id FROM messaging_messages ORDER BY id").fetch_all(&store.pool).await.unwrap()
}

#[test]
fn postgres_a_completion_leaves_a_row_another_transaction_holds_and_completes_the_others() {
    let db = super::Database::new("msgtest_locks");
    super::runtime().block_on(async {
        // Three plain rows and one with an identity (completed through the
        // row's state machine, in a statement of its own).
        let store = store_with(&db.url, &["a", "b", "c"]).await;
        for result in store.enqueue("q", START, vec![Enqueue::test("m-k", Some("k"), "k")], false).await {
            result.unwrap();
        }
        let leased = store.lease("q", START, 4, LEASE, false).await.unwrap();
        assert_eq!(leased.len(), 4);
        let held: Vec<_> = leased.iter().map(|r| r.held()).collect();

        // A plain row held among others, then the identity row alone.
        for (batch, hold, what) in [(&held[..3], 1, "a plain row"), (&held[3..], 0, "a row with an identity")] {
            let row = batch[hold].0;
            let app = holding(&db.url, &format!("id = {row}")).await;
            let started = Instant::now();
            let results =
                tokio::time::timeout(Duration::from_secs(10), store.complete("q", START + 100, batch.to_vec(), 0))
                    .await
                    .unwrap_or_else(|_| panic!("{what}: the completion waits for the held row a moment, not for good"));
            assert!(started.elapsed() < Duration::from_secs(5), "{what}: took {:?}", started.elapsed());
            for (i, result) in results.iter().enumerate() {
                match result {
                    Err(TransportError::Held(e)) if i == hold => {
                        assert!(e.contains("another transaction holds"), "{e}")
                    }
                    Ok(()) if i != hold => {}
                    other => panic!("{what}: the held row fails alone, as held, the others complete: {i}: {other:?}"),
                }
            }
            assert!(rows_left(&store).await.contains(&(row as i64)), "{what}: the held row stays");

            // Tried again while the application's transaction is still
            // open, the completion waits its moment; the transaction ends
            // meanwhile and the completion goes through.
            let again = store.complete("q", START + 200, vec![batch[hold]], 0);
            let commit = async {
                tokio::time::sleep(Duration::from_millis(300)).await;
                let_go(app).await;
            };
            let (done, ()) = tokio::join!(again, commit);
            assert!(matches!(done[..], [Ok(())]), "{what}: {done:?}");
        }
        assert_eq!(rows_left(&store).await, Vec::<i64>::new(), "every row completed once");
        store.close().await;
    });
}

#[test]
fn postgres_a_fifo_lease_skips_a_head_another_transaction_holds_and_leases_the_other_groups() {
    let db = super::Database::new("msgtest_locks");
    super::runtime().block_on(async {
        let store = PostgresStore::connect(&db.url).await.unwrap();
        store.migrate().await.unwrap();
        store.declare("q.fifo", true, START).await.unwrap();
        let items = ["a1", "b1", "a2", "b2"]
            .iter()
            .map(|p| Enqueue { group: Some(p[..1].to_owned()), ..Enqueue::test(&format!("m-{p}"), None, p) })
            .collect();
        for result in store.enqueue("q.fifo", START, items, false).await {
            result.unwrap();
        }
        // The application holds group a's head, still pending.
        let app = holding(&db.url, "message_id = 'm-a1'").await;

        let leased = tokio::time::timeout(Duration::from_secs(10), store.lease("q.fifo", START, 10, LEASE, true))
            .await
            .expect("the lease does not wait for the held head")
            .unwrap();
        let payloads: Vec<String> = leased.iter().map(|r| String::from_utf8_lossy(&r.payload).into_owned()).collect();
        assert_eq!(payloads, ["b1"], "group b goes on; group a waits for its head, and a2 stays behind it");

        let_go(app).await;
        let leased = store.lease("q.fifo", START + 1, 10, LEASE, true).await.unwrap();
        let payloads: Vec<String> = leased.iter().map(|r| String::from_utf8_lossy(&r.payload).into_owned()).collect();
        assert_eq!(payloads, ["a1"], "once free, the head is leased (b2 waits behind b1 in flight)");
        store.close().await;
    });
}

#[test]
fn postgres_housekeeping_wakes_the_sleepers_it_can_and_leaves_a_held_one_for_later() {
    let db = super::Database::new("msgtest_locks");
    super::runtime().block_on(async {
        let store = PostgresStore::connect(&db.url).await.unwrap();
        store.migrate().await.unwrap();
        store.declare("q", false, START).await.unwrap();
        let items = ["a", "b"]
            .iter()
            .map(|p| Enqueue { process_at: Some(START + 10), ..Enqueue::test(&format!("m-{p}"), None, p) })
            .collect();
        for result in store.enqueue("q", START, items, false).await {
            result.unwrap();
        }
        let status = |id: &'static str| {
            let pool = store.pool.clone();
            async move {
                sqlx::query_scalar::<_, String>("SELECT status FROM messaging_messages WHERE message_id = $1")
                    .bind(id)
                    .fetch_one(&pool)
                    .await
                    .unwrap()
            }
        };
        assert_eq!((status("m-a").await, status("m-b").await), ("sleeping".to_owned(), "sleeping".to_owned()));
        let app = holding(&db.url, "message_id = 'm-a'").await;

        let rules = QueueRules::default();
        tokio::time::timeout(Duration::from_secs(10), store.maintain("q", START + 20, rules))
            .await
            .expect("housekeeping does not wait for the held sleeper")
            .unwrap();
        assert_eq!((status("m-a").await, status("m-b").await), ("sleeping".to_owned(), "pending".to_owned()));

        let_go(app).await;
        store.maintain("q", START + 21, rules).await.unwrap();
        assert_eq!(status("m-a").await, "pending");
        store.close().await;
    });
}

#[test]
fn postgres_a_receiver_waits_for_a_sleeper_it_cannot_wake_without_spinning() {
    use crate::queue::QueueSpec;
    use crate::transport::Transport as _;

    let db = super::Database::new("msgtest_locks");
    super::runtime().block_on(async {
        let transport =
            crate::transport::sql::connect::<sqlx::Postgres>(&format!("{}?migrate=true", db.url)).await.unwrap();
        transport.declare(&QueueSpec::standard("spin")).await.unwrap();
        let delayed = crate::transport::Outgoing {
            body: b"{}".to_vec().into(),
            delay: Some(Duration::from_millis(50)),
            ..crate::transport::Outgoing::default()
        };
        transport.send("spin", delayed).await.unwrap();
        tokio::time::sleep(Duration::from_millis(100)).await;
        // The application holds the sleeper, now due.
        let app = holding(&db.url, "queue = 'spin'").await;
        let commits = || async {
            let mut conn = sqlx::PgConnection::connect(&db.url).await.unwrap();
            sqlx::query_scalar::<_, i64>("SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()")
                .fetch_one(&mut conn)
                .await
                .unwrap()
        };
        let before = commits().await;
        let got = transport.receive("spin", 10, Duration::from_secs(2)).await.unwrap();
        assert!(got.is_empty());
        tokio::time::sleep(Duration::from_millis(700)).await; // the statistics are sent every 500 ms
        let spent = commits().await - before;
        // About five statements every 100 ms (housekeeping, a lease, the
        // next due time): 100-160 here; spinning, 2,605.
        assert!(spent < 500, "a 2 s receive ran {spent} transactions while it could not wake the sleeper");
        let_go(app).await;
        let got = transport.receive("spin", 10, Duration::from_secs(2)).await.unwrap();
        assert_eq!(got.len(), 1, "woken and received once the application lets go");
    });
}

#[test]
fn postgres_a_release_gives_back_the_rows_it_can_and_fails_a_held_one_alone() {
    let db = super::Database::new("msgtest_locks");
    super::runtime().block_on(async {
        let store = store_with(&db.url, &["a", "b", "c"]).await;
        let leased = store.lease("q", START, 3, LEASE, false).await.unwrap();
        let items: Vec<(RowId, u64)> = leased.iter().map(|r| (r.id, r.token)).collect();
        let app = holding(&db.url, &format!("id = {}", leased[1].id)).await;

        // A worker's stop gives back what it did not handle, in one call.
        let started = Instant::now();
        let results =
            tokio::time::timeout(Duration::from_secs(10), store.apply_all("q", START + 100, &items, &RowOp::Release))
                .await
                .expect("the release waits for the held row a moment, not until its transaction ends")
                .unwrap();
        assert!(started.elapsed() < Duration::from_secs(5), "took {:?}", started.elapsed());
        assert!(results[0].is_ok() && results[2].is_ok(), "{results:?}");
        assert!(matches!(&results[1], Err(TransportError::Held(_))), "{results:?}");
        let_go(app).await;
        let again = store.lease("q", START + 200, 3, LEASE, false).await.unwrap();
        let ids: Vec<RowId> = again.iter().map(|r| r.id).collect();
        assert_eq!(ids, [leased[0].id, leased[2].id], "the two given back; the held one stays leased");
        store.close().await;
    });
}

/// A failed message's retry, on a row an application holds past the
/// message's visibility: the transport waits for the row a moment at a
/// time, never in one statement for long (one such wait of 30 s was taken
/// for a lost connection: the pool's connections closed, the retry given
/// up, the attempt left uncounted), and records the attempt once the row is
/// let go, though the lease's time ran out meanwhile (nothing took it back).
#[test]
fn postgres_a_retry_waits_for_a_row_another_transaction_holds_a_moment_at_a_time_until_it_is_let_go() {
    use crate::queue::QueueSpec;
    use crate::transport::{FailedAttempt, Transport as _};

    let db = super::Database::new("msgtest_locks");
    super::runtime().block_on(async {
        let transport =
            crate::transport::sql::connect::<sqlx::Postgres>(&format!("{}?migrate=true", db.url)).await.unwrap();
        let spec = QueueSpec { visibility: Duration::from_secs(1), ..QueueSpec::standard("held-retry") };
        transport.declare(&spec).await.unwrap();
        transport.send("held-retry", crate::transport::Outgoing::default()).await.unwrap();
        let got = transport.receive("held-retry", 1, Duration::from_secs(2)).await.unwrap();
        assert_eq!(got.len(), 1);
        let app = holding(&db.url, "queue = 'held-retry'").await;

        let failure = FailedAttempt::new(1, "Error", "the handler failed");
        let retry = transport.fail("held-retry", got[0].receipt.clone(), Duration::from_secs(60), failure);
        // Held for three times the visibility, the longest wait of any
        // statement for a lock looked at every 100 ms meanwhile.
        let watch = async {
            let mut watcher = sqlx::PgConnection::connect(&db.url).await.unwrap();
            let mut longest: Option<f64> = None;
            let until = Instant::now() + Duration::from_secs(3);
            while Instant::now() < until {
                let waits: Vec<f64> = sqlx::query_scalar(
                    "SELECT extract(epoch FROM now() - query_start)::float8 FROM pg_stat_activity \
                     WHERE datname = current_database() AND wait_event_type = 'Lock'",
                )
                .fetch_all(&mut watcher)
                .await
                .unwrap();
                longest = waits.into_iter().fold(longest, |l, w| Some(l.map_or(w, |l: f64| l.max(w))));
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            let_go(app).await;
            longest
        };
        let started = Instant::now();
        let (result, longest) = tokio::time::timeout(Duration::from_secs(20), async { tokio::join!(retry, watch) })
            .await
            .expect("the retry goes through once the row is let go");
        result.expect("the lease holds until it is taken back");
        assert!(started.elapsed() < Duration::from_secs(5), "took {:?} after a 3 s hold", started.elapsed());
        let longest = longest.expect("the retry waited for the row");
        assert!(longest < 1.0, "a statement waited {longest:.1} s for the held row");
        let (status, attempts, error): (String, i32, Option<String>) =
            sqlx::query_as("SELECT status, attempts, error FROM messaging_messages WHERE queue = 'held-retry'")
                .fetch_one(&transport.store.pool)
                .await
                .unwrap();
        assert_eq!((status.as_str(), attempts), ("sleeping", 1), "waiting out its backoff, the attempt counted");
        assert!(error.is_some_and(|e| e.contains("the handler failed")), "the failure recorded");
    });
}

#[test]
fn postgres_marking_a_suspect_fails_as_held_after_a_moment_on_a_row_another_transaction_holds() {
    let db = super::Database::new("msgtest_locks");
    super::runtime().block_on(async {
        let store = store_with(&db.url, &["a"]).await;
        let leased = store.lease("q", START, 1, LEASE, false).await.unwrap();
        let (id, token) = (leased[0].id, leased[0].token);
        let app = holding(&db.url, &format!("id = {id}")).await;
        for mark in ["isolate", "rejoin"] {
            let started = Instant::now();
            let marked = async {
                match mark {
                    "isolate" => store.isolate("q", id, token).await,
                    _ => store.rejoin("q", id, token).await,
                }
            };
            let result = tokio::time::timeout(Duration::from_secs(10), marked)
                .await
                .unwrap_or_else(|_| panic!("{mark}: waits for the held row a moment, not until it is let go"));
            assert!(started.elapsed() < Duration::from_secs(5), "{mark}: took {:?}", started.elapsed());
            assert!(matches!(result, Err(TransportError::Held(_))), "{mark}: {result:?}");
        }
        let_go(app).await;
        store.isolate("q", id, token).await.expect("marked once let go");
        store.rejoin("q", id, token).await.expect("taken back once let go");
        store.close().await;
    });
}
