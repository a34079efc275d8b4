//! Unit tests of the SQLite store.

use std::collections::HashSet;
use std::path::PathBuf;

use super::*;
use crate::transport::sql::machine::{Enqueue, EnqueueOutcome, QueueRules, Status, Suspect};
use crate::transport::sql::migrate::MigrationsBefore;
use crate::transport::sql::store::{Enqueued, RowOp};
use crate::transport::FailedAttempt;

const NOW: i64 = 1_800_000_000_000;
const LEASE: i64 = 1_000;

/// A database file in the temp directory, removed on drop.
struct TempDb {
    path: PathBuf,
}

impl TempDb {
    fn new() -> TempDb {
        let name = format!("messaging-sqlite-{}-{:016x}.db", std::process::id(), fastrand::u64(..));
        TempDb { path: std::env::temp_dir().join(name) }
    }

    fn url(&self) -> String {
        format!("sqlite://{}", self.path.display())
    }
}

impl Drop for TempDb {
    fn drop(&mut self) {
        for suffix in ["", "-wal", "-shm"] {
            let _ = std::fs::remove_file(format!("{}{suffix}", self.path.display()));
        }
    }
}

/// A migrated store on a fresh file.
async fn store() -> (SqliteStore, TempDb) {
    let db = TempDb::new();
    let store = SqliteStore::connect(&db.url()).await.expect("connect");
    store.migrate().await.expect("migrate");
    (store, db)
}

async fn close(store: SqliteStore, db: TempDb) {
    store.close().await;
    drop(db);
}

fn msg(identity: Option<&str>, payload: &str) -> Enqueue {
    Enqueue::test(&format!("m-{payload}"), identity, payload)
}

fn grouped(group: Option<&str>, payload: &str) -> Enqueue {
    Enqueue { group: group.map(str::to_owned), ..msg(None, payload) }
}

async fn enqueue(store: &SqliteStore, queue: &str, now: i64, e: Enqueue) -> Enqueued {
    store.enqueue(queue, now, vec![e], false).await.remove(0).expect("enqueue")
}

/// The row holding message `message_id` (appended rows come back without their ids).
async fn row_of(store: &SqliteStore, queue: &str, message_id: &str) -> Row {
    let rows = store.rows(queue).await.expect("rows");
    rows.into_iter().find(|r| r.message_id == message_id).expect("the message's row")
}

async fn row(store: &SqliteStore, queue: &str, id: RowId) -> Row {
    store.rows(queue).await.expect("rows").into_iter().find(|r| r.id == id).expect("row exists")
}

fn payloads(leased: &[LeasedRow]) -> Vec<String> {
    leased.iter().map(|l| String::from_utf8_lossy(&l.payload).into_owned()).collect()
}

#[tokio::test]
async fn migrates_checks_and_declares_queues() {
    let (store, db) = store().await;
    store.check().await.expect("schema ok");
    // Migrating again is a no-op.
    store.migrate().await.expect("migrate twice");
    store.declare("jobs", false, NOW).await.expect("declare standard");
    store.declare("jobs", false, NOW).await.expect("re-declare standard");
    store.declare("ordered", true, NOW).await.expect("declare FIFO");
    store.declare("ordered", true, NOW).await.expect("re-declare FIFO");
    let err = store.declare("jobs", true, NOW).await.expect_err("kind changed");
    assert!(matches!(&err, TransportError::Rejected(m) if m.contains("exists as a standard queue")), "{err}");
    let err = store.declare("ordered", false, NOW).await.expect_err("kind changed");
    assert!(matches!(&err, TransportError::Rejected(m) if m.contains("exists as a FIFO queue")), "{err}");
    close(store, db).await;
}

#[tokio::test]
async fn connect_runs_the_migrations_when_asked() {
    let db = TempDb::new();
    let transport = crate::transport::sql::connect::<Sqlite>(&format!("{}?migrate=true&poll=50ms", db.url()))
        .await
        .expect("connect");
    transport.store.check().await.expect("migrated");
    transport.store.close().await;
}

#[tokio::test]
async fn a_missing_schema_asks_for_the_migrate_command() {
    let db = TempDb::new();
    let store = SqliteStore::connect(&db.url()).await.expect("connect creates the file");
    for err in
        [store.check().await.expect_err("no tables"), store.declare("jobs", false, NOW).await.expect_err("no tables")]
    {
        let text = err.to_string();
        assert!(text.contains("run the `migrate` command"), "{text}");
        assert!(text.contains("messaging_messages"), "{text}");
    }
    close(store, db).await;
}

#[tokio::test]
async fn a_missing_directory_is_named() {
    let dir = std::env::temp_dir().join(format!("messaging-missing-{:016x}", fastrand::u64(..)));
    let url = format!("sqlite://{}/app.db", dir.display());
    let err = SqliteStore::connect(&url).await.expect_err("no directory");
    let text = err.to_string();
    assert!(matches!(err, TransportError::Backend(_)));
    assert!(text.contains(&dir.display().to_string()) && text.contains("does not exist"), "{text}");
}

#[tokio::test]
async fn enqueue_lease_complete() {
    let (store, db) = store().await;
    store.declare("jobs", false, NOW).await.expect("declare");
    let plain = enqueue(&store, "jobs", NOW, msg(None, "plain")).await;
    let keyed = enqueue(&store, "jobs", NOW, msg(Some("k"), "keyed")).await;
    assert_eq!(plain.outcome, EnqueueOutcome::Appended);
    assert!(matches!(keyed.outcome, EnqueueOutcome::Inserted(_)));
    assert_eq!(keyed.message_id, "m-keyed");
    assert_eq!(store.depth("jobs").await.expect("depth"), 2);

    let leased = store.lease("jobs", NOW, 10, LEASE, false).await.expect("lease");
    assert_eq!(payloads(&leased), ["plain", "keyed"]);
    assert!(leased.iter().all(|l| l.attempts == 1 && l.sent_at == NOW));
    assert_eq!(leased[0].token, leased[1].token, "one token per lease");
    assert!(store.lease("jobs", NOW, 10, LEASE, false).await.expect("lease").is_empty());
    let r = row(&store, "jobs", leased[0].id).await;
    assert_eq!((r.status, r.lease_expires), (Status::Processing, Some(NOW + LEASE)));

    let items = leased.iter().map(|l| l.held()).collect::<Vec<_>>();
    let mut stale = items.clone();
    stale.push(leased[0].held());
    let results = store.complete("jobs", NOW + 1, stale, 0).await;
    assert!(results[0].is_ok() && results[1].is_ok(), "{results:?}");
    assert!(matches!(results[2], Err(TransportError::StaleReceipt)), "{results:?}");
    assert!(store.rows("jobs").await.expect("rows").is_empty());
    assert_eq!(store.previous("jobs", "k").await.expect("previous").as_deref(), Some(&b"keyed"[..]));
    assert_eq!(store.depth("jobs").await.expect("depth"), 0);
    close(store, db).await;
}

/// A store on a fresh file migrated as a version before migration `version`
/// left it (its migrations recorded in sqlx's table, as that version ran them).
///
/// Today's code fills it, and reads and writes the `suspect` column, which
/// came after the rebuilds tested here: it is added by hand, so that the
/// rows can be written. A rebuild drops it with the old table, and the
/// later migration adds it back with the value every row written here
/// has (0).
async fn migrated_before(version: i64) -> (SqliteStore, TempDb) {
    let db = TempDb::new();
    let store = SqliteStore::connect(&db.url()).await.expect("connect");
    let old = MigrationsBefore::new("sqlite", version).migrator().await;
    old.run(&store.pool).await.expect("an earlier version's migrations");
    sqlx::query("ALTER TABLE messaging_messages ADD COLUMN suspect INTEGER NOT NULL DEFAULT 0")
        .execute(&store.pool)
        .await
        .expect("today's column");
    (store, db)
}

