//! On PostgreSQL a receipt carries where its row was leased (the tuple id),
//! and the completion goes there instead of looking the row up. A tuple id
//! only points the way: these tests put a receipt's tuple to other uses
//! (the row moved, a vacuum gave the tuple to the row's next lease or to
//! another row) and check that the completion still settles exactly the
//! receipts whose lease holds.

use crate::error::TransportError;
use crate::transport::sql::machine::Enqueue;
use crate::transport::sql::postgres::PostgresStore;
use crate::transport::sql::record::{LeasedRow, Tuple};
use crate::transport::sql::RowOp;

pub(super) const START: i64 = 1_800_000_000_000;
pub(super) const LEASE: i64 = 1_000;

/// A store on `url` with a standard queue `q` holding `payloads`, the table
/// out of autovacuum's reach (the tests vacuum it themselves).
pub(super) async fn store_with(url: &str, payloads: &[&str]) -> PostgresStore {
    let store = PostgresStore::connect(url).await.unwrap();
    store.migrate().await.unwrap();
    sqlx::query("ALTER TABLE messaging_messages SET (autovacuum_enabled = false)").execute(&store.pool).await.unwrap();
    store.declare("q", false, START).await.unwrap();
    let items = payloads.iter().map(|p| Enqueue::test(&format!("m-{p}"), None, p)).collect();
    for result in store.enqueue("q", START, items, false).await {
        result.unwrap();
    }
    store
}

async fn lease_one(store: &PostgresStore, now: i64) -> LeasedRow {
    let mut leased = store.lease("q", now, 1, LEASE, false).await.unwrap();
    assert_eq!(leased.len(), 1, "one row to lease at {now}");
    leased.remove(0)
}

async fn vacuum(store: &PostgresStore) {
    sqlx::query("VACUUM (INDEX_CLEANUP ON) messaging_messages").execute(&store.pool).await.unwrap();
}

async fn count(store: &PostgresStore) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM messaging_messages").fetch_one(&store.pool).await.unwrap()
}

#[test]
fn postgres_a_stale_receipt_whose_tuple_the_row_took_back_completes_nothing() {
    let db = super::Postgres::new();
    super::runtime().block_on(async {
        let store = store_with(&db.url, &["a"]).await;
        let first = lease_one(&store, START).await;
        // Given back and leased again, round after round, each time a new
        // version; the vacuums free the old versions' places (when no other
        // test's transaction holds them), and a write in between shifts
        // which place a lease's version takes, until it is the first's.
        let mut now = START;
        let mut receipt = first.clone();
        let mut rounds = 0;
        let third = loop {
            now += 1;
            store.apply("q", now, receipt.id, receipt.token, RowOp::Release).await.unwrap();
            vacuum(&store).await;
            sqlx::query("UPDATE messaging_messages SET attributes = attributes").execute(&store.pool).await.unwrap();
            receipt = lease_one(&store, now).await;
            if receipt.tuple == first.tuple {
                break receipt;
            }
            rounds += 1;
            assert!(rounds < 50, "the row never came back to {:?}", first.tuple);
        };
        assert_ne!(third.token, first.token);
        // The first receipt now points at its own row, under another lease.
        let stale = store.complete("q", now, vec![first.held()], 0).await;
        assert!(matches!(stale[..], [Err(TransportError::StaleReceipt)]), "{stale:?}");
        assert_eq!(count(&store).await, 1, "the row stays, leased");
        let done = store.complete("q", now, vec![third.held()], 0).await;
        assert!(matches!(done[..], [Ok(())]), "{done:?}");
        assert_eq!(count(&store).await, 0);
        store.close().await;
    });
}

#[test]
fn postgres_a_receipt_whose_tuple_another_row_took_completes_nothing() {
    let db = super::Postgres::new();
    super::runtime().block_on(async {
        let store = store_with(&db.url, &["a"]).await;
        let first = lease_one(&store, START).await;
        // Completed with the receipt, gone; its place freed by a vacuum (when
        // no other test's transaction holds it) and taken by a message
        // enqueued after it, which is then leased.
        let done = store.complete("q", START + 1, vec![first.held()], 0).await;
        assert!(matches!(done[..], [Ok(())]), "{done:?}");
        let mut now = START + 1;
        let mut rounds = 0;
        let other = loop {
            now += 1;
            vacuum(&store).await;
            let items = vec![Enqueue::test(&format!("m-b{rounds}"), None, "b")];
            for result in store.enqueue("q", now, items, false).await {
                result.unwrap();
            }
            let other = lease_one(&store, now).await;
            if other.tuple == first.tuple {
                break other;
            }
            let done = store.complete("q", now, vec![other.held()], 0).await;
            assert!(matches!(done[..], [Ok(())]), "{done:?}");
            rounds += 1;
            assert!(rounds < 50, "no new row came to {:?}", first.tuple);
        };
        assert_ne!(other.id, first.id);
        // The old receipt, once more (an acknowledgement sent twice), with
        // the token of the lease that now holds that tuple: still nothing.
        let again = store.complete("q", now, vec![(first.id, other.token, first.tuple)], 0).await;
        assert!(matches!(again[..], [Err(TransportError::StaleReceipt)]), "{again:?}");
        assert_eq!(count(&store).await, 1, "the other row stays, leased");
        store.close().await;
    });
}

#[test]
fn postgres_a_row_whose_lease_was_extended_is_completed_where_it_moved() {
    let db = super::Postgres::new();
    super::runtime().block_on(async {
        let store = store_with(&db.url, &["a", "b", "c"]).await;
        let leased = store.lease("q", START, 3, LEASE, false).await.unwrap();
        assert_eq!(leased.len(), 3);
        // The heartbeat extends the second: its row moves to a new version.
        store.apply("q", START + 500, leased[1].id, leased[1].token, RowOp::Extend { lease_ms: LEASE }).await.unwrap();
        let moved: Tuple = sqlx::query_scalar("SELECT ctid FROM messaging_messages WHERE id = $1")
            .bind(leased[1].id as i64)
            .fetch_one(&store.pool)
            .await
            .unwrap();
        assert_ne!(moved, leased[1].tuple, "the extension wrote a new version");
        // Every receipt holds: the two unmoved rows are completed where
        // they were leased, the moved one found by its key.
        let done = store.complete("q", START + 600, leased.iter().map(LeasedRow::held).collect(), 0).await;
        assert!(done.iter().all(Result::is_ok), "{done:?}");
        assert_eq!(count(&store).await, 0);
        store.close().await;
    });
}
