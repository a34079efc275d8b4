//! A FIFO lease finds the heads of the groups without reading every waiting
//! message when it can ([`sql::PICK_FIFO`]), in each shape of backlog, with
//! the bounds the transport uses. (The model test checks every way against
//! the state machine with tight bounds; this one checks that each shape
//! takes the way meant for it, and that the way that reads everything does
//! not start unless it is chosen.)

use crate::transport::sql::dialect::{int, Dialect, SqlStore};
use crate::transport::sql::driver::Value;
use crate::transport::sql::machine::Enqueue;
#[cfg(feature = "postgres")]
use crate::transport::sql::postgres::LEASE_HEADS;
use crate::transport::sql::statements::{self as sql, FifoSearch};

const START: i64 = 1_800_000_000_000;
const LEASE_MS: i64 = 60_000;
/// The lease size of these checks (the walk reads 4 × 32 + 64 rows).
const N: usize = 32;

fn message(queue: &str, group: &str, payload: &str, priority: i32) -> Enqueue {
    Enqueue { group: Some(group.to_owned()), priority, ..Enqueue::test(&format!("{queue}-{payload}"), None, payload) }
}

/// The way [`sql::PICK_FIFO`] would take now for a lease of [`N`] (1 the
/// walk, 2 the groups, 3 every waiting row).
async fn way<D: Dialect>(store: &SqlStore<D>, queue: &str) -> i64 {
    let ctes = &sql::PICK_FIFO[..sql::PICK_FIFO.find("SELECT id FROM (").unwrap()];
    let text = format!("{ctes} SELECT CAST(way AS BIGINT) FROM tier WHERE CAST($3 AS BIGINT) IS NOT NULL");
    let search = FifoSearch::for_lease(N);
    let args =
        [Value::from(queue), Value::Int(Some(N as i64)), Value::Int(Some(0)), search.walk.into(), search.groups.into()];
    let rows = store.query("the way", &[&text], &args).await.unwrap();
    int::<D>(&rows, 0, "the way").unwrap().unwrap()
}

async fn lease<D: Dialect>(store: &SqlStore<D>, queue: &str) -> Vec<String> {
    let leased = store.lease(queue, START, N, LEASE_MS, true).await.unwrap();
    leased.into_iter().map(|l| String::from_utf8(l.payload.to_vec()).unwrap()).collect()
}

async fn send<D: Dialect>(store: &SqlStore<D>, queue: &str, items: Vec<Enqueue>) {
    store.declare(queue, true, START).await.unwrap();
    for result in store.enqueue(queue, START, items, false).await {
        result.unwrap();
    }
}

fn names(prefix: &str, range: std::ops::Range<usize>) -> Vec<String> {
    range.map(|i| format!("{prefix}{i}")).collect()
}

async fn each_shape_takes_its_way<D: Dialect>(store: &SqlStore<D>) {
    store.migrate().await.unwrap();
    // A few long groups: 10 groups of 300, interleaved. The walk finds the
    // 10 heads, fewer than asked; the groups are all enumerated.
    let few = (0..3_000).map(|i| message("few", &format!("g{}", i % 10), &format!("f{i}"), 0)).collect();
    send(store, "few", few).await;
    assert_eq!(way(store, "few").await, 2);
    assert_eq!(lease(store, "few").await, names("f", 0..10));
    // Every group locked now: nothing to lease, and still no full read.
    assert_eq!(way(store, "few").await, 2);
    assert!(lease(store, "few").await.is_empty());

    // A group per customer: most waiting rows are heads, and the walk finds
    // them. A later customer's higher priority goes first.
    let mut customers: Vec<Enqueue> =
        (0..3_000).map(|i| message("customers", &format!("c{i}"), &format!("c{i}"), 0)).collect();
    customers[2_999].priority = 1;
    send(store, "customers", customers).await;
    assert_eq!(way(store, "customers").await, 1);
    let mut expected = vec!["c2999".to_owned()];
    expected.extend(names("c", 0..31));
    assert_eq!(lease(store, "customers").await, expected);
    assert_eq!(way(store, "customers").await, 1);
    assert_eq!(lease(store, "customers").await, names("c", 31..63));

    // A long group in front of 600 groups of one: the walk sees the long
    // group's rows only, and there are too many groups to enumerate. Every
    // waiting row is read, and the answer is still exact.
    let mut blocked: Vec<Enqueue> = (0..1_000).map(|i| message("blocked", "big", &format!("b{i}"), 0)).collect();
    blocked.extend((0..600).map(|i| message("blocked", &format!("s{i}"), &format!("s{i}"), 0)));
    send(store, "blocked", blocked).await;
    assert_eq!(way(store, "blocked").await, 3);
    let mut expected = vec!["b0".to_owned()];
    expected.extend(names("s", 0..31));
    assert_eq!(lease(store, "blocked").await, expected);
    assert_eq!(way(store, "blocked").await, 3);
    assert_eq!(lease(store, "blocked").await, names("s", 31..63));
}