/// The migration that made the identity index partial rebuilt the table: a
/// database an earlier version migrated (recorded in sqlx's table) and
/// filled keeps every row as it was, and the ids it gave (the largest since
/// deleted) are never given again.
#[tokio::test]
async fn the_identity_rebuild_keeps_every_row_and_never_gives_an_id_twice() {
    let (store, db) = migrated_before(20261207000001).await;
    store.declare("jobs", false, NOW).await.expect("declare");
    for e in [msg(None, "a"), msg(Some("k1"), "b"), msg(None, "c"), msg(Some("k2"), "d"), msg(None, "e")] {
        enqueue(&store, "jobs", NOW, e).await;
    }
    let leased = store.lease("jobs", NOW, 10, LEASE, false).await.expect("lease");
    let last = leased.iter().find(|l| l.payload == b"e").expect("the last row");
    assert_eq!(last.id, 5);
    store.complete("jobs", NOW, vec![last.held()], 0).await.remove(0).expect("complete");
    let before = store.rows("jobs").await.expect("rows");
    assert_eq!(before.len(), 4);

    store.migrate().await.expect("the rebuild");
    store.check().await.expect("the schema");
    assert_eq!(store.rows("jobs").await.expect("rows"), before, "every row as it was");
    enqueue(&store, "jobs", NOW, msg(None, "f")).await;
    assert_eq!(row_of(&store, "jobs", "m-f").await.id, 6);
    let index: String = sqlx::query_scalar("SELECT sql FROM sqlite_master WHERE name = 'messaging_messages_identity'")
        .fetch_one(&store.pool)
        .await
        .expect("the identity index");
    assert!(index.ends_with("WHERE identity IS NOT NULL"), "{index}");
    // Still one row per identity, and any number without one.
    let duplicate = "INSERT INTO messaging_messages (queue, identity, message_id, payload, status, seq, sent_at) \
                     VALUES ('jobs', $1, 'x', x'00', 'pending', 99, 0)";
    let refused = sqlx::query(duplicate).bind("k1").execute(&store.pool).await.expect_err("a second k1");
    assert!(refused.to_string().contains("UNIQUE"), "{refused}");
    enqueue(&store, "jobs", NOW, msg(None, "g")).await;
    assert_eq!(store.depth("jobs").await.expect("depth"), 6);
    close(store, db).await;
}

/// The migration that wrote the status check as comparisons rebuilt the
/// table again: rows in every state keep every column (leases, attempts,
/// error histories, a new version waiting behind a leased one), ids go on
/// above the largest ever given, and a status outside the six is still
/// refused.
#[tokio::test]
async fn the_status_check_rebuild_keeps_rows_in_every_state() {
    let (store, db) = migrated_before(20261208000001).await;
    store.declare("jobs", false, NOW).await.expect("declare");
    for e in [msg(None, "a"), msg(Some("k1"), "b"), msg(None, "c"), msg(None, "d"), msg(None, "e")] {
        enqueue(&store, "jobs", NOW, e).await;
    }
    enqueue(&store, "jobs", NOW, Enqueue { process_at: Some(NOW + 60_000), ..msg(None, "later") }).await;
    let leased = store.lease("jobs", NOW, 5, LEASE, false).await.expect("lease");
    let by = |p: &[u8]| leased.iter().find(|l| l.payload == p).expect("leased").clone();
    // b stays leased with a new version waiting; c failed once and waits for
    // its retry; d is a dead letter; e completed (the largest id so far).
    enqueue(&store, "jobs", NOW, msg(Some("k1"), "b2")).await;
    let (c, d, e) = (by(b"c"), by(b"d"), by(b"e"));
    let fail =
        RowOp::Fail { retry_at: NOW + 500, failure: FailedAttempt::new(1, "Error", "card declined"), max_attempts: 5 };
    store.apply("jobs", NOW + 1, c.id, c.token, fail).await.expect("fail");
    let dead = RowOp::DeadLetter { failure: FailedAttempt::new(1, "Error", "bad input") };
    store.apply("jobs", NOW + 1, d.id, d.token, dead).await.expect("dead letter");
    store.complete("jobs", NOW + 1, vec![e.held()], 0).await.remove(0).expect("complete");
    let before = store.rows("jobs").await.expect("rows");
    let statuses: HashSet<Status> = before.iter().map(|r| r.status).collect();
    assert!(statuses.len() >= 4, "rows in several states: {statuses:?}");

    store.migrate().await.expect("the rebuild");
    store.check().await.expect("the schema");
    assert_eq!(store.rows("jobs").await.expect("rows"), before, "every row as it was");
    let table: String = sqlx::query_scalar("SELECT sql FROM sqlite_master WHERE name = 'messaging_messages'")
        .fetch_one(&store.pool)
        .await
        .expect("the table");
    assert!(table.contains("status = 'pending' OR") && !table.contains("status IN"), "{table}");
    enqueue(&store, "jobs", NOW, msg(None, "f")).await;
    let largest = leased.iter().map(|l| l.id).max().unwrap_or_default().max(e.id);
    let next = row_of(&store, "jobs", "m-f").await.id;
    assert!(next > largest + 1, "{next}");
    let odd = "INSERT INTO messaging_messages (queue, message_id, payload, status, seq, sent_at) \
               VALUES ('jobs', 'x', x'00', 'paused', 99, 0)";
    let refused = sqlx::query(odd).execute(&store.pool).await.expect_err("an unknown status");
    assert!(refused.to_string().contains("CHECK"), "{refused}");
    // The rebuilt table leases and completes as before.
    let again = store.lease("jobs", NOW + 1_000, 10, LEASE, false).await.expect("lease");
    assert_eq!(payloads(&again), ["f"]);
    store.complete("jobs", NOW + 1_001, vec![again[0].held()], 0).await.remove(0).expect("complete");
    close(store, db).await;
}

#[tokio::test]
async fn a_lost_counter_asks_for_the_migrate_command_and_leases_nothing() {
    let (store, db) = store().await;
    store.declare("jobs", false, NOW).await.expect("declare");
    enqueue(&store, "jobs", NOW, msg(None, "plain")).await;
    sqlx::query("DELETE FROM messaging_counters").execute(&store.pool).await.expect("delete");
    let error = store.lease("jobs", NOW, 10, LEASE, false).await.expect_err("no counter");
    assert!(
        error.to_string().contains("the counter `seq` is missing") && error.to_string().contains("`migrate`"),
        "{error}"
    );
    let error = store.enqueue("jobs", NOW, vec![msg(None, "more")], false).await.remove(0).expect_err("no counter");
    assert!(error.to_string().contains("run the `migrate` command"), "{error}");
    // Inside the caller's transaction too, and nothing is inserted.
    let mut tx = store.pool.begin().await.expect("begin");
    let error = store.enqueue_on(&mut tx, "jobs", NOW, vec![msg(None, "more")], false).await.expect_err("no counter");
    assert!(error.to_string().contains("run the `migrate` command"), "{error}");
    tx.commit().await.expect("commit");
    assert_eq!(store.rows("jobs").await.expect("rows").len(), 1);
    // The failed lease was rolled back: the message still waits.
    assert_eq!(row(&store, "jobs", 1).await.status, Status::Pending);
    close(store, db).await;
}

