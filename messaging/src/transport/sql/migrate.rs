//! The framework's migrations, with their own history table.
//!
//! sqlx's migrator records what it applied in `_sqlx_migrations`, one table
//! per database. An application that runs its own sqlx migrations on the same
//! database then meets our versions in that table ("previously applied but
//! is missing"), and ours meet its. So the framework keeps its own history in
//! `messaging_migrations` and runs its migrations itself: all in one
//! transaction (PostgreSQL and SQLite both roll DDL back), under a lock that
//! makes concurrent starters take turns.
//!
//! A database migrated by an earlier version has our rows in
//! `_sqlx_migrations`: they are carried over (same version and checksum) and
//! removed from there, so that the application's migrator no longer sees them.

use sqlx::migrate::Migration;

use super::dialect::{backend, Dialect, SqlStore, Write};
use crate::error::TransportError;

/// Our history table; `checksum` is hex text so that one statement serves both databases.
const CREATE_HISTORY: &str = "CREATE TABLE IF NOT EXISTS messaging_migrations ( \
    version BIGINT PRIMARY KEY, description TEXT NOT NULL, checksum TEXT NOT NULL, applied_at BIGINT NOT NULL)";

/// The lowercase hex of a checksum.
fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Applies the migrations `store`'s history lacks; fails, changing nothing,
/// when an applied migration differs from the one this version carries.
pub(crate) async fn run<D: Dialect>(store: &SqlStore<D>) -> Result<(), TransportError> {
    if up_to_date(store).await {
        return Ok(());
    }
    // Earlier versions had no `schema=`: nothing of ours is in sqlx's table
    // for a named schema (and the connection's one may be the application's).
    let carried = if store.tables.schema().is_some() { Vec::new() } else { sqlx_history::<D>(store).await };
    let mut w = Write::begin(store).await?;
    let done = apply(store, &mut w, &carried).await;
    w.finish(done).await
}

/// Whether every migration this version carries is applied with its
/// checksum, as read outside a transaction: the usual start (`migrate=true`
/// on every process), which then takes no lock. On SQLite the migration's
/// transaction takes the write lock, which an application sharing the file
/// may hold: a worker started meanwhile waited out the busy timeout and
/// exited (tried from outside). Anything else, an error included, goes the
/// whole way, under the lock.
async fn up_to_date<D: Dialect>(store: &SqlStore<D>) -> bool {
    let read = "SELECT version, checksum FROM messaging_migrations";
    let Ok(rows) = store.query("reading messaging_migrations", &[read], &[]).await else {
        return false;
    };
    let applied: std::collections::HashSet<(i64, String)> =
        rows.iter().filter_map(|r| Some((D::int(r, 0).ok()??, D::text(r, 1).ok()??))).collect();
    D::migrations()
        .iter()
        .filter(|m| m.migration_type.is_up_migration())
        .all(|m| applied.contains(&(m.version, hex(&m.checksum))))
}

/// Rows of `_sqlx_migrations` (version, checksum), if that table exists.
/// Read outside the migration's transaction: on PostgreSQL a failed
/// statement (no such table) would abort it.
async fn sqlx_history<D: Dialect>(store: &SqlStore<D>) -> Vec<(i64, String)> {
    let Ok(rows) =
        store.query("reading _sqlx_migrations", &["SELECT version, checksum FROM _sqlx_migrations"], &[]).await
    else {
        return Vec::new();
    };
    rows.iter().filter_map(|r| Some((D::int(r, 0).ok()??, hex(&D::bytes(r, 1).ok()??)))).collect()
}

