//! The SQL idempotency stores (PostgreSQL and SQLite) against the semantics of
//! the memory store: claim → Claimed | InProgress | Completed, lease expiry and
//! takeover, fencing of stale holders, atomic claims under concurrency,
//! retention (purge) and a clear error when the table is missing.
//!
//! PostgreSQL: `TEST_POSTGRES_URL` (default
//! `postgres://postgres@127.0.0.1:5432/test`); every test works in its own
//! schema, dropped afterwards. SQLite: a temporary file per test.

use std::future::Future;
use std::hash::{BuildHasher, Hasher};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use crate::claims::{Claim, IdempotencyStore};
use crate::error::TransportError;
use crate::transport::sql::{PostgresIdempotencyStore, SqliteIdempotencyStore};

/// The explicit-time operations both SQL stores offer.
trait SqlStore: IdempotencyStore + Clone {
    fn claim_at(
        &self,
        message_id: &str,
        scope: &str,
        processor: &str,
        lease: Duration,
        now: SystemTime,
    ) -> impl Future<Output = Result<Claim, TransportError>> + Send;

    fn complete_at(
        &self,
        message_id: &str,
        scope: &str,
        processor: &str,
        now: SystemTime,
    ) -> impl Future<Output = Result<(), TransportError>> + Send;

    fn purge_at(
        &self,
        older_than: Duration,
        now: SystemTime,
    ) -> impl Future<Output = Result<u64, TransportError>> + Send;

    fn purge(&self, older_than: Duration) -> impl Future<Output = Result<u64, TransportError>> + Send;

    fn extend_at(
        &self,
        message_id: &str,
        scope: &str,
        processor: &str,
        lease: Duration,
        now: SystemTime,
    ) -> impl Future<Output = Result<(), TransportError>> + Send;
}

macro_rules! sql_store {
    ($store:ty) => {
        impl SqlStore for $store {
            async fn claim_at(
                &self,
                message_id: &str,
                scope: &str,
                processor: &str,
                lease: Duration,
                now: SystemTime,
            ) -> Result<Claim, TransportError> {
                <$store>::claim_at(self, message_id, scope, processor, lease, now).await
            }

            async fn complete_at(
                &self,
                message_id: &str,
                scope: &str,
                processor: &str,
                now: SystemTime,
            ) -> Result<(), TransportError> {
                <$store>::complete_at(self, message_id, scope, processor, now).await
            }

            async fn purge_at(&self, older_than: Duration, now: SystemTime) -> Result<u64, TransportError> {
                <$store>::purge_at(self, older_than, now).await
            }

            async fn purge(&self, older_than: Duration) -> Result<u64, TransportError> {
                <$store>::purge(self, older_than).await
            }

            async fn extend_at(
                &self,
                message_id: &str,
                scope: &str,
                processor: &str,
                lease: Duration,
                now: SystemTime,
            ) -> Result<(), TransportError> {
                <$store>::extend_at(self, message_id, scope, processor, lease, now).await
            }
        }
    };
}

sql_store!(PostgresIdempotencyStore);
sql_store!(SqliteIdempotencyStore);

// ---------------------------------------------------------------------------
// Fixtures
// ---------------------------------------------------------------------------

fn unique_name(prefix: &str) -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let mut hasher = std::hash::RandomState::new().build_hasher();
    hasher.write_u64(COUNTER.fetch_add(1, Ordering::Relaxed));
    hasher.write_u32(std::process::id());
    format!("{prefix}_{:016x}", hasher.finish())
}

fn postgres_url() -> String {
    std::env::var("TEST_POSTGRES_URL").unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into())
}

