//! Statements on the framework's table keep to their indexes whatever the
//! planner's statistics say: a queue filled and drained faster than (or
//! without) autovacuum's ANALYZE must not be planned from the wrong index.

use crate::transport::sql::machine::Enqueue;
use crate::transport::sql::postgres::{completion, PostgresStore, REDRIVE, TUPLES_WAITING};
use crate::transport::sql::record::{Held, Tuple};

const START: i64 = 1_800_000_000_000;

/// The plan PostgreSQL picks for `sql` with these receipts, as text (bound
/// as the completion binds them: tuples, ids, tokens, queue, now; `tuples`
/// `None` for a statement that takes none).
async fn plan(store: &PostgresStore, sql: &str, tuples: Option<&[Tuple]>, ids: &[i64], tokens: &[i64]) -> String {
    let explain = format!("EXPLAIN {sql}");
    let mut query = sqlx::query_as(&explain);
    if let Some(tuples) = tuples {
        query = query.bind(tuples);
    }
    let rows: Vec<(String,)> =
        query.bind(ids).bind(tokens).bind("planned").bind(START).fetch_all(&store.pool).await.unwrap();
    rows.into_iter().map(|(line,)| line).collect::<Vec<_>>().join("\n")
}

/// A store on `db` whose table autovacuum never analyzes, with `thousands`
/// × 1,000 plain messages enqueued on standard queue `queue`.
async fn unanalyzed(db: &super::Postgres, queue: &str, thousands: usize) -> PostgresStore {
    let store = PostgresStore::connect(&db.url).await.unwrap();
    store.migrate().await.unwrap();
    sqlx::query("ALTER TABLE messaging_messages SET (autovacuum_enabled = false)").execute(&store.pool).await.unwrap();
    store.declare(queue, false, START).await.unwrap();
    for batch in 0..thousands {
        let items = (0..1_000).map(|i| Enqueue::test(&format!("m{batch}.{i}"), None, "x")).collect();
        for result in store.enqueue(queue, START, items, false).await {
            result.unwrap();
        }
    }
    store
}

#[test]
fn postgres_completes_by_tuple_id_on_a_table_never_analyzed() {
    let db = super::Postgres::new();
    super::runtime().block_on(async {
        // No statistics at all, as with autovacuum off: the state in which
        // the join was planned from the leased index.
        let store = unanalyzed(&db, "planned", 10).await;
        let mut held: Vec<Held> = Vec::new();
        while held.len() < 9_000 {
            let leased = store.lease("planned", START, 300, 60_000, false).await.unwrap();
            assert!(!leased.is_empty());
            assert!(leased.iter().all(|l| l.tuple != Tuple::default()), "a lease returns where its rows lie");
            held.extend(leased.iter().map(|l| l.held()));
        }
        held[..300].sort_unstable();
        let receipts: Vec<(i64, i64)> = held.iter().map(|&(id, token, _)| (id as i64, token as i64)).collect();
        let tuples: Vec<Tuple> = held[..300].iter().map(|&(_, _, tuple)| tuple).collect();
        let (ids, tokens): (Vec<i64>, Vec<i64>) = receipts.iter().take(300).copied().unzip();
        for retain in [false, true] {
            // The rows fetched by tuple id and joined to the receipts: no
            // index, no scan of the table.
            let ours = plan(&store, &completion(retain, false).concat(), Some(&tuples), &ids, &tokens).await;
            assert!(ours.contains("TID Cond: (ctid = ANY ($0))"), "{ours}");
            assert!(!ours.contains("Index") && !ours.contains("Seq Scan"), "{ours}");
            // The tuple ids bound as a plain array are costed one random
            // page each, and this table is small enough for a scan of it
            // to look cheaper: what the `ARRAY(SELECT …)` is there for.
            let bound = completion(retain, false).concat().replace(TUPLES_WAITING, "$1::tid[])");
            let theirs = plan(&store, &bound, Some(&tuples), &ids, &tokens).await;
            assert!(theirs.contains("Seq Scan on messaging_messages"), "{theirs}");
        }
        // The join it replaces, in the same state, went through the leased
        // index: the state reproduces what the test guards against.
        let join = "DELETE FROM messaging_messages m USING UNNEST($1::bigint[], $2::bigint[]) AS t(id, token) \
                    WHERE m.id = t.id AND m.lease_token = t.token AND m.queue = $3 AND m.status = 'processing' \
                    AND m.identity IS NULL AND m.lease_expires > $4";
        let theirs = plan(&store, join, None, &ids, &tokens).await;
        assert!(theirs.contains("messaging_messages_leased"), "{theirs}");
        // The rest as dead letters: a redrive looks each one up by key too.
        sqlx::query("UPDATE messaging_messages SET status = 'error' WHERE status = 'processing' AND id <> ALL($1)")
            .bind(&ids)
            .execute(&store.pool)
            .await
            .unwrap();
        let letters: Vec<i64> = receipts[300..800].iter().map(|&(id, _)| id).collect();
        let explain = |sql: String| {
            let store = &store;
            let letters = &letters;
            async move {
                let rows: Vec<(String,)> =
                    sqlx::query_as(&sql).bind("planned").bind(letters).fetch_all(&store.pool).await.unwrap();
                rows.into_iter().map(|(line,)| line).collect::<Vec<_>>().join("\n")
            }
        };
        // (The update then goes by tuple id, or hashes a scan of a table this
        // small: a choice by the table's size, which the planner knows
        // without statistics.)
        let ours = explain(format!("EXPLAIN {REDRIVE}")).await;
        assert!(ours.contains("messaging_messages_pkey"), "{ours}");
        assert!(!ours.contains("messaging_messages_error"), "{ours}");
        let theirs = explain(
            "EXPLAIN UPDATE messaging_messages m SET status = 'pending', seq = nextval('messaging_seq') \
             WHERE m.id = ANY($2) AND m.queue = $1 AND m.status = 'error'"
                .to_owned(),
        )
        .await;
        assert!(theirs.contains("messaging_messages_error"), "{theirs}");
        assert_eq!(store.redrive("planned", letters.iter().map(|&id| id as u64).collect()).await.unwrap(), 500);
        let order: Vec<i64> = sqlx::query_scalar("SELECT id FROM messaging_messages WHERE id = ANY($1) ORDER BY seq")
            .bind(&letters)
            .fetch_all(&store.pool)
            .await
            .unwrap();
        assert_eq!(order, letters, "back in the order given");
        // And the completion completes.
        let done = store.complete("planned", START, held[..300].to_vec(), 0).await;
        assert!(done.iter().all(Result::is_ok), "{done:?}");
        let left: i64 = sqlx::query_scalar("SELECT count(*) FROM messaging_messages WHERE id = ANY($1)")
            .bind(&ids)
            .fetch_one(&store.pool)
            .await
            .unwrap();
        assert_eq!(left, 0, "the completion deleted its rows");
        store.close().await;
    });
}

