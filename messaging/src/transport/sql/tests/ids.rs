//! On PostgreSQL a message's id is its enqueue order, one value of
//! `messaging_seq` for both columns, numbered from one draw per block of
//! 1,024 rows. A database an earlier version filled (ids from the column's
//! own sequence) keeps its rows, and no id is given twice.

use crate::transport::sql::machine::Enqueue;
use crate::transport::sql::migrate::MigrationsBefore;
use crate::transport::sql::postgres::PostgresStore;

const START: i64 = 1_800_000_000_000;

/// The migration that moved the ids to `messaging_seq`.
const IDS_FROM_SEQ: i64 = 20261206000001;

/// Applies the PostgreSQL migrations before `version` to the schema of
/// `url`, as the version before it did (recorded in sqlx's table).
async fn migrated_before(url: &str, version: i64) {
    let pool = sqlx::PgPool::connect(url).await.unwrap();
    MigrationsBefore::new("postgres", version).migrator().await.run(&pool).await.unwrap();
    pool.close().await;
}

/// (id, seq, message id) of every row of queue `q`, in id order.
async fn ids(store: &PostgresStore) -> Vec<(i64, i64, String)> {
    sqlx::query_as("SELECT id, seq, message_id FROM messaging_messages WHERE queue = 'q' ORDER BY id")
        .fetch_all(&store.pool)
        .await
        .unwrap()
}

#[test]
fn postgres_ids_come_from_the_enqueue_order_and_an_upgraded_table_gives_none_twice() {
    let db = super::Postgres::new();
    super::runtime().block_on(async {
        migrated_before(&db.url, IDS_FROM_SEQ).await;
        // An earlier version's rows: ids from the column's own sequence, here
        // far ahead of `messaging_seq` (which each insert also drew from).
        let pool = sqlx::PgPool::connect(&db.url).await.unwrap();
        sqlx::query("SELECT setval('messaging_messages_id_seq', 5000)").execute(&pool).await.unwrap();
        let old: i64 = sqlx::query_scalar(
            "INSERT INTO messaging_messages (queue, message_id, payload, status, seq, sent_at) \
             VALUES ('q', 'm-old', '\\x00', 'pending', nextval('messaging_seq'), 0) RETURNING id",
        )
        .fetch_one(&pool)
        .await
        .unwrap();
        assert_eq!(old, 5001);
        pool.close().await;

        let store = PostgresStore::connect(&db.url).await.unwrap();
        store.migrate().await.unwrap();
        store.check().await.unwrap();
        store.declare("q", false, START).await.unwrap();
        // Appended (no identity), then inserted (identities), then a row
        // written by hand, which takes the column's default.
        let plain = ["a", "b", "c"].iter().map(|p| Enqueue::test(&format!("m-{p}"), None, p)).collect();
        for result in store.enqueue("q", START, plain, false).await {
            result.unwrap();
        }
        let keyed = ["d", "e"].iter().map(|p| Enqueue::test(&format!("m-{p}"), Some(p), p)).collect();
        for result in store.enqueue("q", START, keyed, false).await {
            result.unwrap();
        }
        sqlx::query(
            "INSERT INTO messaging_messages (queue, message_id, payload, status, seq, sent_at) \
             VALUES ('q', 'm-hand', '\\x00', 'processed', 0, 0)",
        )
        .execute(&store.pool)
        .await
        .unwrap();

        let rows = ids(&store).await;
        let names: Vec<&str> = rows.iter().map(|(_, _, m)| m.as_str()).collect();
        assert_eq!(names, ["m-old", "m-a", "m-b", "m-c", "m-d", "m-e", "m-hand"], "{rows:?}");
        for (id, seq, message) in &rows[1..6] {
            assert_eq!(id, seq, "{message}: the id is the enqueue order");
        }
        assert!(rows[1].0 > 5001, "no id given twice: {rows:?}");
        let gone: Option<String> = sqlx::query_scalar("SELECT to_regclass('messaging_messages_id_seq')::text")
            .fetch_one(&store.pool)
            .await
            .unwrap();
        assert_eq!(gone, None, "the column's own sequence is dropped");

        // The queue's order holds across the versions: the old row first.
        let leased = store.lease("q", START, 10, 1_000, false).await.unwrap();
        let order: Vec<&[u8]> = leased.iter().map(|l| l.payload.as_slice()).collect();
        assert_eq!(order, [&b"\x00"[..], b"a", b"b", b"c", b"d", b"e"]);
    });
}

/// A migrated store on `url` with standard queue `q`.
async fn with_queue(url: &str) -> PostgresStore {
    let store = PostgresStore::connect(url).await.unwrap();
    store.migrate().await.unwrap();
    store.declare("q", false, START).await.unwrap();
    store
}

/// The next value of `messaging_seq`, drawn.
async fn draw(store: &PostgresStore) -> i64 {
    sqlx::query_scalar("SELECT nextval('messaging_seq')").fetch_one(&store.pool).await.unwrap()
}

/// Enqueues `batch` on queue `q`, every message accepted.
async fn enqueued(store: &PostgresStore, batch: Vec<Enqueue>) {
    for result in store.enqueue("q", START, batch, false).await {
        result.unwrap();
    }
}

