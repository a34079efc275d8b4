//! This process's write turn, and the connection the hot paths write on.
//!
//! Every statement is a hop to the connection's thread and back (sqlx runs
//! each SQLite connection on a thread of its own): 60 us on the 2-core
//! machine of the benchmarks, against 5 to 30 us for the statements of a
//! lease or a completion of a few hundred rows. A lease was four hops (a look,
//! `BEGIN IMMEDIATE`, the lease, `COMMIT`), a completion four, and each
//! connection given back to the pool one more (sqlx tests it on release). So
//! the lease, the completion and the enqueue of plain messages each run as one
//! transaction in one call, `BEGIN IMMEDIATE; …; COMMIT`, on a connection the
//! write turn keeps.
//!
//! A call cut short (its future dropped: a receive ended at shutdown) may
//! leave its transaction open, holding the database's write lock. The turn
//! then closes that connection as it is given back (closing rolls back), and
//! the next call takes a new one.

use std::sync::Arc;

use sqlx::pool::PoolConnection;
use sqlx::sqlite::{SqliteArguments, SqliteRow};
use sqlx::{Pool, Sqlite};
use tokio::sync::{Mutex, OwnedMutexGuard};

/// The connection of this process's write turn.
#[derive(Debug, Default)]
pub(crate) struct Writer {
    /// The connection, between calls when `keep`.
    conn: Option<PoolConnection<Sqlite>>,
    /// Whether a call may have left a transaction open on `conn`.
    open: bool,
    /// Whether to keep the connection between calls: not for an in-memory
    /// database (its pool has one connection, which readers need too) nor
    /// for the application's own pool (whose size is the application's).
    keep: bool,
}

impl Writer {
    /// A turn whose connection is kept between calls when `keep`.
    pub(crate) fn shared(keep: bool) -> Arc<Mutex<Writer>> {
        Arc::new(Mutex::new(Writer { conn: None, open: false, keep }))
    }

    /// The kept connection, taken from `pool` when there is none.
    async fn connection(&mut self, pool: &Pool<Sqlite>) -> Result<&mut PoolConnection<Sqlite>, sqlx::Error> {
        Ok(match &mut self.conn {
            Some(conn) => conn,
            empty => empty.insert(pool.acquire().await?),
        })
    }

    /// After a call: the connection back to the pool unless it is kept.
    fn done(&mut self) {
        if !self.keep {
            self.conn = None;
        }
    }
}

impl Drop for Writer {
    fn drop(&mut self) {
        // A pool connection goes back to its pool from a task, which needs a
        // runtime; a store dropped outside one (its runtime gone first) closes
        // the connection here instead, which needs none.
        if tokio::runtime::Handle::try_current().is_err() {
            if let Some(conn) = self.conn.take() {
                drop(conn.detach());
            }
        }
    }
}

/// This process's write turn: held by every write of the framework's, so that
/// they take turns in order (without it, writers of one process compete
/// through SQLite's busy handler, sleeps of up to 100 ms and unfair: an ack
/// could starve into "database is locked"; other processes still wait through
/// the busy timeout).
#[derive(Debug)]
pub struct Turn(OwnedMutexGuard<Writer>);

impl Turn {
    /// Waits for the turn.
    pub(crate) async fn take(writer: &Arc<Mutex<Writer>>) -> Turn {
        Turn(writer.clone().lock_owned().await)
    }

    /// Gives the kept connection back to the pool (a pool being closed
    /// waits for it); the next call takes one again.
    pub(crate) fn release(mut self) {
        self.0.conn = None;
    }

    /// Runs `query`, a read outside any transaction, on the turn's
    /// connection (no pool connection taken and given back for it).
    pub(crate) async fn read<'q>(
        &mut self,
        pool: &Pool<Sqlite>,
        query: sqlx::query::Query<'q, Sqlite, SqliteArguments<'q>>,
    ) -> Result<Vec<SqliteRow>, sqlx::Error> {
        let writer = &mut *self.0;
        let result = query.fetch_all(&mut **writer.connection(pool).await?).await;
        writer.done();
        result
    }

    /// Runs `query`, whose text is one transaction (`BEGIN IMMEDIATE; …;
    /// COMMIT`), in one call on the turn's connection; returns every row its
    /// statements gave. On an error the transaction is rolled back.
    pub(crate) async fn transaction<'q>(
        &mut self,
        pool: &Pool<Sqlite>,
        query: sqlx::query::Query<'q, Sqlite, SqliteArguments<'q>>,
    ) -> Result<Vec<SqliteRow>, sqlx::Error> {
        let writer = &mut *self.0;
        // Set before the call and cleared after it: if the call is cut
        // short, `drop` finds the connection still here and closes it (and
        // finds none if it was cut short while taking one).
        writer.open = true;
        let conn = match writer.connection(pool).await {
            Ok(conn) => conn,
            Err(e) => {
                writer.open = false;
                return Err(e);
            }
        };
        let result = query.fetch_all(&mut **conn).await;
        if result.is_err() {
            // A statement failed and the ones after it did not run: the
            // transaction may still be open ("no transaction is active" when
            // BEGIN itself failed).
            if let Err(e) = sqlx::query("ROLLBACK").execute(&mut **conn).await {
                if !e.to_string().contains("no transaction is active") {
                    tracing::debug!("sqlite: rollback failed, closing the connection: {e}");
                    return result; // `open` stays set: `drop` closes it
                }
            }
        }
        writer.open = false;
        writer.done();
        result
    }
}

impl Drop for Turn {
    fn drop(&mut self) {
        let writer = &mut *self.0;
        if writer.open {
            // A call was cut short; its transaction may still hold the write
            // lock. Closing the connection (in the background) rolls it back.
            if let Some(mut conn) = writer.conn.take() {
                conn.close_on_drop();
            }
            writer.open = false;
        }
    }
}

/// `statements` as one transaction: `BEGIN IMMEDIATE` takes the write lock at
/// once, as every write transaction here does.
pub(crate) fn transaction(statements: &str) -> String {
    format!("BEGIN IMMEDIATE; {statements}; COMMIT")
}