/// A standard queue's lease updates the rows it locked by tuple id, with
/// statistics or without: joined back by `id`, it was planned as a hash join
/// over a scan of the whole table once the table was analyzed.
#[test]
fn postgres_leases_by_tuple_id_whatever_the_statistics() {
    use crate::transport::sql::postgres::{LEASE_PART, LEASE_PICKED, LEASE_TAKEN, LEASE_WHOLE};
    use crate::transport::sql::statements::LEASED;
    let db = super::Postgres::new();
    super::runtime().block_on(async {
        let store = unanalyzed(&db, "leased", 20).await;
        for analyzed in [false, true] {
            if analyzed {
                sqlx::query("ANALYZE messaging_messages").execute(&store.pool).await.unwrap();
            }
            for (pick, binds) in [(LEASE_WHOLE, 5), (LEASE_PART, 7)] {
                let sql = format!("EXPLAIN {pick}{LEASE_TAKEN}{LEASE_PICKED}{LEASED}");
                let mut query = sqlx::query_as::<_, (String,)>(&sql)
                    .bind("leased")
                    .bind(300i64)
                    .bind(START + 60_000)
                    .bind(8i64 << 20)
                    .bind(8i64);
                if binds == 7 {
                    query = query.bind(0i64).bind(2i64);
                }
                let plan: Vec<String> = query.fetch_all(&store.pool).await.unwrap().into_iter().map(|(l,)| l).collect();
                let plan = plan.join("\n");
                assert!(plan.contains("Tid Scan on messaging_messages"), "analyzed {analyzed}:\n{plan}");
                for node in ["Seq Scan", "Hash", "Join", "Nested Loop"] {
                    assert!(!plan.contains(node), "no {node} (analyzed {analyzed}):\n{plan}");
                }
            }
            // And the lease leases: 300 rows in order, one token.
            let leased = store.lease("leased", START, 300, 60_000, false).await.unwrap();
            assert_eq!(leased.len(), 300);
            assert!(leased.windows(2).all(|w| w[0].id < w[1].id && w[0].token == w[1].token));
        }
        store.close().await;
    });
}

/// A completion that waited for rows another transaction was changing (the
/// heartbeat's extension) reports only the rows it completed: what it
/// reported and did not delete stayed leased until the lease ran out, and
/// the message was handled again.
#[test]
fn postgres_a_completion_that_waited_for_a_lock_completes_what_it_reports() {
    let db = super::Postgres::new();
    super::runtime().block_on(async {
        let store = PostgresStore::connect(&db.url).await.unwrap();
        store.migrate().await.unwrap();
        store.declare("raced", false, START).await.unwrap();
        let items = (0..10).map(|i| Enqueue::test(&format!("r{i}"), None, "x")).collect();
        for result in store.enqueue("raced", START, items, false).await {
            result.unwrap();
        }
        let leased = store.lease("raced", START, 10, 60_000, false).await.unwrap();
        assert_eq!(leased.len(), 10);
        // Another transaction changes the rows, as an extension does, and
        // keeps them locked while the completion starts.
        let mut other = store.pool.begin().await.unwrap();
        sqlx::query("UPDATE messaging_messages SET lease_expires = lease_expires + 1000 WHERE queue = 'raced'")
            .execute(&mut *other)
            .await
            .unwrap();
        let receipts: Vec<_> = leased.iter().map(|l| l.held()).collect();
        let completing = tokio::spawn({
            let store = store.clone();
            async move { store.complete("raced", START, receipts, 0).await }
        });
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        loop {
            let waiting: i64 = sqlx::query_scalar(
                "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query LIKE 'DELETE FROM messaging_messages m USING%'",
            )
            .fetch_one(&store.pool)
            .await
            .unwrap();
            if waiting > 0 {
                break;
            }
            assert!(std::time::Instant::now() < deadline, "the completion never waited for the locks");
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        other.commit().await.unwrap();
        let results = completing.await.unwrap();
        assert!(results.iter().all(Result::is_ok), "{results:?}");
        let left: i64 = sqlx::query_scalar("SELECT count(*) FROM messaging_messages WHERE queue = 'raced'")
            .fetch_one(&store.pool)
            .await
            .unwrap();
        assert_eq!(left, 0, "every message reported completed is gone");
        store.close().await;
    });
}