/// Runs `body` against a PostgreSQL store in a fresh schema (migrated when
/// `migrate`), then drops the schema, whether `body` passed or panicked.
async fn with_postgres<F, Fut>(migrate: bool, body: F)
where
    F: FnOnce(PostgresIdempotencyStore) -> Fut,
    Fut: Future<Output = ()> + Send + 'static,
{
    let url = postgres_url();
    let admin = PostgresIdempotencyStore::connect(&url).await.unwrap();
    let schema = unique_name("idem");
    sqlx::raw_sql(&format!("CREATE SCHEMA {schema}")).execute(&admin.store.pool).await.unwrap();
    let separator = if url.contains('?') { '&' } else { '?' };
    let store = PostgresIdempotencyStore::connect(&format!("{url}{separator}options=-c%20search_path%3D{schema}"))
        .await
        .unwrap();
    if migrate {
        store.store.migrate().await.unwrap();
    }
    let outcome = tokio::spawn(body(store.clone())).await;
    store.store.close().await;
    sqlx::raw_sql(&format!("DROP SCHEMA {schema} CASCADE")).execute(&admin.store.pool).await.unwrap();
    admin.store.close().await;
    if let Err(e) = outcome {
        std::panic::resume_unwind(e.into_panic());
    }
}

/// Runs `body` against a SQLite store in a fresh temporary file (migrated
/// when `migrate`), then removes the file, whether `body` passed or panicked.
async fn with_sqlite<F, Fut>(migrate: bool, body: F)
where
    F: FnOnce(SqliteIdempotencyStore) -> Fut,
    Fut: Future<Output = ()> + Send + 'static,
{
    let path: PathBuf = std::env::temp_dir().join(format!("{}.sqlite3", unique_name("messaging_idem")));
    let store = SqliteIdempotencyStore::connect(&format!("sqlite://{}?mode=rwc", path.display())).await.unwrap();
    if migrate {
        store.store.migrate().await.unwrap();
    }
    let outcome = tokio::spawn(body(store.clone())).await;
    store.store.close().await;
    for suffix in ["", "-journal", "-wal", "-shm"] {
        let mut file = path.clone().into_os_string();
        file.push(suffix);
        let _ = std::fs::remove_file(file);
    }
    if let Err(e) = outcome {
        std::panic::resume_unwind(e.into_panic());
    }
}

/// A fixed point in time, so that tests pass time explicitly instead of sleeping.
fn t0() -> SystemTime {
    SystemTime::UNIX_EPOCH + Duration::from_secs(1_900_000_000)
}

fn secs(s: u64) -> Duration {
    Duration::from_secs(s)
}

// ---------------------------------------------------------------------------
// Scenarios, run on both databases
// ---------------------------------------------------------------------------