async fn apply<D: Dialect>(
    store: &SqlStore<D>,
    w: &mut Write<'_, D>,
    carried: &[(i64, String)],
) -> Result<(), TransportError> {
    store.exec_in(w, "locking the migrations", &[D::MIGRATION_LOCK], &[]).await?;
    if let Some(schema) = store.tables.schema() {
        // Only PostgreSQL has schemas (`Dialect::SCHEMAS`). The scripts name
        // tables bare (and `CREATE INDEX` takes no schema), so they run with
        // the schema as the transaction's search path; the statements of the
        // transport name it in every table instead, which holds inside a
        // caller's own transaction too. The name is a checked identifier;
        // these run as written (qualifying tables would rewrite a schema
        // name that contains `messaging_`).
        let enter = [format!("CREATE SCHEMA IF NOT EXISTS {schema}"), format!("SET LOCAL search_path TO {schema}")];
        for sql in &enter {
            D::execute(w.conn(), sql, &[]).await.map_err(|e| backend::<D>("entering the schema", e))?;
        }
    }
    store.exec_in(w, "creating messaging_migrations", &[CREATE_HISTORY], &[]).await?;
    let found = store
        .query_in(w, "reading messaging_migrations", &["SELECT version, checksum FROM messaging_migrations"], &[])
        .await?;
    let mut applied = Vec::with_capacity(found.len());
    for r in &found {
        let read = |e| backend::<D>("reading messaging_migrations", e);
        applied
            .push((D::int(r, 0).map_err(read)?.unwrap_or_default(), D::text(r, 1).map_err(read)?.unwrap_or_default()));
    }
    let now = D::now(&store.state);
    for m in D::migrations().iter().filter(|m| m.migration_type.is_up_migration()) {
        let checksum = hex(&m.checksum);
        match applied.iter().find(|(v, _)| *v == m.version) {
            Some((_, c)) if *c == checksum => continue,
            Some(_) => return Err(changed::<D>(m)),
            None => {}
        }
        if carried.iter().any(|(v, c)| *v == m.version && *c == checksum) {
            // Applied by an earlier version through sqlx's table: move the record.
            let args = [m.version.into()];
            store
                .exec_in(w, "carrying over a migration", &["DELETE FROM _sqlx_migrations WHERE version = $1"], &args)
                .await?;
        } else {
            D::execute_script(w.conn(), &m.sql)
                .await
                .map_err(|e| backend::<D>(&format!("migration {} ({})", m.version, m.description), e))?;
        }
        let args = [m.version.into(), m.description.as_ref().into(), checksum.as_str().into(), now.into()];
        let record =
            "INSERT INTO messaging_migrations (version, description, checksum, applied_at) VALUES ($1, $2, $3, $4)";
        store.exec_in(w, "recording a migration", &[record], &args).await?;
    }
    Ok(())
}

fn changed<D: Dialect>(m: &Migration) -> TransportError {
    TransportError::Backend(format!(
        "{}: migration {} ({}) was applied with other contents than this version of the framework carries; \
         the database was migrated by another build: restore that build, or migrate a fresh database",
        D::SYSTEM,
        m.version,
        m.description
    ))
}

/// The migrations of one database (`postgres`, `sqlite`: their directory
/// under `migrations/`) that came before migration `version`, copied to a
/// directory of their own, removed on drop: what a version of the framework
/// before that migration carried, for tests of upgrades.
#[cfg(all(test, feature = "sqlite"))]
pub(crate) struct MigrationsBefore(std::path::PathBuf);

#[cfg(all(test, feature = "sqlite"))]
impl MigrationsBefore {
    pub(crate) fn new(system: &str, version: i64) -> MigrationsBefore {
        let dir = std::env::temp_dir().join(format!("messaging-migrations-{:016x}", fastrand::u64(..)));
        std::fs::create_dir_all(&dir).expect("a directory for the earlier migrations");
        let source = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("migrations").join(system);
        for file in std::fs::read_dir(&source).expect("the migrations") {
            let path = file.expect("a migration").path();
            let name = path.file_name().and_then(|n| n.to_str()).unwrap_or_default().to_owned();
            if name.split('_').next().and_then(|v| v.parse::<i64>().ok()).is_some_and(|v| v < version) {
                std::fs::copy(&path, dir.join(&name)).expect("copy");
            }
        }
        MigrationsBefore(dir)
    }

    /// sqlx's migrator of these migrations (it records them in
    /// `_sqlx_migrations`, as the framework's versions before its own
    /// history table did).
    pub(crate) async fn migrator(&self) -> sqlx::migrate::Migrator {
        sqlx::migrate::Migrator::new(self.0.as_path()).await.expect("the earlier migrations")
    }
}

#[cfg(all(test, feature = "sqlite"))]
impl Drop for MigrationsBefore {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}
