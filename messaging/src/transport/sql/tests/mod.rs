//! Tests of the SQL layer against real databases: the model test (both
//! stores against the row state machine) and the idempotency claim stores.
//! PostgreSQL at `TEST_POSTGRES_URL` (default
//! `postgres://postgres@127.0.0.1:5432/test`), each test in its own schema;
//! SQLite in a temporary file.

#![allow(clippy::unwrap_used)] // tests: a failed step is a failed test

mod claims;
mod fifo;
mod horizon;
mod ids;
mod locks;
mod model;
mod notify;
mod plans;
mod pool;
mod schedules;
mod tuples;

/// The server the tests use (trust auth).
fn postgres_base() -> String {
    std::env::var("TEST_POSTGRES_URL").unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".to_owned())
}

/// A multi-thread runtime for tests that drive async code from sync code.
fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("runtime")
}

fn unique(prefix: &str) -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.subsec_nanos());
    format!("{prefix}_{}_{nanos}_{}", std::process::id(), COUNTER.fetch_add(1, Ordering::Relaxed))
}

/// Runs one statement with the `psql` client (present wherever the server is).
fn psql(sql: &str) {
    let out = std::process::Command::new("psql")
        .args([&postgres_base(), "-v", "ON_ERROR_STOP=1", "-qc", sql])
        .output()
        .expect("psql is installed (PostgreSQL client)");
    assert!(out.status.success(), "psql `{sql}` failed: {}", String::from_utf8_lossy(&out.stderr));
}

/// The URL of database `name` on the test server.
fn on_database(name: &str) -> String {
    let base = postgres_base();
    let (path, query) = base.split_once('?').map_or((base.as_str(), None), |(p, q)| (p, Some(q)));
    let server = path.rsplit_once('/').map_or(path, |(server, _)| server);
    match query {
        Some(query) => format!("{server}/{name}?{query}"),
        None => format!("{server}/{name}"),
    }
}

/// A database of its own on the test server, dropped on drop: for tests
/// whose open transactions would hold back the cleanup that other tests
/// in the shared database wait for (a vacuum only waits for transactions
/// in its own database).
struct Database {
    name: String,
    url: String,
}

impl Database {
    fn new(prefix: &str) -> Database {
        let name = unique(prefix);
        psql(&format!("CREATE DATABASE {name}"));
        let url = on_database(&name);
        Database { name, url }
    }
}

impl Drop for Database {
    fn drop(&mut self) {
        psql(&format!("DROP DATABASE IF EXISTS {} WITH (FORCE)", self.name));
    }
}

/// A fresh schema in the test database, dropped on drop; `url` connects with
/// it as search_path.
struct Postgres {
    schema: String,
    url: String,
}

impl Postgres {
    fn new() -> Postgres {
        let schema = unique("msgtest");
        psql(&format!("CREATE SCHEMA {schema}"));
        let base = postgres_base();
        let sep = if base.contains('?') { '&' } else { '?' };
        let url = format!("{base}{sep}options=-c%20search_path%3D{schema}");
        Postgres { schema, url }
    }
}

impl Drop for Postgres {
    fn drop(&mut self) {
        psql(&format!("DROP SCHEMA IF EXISTS {} CASCADE", self.schema));
    }
}

/// A SQLite database file in the temp directory, removed on drop.
struct SqliteFile {
    path: std::path::PathBuf,
    url: String,
}

impl SqliteFile {
    fn new() -> SqliteFile {
        let path = std::env::temp_dir().join(format!("{}.db", unique("msgtest")));
        let url = format!("sqlite://{}?mode=rwc", path.display());
        SqliteFile { path, url }
    }
}

impl Drop for SqliteFile {
    fn drop(&mut self) {
        for suffix in ["", "-wal", "-shm"] {
            let _ = std::fs::remove_file(format!("{}{suffix}", self.path.display()));
        }
    }
}

/// `send_batch` converts the batch's vector of outgoing messages into rows
/// to store in place, which Rust does only while a row is no larger than a
/// message (and aligned alike). With the message id inline, a row 16 bytes
/// larger, every `send_batch` of 1,000 took a fresh vector of 160 KB and
/// the publish ran slower despite fewer instructions (docs/PERFORMANCE.md,
/// fifteenth session).
#[test]
fn a_row_to_store_is_no_larger_than_an_outgoing_message() {
    use crate::transport::sql::machine::Enqueue;
    use crate::transport::Outgoing;
    let (row, message) = (std::mem::size_of::<Enqueue>(), std::mem::size_of::<Outgoing>());
    assert!(row <= message, "a row to store takes {row} bytes, an outgoing message {message}");
    assert_eq!(std::mem::align_of::<Enqueue>(), std::mem::align_of::<Outgoing>());
}