#[tokio::test]
async fn priority_then_enqueue_order_and_batches_in_input_order() {
    let (store, db) = store().await;
    let items = vec![
        msg(None, "a"),
        Enqueue { priority: 5, ..msg(Some("k"), "b") },
        msg(None, "c"),
        Enqueue { priority: 5, ..msg(None, "d") },
        Enqueue { process_at: Some(NOW + 10), ..msg(None, "later") },
    ];
    let results = store.enqueue("jobs", NOW, items, false).await;
    let message_ids: Vec<String> = results.into_iter().map(|r| r.expect("enqueued").message_id.to_string()).collect();
    let rows = store.rows("jobs").await.expect("rows");
    let of = |m: &String| rows.iter().find(|r| r.message_id == *m).expect("row");
    let seqs: Vec<u64> = message_ids.iter().map(|m| of(m).seq).collect();
    assert!(seqs.windows(2).all(|w| w[0] < w[1]), "seqs in input order: {seqs:?}");
    assert_eq!(of(&message_ids[4]).status, Status::Sleeping);
    let leased = store.lease("jobs", NOW, 2, LEASE, false).await.expect("lease");
    assert_eq!(payloads(&leased), ["b", "d"]);
    let first_token = leased[0].token;
    let leased = store.lease("jobs", NOW, 10, LEASE, false).await.expect("lease");
    assert_eq!(payloads(&leased), ["a", "c"]);
    assert!(leased[0].token > first_token, "a later lease draws a newer token");
    close(store, db).await;
}

/// A plain batch longer than one insert statement, its chunks' ids bound
/// packed (ids of a UUID's length) or one by one (a shorter id among them),
/// inside a transaction of its own and inside the caller's: every row keeps
/// its own id, in input order, with consecutive sequence values.
#[tokio::test]
async fn a_batch_of_several_inserts_keeps_each_message_id_in_input_order() {
    let (store, db) = store().await;
    let id = |i: usize| if i == 1_500 { format!("short-{i}") } else { format!("{i:->36}") };
    for (queue, in_transaction) in [("whole", false), ("caller", true)] {
        let items: Vec<Enqueue> = (0..2_500).map(|i| Enqueue::test(&id(i), None, &i.to_string())).collect();
        let reported: Vec<String> = if in_transaction {
            let mut tx = store.pool.begin_with(Sqlite::BEGIN).await.expect("begin");
            let stored = store.enqueue_on(&mut tx, queue, NOW, items, false).await.expect("enqueue");
            tx.commit().await.expect("commit");
            stored.into_iter().map(|e| e.message_id.to_string()).collect()
        } else {
            let results = store.enqueue(queue, NOW, items, false).await;
            results.into_iter().map(|r| r.expect("enqueued").message_id.to_string()).collect()
        };
        let mut rows = store.rows(queue).await.expect("rows");
        rows.sort_by_key(|r| r.seq);
        let stored: Vec<(&str, &[u8])> = rows.iter().map(|r| (r.message_id.as_str(), r.payload.as_slice())).collect();
        let sent: Vec<String> = (0..2_500).map(id).collect();
        let bodies: Vec<String> = (0..2_500).map(|i| i.to_string()).collect();
        let expected: Vec<(&str, &[u8])> =
            sent.iter().map(String::as_str).zip(bodies.iter().map(String::as_bytes)).collect();
        assert!(stored == expected, "{queue}: rows in input order with their own ids");
        assert_eq!(reported, sent, "{queue}: the results name the ids sent");
        assert!(rows.windows(2).all(|w| w[1].seq == w[0].seq + 1), "{queue}: consecutive sequence values");
    }
    close(store, db).await;
}

/// Payloads of a batch of two insert statements come back byte for byte:
/// empty ones, NUL and bytes that are no UTF-8, and 9 MiB in three rows.
#[tokio::test]
async fn payloads_of_any_bytes_and_size_are_stored_byte_for_byte() {
    let (store, db) = store().await;
    let big = 3 << 20;
    let body = |i: usize| -> Vec<u8> {
        match i {
            // The second statement's rows.
            1_000.. => vec![i as u8; big],
            _ if i % 7 == 0 => Vec::new(),
            _ => (0..i % 300).map(|b| (b * 37 + i) as u8).chain([0, 0xff, 0xfe]).collect(),
        }
    };
    let items: Vec<Enqueue> =
        (0..1_003).map(|i| Enqueue { payload: body(i), ..Enqueue::test(&format!("{i:->36}"), None, "") }).collect();
    let results = store.enqueue("bytes", NOW, items, false).await;
    assert!(results.iter().all(Result::is_ok), "enqueued");
    let mut rows = store.rows("bytes").await.expect("rows");
    rows.sort_by_key(|r| r.seq);
    assert_eq!(rows.len(), 1_003);
    for (i, row) in rows.iter().enumerate() {
        assert_eq!(row.message_id, format!("{i:->36}"), "row {i} in input order");
        assert!(row.payload == body(i), "row {i}: {} bytes stored, {} sent", row.payload.len(), body(i).len());
    }
    close(store, db).await;
}

/// Plain batches of one length whose rows agree on different columns: each
/// shape has a statement text of its own (kept between calls), and every
/// row stores its own values whichever text was kept before.
#[tokio::test]
async fn plain_batches_of_one_length_in_turn_store_their_own_values() {
    let (store, db) = store().await;
    let shapes: [fn(usize) -> Enqueue; 4] = [
        |i| msg(None, &format!("same-{i}")),
        |i| Enqueue { priority: i as i32, ..msg(None, &format!("priority-{i}")) },
        |i| Enqueue { process_at: Some(NOW + 10 * (i as i64 + 1)), ..msg(None, &format!("later-{i}")) },
        |i| Enqueue { attributes: format!("k={i}"), ..grouped(Some(&format!("g{i}")), &format!("grouped-{i}")) },
    ];
    for round in 0..2 {
        for (s, shape) in shapes.iter().enumerate() {
            let items: Vec<Enqueue> = (0..3)
                .map(|i| {
                    let mut e = shape(i);
                    e.message_id = format!("{}-{round}", e.message_id);
                    e
                })
                .collect();
            let results = store.enqueue("jobs", NOW, items, false).await;
            assert!(results.iter().all(Result::is_ok), "shape {s}, round {round}: {results:?}");
        }
    }
    for round in 0..2 {
        for i in 0..3_usize {
            let row = row_of(&store, "jobs", &format!("m-same-{i}-{round}")).await;
            assert_eq!(
                (row.priority, row.process_at, row.group.as_deref(), row.status),
                (0, None, None, Status::Pending)
            );
            let row = row_of(&store, "jobs", &format!("m-priority-{i}-{round}")).await;
            assert_eq!((row.priority, row.process_at, row.status), (i as i32, None, Status::Pending));
            let row = row_of(&store, "jobs", &format!("m-later-{i}-{round}")).await;
            assert_eq!((row.process_at, row.status), (Some(NOW + 10 * (i as i64 + 1)), Status::Sleeping));
            let row = row_of(&store, "jobs", &format!("m-grouped-{i}-{round}")).await;
            assert_eq!((row.group, row.attributes), (Some(format!("g{i}")), format!("k={i}")));
            assert_eq!(row.payload, format!("grouped-{i}").into_bytes());
        }
    }
    close(store, db).await;
}

