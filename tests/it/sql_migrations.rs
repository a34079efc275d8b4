//! The framework's migrations beside the application's own sqlx migrations in
//! one database: both migrate, in either order, again and again; a database
//! migrated by an earlier version (our rows in `_sqlx_migrations`) is carried
//! over.
#![cfg(all(feature = "postgres", feature = "sqlite"))]

use crate::fixtures;

use std::path::{Path, PathBuf};

use messaging::sqlx::migrate::Migrator;

/// A migrations folder of the application's own: one table.
struct AppMigrations {
    dir: PathBuf,
}

impl AppMigrations {
    fn new() -> AppMigrations {
        let dir = std::env::temp_dir().join(format!("app-migrations-{}", messaging::MessageId::random()));
        std::fs::create_dir_all(&dir).expect("create the folder");
        std::fs::write(dir.join("20200101000000_orders.sql"), "CREATE TABLE app_orders (id BIGINT PRIMARY KEY);")
            .expect("write the migration");
        AppMigrations { dir }
    }

    async fn migrator(&self) -> Migrator {
        Migrator::new(self.dir.as_path()).await.expect("the app's migrations")
    }
}

impl Drop for AppMigrations {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Our migrations as an earlier version ran them: through sqlx's own table.
async fn ours_the_old_way(database: &str) -> Migrator {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("messaging/migrations").join(database);
    Migrator::new(dir.as_path()).await.expect("the framework's migration files")
}

/// Runs `check` on a fresh PostgreSQL schema and a fresh SQLite file. Each
/// run of a migrator gets a pool of its own, closed after it: sqlx's
/// migrator keeps its session lock on PostgreSQL when a migration fails (as
/// the app's refusal below does), and a closed connection lets it go.
macro_rules! on_both {
    ($check:ident) => {{
        let db = fixtures::Postgres::new().await;
        let url = db.url.clone();
        $check(&db.url, "postgres", move |m: Migrator| {
            let url = url.clone();
            async move {
                let pool = messaging::sqlx::PgPool::connect(&url).await.expect("connect");
                let ran = m.run(&pool).await.map_err(|e| e.to_string());
                pool.close().await;
                ran
            }
        })
        .await;
        let file = fixtures::SqliteFile::new();
        let url = file.url.clone();
        $check(&file.url, "sqlite", move |m: Migrator| {
            let url = url.clone();
            async move {
                let pool = messaging::sqlx::SqlitePool::connect(&url).await.expect("open");
                let ran = m.run(&pool).await.map_err(|e| e.to_string());
                pool.close().await;
                ran
            }
        })
        .await;
    }};
}

async fn migrate_ours(url: &str) {
    let transport = messaging::transport::connect(url).await.expect("connects");
    transport.migrate().await.expect("our migrations");
    messaging::App::new(transport).await.expect("the framework's tables are ready");
}

async fn both_orders<F, Fut>(url: &str, database: &str, run: F)
where
    F: Fn(Migrator) -> Fut,
    Fut: std::future::Future<Output = Result<(), String>>,
{
    let app = AppMigrations::new();
    // The application first, then ours, then both again.
    run(app.migrator().await).await.expect("the app migrates");
    migrate_ours(url).await;
    run(app.migrator().await).await.unwrap_or_else(|e| panic!("{database}: the app migrates after us: {e}"));
    migrate_ours(url).await;
}

async fn ours_first<F, Fut>(url: &str, database: &str, run: F)
where
    F: Fn(Migrator) -> Fut,
    Fut: std::future::Future<Output = Result<(), String>>,
{
    let app = AppMigrations::new();
    migrate_ours(url).await;
    run(app.migrator().await).await.unwrap_or_else(|e| panic!("{database}: the app migrates after us: {e}"));
    migrate_ours(url).await;
}

async fn carried_over<F, Fut>(url: &str, database: &str, run: F)
where
    F: Fn(Migrator) -> Fut,
    Fut: std::future::Future<Output = Result<(), String>>,
{
    run(ours_the_old_way(database).await).await.expect("the earlier version's migrate");
    let app = AppMigrations::new();
    let refused = run(app.migrator().await).await.expect_err("sqlx's table is shared: the app's migrator refuses");
    assert!(refused.contains("previously applied but is missing"), "{database}: {refused}");
    migrate_ours(url).await;
    run(app.migrator().await).await.unwrap_or_else(|e| panic!("{database}: after the carry-over: {e}"));
    migrate_ours(url).await;
}

#[tokio::test]
async fn the_apps_migrations_first_then_ours_then_both_again() {
    on_both!(both_orders);
}

#[tokio::test]
async fn ours_first_then_the_apps() {
    on_both!(ours_first);
}

#[tokio::test]
async fn a_database_migrated_by_an_earlier_version_is_carried_over() {
    on_both!(carried_over);
}