/// The memory store's unit test, plus re-claims, non-holder release and
/// settling after completion.
async fn claim_lease_complete_release(store: impl SqlStore) {
    let lease = secs(10);
    let t0 = t0();
    assert_eq!(store.claim_at("m", "s", "p1", lease, t0).await.unwrap(), Claim::Claimed);
    assert_eq!(store.claim_at("m", "s", "p2", lease, t0).await.unwrap(), Claim::InProgress { remaining: lease });
    assert_eq!(store.claim_at("m", "other", "p2", lease, t0).await.unwrap(), Claim::Claimed, "scopes are independent");
    assert_eq!(store.claim_at("m2", "s", "p2", lease, t0).await.unwrap(), Claim::Claimed, "messages are independent");
    // The holder re-claiming extends its lease to t0 + 11 s.
    assert_eq!(store.claim_at("m", "s", "p1", lease, t0 + secs(1)).await.unwrap(), Claim::Claimed);
    assert_eq!(
        store.claim_at("m", "s", "p2", lease, t0 + secs(10)).await.unwrap(),
        Claim::InProgress { remaining: secs(1) },
        "the refusal says when the holder's lease ends"
    );
    assert_eq!(
        store.claim_at("m", "s", "p2", lease, t0 + secs(11)).await.unwrap(),
        Claim::Claimed,
        "an expired lease is taken over"
    );
    assert!(
        matches!(store.complete_at("m", "s", "p1", t0 + secs(12)).await, Err(TransportError::StaleReceipt)),
        "a fenced-out holder cannot complete"
    );
    store.release("m", "s", "p1").await.unwrap();
    assert_eq!(
        store.claim_at("m", "s", "p3", lease, t0 + secs(12)).await.unwrap(),
        Claim::InProgress { remaining: secs(9) },
        "a fenced-out holder cannot release"
    );
    // The heartbeat: only the holder extends, and only an open claim.
    store.extend_at("m", "s", "p2", secs(30), t0 + secs(12)).await.unwrap();
    assert_eq!(
        store.claim_at("m", "s", "p3", lease, t0 + secs(40)).await.unwrap(),
        Claim::InProgress { remaining: secs(2) }
    );
    assert!(
        matches!(store.extend_at("m", "s", "p1", lease, t0 + secs(12)).await, Err(TransportError::StaleReceipt)),
        "a fenced-out holder cannot extend"
    );
    store.release("m", "s", "p2").await.unwrap();
    assert_eq!(store.claim_at("m", "s", "p3", lease, t0 + secs(12)).await.unwrap(), Claim::Claimed, "released");
    store.complete_at("m", "s", "p3", t0 + secs(13)).await.unwrap();
    assert!(
        matches!(store.extend_at("m", "s", "p3", lease, t0 + secs(13)).await, Err(TransportError::StaleReceipt)),
        "a completed claim is not extended"
    );
    assert_eq!(store.claim_at("m", "s", "p4", lease, t0 + secs(13)).await.unwrap(), Claim::Completed);
    assert_eq!(store.claim_at("m", "s", "p3", lease, t0 + secs(13)).await.unwrap(), Claim::Completed);
    assert_eq!(store.claim_at("m", "s", "p4", lease, t0 + secs(3600)).await.unwrap(), Claim::Completed);
    assert!(matches!(store.complete_at("m", "s", "p3", t0 + secs(14)).await, Err(TransportError::StaleReceipt)));
    store.release("m", "s", "p3").await.unwrap();
    assert_eq!(
        store.claim_at("m", "s", "p4", lease, t0 + secs(14)).await.unwrap(),
        Claim::Completed,
        "a completed claim cannot be released"
    );
    assert!(
        matches!(store.complete_at("never", "s", "p1", t0).await, Err(TransportError::StaleReceipt)),
        "completing an unknown claim fails"
    );
    store.release("never", "s", "p1").await.unwrap();
}

/// The same sequence through the trait (application clock, real sleeps).
async fn trait_methods_use_the_clock(store: impl SqlStore) {
    let store: &dyn IdempotencyStore = &store;
    let lease = Duration::from_millis(300);
    assert_eq!(store.claim("m", "s", "p1", lease).await.unwrap(), Claim::Claimed);
    assert!(
        matches!(store.claim("m", "s", "p2", lease).await.unwrap(), Claim::InProgress { remaining } if remaining <= lease)
    );
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert_eq!(store.claim("m", "s", "p2", lease).await.unwrap(), Claim::Claimed, "expired lease is taken over");
    assert!(matches!(store.complete("m", "s", "p1").await, Err(TransportError::StaleReceipt)));
    store.release("m", "s", "p2").await.unwrap();
    assert_eq!(store.claim("m", "s", "p3", lease).await.unwrap(), Claim::Claimed);
    store.complete("m", "s", "p3").await.unwrap();
    assert_eq!(store.claim("m", "s", "p4", lease).await.unwrap(), Claim::Completed);
}