/// (id, seq) of the rows of `q` whose message id starts with `prefix`, in
/// the order the queue gives them (`seq`), with their message ids.
async fn numbered(store: &PostgresStore, prefix: &str) -> Vec<(i64, i64, String)> {
    sqlx::query_as(
        "SELECT id, seq, message_id FROM messaging_messages WHERE queue = 'q' AND message_id LIKE $1 || '%' \
         ORDER BY seq",
    )
    .bind(prefix)
    .fetch_all(&store.pool)
    .await
    .unwrap()
}

#[test]
fn postgres_an_append_numbers_its_rows_in_input_order_from_one_draw_per_block() {
    let db = super::Postgres::new();
    super::runtime().block_on(async {
        let store = with_queue(&db.url).await;
        // Rows that agree on every column bound once, rows that differ in
        // each (every column an array), and more rows than a block holds.
        let agreeing: Vec<Enqueue> = (0..1_000).map(|i| Enqueue::test(&format!("a{i:04}"), None, "x")).collect();
        let differing: Vec<Enqueue> = (0..1_000)
            .map(|i| Enqueue {
                priority: i % 3,
                process_at: (i % 2 == 0).then_some(START - 1),
                group: (i % 5 != 0).then(|| format!("g{}", i % 7)),
                attributes: format!("{{\"n\":{i}}}"),
                ..Enqueue::test(&format!("d{i:04}"), None, &format!("payload {i}"))
            })
            .collect();
        let many: Vec<Enqueue> = (0..2_500).map(|i| Enqueue::test(&format!("z{i:04}"), None, "x")).collect();
        for (prefix, batch, blocks) in [("a", agreeing, 1), ("d", differing, 1), ("z", many, 3)] {
            let sent: Vec<String> = batch.iter().map(|e| e.message_id.clone()).collect();
            let before = draw(&store).await;
            enqueued(&store, batch).await;
            let after = draw(&store).await;
            assert_eq!(after - before, (blocks + 1) * 1024, "{prefix}: one draw per block of 1,024 rows");
            let rows = numbered(&store, prefix).await;
            let order: Vec<&str> = rows.iter().map(|(_, _, m)| m.as_str()).collect();
            assert_eq!(order, sent, "{prefix}: the enqueue order is the input order");
            for (i, (id, seq, message)) in rows.iter().enumerate() {
                assert_eq!(id, seq, "{message}: the id is the enqueue order");
                let (block, offset) = ((i / 1024) as i64, (i % 1024) as i64);
                assert_eq!(*seq, before + (block + 1) * 1024 + offset, "{message}: numbered from its block's draw");
            }
        }
        store.close().await;
    });
}

#[test]
fn postgres_identity_rows_take_their_values_from_blocks_and_order_holds_beside_single_draws() {
    let db = super::Postgres::new();
    super::runtime().block_on(async {
        let store = with_queue(&db.url).await;
        // Identities (values from `next_seqs`), a plain append, a lease
        // token drawn, then identities again: every value unique, and the
        // queue's order the order of the enqueues.
        let keyed =
            |from: usize, to: usize| (from..to).map(|i| Enqueue::test(&format!("k{i:04}"), Some(&format!("{i}")), "x"));
        let before = draw(&store).await;
        enqueued(&store, keyed(0, 1_100).collect()).await;
        assert_eq!(draw(&store).await - before, 3 * 1024, "two blocks for 1,100 identities");
        enqueued(&store, (0..10).map(|i| Enqueue::test(&format!("k{:04}", 1_100 + i), None, "x")).collect()).await;
        let leased = store.lease("q", START, 1, 60_000, false).await.unwrap();
        assert_eq!(leased.len(), 1);
        enqueued(&store, keyed(1_110, 1_120).collect()).await;
        let rows = numbered(&store, "k").await;
        let order: Vec<String> = rows.iter().map(|(_, _, m)| m.clone()).collect();
        let sent: Vec<String> = (0..1_120).map(|i| format!("k{i:04}")).collect();
        assert_eq!(order, sent, "the enqueue order");
        let mut ids: Vec<i64> = rows.iter().map(|(id, _, _)| *id).collect();
        ids.sort_unstable();
        ids.dedup();
        assert_eq!(ids.len(), 1_120, "no id given twice");
        store.close().await;
    });
}

#[test]
fn postgres_a_sequence_drawing_one_value_at_a_time_is_refused_with_the_migration_to_run() {
    let db = super::Postgres::new();
    super::runtime().block_on(async {
        let store = PostgresStore::connect(&db.url).await.unwrap();
        store.migrate().await.unwrap();
        store.check().await.unwrap();
        sqlx::query("ALTER SEQUENCE messaging_seq INCREMENT BY 1").execute(&store.pool).await.unwrap();
        let refused = store.check().await.unwrap_err().to_string();
        assert!(refused.contains("sequence `messaging_seq` draws blocks of 1 value(s)"), "{refused}");
        assert!(refused.contains("20261210000001_seq_blocks.sql"), "{refused}");
        assert!(refused.contains("run the `migrate` command"), "{refused}");
        sqlx::query("DROP SEQUENCE messaging_seq CASCADE").execute(&store.pool).await.unwrap();
        let refused = store.check().await.unwrap_err().to_string();
        assert!(refused.contains("sequence `messaging_seq` is missing"), "{refused}");
        store.close().await;
    });
}
