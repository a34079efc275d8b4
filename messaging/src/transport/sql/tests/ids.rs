//! On PostgreSQL a message's id is drawn from `messaging_seq` with its
//! enqueue order, one value for both columns, by every insert. A database
//! an earlier version filled (ids from the column's own sequence) keeps its
//! rows, and no id is given twice.

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

#[test]
fn postgres_a_fresh_table_draws_one_value_per_row_for_its_id_and_order() {
    let db = super::Postgres::new();
    super::runtime().block_on(async {
        let store = PostgresStore::connect(&db.url).await.unwrap();
        store.migrate().await.unwrap();
        store.declare("q", false, START).await.unwrap();
        let before: i64 = sqlx::query_scalar("SELECT nextval('messaging_seq')").fetch_one(&store.pool).await.unwrap();
        let plain = (0..100).map(|i| Enqueue::test(&format!("m-{i}"), None, "x")).collect();
        for result in store.enqueue("q", START, plain, false).await {
            result.unwrap();
        }
        let after: i64 = sqlx::query_scalar("SELECT nextval('messaging_seq')").fetch_one(&store.pool).await.unwrap();
        assert_eq!(after - before, 101, "one draw per row");
        let rows = ids(&store).await;
        assert!(rows.iter().all(|(id, seq, _)| id == seq), "{rows:?}");
    });
}