#[tokio::test]
async fn identity_enqueue_while_leased_waits_for_the_release() {
    let (store, db) = store().await;
    enqueue(&store, "jobs", NOW, msg(Some("k"), "v1")).await;
    let leased = store.lease("jobs", NOW, 1, LEASE, false).await.expect("lease").remove(0);
    let newer = enqueue(&store, "jobs", NOW + 1, Enqueue { priority: 3, ..msg(Some("k"), "v2") }).await;
    assert_eq!(newer.outcome, EnqueueOutcome::Deferred(leased.id));
    assert_eq!(newer.message_id, "m-v2");
    // A later enqueue replaces the deferred version.
    let newest = enqueue(&store, "jobs", NOW + 2, Enqueue { priority: 4, ..msg(Some("k"), "v3") }).await;
    assert_eq!(newest.outcome, EnqueueOutcome::Deferred(leased.id));
    let r = row(&store, "jobs", leased.id).await;
    assert_eq!(r.status, Status::AwaitingRelease);
    assert_eq!(r.payload, b"v1");
    let d = r.deferred.expect("deferred version");
    assert_eq!((d.payload.as_slice(), d.priority, d.message_id.as_str(), d.sent_at), (&b"v3"[..], 4, "m-v3", NOW + 2));
    // Nobody else can lease the newer version meanwhile.
    assert!(store.lease("jobs", NOW + 3, 10, LEASE, false).await.expect("lease").is_empty());
    // The lease holder keeps its lease: completing applies the deferred version.
    store.complete("jobs", NOW + 4, vec![leased.held()], 0).await.remove(0).expect("complete");
    let r = row(&store, "jobs", leased.id).await;
    assert_eq!((r.status, r.payload.as_slice(), r.priority, r.attempts), (Status::Pending, &b"v3"[..], 4, 0));
    assert!(r.deferred.is_none() && r.lease_token.is_none());
    assert_eq!(store.previous("jobs", "k").await.expect("previous").as_deref(), Some(&b"v1"[..]));
    let again = store.lease("jobs", NOW + 5, 10, LEASE, false).await.expect("lease");
    assert_eq!(payloads(&again), ["v3"]);
    assert_eq!(again[0].message_id, "m-v3");
    // An identity enqueue of an unleased row updates it in place.
    store.complete("jobs", NOW + 6, vec![again[0].held()], 60_000).await.remove(0).expect("complete");
    assert_eq!(row(&store, "jobs", again[0].id).await.status, Status::Processed);
    let updated = enqueue(&store, "jobs", NOW + 7, msg(Some("k"), "v4")).await;
    assert_eq!(updated.outcome, EnqueueOutcome::Updated(again[0].id));
    assert_eq!(store.previous("jobs", "k").await.expect("previous").as_deref(), Some(&b"v3"[..]));
    // Idempotent queues discard an equal payload.
    let same = store.enqueue("jobs", NOW + 8, vec![msg(Some("k"), "v4")], true).await.remove(0).expect("enqueue");
    assert_eq!(same.outcome, EnqueueOutcome::Discarded(again[0].id));
    assert_eq!(store.rows("jobs").await.expect("rows").len(), 1);
    close(store, db).await;
}

#[tokio::test]
async fn failure_sleeps_until_the_retry_time() {
    let (store, db) = store().await;
    let rules = QueueRules { max_attempts: 2, ..QueueRules::default() };
    enqueue(&store, "jobs", NOW, msg(None, "x")).await;
    let l = store.lease("jobs", NOW, 1, LEASE, false).await.expect("lease").remove(0);
    let fail = |retry_at| RowOp::Fail {
        retry_at,
        failure: FailedAttempt::new(1, "Error", "boom"),
        max_attempts: rules.max_attempts,
    };
    store.apply("jobs", NOW + 10, l.id, l.token, fail(NOW + 500)).await.expect("fail");
    // The stale token is rejected afterwards.
    let stale = store.apply("jobs", NOW + 11, l.id, l.token, RowOp::Release).await;
    assert!(matches!(stale, Err(TransportError::StaleReceipt)), "{stale:?}");
    let r = row(&store, "jobs", l.id).await;
    assert_eq!(
        (r.status, r.process_at, r.error.as_deref()),
        (Status::Sleeping, Some(NOW + 500), Some("boom (after 1 attempt)"))
    );
    assert_eq!(store.next_due("jobs").await.expect("next due"), Some(NOW + 500));
    store.maintain("jobs", NOW + 499, rules).await.expect("maintain");
    assert!(store.lease("jobs", NOW + 499, 1, LEASE, false).await.expect("lease").is_empty());
    store.maintain("jobs", NOW + 500, rules).await.expect("maintain");
    assert_eq!(row(&store, "jobs", l.id).await.status, Status::Pending);
    let l = store.lease("jobs", NOW + 500, 1, LEASE, false).await.expect("lease").remove(0);
    assert_eq!(l.attempts, 2);
    assert_eq!(store.next_due("jobs").await.expect("next due"), Some(NOW + 500 + LEASE));
    // Out of attempts: Error.
    store.apply("jobs", NOW + 600, l.id, l.token, fail(NOW + 900)).await.expect("fail");
    assert_eq!(row(&store, "jobs", l.id).await.status, Status::Error);
    assert_eq!(store.next_due("jobs").await.expect("next due"), None);
    close(store, db).await;
}

#[tokio::test]
async fn release_extend_and_dead_letter() {
    let (store, db) = store().await;
    enqueue(&store, "jobs", NOW, msg(None, "x")).await;
    let l = store.lease("jobs", NOW, 1, LEASE, false).await.expect("lease").remove(0);
    store.apply("jobs", NOW + 900, l.id, l.token, RowOp::Extend { lease_ms: LEASE }).await.expect("extend");
    assert_eq!(row(&store, "jobs", l.id).await.lease_expires, Some(NOW + 900 + LEASE));
    store.apply("jobs", NOW + 1_500, l.id, l.token, RowOp::Release).await.expect("release within the extension");
    let r = row(&store, "jobs", l.id).await;
    assert_eq!((r.status, r.attempts, r.lease_token), (Status::Pending, 0, None));
    let l = store.lease("jobs", NOW + 1_600, 1, LEASE, false).await.expect("lease").remove(0);
    let dead = RowOp::DeadLetter { failure: FailedAttempt::new(1, "Error", "bad input") };
    store.apply("jobs", NOW + 1_700, l.id, l.token, dead).await.expect("dead letter");
    let r = row(&store, "jobs", l.id).await;
    assert_eq!(
        (r.status, r.error.as_deref()),
        (Status::Error, Some("bad input (after 1 attempt)")),
        "a release charged no receive"
    );
    // A row of another queue is not reachable through this one.
    let other = store.apply("other", NOW, l.id, l.token, RowOp::Release).await;
    assert!(matches!(other, Err(TransportError::StaleReceipt)));
    close(store, db).await;
}