/// PostgreSQL's plan of [`sql::PICK_FIFO`] for a lease of `n`, as executed.
#[cfg(feature = "postgres")]
async fn executed_plan(store: &crate::transport::sql::postgres::PostgresStore, queue: &str, n: usize) -> String {
    let search = FifoSearch::for_lease(n);
    let rows: Vec<(String,)> = sqlx::query_as(&format!("EXPLAIN (ANALYZE, COSTS OFF) {}", sql::PICK_FIFO))
        .bind(queue)
        .bind(n as i64)
        .bind(0i64)
        .bind(search.walk)
        .bind(search.groups)
        .fetch_all(&store.pool)
        .await
        .unwrap();
    rows.into_iter().map(|(line,)| line).collect::<Vec<_>>().join("\n")
}

#[cfg(feature = "postgres")]
#[test]
fn postgres_finds_fifo_heads_each_way() {
    let runtime = super::runtime();
    let db = super::Postgres::new();
    runtime.block_on(async {
        let store = crate::transport::sql::postgres::PostgresStore::connect(&db.url).await.unwrap();
        store.migrate().await.unwrap();
        // Never analyzed, as with autovacuum off: the planner sees a table of
        // a few rows whatever it holds.
        sqlx::query("ALTER TABLE messaging_messages SET (autovacuum_enabled = false)")
            .execute(&store.pool)
            .await
            .unwrap();
        each_shape_takes_its_way(&store).await;
        // The way that reads every waiting row does not start when another
        // answers: no scan under its window function is executed.
        for queue in ["few", "customers"] {
            let plan = executed_plan(&store, queue, N).await;
            // (The walk has a window function too; the third way's is the last.)
            let lines: Vec<&str> = plan.lines().collect();
            let window = lines.iter().rposition(|l| l.contains("WindowAgg")).unwrap_or_else(|| panic!("{plan}"));
            let scans: Vec<&&str> = lines[window..].iter().filter(|l| l.contains(" on messaging_messages")).collect();
            assert!(!scans.is_empty(), "{plan}");
            assert!(scans.iter().all(|l| l.contains("never executed")), "{queue}:\n{plan}");
        }
        // A worker's lease of 300 over 10 long groups walks 1,264 rows and
        // probes each group's earliest only: one probe per group.
        let items = (0..3_000).map(|i| message("probes", &format!("g{}", i % 10), &format!("p{i}"), 0)).collect();
        send(&store, "probes", items).await;
        let plan = executed_plan(&store, "probes", 300).await;
        let probe = plan.lines().find(|l| l.contains(" on messaging_messages e ")).unwrap_or_else(|| panic!("{plan}"));
        assert!(probe.contains("loops=10)"), "{plan}");
        // The lease updates the picked rows by tuple id, each looked up by
        // primary key, not through the ready index (every pending row).
        let search = FifoSearch::for_lease(300);
        let lease = [LEASE_HEADS[0], sql::PICK_FIFO, LEASE_HEADS[1], sql::LEASED].concat();
        let mut tx = store.pool.begin().await.unwrap();
        let rows: Vec<(String,)> = sqlx::query_as(&format!("EXPLAIN (ANALYZE, COSTS OFF) {lease}"))
            .bind("probes")
            .bind(300i64)
            .bind(START + LEASE_MS)
            .bind(search.walk)
            .bind(search.groups)
            .fetch_all(&mut *tx)
            .await
            .unwrap();
        tx.rollback().await.unwrap();
        let plan = rows.into_iter().map(|(line,)| line).collect::<Vec<_>>().join("\n");
        assert!(plan.contains("Tid Scan on messaging_messages"), "{plan}");
        assert!(!plan.contains("Recheck Cond: (status = 'pending'::text)"), "{plan}");
        assert!(
            plan.starts_with("Update on messaging_messages (actual") && plan.contains("rows=10 loops=1)"),
            "{plan}"
        );
    });
}

#[cfg(feature = "sqlite")]
#[test]
fn sqlite_finds_fifo_heads_each_way() {
    let runtime = super::runtime();
    let file = super::SqliteFile::new();
    runtime.block_on(async {
        let store = crate::transport::sql::sqlite::SqliteStore::connect(&file.url).await.unwrap();
        each_shape_takes_its_way(&store).await;
        // SQLite evaluates a scalar subquery in a WHERE clause row by row, so
        // the third way's scan must come after `tier`'s, whose `way` stops it.
        let rows: Vec<(i64, i64, i64, String)> =
            sqlx::query_as(&format!("EXPLAIN QUERY PLAN {}", sql::PICK_FIFO)).fetch_all(&store.pool).await.unwrap();
        let details: Vec<&str> = rows.iter().map(|r| r.3.as_str()).collect();
        let third =
            details.iter().position(|d| *d == "CO-ROUTINE first_rows").unwrap_or_else(|| panic!("{details:#?}"));
        let tier = details[third..].iter().position(|d| *d == "SCAN tier");
        let table = details[third..].iter().position(|d| d.contains("messaging_messages"));
        assert!(tier.is_some() && tier < table, "{details:#?}");
    });
}