/// 16 tasks claim the same (message, scope) at once: exactly one wins, both
/// for a new row (insert race) and for an expired one (takeover race).
async fn concurrent_claims_have_one_winner(store: impl SqlStore + 'static) {
    const TASKS: usize = 16;
    let store = Arc::new(store);
    for round in 0..5 {
        let message = format!("m{round}");
        // A fresh row: everybody inserts at once.
        let outcomes = race(&store, &message, TASKS, t0()).await;
        assert_eq!(count(&outcomes, Claim::Claimed), 1, "round {round}, insert race: {outcomes:?}");
        assert_eq!(in_progress(&outcomes), TASKS - 1, "round {round}: {outcomes:?}");
        // The lease (60 s) has expired: everybody takes over at once.
        let outcomes = race(&store, &message, TASKS, t0() + secs(61)).await;
        assert_eq!(count(&outcomes, Claim::Claimed), 1, "round {round}, takeover race: {outcomes:?}");
        assert_eq!(in_progress(&outcomes), TASKS - 1, "round {round}: {outcomes:?}");
    }
    // Through the trait, with the application clock.
    let barrier = Arc::new(tokio::sync::Barrier::new(TASKS));
    let tasks: Vec<_> = (0..TASKS)
        .map(|i| {
            let (store, barrier) = (Arc::clone(&store), Arc::clone(&barrier));
            tokio::spawn(async move {
                barrier.wait().await;
                IdempotencyStore::claim(&store, "clock", "s", &format!("q{i}"), secs(60)).await.unwrap()
            })
        })
        .collect();
    let mut outcomes = Vec::new();
    for task in tasks {
        outcomes.push(task.await.unwrap());
    }
    assert_eq!(count(&outcomes, Claim::Claimed), 1, "{outcomes:?}");
}

async fn race<S: SqlStore + 'static>(store: &Arc<S>, message: &str, tasks: usize, now: SystemTime) -> Vec<Claim> {
    let barrier = Arc::new(tokio::sync::Barrier::new(tasks));
    let handles: Vec<_> = (0..tasks)
        .map(|i| {
            let (store, barrier, message) = (Arc::clone(store), Arc::clone(&barrier), message.to_owned());
            let processor = format!("{message}-{now:?}-p{i}");
            tokio::spawn(async move {
                barrier.wait().await;
                store.claim_at(&message, "s", &processor, secs(60), now).await.unwrap()
            })
        })
        .collect();
    let mut outcomes = Vec::new();
    for handle in handles {
        outcomes.push(handle.await.unwrap());
    }
    outcomes
}

fn count(outcomes: &[Claim], which: Claim) -> usize {
    outcomes.iter().filter(|c| **c == which).count()
}

fn in_progress(outcomes: &[Claim]) -> usize {
    outcomes.iter().filter(|c| matches!(c, Claim::InProgress { .. })).count()
}

/// Purge deletes completed claims older than the retention, nothing else.
async fn purge_removes_old_completed_claims(store: impl SqlStore) {
    let now = t0();
    let hour = secs(3600);
    let lease = secs(60);
    let old = now - 2 * hour;
    let recent = now - secs(600);
    for (message, at) in [("old", old), ("old2", old), ("recent", recent)] {
        assert_eq!(store.claim_at(message, "s", "p", lease, at).await.unwrap(), Claim::Claimed);
        store.complete_at(message, "s", "p", at).await.unwrap();
    }
    // Old but never completed: an abandoned claim, not purged.
    assert_eq!(store.claim_at("held", "s", "p", lease, old).await.unwrap(), Claim::Claimed);
    // Completed exactly at the cutoff: kept (strictly older only).
    assert_eq!(store.claim_at("edge", "s", "p", lease, now - hour).await.unwrap(), Claim::Claimed);
    store.complete_at("edge", "s", "p", now - hour).await.unwrap();

    assert_eq!(store.purge_at(hour, now).await.unwrap(), 2);
    assert_eq!(store.purge_at(hour, now).await.unwrap(), 0, "purge is idempotent");

    // A purged message is claimable again; the others are as they were.
    assert_eq!(store.claim_at("old", "s", "q", lease, now).await.unwrap(), Claim::Claimed);
    assert_eq!(store.claim_at("recent", "s", "q", lease, now).await.unwrap(), Claim::Completed);
    assert_eq!(store.claim_at("edge", "s", "q", lease, now).await.unwrap(), Claim::Completed);
    assert!(
        matches!(store.claim_at("held", "s", "q", lease, old + secs(1)).await.unwrap(), Claim::InProgress { .. }),
        "the uncompleted claim is still there"
    );

    // The public purge uses the application clock: the claims completed at
    // t0 (far in the future) are not older than an hour.
    assert_eq!(store.purge(hour).await.unwrap(), 0);
    assert_eq!(store.purge(Duration::ZERO).await.unwrap(), 0);
}