#[tokio::test]
async fn an_expired_lease_is_abandoned() {
    let (store, db) = store().await;
    let retry = QueueRules::default();
    let give_up = QueueRules { retry_abandoned: false, ..QueueRules::default() };
    enqueue(&store, "jobs", NOW, msg(None, "retried")).await;
    enqueue(&store, "lost", NOW, msg(None, "dead")).await;
    enqueue(&store, "jobs", NOW, msg(Some("k"), "v1")).await;
    let leased = store.lease("jobs", NOW, 10, LEASE, false).await.expect("lease");
    let lost = store.lease("lost", NOW, 10, LEASE, false).await.expect("lease").remove(0);
    enqueue(&store, "jobs", NOW + 1, msg(Some("k"), "v2")).await;

    store.maintain("jobs", NOW + LEASE - 1, retry).await.expect("maintain");
    assert_eq!(row(&store, "jobs", leased[0].id).await.status, Status::Processing);
    store.maintain("jobs", NOW + LEASE, retry).await.expect("maintain");
    store.maintain("lost", NOW + LEASE, give_up).await.expect("maintain");
    // Held with another message: the attempt is given back, and the
    // message is marked (a suspect if it happens again).
    let r = row(&store, "jobs", leased[0].id).await;
    assert_eq!((r.status, r.lease_token, r.attempts, r.suspect), (Status::Pending, None, 0, Suspect::Once));
    assert!(r.error.as_deref().is_some_and(|e| e.contains("lease expired")));
    // The deferred version applies on abandonment.
    let r = row(&store, "jobs", leased[1].id).await;
    assert_eq!((r.status, r.payload.as_slice(), r.attempts), (Status::Pending, &b"v2"[..], 0));
    assert_eq!(row(&store, "lost", lost.id).await.status, Status::Error);
    // The late lease holder is fenced off.
    let late = store.complete("jobs", NOW + LEASE + 1, vec![leased[0].held()], 0).await;
    assert!(matches!(late[0], Err(TransportError::StaleReceipt)));
    let again = store.lease("jobs", NOW + LEASE + 2, 10, LEASE, false).await.expect("lease");
    assert_eq!(payloads(&again), ["retried", "v2"]);
    assert_eq!((again[0].attempts, again[0].suspect, again[1].suspect), (1, Suspect::Once, Suspect::No));
    // Their leases run out again: given back; the first is a suspect now.
    let mut now = NOW + 2 * LEASE + 2;
    store.maintain("jobs", now, retry).await.expect("maintain");
    let r = row(&store, "jobs", again[1].id).await;
    assert_eq!((r.status, r.attempts, r.suspect), (Status::Pending, 0, Suspect::Once));
    let again = store.lease("jobs", now, 10, LEASE, false).await.expect("lease");
    assert_eq!((again[0].attempts, again[0].suspect, again[1].suspect), (1, Suspect::Yes, Suspect::Once));
    // Run alone, its lease runs out again: that attempt counts (the other,
    // not run alone, is given back, a suspect now too).
    store.isolate("jobs", again[0].id, again[0].token).await.expect("isolate");
    now += LEASE;
    store.maintain("jobs", now, retry).await.expect("maintain");
    let r = row(&store, "jobs", again[0].id).await;
    assert_eq!((r.status, r.attempts, r.suspect), (Status::Pending, 1, Suspect::Yes));
    assert!(r.history.last().is_some_and(|a| a.message.contains("ran alone")), "{:?}", r.history);
    let r = row(&store, "jobs", again[1].id).await;
    assert_eq!((r.status, r.attempts, r.suspect), (Status::Pending, 0, Suspect::Yes));
    close(store, db).await;
}

#[tokio::test]
async fn a_large_mixed_batch_keeps_input_order_and_identities() {
    let (store, db) = store().await;
    // More rows than one multi-row insert takes, every tenth with an
    // identity, and one identity twice (its second version replaces the
    // first, which is still pending).
    let mut items: Vec<Enqueue> = (0..1_200)
        .map(|i| if i % 10 == 0 { msg(Some(&format!("k{i}")), &format!("p{i}")) } else { msg(None, &format!("p{i}")) })
        .collect();
    items.push(msg(Some("k0"), "p0-v2"));
    let results = store.enqueue("jobs", NOW, items, false).await;
    let results: Vec<Enqueued> = results.into_iter().map(|r| r.expect("enqueued")).collect();
    assert_eq!(results.len(), 1_201);
    assert_eq!(results[1_200].message_id, "m-p0-v2");
    let first = match results[0].outcome {
        EnqueueOutcome::Inserted(id) => id,
        ref other => panic!("{other:?}"),
    };
    assert!(
        matches!(results[1_200].outcome, EnqueueOutcome::Updated(id) if id == first),
        "{:?}",
        results[1_200].outcome
    );
    let ids: HashSet<RowId> = results[..1_200]
        .iter()
        .enumerate()
        .filter_map(|(i, r)| match r.outcome {
            EnqueueOutcome::Inserted(id) if i % 10 == 0 => Some(id),
            EnqueueOutcome::Appended if i % 10 != 0 => None,
            ref other => panic!("{i}: {other:?}"),
        })
        .collect();
    assert_eq!(ids.len(), 120, "distinct rows of the identities");
    let rows: HashSet<RowId> = store.rows("jobs").await.expect("rows").iter().map(|r| r.id).collect();
    assert_eq!(rows.len(), 1_200, "a row each");
    // Input order; the new version of k0 took its place at the back.
    let leased = store.lease("jobs", NOW, 2_000, LEASE, false).await.expect("lease");
    let mut expected: Vec<String> = (1..1_200).map(|i| format!("p{i}")).collect();
    expected.push("p0-v2".into());
    assert_eq!(payloads(&leased), expected);
    let message_ids: Vec<&str> = leased.iter().map(|l| l.message_id.as_str()).collect();
    assert_eq!(message_ids[0], "m-p1");
    assert_eq!(message_ids[1_199], "m-p0-v2");
    close(store, db).await;
}

#[tokio::test]
async fn a_completion_batch_fences_each_receipt() {
    let (store, db) = store().await;
    for p in ["a", "b", "c"] {
        enqueue(&store, "jobs", NOW, msg(None, p)).await;
    }
    let first = store.lease("jobs", NOW, 10, LEASE, false).await.expect("lease");
    store.maintain("jobs", NOW + LEASE, QueueRules::default()).await.expect("maintain");
    let second = store.lease("jobs", NOW + LEASE + 1, 10, LEASE, false).await.expect("lease");
    assert_eq!(payloads(&second), ["a", "b", "c"]);
    // One batch: a stale receipt of "a", the current one of "a" twice,
    // the current one of "b"; "c" stays leased.
    let batch = vec![first[0].held(), second[0].held(), second[0].held(), second[1].held()];
    let done = store.complete("jobs", NOW + LEASE + 2, batch, 0).await;
    assert!(matches!(done[0], Err(TransportError::StaleReceipt)), "{:?}", done[0]);
    assert!(done[1].is_ok() && done[3].is_ok(), "{done:?}");
    assert!(matches!(done[2], Err(TransportError::StaleReceipt)), "the same receipt twice: {:?}", done[2]);
    assert_eq!(store.depth("jobs").await.expect("depth"), 1);
    assert_eq!(row(&store, "jobs", second[2].id).await.status, Status::Processing);
    close(store, db).await;
}

#[tokio::test]
async fn retention_keeps_processed_rows_then_purges_them() {
    let (store, db) = store().await;
    let rules = QueueRules { retention_ms: 1_000, ..QueueRules::default() };
    enqueue(&store, "jobs", NOW, msg(None, "x")).await;
    let l = store.lease("jobs", NOW, 1, LEASE, false).await.expect("lease").remove(0);
    store.complete("jobs", NOW + 10, vec![l.held()], rules.retention_ms).await.remove(0).expect("complete");
    let r = row(&store, "jobs", l.id).await;
    assert_eq!((r.status, r.processed_at, r.lease_token), (Status::Processed, Some(NOW + 10), None));
    assert_eq!(store.depth("jobs").await.expect("depth"), 0);
    store.maintain("jobs", NOW + 1_009, rules).await.expect("maintain");
    assert_eq!(store.rows("jobs").await.expect("rows").len(), 1);
    store.maintain("jobs", NOW + 1_010, rules).await.expect("maintain");
    assert!(store.rows("jobs").await.expect("rows").is_empty());
    close(store, db).await;
}

