//! `postgres://`: queues in PostgreSQL. Many processes share a queue:
//! leasing takes rows with `FOR UPDATE SKIP LOCKED` in batches, enqueues
//! `NOTIFY` idle receivers (with polling as the fallback for poolers that drop
//! notifications), and row transitions lock the row they change.

use std::time::Duration;

use sqlx::postgres::{PgListener, PgPool, PgPoolOptions, PgRow};
use sqlx::{Postgres, Row as _, Transaction};
use tokio::sync::broadcast;

use super::store::{Enqueued, LeasedRow, RowOp, RowStore};
use super::{SqlOptions, SqlTransport};
use crate::error::{Error, TransportError};
use crate::identity::{Deferred, Enqueue, EnqueueOutcome, QueueRules, Row, RowId, Status};
use crate::transport::BoxFuture;

mod rows;
mod txn;

use rows::*;

/// The notification channel enqueues signal on (payload: the queue name).
const CHANNEL: &str = "messaging_enqueued";

/// The PostgreSQL transport.
pub type PostgresTransport = SqlTransport<PostgresStore>;

/// Rows in PostgreSQL.
#[derive(Debug, Clone)]
pub struct PostgresStore {
    pool: PgPool,
    changes: broadcast::Sender<String>,
}

/// Connects to `url` (with the framework's options already taken out).
pub async fn connect(url: &str) -> Result<PostgresTransport, Error> {
    let (options, url) = SqlOptions::parse(url)?;
    let store = PostgresStore::connect(&url).await?;
    if options.migrate {
        store.migrate().await?;
    }
    Ok(SqlTransport::new(store, options))
}

/// Commits on success; on failure rolls back at once. (A dropped transaction
/// is only rolled back when its connection is next used, and until then it
/// keeps its row locks: a lease would skip those rows as locked.)
async fn finish<R>(tx: Transaction<'static, Postgres>, result: Result<R, TransportError>) -> Result<R, TransportError> {
    match result {
        Ok(value) => {
            tx.commit().await.map_err(|e| backend("commit", e))?;
            Ok(value)
        }
        Err(e) => {
            if let Err(rollback) = tx.rollback().await {
                tracing::warn!("postgresql: rollback failed: {rollback}");
            }
            Err(e)
        }
    }
}

fn backend(what: &str, e: sqlx::Error) -> TransportError {
    TransportError::Backend(format!("postgresql: {what} failed: {e}"))
}

impl PostgresStore {
    /// Connects a pool and starts listening for enqueue notifications.
    pub async fn connect(url: &str) -> Result<PostgresStore, TransportError> {
        let pool = PgPoolOptions::new()
            .max_connections(10)
            .acquire_timeout(Duration::from_secs(5))
            .connect(url)
            .await
            .map_err(|e| TransportError::Backend(format!("cannot connect to PostgreSQL at {}: {e}", redact(url))))?;
        let store = PostgresStore { pool, changes: broadcast::channel(1024).0 };
        store.listen().await;
        Ok(store)
    }

    /// The connection pool.
    pub fn pool(&self) -> &PgPool {
        &self.pool
    }

    /// Forwards NOTIFYs to [`RowStore::changes`] until the store is dropped.
    async fn listen(&self) {
        let mut listener = match PgListener::connect_with(&self.pool).await {
            Ok(l) => l,
            Err(e) => {
                tracing::warn!("no LISTEN connection ({e}); idle receivers fall back to polling");
                return;
            }
        };
        if let Err(e) = listener.listen(CHANNEL).await {
            tracing::warn!("LISTEN failed ({e}); idle receivers fall back to polling");
            return;
        }
        let sender = self.changes.downgrade();
        tokio::spawn(async move {
            loop {
                let received = listener.recv().await;
                let Some(sender) = sender.upgrade() else { return };
                match received {
                    Ok(note) => {
                        let _ = sender.send(note.payload().to_owned());
                    }
                    // The listener reconnects by itself; meanwhile polling covers.
                    Err(e) => {
                        tracing::debug!("LISTEN connection lost ({e}); reconnecting");
                        tokio::time::sleep(Duration::from_millis(200)).await;
                    }
                }
            }
        });
    }

    async fn begin(&self) -> Result<Transaction<'static, Postgres>, TransportError> {
        self.pool.begin().await.map_err(|e| backend("begin", e))
    }

    async fn notify(&self, queue: &str) {
        if let Err(e) = sqlx::query("SELECT pg_notify($1, $2)").bind(CHANNEL).bind(queue).execute(&self.pool).await {
            tracing::debug!("NOTIFY failed ({e}); receivers will poll");
        }
    }
}