/// Without the migrations every operation says the table is missing and how
/// to create it.
async fn missing_table_is_reported(store: impl SqlStore, database: &str) {
    let check = |what: &str, err: TransportError| {
        let TransportError::Backend(message) = &err else { panic!("{what}: expected a backend error, got {err:?}") };
        assert!(message.contains("messaging_idempotency"), "{what}: {message}");
        assert!(message.contains("missing"), "{what}: {message}");
        assert!(message.contains("`migrate` command"), "{what}: {message}");
        assert!(message.contains(database), "{what}: {message}");
        assert!(message.contains(what), "{what}: {message}");
    };
    check("claim", store.claim("m", "s", "p", secs(10)).await.unwrap_err());
    check("complete", store.complete("m", "s", "p").await.unwrap_err());
    check("release", store.release("m", "s", "p").await.unwrap_err());
    check("purge", store.purge(secs(10)).await.unwrap_err());
}

// ---------------------------------------------------------------------------
// PostgreSQL
// ---------------------------------------------------------------------------

#[tokio::test]
async fn postgres_claim_lease_complete_release() {
    with_postgres(true, claim_lease_complete_release).await;
}

#[tokio::test]
async fn postgres_trait_methods_use_the_clock() {
    with_postgres(true, trait_methods_use_the_clock).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn postgres_concurrent_claims_have_one_winner() {
    with_postgres(true, concurrent_claims_have_one_winner).await;
}

#[tokio::test]
async fn postgres_purge_removes_old_completed_claims() {
    with_postgres(true, purge_removes_old_completed_claims).await;
}

#[tokio::test]
async fn postgres_missing_table_is_reported() {
    with_postgres(false, |store| missing_table_is_reported(store, "postgres")).await;
}

// ---------------------------------------------------------------------------
// SQLite
// ---------------------------------------------------------------------------

#[tokio::test]
async fn sqlite_claim_lease_complete_release() {
    with_sqlite(true, claim_lease_complete_release).await;
}

#[tokio::test]
async fn sqlite_trait_methods_use_the_clock() {
    with_sqlite(true, trait_methods_use_the_clock).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sqlite_concurrent_claims_have_one_winner() {
    with_sqlite(true, concurrent_claims_have_one_winner).await;
}

#[tokio::test]
async fn sqlite_purge_removes_old_completed_claims() {
    with_sqlite(true, purge_removes_old_completed_claims).await;
}

#[tokio::test]
async fn sqlite_missing_table_is_reported() {
    with_sqlite(false, |store| missing_table_is_reported(store, "sqlite")).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_in_memory_database_is_one_connection() {
    let store = SqliteIdempotencyStore::connect("sqlite::memory:").await.unwrap();
    store.store.migrate().await.unwrap();
    // Smoke test: concurrent operations all see the one migrated database.
    let tasks: Vec<_> = (0..8)
        .map(|i| {
            let store = store.clone();
            tokio::spawn(async move { store.claim("m", "s", &format!("p{i}"), secs(60)).await.unwrap() })
        })
        .collect();
    let mut outcomes = Vec::new();
    for task in tasks {
        outcomes.push(task.await.unwrap());
    }
    assert_eq!(count(&outcomes, Claim::Claimed), 1, "{outcomes:?}");
    store.store.close().await;
}