#[tokio::test]
async fn fifo_leases_group_heads_in_enqueue_order() {
    let (store, db) = store().await;
    store.declare("ordered", true, NOW).await.expect("declare");
    for e in [
        grouped(Some("g1"), "a1"),
        grouped(Some("g1"), "a2"),
        grouped(Some("g2"), "b1"),
        grouped(Some("g4"), "n1"),
        grouped(Some("g4"), "n2"),
        Enqueue { process_at: Some(NOW + 100), ..grouped(Some("g3"), "c1") },
        grouped(Some("g3"), "c2"),
    ] {
        enqueue(&store, "ordered", NOW, e).await;
    }
    // One per group; the sleeping head of g3 holds its group back.
    let first = store.lease("ordered", NOW, 10, LEASE, true).await.expect("lease");
    assert_eq!(payloads(&first), ["a1", "b1", "n1"]);
    // Pending rows, none of them a free head: nothing leased, nothing
    // written (the counter stays), and the next lease gets the next token.
    let counter = || sqlx::query_scalar::<_, i64>("SELECT value FROM messaging_counters").fetch_one(&store.pool);
    let before = counter().await.expect("counter");
    assert_eq!(first[0].token as i64, before, "the lease took the counter's next value");
    assert!(store.lease("ordered", NOW, 10, LEASE, true).await.expect("lease").is_empty());
    assert_eq!(counter().await.expect("counter"), before, "an empty lease spends no token");
    // Completing a1 unlocks g1; n limits the batch.
    store.complete("ordered", NOW + 1, vec![first[0].held()], 0).await.remove(0).expect("complete");
    store.complete("ordered", NOW + 1, vec![first[2].held()], 0).await.remove(0).expect("complete");
    let next = store.lease("ordered", NOW + 1, 1, LEASE, true).await.expect("lease");
    assert_eq!(payloads(&next), ["a2"]);
    assert_eq!(next[0].token as i64, before + 1);
    let next = store.lease("ordered", NOW + 1, 10, LEASE, true).await.expect("lease");
    assert_eq!(payloads(&next), ["n2"]);
    store.maintain("ordered", NOW + 100, QueueRules { fifo: true, ..QueueRules::default() }).await.expect("maintain");
    let next = store.lease("ordered", NOW + 100, 10, LEASE, true).await.expect("lease");
    assert_eq!(payloads(&next), ["c1"]);
    close(store, db).await;
}

#[tokio::test]
async fn dead_letters_are_listed_counted_and_redriven() {
    let (store, db) = store().await;
    for p in ["a", "b", "c"] {
        enqueue(&store, "jobs", NOW, msg(None, p)).await;
    }
    let leased = store.lease("jobs", NOW, 10, LEASE, false).await.expect("lease");
    for l in &leased[..2] {
        let op = RowOp::DeadLetter { failure: FailedAttempt::new(1, "Error", &format!("bad {}", l.id)) };
        store.apply("jobs", NOW + 1, l.id, l.token, op).await.expect("dead letter");
    }
    assert_eq!(store.error_depth("jobs").await.expect("error depth"), 2);
    assert_eq!(store.depth("jobs").await.expect("depth"), 1);
    let errors = store.dead_letters("jobs", 10).await.expect("errors");
    assert_eq!(errors.iter().map(|r| r.payload.clone()).collect::<Vec<_>>(), [b"a".to_vec(), b"b".to_vec()]);
    assert_eq!(errors[0].error, Some(format!("bad {} (after 1 attempt)", leased[0].id)));
    assert_eq!(store.dead_letters("jobs", 1).await.expect("errors").len(), 1);
    assert_eq!(store.dead_letters("other", usize::MAX).await.expect("errors").len(), 0);

    let moved = store.redrive("jobs", vec![leased[1].id, leased[2].id, 999_999]).await.expect("redrive");
    assert_eq!(moved, 1, "only Error rows move");
    assert_eq!(store.redrive("other", vec![leased[0].id]).await.expect("redrive"), 0);
    assert_eq!(store.error_depth("jobs").await.expect("error depth"), 1);
    let r = row(&store, "jobs", leased[1].id).await;
    let max_seq = store.rows("jobs").await.expect("rows").iter().map(|r| r.seq).max();
    assert_eq!((r.status, r.attempts, r.process_at, Some(r.seq)), (Status::Pending, 0, None, max_seq));
    let again = store.lease("jobs", NOW + 2, 10, LEASE, false).await.expect("lease");
    assert_eq!(payloads(&again), ["b"]);
    assert_eq!(again[0].attempts, 1);
    close(store, db).await;
}

