//! `schema=NAME` on PostgreSQL: every table of ours in that schema, none in
//! the connection's own; two schemas of one database are two independent
//! sets of queues; the idempotency claims follow, inside a caller's own
//! transaction too (where `search_path` cannot be relied on). SQLite refuses
//! the option.
#![cfg(feature = "postgres")]

use std::time::Duration;

use messaging::idempotency::PostgresIdempotencyStore;
use messaging::prelude::*;

use crate::fixtures;

/// A queue declared in both schemas.
#[messaging::queue("schema-jobs")]
struct SchemaJobs;

/// What it carries.
#[messaging::message(name = "schema.job", v = 1)]
#[derive(Debug, Clone, Serialize, Deserialize)]
struct SchemaJob {
    /// Its number.
    n: u32,
}

/// A schema of its own, dropped at the end (also when the test fails).
struct Named(String);

impl Drop for Named {
    fn drop(&mut self) {
        fixtures::psql(&format!("DROP SCHEMA IF EXISTS {} CASCADE", self.0));
    }
}

/// The framework's tables in `schema`.
fn tables_in(schema: &str) -> Vec<String> {
    let out = std::process::Command::new("psql")
        .args([
            &fixtures::postgres_base(),
            "-qAtc",
            &format!(
                "SELECT table_name FROM information_schema.tables WHERE table_schema = '{schema}' \
                 AND table_name LIKE 'messaging%' ORDER BY 1"
            ),
        ])
        .output()
        .expect("psql");
    String::from_utf8_lossy(&out.stdout).lines().map(str::to_owned).collect()
}

async fn app_on(url: &str) -> (messaging::App, std::sync::Arc<dyn messaging::transport::Transport>) {
    let transport = messaging::transport::connect(url).await.unwrap_or_else(|e| panic!("connect {url}: {e}"));
    let mut app = messaging::App::new(transport.clone()).await.expect("declares");
    app.only_queues(&["schema-jobs"]);
    (app, transport)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_named_schema_holds_every_table_and_is_a_world_of_its_own() {
    let pg = fixtures::Postgres::new().await;
    // A name with `messaging_` inside: table names are qualified in the
    // statements' text, and the schema's own name must survive that.
    let named = Named(format!("{}_messaging_q", pg.schema));
    let in_schema = format!("{}&schema={}&migrate=true", pg.url, named.0);
    let (mut app, transport) = app_on(&in_schema).await;
    let found = tables_in(&named.0);
    for table in [
        "messaging_idempotency",
        "messaging_messages",
        "messaging_migrations",
        "messaging_previous",
        "messaging_queues",
    ] {
        assert!(found.iter().any(|t| t == table), "{table} not in {}: {found:?}", named.0);
    }
    assert_eq!(tables_in(&pg.schema), Vec::<String>::new(), "nothing of ours in the connection's schema");
    let publisher = app.setup().publisher();
    publisher.send::<SchemaJobs, _>(&SchemaJob { n: 1 }).await.expect("sent");
    assert_eq!(transport.depth("schema-jobs").await.expect("depth"), 1);
    // Migrating again changes nothing; the connection's own schema is another world.
    let (_, again) = app_on(&in_schema).await;
    assert_eq!(again.depth("schema-jobs").await.expect("depth"), 1);
    let (_, other) = app_on(&format!("{}&migrate=true", pg.url)).await;
    assert_eq!(other.depth("schema-jobs").await.expect("depth"), 0);
    assert!(!tables_in(&pg.schema).is_empty(), "the default schema got its own tables");
    // The named schema's messages are consumed there.
    let handled = std::sync::Arc::new(std::sync::atomic::AtomicU32::new(0));
    app.setup().provide(handled.clone());
    app.setup().provide(messaging::sqlx::PgPool::connect(&pg.url).await.expect("the application's pool"));
    let running = app.start().expect("start");
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while transport.depth("schema-jobs").await.expect("depth") > 0 {
        assert!(std::time::Instant::now() < deadline, "not consumed in the named schema");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    running.stop().await;
    assert_eq!(handled.load(std::sync::atomic::Ordering::SeqCst), 1);
    assert_eq!(other.depth("schema-jobs").await.expect("depth"), 0);

    // The handler's claim was completed in the named schema, inside a
    // transaction on the application's pool, whose search_path is the
    // connection's schema.
    let completed = psql_count(&format!("SELECT count(*) FROM {}.messaging_idempotency WHERE completed", named.0));
    assert_eq!(completed, 1);
    let elsewhere = psql_count(&format!("SELECT count(*) FROM {}.messaging_idempotency", pg.schema));
    assert_eq!(elsewhere, 0);
    // A store of the application's own, by URL, reads the same claims.
    let claims = PostgresIdempotencyStore::connect(&format!("{}&schema={}", pg.url, named.0)).await.expect("claims");
    assert_eq!(claims.purge(Duration::ZERO).await.expect("purge"), 1);
}

fn psql_count(sql: &str) -> i64 {
    let out =
        std::process::Command::new("psql").args([&fixtures::postgres_base(), "-qAtc", sql]).output().expect("psql");
    let text = String::from_utf8_lossy(&out.stdout);
    text.trim().parse().unwrap_or_else(|_| panic!("`{sql}`: {text} {}", String::from_utf8_lossy(&out.stderr)))
}

#[messaging::handler(queue = SchemaJobs, idempotent = "schema-job")]
async fn schema_job(
    _job: SchemaJob,
    claim: IdempotencyClaim,
    pool: State<messaging::sqlx::PgPool>,
    handled: State<std::sync::Arc<std::sync::atomic::AtomicU32>>,
) -> Result<(), HandlerError> {
    let mut tx = pool.begin().await?;
    claim.complete_in(&mut tx).await?;
    tx.commit().await?;
    handled.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    Ok(())
}

#[tokio::test]
async fn schema_names_are_checked_and_sqlite_refuses_them() {
    let err = |url: &str| {
        let url = url.to_owned();
        async move {
            match messaging::transport::connect(&url).await {
                Ok(_) => panic!("{url} was accepted"),
                Err(e) => e.to_string(),
            }
        }
    };
    let bad = err("postgres://postgres@127.0.0.1:5432/test?schema=Robert%27);DROP").await;
    assert!(bad.contains("a schema name is 1 to 63 lowercase letters"), "{bad}");
    #[cfg(feature = "sqlite")]
    {
        let lite = err("sqlite::memory:?schema=jobs").await;
        assert!(lite.contains("`schema=` is a PostgreSQL option"), "{lite}");
    }
}