/// The URL without its password, for error messages.
fn redact(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(scheme), Some(at)) if at > scheme => {
            let userinfo = &url[scheme + 3..at];
            match userinfo.split_once(':') {
                Some((user, _)) => format!("{}{user}:***{}", &url[..scheme + 3], &url[at..]),
                None => url.to_owned(),
            }
        }
        _ => url.to_owned(),
    }
}

impl RowStore for PostgresStore {
    fn system(&self) -> &'static str {
        "postgresql"
    }

    fn migrate(&self) -> BoxFuture<'_, Result<(), TransportError>> {
        Box::pin(async move {
            sqlx::migrate!("./migrations/postgres")
                .run(&self.pool)
                .await
                .map_err(|e| TransportError::Backend(format!("postgresql: migration failed: {e}")))
        })
    }

    fn check_schema(&self) -> BoxFuture<'_, Result<(), TransportError>> {
        Box::pin(super::schema::check_postgres(&self.pool))
    }

    fn declare<'a>(&'a self, queue: &'a str, fifo: bool, now: i64) -> BoxFuture<'a, Result<(), TransportError>> {
        Box::pin(async move {
            self.check_schema().await?;
            sqlx::query("INSERT INTO messaging_queues (name, fifo, created_at) VALUES ($1, $2, $3) ON CONFLICT (name) DO NOTHING")
                .bind(queue)
                .bind(fifo)
                .bind(now)
                .execute(&self.pool)
                .await
                .map_err(|e| backend("declaring a queue", e))?;
            let stored: bool = sqlx::query_scalar("SELECT fifo FROM messaging_queues WHERE name = $1")
                .bind(queue)
                .fetch_one(&self.pool)
                .await
                .map_err(|e| backend("declaring a queue", e))?;
            super::schema::check_kind(queue, fifo, stored)
        })
    }

    fn enqueue<'a>(
        &'a self,
        queue: &'a str,
        now: i64,
        items: Vec<Enqueue>,
        idempotent: bool,
    ) -> BoxFuture<'a, Vec<Result<Enqueued, TransportError>>> {
        Box::pin(async move {
            // Runs of messages without identity go in one multi-row INSERT each;
            // a message with identity runs its own transition in between, so
            // the enqueue order is the input order.
            let mut results = Vec::with_capacity(items.len());
            let mut run: Vec<Enqueue> = Vec::new();
            for e in items {
                if e.identity.is_none() {
                    run.push(e);
                    continue;
                }
                if !run.is_empty() {
                    results.extend(self.insert_plain(queue, now, std::mem::take(&mut run)).await);
                }
                results.push(self.enqueue_identity(queue, now, e, idempotent).await);
            }
            if !run.is_empty() {
                results.extend(self.insert_plain(queue, now, run).await);
            }
            self.notify(queue).await;
            results
        })
    }

    fn lease<'a>(
        &'a self,
        queue: &'a str,
        now: i64,
        n: usize,
        lease_ms: i64,
        fifo: bool,
    ) -> BoxFuture<'a, Result<Vec<LeasedRow>, TransportError>> {
        Box::pin(async move {
            if fifo {
                self.lease_fifo(queue, now, n, lease_ms).await
            } else {
                self.lease_standard(queue, now, n, lease_ms, None).await
            }
        })
    }

    fn concurrent_leases(&self) -> u32 {
        2
    }

    fn lease_partition<'a>(
        &'a self,
        queue: &'a str,
        now: i64,
        n: usize,
        lease_ms: i64,
        part: u32,
        of: u32,
    ) -> BoxFuture<'a, Result<Vec<LeasedRow>, TransportError>> {
        Box::pin(self.lease_standard(queue, now, n, lease_ms, Some((part, of))))
    }

    fn complete<'a>(
        &'a self,
        queue: &'a str,
        now: i64,
        items: Vec<(RowId, u64)>,
        retention_ms: i64,
    ) -> BoxFuture<'a, Vec<Result<(), TransportError>>> {
        Box::pin(async move {
            // Fast path: plain rows being processed, deleted (or kept) in one statement.
            let ids: Vec<i64> = items.iter().map(|(id, _)| *id as i64).collect();
            let tokens: Vec<i64> = items.iter().map(|(_, t)| *t as i64).collect();
            let sql = if retention_ms <= 0 {
                "DELETE FROM messaging_messages m USING UNNEST($1::bigint[], $2::bigint[]) AS t(id, token) \
                 WHERE m.id = t.id AND m.lease_token = t.token AND m.queue = $3 AND m.status = 'processing' \
                 AND m.identity IS NULL AND m.lease_expires > $4 RETURNING m.id"
            } else {
                "UPDATE messaging_messages m SET status = 'processed', processed_at = $4, lease_token = NULL, lease_expires = NULL \
                 FROM UNNEST($1::bigint[], $2::bigint[]) AS t(id, token) \
                 WHERE m.id = t.id AND m.lease_token = t.token AND m.queue = $3 AND m.status = 'processing' \
                 AND m.identity IS NULL AND m.lease_expires > $4 RETURNING m.id"
            };
            let done: Vec<i64> = match sqlx::query_scalar(sql)
                .bind(&ids)
                .bind(&tokens)
                .bind(queue)
                .bind(now)
                .fetch_all(&self.pool)
                .await
            {
                Ok(done) => done,
                Err(e) => {
                    let message = format!("postgresql: completing messages failed: {e}");
                    return items.iter().map(|_| Err(TransportError::Backend(message.clone()))).collect();
                }
            };
            let done: std::collections::HashSet<i64> = done.into_iter().collect();
            let mut results = Vec::with_capacity(items.len());
            for (id, token) in items {
                if done.contains(&(id as i64)) {
                    results.push(Ok(()));
                } else {
                    // Identity rows, deferred versions and lost leases: the full transition.
                    results.push(self.complete_one(queue, now, id, token, retention_ms).await);
                }
            }
            results
        })
    }

    fn apply<'a>(
        &'a self,
        queue: &'a str,
        now: i64,
        id: RowId,
        token: u64,
        op: RowOp,
    ) -> BoxFuture<'a, Result<(), TransportError>> {
        Box::pin(async move {
            self.with_row(queue, id, |row| {
                op.apply(row, now, token).map_err(|_| TransportError::StaleReceipt)?;
                Ok(((), false))
            })
            .await
        })
    }

    fn maintain<'a>(
        &'a self,
        queue: &'a str,
        now: i64,
        rules: QueueRules,
    ) -> BoxFuture<'a, Result<(), TransportError>> {
        Box::pin(async move {
            sqlx::query(
                "UPDATE messaging_messages SET status = 'pending' WHERE queue = $1 AND status = 'sleeping' \
                 AND (process_at IS NULL OR process_at <= $2)",
            )
            .bind(queue)
            .bind(now)
            .execute(&self.pool)
            .await
            .map_err(|e| backend("waking sleeping messages", e))?;
            let expired: Vec<i64> = sqlx::query_scalar(
                "SELECT id FROM messaging_messages WHERE queue = $1 AND status IN ('processing', 'awaiting_release') \
                 AND lease_expires <= $2",
            )
            .bind(queue)
            .bind(now)
            .fetch_all(&self.pool)
            .await
            .map_err(|e| backend("finding expired leases", e))?;
            for id in expired {
                let abandoned = self
                    .with_row(queue, id as RowId, |row| {
                        if row.is_abandoned(now) {
                            row.abandon(now, &rules);
                        }
                        Ok(((), false))
                    })
                    .await;
                match abandoned {
                    Ok(()) | Err(TransportError::StaleReceipt) => {}
                    Err(e) => return Err(e),
                }
            }
            if rules.retention_ms > 0 {
                sqlx::query(
                    "DELETE FROM messaging_messages WHERE queue = $1 AND status = 'processed' AND processed_at <= $2",
                )
                .bind(queue)
                .bind(now - rules.retention_ms)
                .execute(&self.pool)
                .await
                .map_err(|e| backend("purging processed messages", e))?;
            }
            Ok(())
        })
    }

    fn next_due<'a>(&'a self, queue: &'a str) -> BoxFuture<'a, Result<Option<i64>, TransportError>> {
        Box::pin(async move {
            sqlx::query_scalar(
                "SELECT LEAST( \
                    (SELECT min(process_at) FROM messaging_messages WHERE queue = $1 AND status = 'sleeping'), \
                    (SELECT min(lease_expires) FROM messaging_messages WHERE queue = $1 \
                        AND status IN ('processing', 'awaiting_release')))",
            )
            .bind(queue)
            .fetch_one(&self.pool)
            .await
            .map_err(|e| backend("next due time", e))
        })
    }

    fn depth<'a>(&'a self, queue: &'a str) -> BoxFuture<'a, Result<u64, TransportError>> {
        Box::pin(async move {
            let n: i64 = sqlx::query_scalar(
                "SELECT count(*) FROM messaging_messages WHERE queue = $1 \
                 AND status IN ('pending', 'sleeping', 'processing', 'awaiting_release')",
            )
            .bind(queue)
            .fetch_one(&self.pool)
            .await
            .map_err(|e| backend("depth", e))?;
            Ok(n as u64)
        })
    }

    fn errors<'a>(&'a self, queue: &'a str, max: usize) -> BoxFuture<'a, Result<Vec<Row>, TransportError>> {
        Box::pin(async move {
            let sql = format!(
                "SELECT {COLUMNS} FROM messaging_messages WHERE queue = $1 AND status = 'error' ORDER BY seq LIMIT $2"
            );
            let rows = sqlx::query(&sql)
                .bind(queue)
                .bind(max.min(i64::MAX as usize) as i64)
                .fetch_all(&self.pool)
                .await
                .map_err(|e| backend("reading dead letters", e))?;
            rows.iter().map(row_of).collect()
        })
    }

    fn redrive<'a>(&'a self, queue: &'a str, ids: Vec<RowId>) -> BoxFuture<'a, Result<usize, TransportError>> {
        Box::pin(async move {
            let ids: Vec<i64> = ids.into_iter().map(|id| id as i64).collect();
            let moved = sqlx::query(
                "UPDATE messaging_messages m SET status = 'pending', attempts = 0, process_at = NULL, \
                    seq = nextval('messaging_seq') \
                 WHERE m.id = ANY($2) AND m.queue = $1 AND m.status = 'error'",
            )
            .bind(queue)
            .bind(&ids)
            .execute(&self.pool)
            .await
            .map_err(|e| backend("redrive", e))?;
            self.notify(queue).await;
            Ok(moved.rows_affected() as usize)
        })
    }

    fn error_depth<'a>(&'a self, queue: &'a str) -> BoxFuture<'a, Result<u64, TransportError>> {
        Box::pin(async move {
            let n: i64 =
                sqlx::query_scalar("SELECT count(*) FROM messaging_messages WHERE queue = $1 AND status = 'error'")
                    .bind(queue)
                    .fetch_one(&self.pool)
                    .await
                    .map_err(|e| backend("dead-letter depth", e))?;
            Ok(n as u64)
        })
    }

    fn rows<'a>(&'a self, queue: &'a str) -> BoxFuture<'a, Result<Vec<Row>, TransportError>> {
        Box::pin(async move {
            let sql = format!("SELECT {COLUMNS} FROM messaging_messages WHERE queue = $1 ORDER BY id");
            let rows = sqlx::query(&sql)
                .bind(queue)
                .fetch_all(&self.pool)
                .await
                .map_err(|e| backend("reading messages", e))?;
            rows.iter().map(row_of).collect()
        })
    }

    fn previous<'a>(
        &'a self,
        queue: &'a str,
        identity: &'a str,
    ) -> BoxFuture<'a, Result<Option<Vec<u8>>, TransportError>> {
        Box::pin(async move {
            sqlx::query_scalar("SELECT payload FROM messaging_previous WHERE queue = $1 AND identity = $2")
                .bind(queue)
                .bind(identity)
                .fetch_optional(&self.pool)
                .await
                .map_err(|e| backend("reading the previous message", e))
        })
    }

    fn purge_claims(&self, before: i64) -> BoxFuture<'_, Result<u64, TransportError>> {
        Box::pin(async move {
            let done = sqlx::query("DELETE FROM messaging_idempotency WHERE completed AND completed_at < $1")
                .bind(before)
                .execute(&self.pool)
                .await
                .map_err(|e| backend("purging idempotency claims", e))?;
            Ok(done.rows_affected())
        })
    }

    fn idempotency_store(&self) -> Option<std::sync::Arc<dyn crate::idempotency::IdempotencyStore>> {
        Some(std::sync::Arc::new(crate::idempotency::PostgresIdempotencyStore::new(self.pool.clone())))
    }

    fn changes(&self) -> Option<broadcast::Receiver<String>> {
        Some(self.changes.subscribe())
    }
}