#[tokio::test]
async fn a_redrive_looks_each_letter_up_by_key_in_the_order_given() {
    let (store, db) = store().await;
    let items: Vec<Enqueue> = (0..6).map(|i| msg(None, &format!("p{i}"))).collect();
    for r in store.enqueue("jobs", NOW, items, false).await {
        r.expect("enqueue");
    }
    enqueue(&store, "other", NOW, msg(None, "elsewhere")).await;
    for queue in ["jobs", "other"] {
        for l in store.lease(queue, NOW, 10, LEASE, false).await.expect("lease") {
            let op = RowOp::DeadLetter { failure: FailedAttempt::new(1, "Error", "bad") };
            store.apply(queue, NOW + 1, l.id, l.token, op).await.expect("dead letter");
        }
    }
    let letters = store.dead_letters("jobs", 10).await.expect("letters");
    let elsewhere = store.dead_letters("other", 10).await.expect("letters")[0].id;
    // Out of id order, one twice, one of another queue, one that does not exist.
    let given = vec![letters[4].id, letters[1].id, letters[5].id, letters[1].id, elsewhere, 999_999, letters[0].id];
    assert_eq!(store.redrive("jobs", given).await.expect("redrive"), 4);
    let order: Vec<String> = store
        .lease("jobs", NOW + 2, 10, LEASE, false)
        .await
        .expect("lease")
        .iter()
        .map(|l| String::from_utf8_lossy(&l.payload).into_owned())
        .collect();
    assert_eq!(order, ["p4", "p1", "p5", "p0"], "back in the order given");
    assert_eq!(store.error_depth("jobs").await.expect("error depth"), 2);
    assert_eq!(store.error_depth("other").await.expect("error depth"), 1, "another queue's letter stays");
    let plan: Vec<(i64, i64, i64, String)> = sqlx::query_as(&format!("EXPLAIN QUERY PLAN {}", super::REDRIVE))
        .bind(0_i64)
        .bind("jobs")
        .bind("[1, 2, 3]")
        .fetch_all(&store.pool)
        .await
        .expect("the plan");
    let plan: Vec<String> = plan.into_iter().map(|(_, _, _, detail)| detail).collect();
    assert!(plan.iter().any(|d| d.contains("USING INTEGER PRIMARY KEY")), "each letter by key: {plan:?}");
    assert!(!plan.iter().any(|d| d.contains("messaging_messages_error")), "not the queue's letters: {plan:?}");
    close(store, db).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_leases_never_share_a_row() {
    let (store, db) = store().await;
    let items: Vec<Enqueue> = (0..200).map(|i| msg(None, &format!("p{i}"))).collect();
    for chunk in items.chunks(50) {
        for r in store.enqueue("jobs", NOW, chunk.to_vec(), false).await {
            r.expect("enqueued");
        }
    }
    let mut tasks = Vec::new();
    for _ in 0..4 {
        let store = store.clone();
        tasks.push(tokio::spawn(async move {
            let mut got = Vec::new();
            loop {
                let leased = store.lease("jobs", NOW, 10, 60_000, false).await.expect("lease");
                if leased.is_empty() {
                    return got;
                }
                got.extend(leased.into_iter().map(|l| (l.id, l.token)));
                tokio::task::yield_now().await;
            }
        }));
    }
    let mut all = Vec::new();
    for task in tasks {
        all.extend(task.await.expect("task"));
    }
    let ids: HashSet<RowId> = all.iter().map(|(id, _)| *id).collect();
    let tokens: HashSet<u64> = all.iter().map(|(_, t)| *t).collect();
    assert_eq!(all.len(), 200, "every row leased exactly once");
    // One token per lease of up to 10 rows.
    assert_eq!(ids.len(), 200);
    assert!((20..=200).contains(&tokens.len()), "{} leases", tokens.len());
    assert!(store.rows("jobs").await.expect("rows").iter().all(|r| r.status == Status::Processing && r.attempts == 1));
    close(store, db).await;
}

#[tokio::test]
async fn an_in_memory_database_keeps_its_data() {
    let store = SqliteStore::connect("sqlite::memory:").await.expect("connect");
    store.migrate().await.expect("migrate");
    enqueue(&store, "jobs", NOW, msg(None, "x")).await;
    assert_eq!(store.lease("jobs", NOW, 1, LEASE, false).await.expect("lease").len(), 1);
}

#[tokio::test]
async fn the_wal_is_checkpointed_in_the_background() {
    let (store, db) = store().await;
    let size = || std::fs::metadata(&db.path).map_or(0, |m| m.len());
    let wal = || std::fs::metadata(format!("{}-wal", db.path.display())).map_or(0, |m| m.len());
    // ~4 MB of rows: about 1,000 pages, far below the commits' own
    // checkpoint threshold, so only the background task moves them.
    let before = size();
    let payload = "p".repeat(2_000);
    let items: Vec<Enqueue> = (0..2_000).map(|i| msg(None, &format!("{i}{payload}"))).collect();
    for r in store.enqueue("jobs", NOW, items, false).await {
        r.expect("enqueued");
    }
    assert!(wal() > 2_000_000, "the rows are in the WAL first ({} bytes)", wal());
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while size() < before + 2_000_000 {
        assert!(std::time::Instant::now() < deadline, "not checkpointed: {} bytes, WAL {} bytes", size(), wal());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    close(store, db).await;
}

/// An application sharing the file holds a read transaction: nothing can be
/// checkpointed meanwhile and the WAL grows past 64 MiB. Once the reader is
/// done and the WAL checkpointed, the next write starts the WAL over and
/// the file is cut back (it stayed at its largest for as long as the
/// database was open).
#[tokio::test]
async fn a_wal_grown_behind_a_long_reader_is_cut_back_once_it_is_checkpointed() {
    let (store, db) = store().await;
    let wal = || std::fs::metadata(format!("{}-wal", db.path.display())).map_or(0, |m| m.len());
    let mut reader = <sqlx::SqliteConnection as sqlx::Connection>::connect(&db.url()).await.expect("connect");
    sqlx::query("BEGIN").execute(&mut reader).await.expect("begin");
    sqlx::query("SELECT count(*) FROM messaging_messages").execute(&mut reader).await.expect("a snapshot");
    let payload = "p".repeat(100_000);
    for chunk in 0..8 {
        let items: Vec<Enqueue> = (0..100).map(|i| msg(None, &format!("{chunk}-{i}-{payload}"))).collect();
        for r in store.enqueue("jobs", NOW, items, false).await {
            r.expect("enqueued");
        }
    }
    let grown = wal();
    assert!(grown > 70_000_000, "the reader kept the WAL from being checkpointed ({grown} bytes)");
    sqlx::query("COMMIT").execute(&mut reader).await.expect("the reader is done");
    drop(reader);
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        // A write after a complete checkpoint starts the WAL over.
        enqueue(&store, "jobs", NOW, msg(None, "small")).await;
        if wal() <= 67_108_864 {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "the WAL stayed at {} bytes (was {grown})", wal());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    close(store, db).await;
}

/// Another connection to `db` in a write transaction, as an application
/// sharing the file would hold one (`ROLLBACK` on it ends it).
async fn holding_the_write_lock(db: &TempDb) -> sqlx::SqliteConnection {
    let mut app = <sqlx::SqliteConnection as sqlx::Connection>::connect(&db.url()).await.expect("connect");
    sqlx::query("BEGIN IMMEDIATE").execute(&mut app).await.expect("the application's write transaction");
    app
}

#[tokio::test]
async fn a_declared_queue_is_declared_again_while_another_connection_holds_the_write_lock() {
    // An application sharing the file holds a write transaction: a process
    // starting meanwhile finds its queues there without waiting for the lock.
    let (store, db) = store().await;
    store.declare("shared", false, NOW).await.expect("declare");
    let mut app = holding_the_write_lock(&db).await;
    let again = tokio::time::timeout(Duration::from_secs(2), store.declare("shared", false, NOW)).await;
    assert!(matches!(again, Ok(Ok(()))), "declared at once: {again:?}");
    let conflict = tokio::time::timeout(Duration::from_secs(2), store.declare("shared", true, NOW)).await;
    assert!(matches!(conflict, Ok(Err(_))), "the kind is still checked: {conflict:?}");
    // An idle poll looks first and finds nothing, without the lock.
    let idle = tokio::time::timeout(Duration::from_secs(2), store.lease("shared", NOW, 10, LEASE, false)).await;
    assert!(matches!(&idle, Ok(Ok(rows)) if rows.is_empty()), "an idle lease returns at once: {idle:?}");
    // A write waits the busy timeout, then says what held it up.
    let write = tokio::time::timeout(BUSY_TIMEOUT * 2, store.enqueue("shared", NOW, vec![msg(None, "x")], false));
    let error = write.await.expect("no hang").remove(0).expect_err("locked out").to_string();
    assert!(error.contains("(code 5)"), "{error}");
    let timeout = format!("longer than the busy timeout ({} s)", BUSY_TIMEOUT.as_secs());
    assert!(error.contains(&timeout) && error.contains("a long write transaction on this file"), "{error}");
    sqlx::query("ROLLBACK").execute(&mut app).await.expect("rollback");
    drop(app);
    close(store, db).await;
}

#[tokio::test]
async fn an_up_to_date_database_migrates_while_another_connection_holds_the_write_lock() {
    // Every process starts with `migrate=true`: when nothing is left to
    // apply, it must not wait for the application's write transaction.
    let (store, db) = store().await;
    let mut app = holding_the_write_lock(&db).await;
    let again = tokio::time::timeout(Duration::from_secs(2), store.migrate()).await;
    assert!(matches!(again, Ok(Ok(()))), "nothing to apply, no lock: {again:?}");
    // With a migration missing, it waits for the lock as before.
    sqlx::query("ROLLBACK").execute(&mut app).await.expect("rollback");
    sqlx::query("DELETE FROM messaging_migrations WHERE version = (SELECT max(version) FROM messaging_migrations)")
        .execute(&mut app)
        .await
        .expect("forget the last migration");
    sqlx::query("BEGIN IMMEDIATE").execute(&mut app).await.expect("the application's write transaction");
    let blocked = tokio::time::timeout(Duration::from_secs(1), store.migrate()).await;
    assert!(blocked.is_err(), "a migration to apply waits for the write lock: {blocked:?}");
    sqlx::query("ROLLBACK").execute(&mut app).await.expect("rollback");
    drop(app);
    close(store, db).await;
}

/// Whether another connection can take the write lock now.
async fn write_lock_is_free(db: &TempDb) -> bool {
    let mut other = <sqlx::SqliteConnection as sqlx::Connection>::connect(&db.url()).await.expect("connect");
    sqlx::query("PRAGMA busy_timeout = 0").execute(&mut other).await.expect("no waiting");
    let free = sqlx::query("BEGIN IMMEDIATE").execute(&mut other).await.is_ok();
    if free {
        sqlx::query("ROLLBACK").execute(&mut other).await.expect("rollback");
    }
    free
}

#[tokio::test]
async fn a_lease_cut_short_leaves_no_transaction_behind() {
    // A receive ended at shutdown drops its lease mid-call. Here the call
    // waits for the write lock another connection holds, is dropped, and its
    // BEGIN succeeds after all once the lock is released: the connection it
    // ran on must not keep that transaction (and the lock).
    let (store, db) = store().await;
    enqueue(&store, "jobs", NOW, msg(None, "a")).await;
    let mut app = holding_the_write_lock(&db).await;
    let cut = tokio::time::timeout(Duration::from_millis(300), store.lease("jobs", NOW, 10, LEASE, false)).await;
    assert!(cut.is_err(), "the lease waited for the lock: {cut:?}");
    sqlx::query("ROLLBACK").execute(&mut app).await.expect("rollback");
    drop(app);
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while !write_lock_is_free(&db).await {
        assert!(std::time::Instant::now() < deadline, "the cut lease still holds the write lock");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let leased = store.lease("jobs", NOW, 10, LEASE, false).await.expect("lease");
    assert_eq!(payloads(&leased), ["a"], "the cut lease leased nothing");
    store.complete("jobs", NOW, vec![leased[0].held()], 0).await.remove(0).expect("complete");
    assert!(write_lock_is_free(&db).await);
    close(store, db).await;
}

#[tokio::test]
async fn a_failed_statement_in_a_one_call_write_rolls_its_transaction_back() {
    // The enqueue's call begins, then fails on a missing table: nothing it
    // did stays, and the write lock is free at once.
    let (store, db) = store().await;
    enqueue(&store, "jobs", NOW, msg(None, "a")).await;
    sqlx::query("ALTER TABLE messaging_counters RENAME TO counters_away").execute(&store.pool).await.expect("rename");
    let error = store.enqueue("jobs", NOW, vec![msg(None, "b")], false).await.remove(0).expect_err("no counters");
    assert!(error.to_string().contains("messaging_counters"), "{error}");
    assert!(write_lock_is_free(&db).await, "rolled back");
    sqlx::query("ALTER TABLE counters_away RENAME TO messaging_counters").execute(&store.pool).await.expect("back");
    enqueue(&store, "jobs", NOW, msg(None, "c")).await;
    let leased = store.lease("jobs", NOW, 10, LEASE, false).await.expect("lease");
    assert_eq!(payloads(&leased), ["a", "c"]);
    close(store, db).await;
}

#[tokio::test]
async fn claims_are_purged_when_due_and_looked_at_without_the_write_lock() {
    let (store, db) = store().await;
    let claim =
        "INSERT INTO messaging_idempotency (message_id, scope, completed, completed_at) VALUES ($1, 's', TRUE, $2)";
    for (id, at) in [("old", NOW - 10_000), ("new", NOW)] {
        sqlx::query(claim).bind(id).bind(at).execute(&store.pool).await.expect("a completed claim");
    }
    let mut app = holding_the_write_lock(&db).await;
    let nothing = tokio::time::timeout(Duration::from_secs(2), store.purge_claims(NOW - 20_000)).await;
    assert!(matches!(nothing, Ok(Ok(0))), "nothing due: no lock taken: {nothing:?}");
    sqlx::query("ROLLBACK").execute(&mut app).await.expect("rollback");
    assert_eq!(store.purge_claims(NOW - 5_000).await.expect("purge"), 1, "the old claim");
    let left: Vec<String> = sqlx::query_scalar("SELECT message_id FROM messaging_idempotency")
        .fetch_all(&store.pool)
        .await
        .expect("claims");
    assert_eq!(left, ["new"]);
    drop(app);
    close(store, db).await;
}

/// A full disk (here the file's page limit, which SQLite reports alike) is
/// named as such with what it means for the messages, as a lock waited for
/// in vain is.
#[tokio::test]
async fn a_full_database_says_so_and_what_it_means() {
    use sqlx::Connection as _;
    let db = TempDb::new();
    let mut conn = sqlx::SqliteConnection::connect(&format!("{}?mode=rwc", db.url())).await.expect("connect");
    sqlx::query("CREATE TABLE t (x BLOB)").execute(&mut conn).await.expect("create");
    sqlx::query("PRAGMA max_page_count = 3").execute(&mut conn).await.expect("limit");
    let full = sqlx::query("INSERT INTO t VALUES (zeroblob(100000))").execute(&mut conn).await.expect_err("full");
    let text = crate::transport::sql::dialect::backend::<Sqlite>("enqueue", full).to_string();
    assert!(text.contains("sqlite: enqueue failed: ") && text.contains("(code 13)"), "{text}");
    assert!(text.contains(": the disk holding the database file is full"), "{text}");
    assert!(text.contains("not even an acknowledgement; what is stored is kept"), "{text}");
}

/// SQLite rolls a transaction back by itself when its COMMIT fails for a
/// full disk or an I/O error (here the rollback is a statement of the
/// transaction's, which ends it the same way before its COMMIT). The commit
/// fails, and every write after it must still begin: sqlx counted that
/// transaction as open for as long as its connection lived, and each later
/// BEGIN on the connection failed ("attempted to call begin_with at
/// non-zero transaction depth"), so a consumer that had met a full disk
/// once never wrote again (tried from outside on a 3 MB tmpfs).
#[tokio::test]
async fn a_transaction_that_ended_itself_before_its_commit_leaves_every_later_write_working() {
    use crate::transport::sql::dialect::Write;
    let (store, db) = store().await;
    let mut w = Write::begin(&store).await.expect("begin");
    sqlx::query("ROLLBACK").execute(w.conn()).await.expect("ended before the commit");
    let failed = w.finish(Ok(())).await.expect_err("no transaction to commit");
    assert!(failed.to_string().contains("commit failed"), "{failed}");
    // More writes than the pool has connections, one after another: each
    // takes an idle connection, the one the failed commit was on among them.
    for n in 0..12 {
        enqueue(&store, "jobs", NOW, msg(None, &format!("p{n}"))).await;
        let mut w = Write::begin(&store).await.unwrap_or_else(|e| panic!("write {n} begins: {e}"));
        sqlx::query("SELECT 1").execute(w.conn()).await.expect("a statement");
        w.finish(Ok(())).await.unwrap_or_else(|e| panic!("write {n} commits: {e}"));
    }
    let leased = store.lease("jobs", NOW, 20, LEASE, false).await.expect("lease");
    assert_eq!(leased.len(), 12);
    assert!(write_lock_is_free(&db).await);
    close(store, db).await;
}
