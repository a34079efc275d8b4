//! [`SqlStore`]: the one [`RowStore`] over PostgreSQL and SQLite. Each
//! operation loads rows, runs their transition in [`crate::identity::Row`]
//! and stores them, in a transaction; only what the databases do differently
//! goes through the [`Dialect`].

mod write;

use sqlx::Pool;

use super::dialect::{backend, each, Dialect, Write};
use super::driver::stmt;
use super::statements::{self as sql, Tables};
use super::store::{Enqueued, LeasedRow, RowOp, RowStore};
use crate::error::TransportError;
use crate::identity::{Enqueue, QueueRules, Row, RowId};
use crate::transport::BoxFuture;

/// Message rows in a database: `SqlStore<sqlx::Postgres>` or `SqlStore<sqlx::Sqlite>`.
#[derive(Debug)]
pub struct SqlStore<D: Dialect> {
    pub(crate) pool: Pool<D>,
    pub(crate) state: D::State,
    pub(crate) tables: Tables,
}

impl<D: Dialect> Clone for SqlStore<D> {
    fn clone(&self) -> Self {
        SqlStore { pool: self.pool.clone(), state: self.state.clone(), tables: self.tables.clone() }
    }
}

impl<D: Dialect> SqlStore<D> {
    /// Connects to `url` (without the framework's options).
    pub async fn connect(url: &str) -> Result<Self, TransportError> {
        let (pool, state) = D::connect(url).await?;
        Ok(SqlStore { pool, state, tables: Tables::default() })
    }

    /// The connection pool.
    pub fn pool(&self) -> &Pool<D> {
        &self.pool
    }

    /// A connection for reading.
    async fn read(&self) -> Result<sqlx::pool::PoolConnection<D>, TransportError> {
        self.pool.acquire().await.map_err(|e| backend::<D>("connect", e))
    }

    /// A count.
    async fn count(&self, template: &str, queue: &str, what: &str) -> Result<u64, TransportError> {
        let sql = self.tables.sql(&[template]);
        let mut conn = self.read().await?;
        let row = stmt(&sql).bind(queue).fetch_optional::<D>(&mut conn).await.map_err(|e| backend::<D>(what, e))?;
        let n = row.map(|r| D::int(&r, 0)).transpose().map_err(|e| backend::<D>(what, e))?.flatten();
        Ok(n.unwrap_or(0).max(0) as u64)
    }

    /// Whole rows.
    async fn records(&self, template: &str, queue: &str, limit: Option<usize>) -> Result<Vec<Row>, TransportError> {
        let sql = self.tables.sql(&[template]);
        let mut conn = self.read().await?;
        let mut s = stmt(&sql).bind(queue);
        if let Some(limit) = limit {
            s = s.bind(i64::try_from(limit).unwrap_or(i64::MAX));
        }
        let rows = s.fetch_all::<D>(&mut conn).await.map_err(|e| backend::<D>("reading messages", e))?;
        rows.iter().map(|r| D::record(r).map_err(|e| backend::<D>("reading a message", e))?.try_into()).collect()
    }

    /// Checks the tables and columns (see [`super::schema`]).
    async fn check(&self) -> Result<(), TransportError> {
        let mut conn = self.read().await?;
        let rows = stmt(D::SCHEMA_COLUMNS)
            .fetch_all::<D>(&mut conn)
            .await
            .map_err(|e| backend::<D>("reading the schema", e))?;
        let found = rows
            .iter()
            .map(|r| Ok((D::text(r, 0)?.unwrap_or_default(), D::text(r, 1)?.unwrap_or_default())))
            .collect::<Result<Vec<_>, sqlx::Error>>()
            .map_err(|e| backend::<D>("reading the schema", e))?;
        super::schema::compare(D::SYSTEM, &found)
    }

    /// Records `queue` with its kind.
    async fn declare_queue(&self, queue: &str, fifo: bool, now: i64) -> Result<(), TransportError> {
        self.check().await?;
        let mut w = Write::single(self).await?;
        let sql = self.tables.sql(&[sql::DECLARE]);
        let done = stmt(&sql).bind(queue).bind(fifo).bind(now).execute::<D>(w.conn()).await;
        w.finish(done.map_err(|e| backend::<D>("declaring a queue", e))).await?;
        let sql = self.tables.sql(&[sql::QUEUE_KIND]);
        let mut conn = self.read().await?;
        let row = stmt(&sql).bind(queue).fetch_optional::<D>(&mut conn).await;
        let stored = row
            .and_then(|r| r.map(|r| D::flag(&r, 0)).transpose())
            .map_err(|e| backend::<D>("declaring a queue", e))?
            .unwrap_or(fifo);
        super::schema::check_kind(queue, fifo, stored)
    }

    /// Housekeeping: wakes due sleepers, abandons expired leases, purges
    /// processed rows past retention. Looks first, without writing: usually
    /// there is nothing to do, and on SQLite taking the write lock every
    /// 100 ms would hold up publishers.
    async fn housekeeping(&self, queue: &str, now: i64, rules: QueueRules) -> Result<(), TransportError> {
        let due = {
            let sql = self.tables.sql(&[sql::HOUSEKEEPING_DUE]);
            let mut conn = self.read().await?;
            let row = stmt(&sql)
                .bind(queue)
                .bind(now)
                .bind(rules.retention_ms > 0)
                .bind(now - rules.retention_ms)
                .fetch_optional::<D>(&mut conn)
                .await
                .map_err(|e| backend::<D>("housekeeping", e))?;
            let flag = |i| row.as_ref().map(|r| D::flag(r, i)).transpose().map(Option::unwrap_or_default);
            (flag(0), flag(1), flag(2))
        };
        let (sleepers, expired, purgeable) = match due {
            (Ok(a), Ok(b), Ok(c)) => (a, b, c),
            (Err(e), _, _) | (_, Err(e), _) | (_, _, Err(e)) => return Err(backend::<D>("housekeeping", e)),
        };
        if sleepers {
            let mut w = Write::single(self).await?;
            let sql = self.tables.sql(&[sql::WAKE]);
            let done = stmt(&sql).bind(queue).bind(now).execute::<D>(w.conn()).await;
            w.finish(done.map_err(|e| backend::<D>("waking sleeping messages", e))).await?;
        }
        if expired {
            let mut w = Write::begin(self).await?;
            let done = self.abandon_in(&mut w, queue, now, &rules).await;
            w.finish(done).await?;
        }
        if purgeable {
            let mut w = Write::single(self).await?;
            let sql = self.tables.sql(&[sql::PURGE_PROCESSED]);
            let done = stmt(&sql).bind(queue).bind(now - rules.retention_ms).execute::<D>(w.conn()).await;
            w.finish(done.map_err(|e| backend::<D>("purging processed messages", e))).await?;
        }
        Ok(())
    }

    /// Abandons the expired leases of `queue` (rows another transaction
    /// holds are being settled: skipped).
    async fn abandon_in(&self, w: &mut Write<D>, queue: &str, now: i64, rules: &QueueRules) -> Result<(), TransportError> {
        let sql = self.tables.sql(&[sql::EXPIRED, D::LOCK_SKIP]);
        let rows = stmt(&sql)
            .bind(queue)
            .bind(now)
            .fetch_all::<D>(w.conn())
            .await
            .map_err(|e| backend::<D>("finding expired leases", e))?;
        for found in &rows {
            let mut row: Row = D::record(found).map_err(|e| backend::<D>("reading a message", e))?.try_into()?;
            if row.is_abandoned(now) {
                row.abandon(now, rules);
                self.store_row(w, &row).await?;
            }
        }
        Ok(())
    }

    async fn next(&self, queue: &str) -> Result<Option<i64>, TransportError> {
        let sql = self.tables.sql(&[sql::NEXT_DUE]);
        let mut conn = self.read().await?;
        let row = stmt(&sql).bind(queue).fetch_optional::<D>(&mut conn).await;
        let row = row.map_err(|e| backend::<D>("next due time", e))?;
        let Some(row) = row else { return Ok(None) };
        let (sleeping, leased) = (D::int(&row, 0), D::int(&row, 1));
        let (sleeping, leased) = (
            sleeping.map_err(|e| backend::<D>("next due time", e))?,
            leased.map_err(|e| backend::<D>("next due time", e))?,
        );
        Ok(match (sleeping, leased) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        })
    }

    async fn previous_of(&self, queue: &str, identity: &str) -> Result<Option<Vec<u8>>, TransportError> {
        let sql = self.tables.sql(&[sql::PREVIOUS]);
        let mut conn = self.read().await?;
        let row = stmt(&sql).bind(queue).bind(identity).fetch_optional::<D>(&mut conn).await;
        let row = row.map_err(|e| backend::<D>("reading the previous message", e))?;
        row.map(|r| D::bytes(&r, 1)).transpose().map(Option::flatten).map_err(|e| backend::<D>("reading the previous message", e))
    }

    async fn purge(&self, before: i64) -> Result<u64, TransportError> {
        let mut w = Write::single(self).await?;
        let sql = self.tables.sql(&[sql::CLAIMS_PURGE]);
        let done = stmt(&sql).bind(before).execute::<D>(w.conn()).await;
        w.finish(done.map_err(|e| backend::<D>("purging idempotency claims", e))).await
    }

    async fn redrive_rows(&self, queue: &str, ids: Vec<RowId>) -> Result<usize, TransportError> {
        if ids.is_empty() {
            return Ok(0);
        }
        let mut w = Write::begin(self).await?;
        let moved = D::redrive(w.conn(), &self.tables, queue, &ids).await;
        let moved = w.finish(moved).await?;
        D::notify(&self.pool, queue).await;
        Ok(moved)
    }
}

impl<D: Dialect> RowStore for SqlStore<D> {
    fn system(&self) -> &'static str {
        D::SYSTEM
    }

    fn now(&self) -> i64 {
        D::now(&self.state)
    }

    fn migrate(&self) -> BoxFuture<'_, Result<(), TransportError>> {
        Box::pin(D::migrate(&self.pool))
    }

    fn check_schema(&self) -> BoxFuture<'_, Result<(), TransportError>> {
        Box::pin(self.check())
    }

    fn declare<'a>(&'a self, queue: &'a str, fifo: bool, now: i64) -> BoxFuture<'a, Result<(), TransportError>> {
        Box::pin(self.declare_queue(queue, fifo, now))
    }

    fn enqueue<'a>(
        &'a self,
        queue: &'a str,
        now: i64,
        items: Vec<Enqueue>,
        idempotent: bool,
    ) -> BoxFuture<'a, Vec<Result<Enqueued, TransportError>>> {
        Box::pin(async move {
            if items.is_empty() {
                return Vec::new();
            }
            let n = items.len();
            let plain = items.iter().all(|e| e.identity.is_none());
            let results = match if plain { Write::single(self).await } else { Write::begin(self).await } {
                Ok(mut w) => {
                    let stored = self.enqueue_in(&mut w, queue, now, items, idempotent).await;
                    w.finish(stored).await
                }
                Err(e) => Err(e),
            };
            D::notify(&self.pool, queue).await;
            match results {
                Ok(stored) => stored.into_iter().map(Ok).collect(),
                Err(e) => each(n, &e),
            }
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
            if n == 0 {
                return Ok(Vec::new());
            }
            D::lease(self, queue, now, n, lease_ms, fifo, None).await
        })
    }

    fn concurrent_leases(&self) -> u32 {
        D::CONCURRENT_LEASES
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
        Box::pin(D::lease(self, queue, now, n, lease_ms, false, Some((part, of.max(1)))))
    }

    fn complete<'a>(
        &'a self,
        queue: &'a str,
        now: i64,
        items: Vec<(RowId, u64)>,
        retention_ms: i64,
    ) -> BoxFuture<'a, Vec<Result<(), TransportError>>> {
        Box::pin(async move {
            if items.is_empty() {
                return Vec::new();
            }
            self.complete_all(queue, now, &items, retention_ms).await.unwrap_or_else(|e| each(items.len(), &e))
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
            let mut w = Write::begin(self).await?;
            let done = self
                .transition(&mut w, queue, id, |row| {
                    op.apply(row, now, token).map_err(|_| TransportError::StaleReceipt)?;
                    Ok(((), false))
                })
                .await;
            w.finish(done).await
        })
    }

    fn maintain<'a>(
        &'a self,
        queue: &'a str,
        now: i64,
        rules: QueueRules,
    ) -> BoxFuture<'a, Result<(), TransportError>> {
        Box::pin(self.housekeeping(queue, now, rules))
    }

    fn next_due<'a>(&'a self, queue: &'a str) -> BoxFuture<'a, Result<Option<i64>, TransportError>> {
        Box::pin(self.next(queue))
    }

    fn depth<'a>(&'a self, queue: &'a str) -> BoxFuture<'a, Result<u64, TransportError>> {
        Box::pin(self.count(sql::DEPTH, queue, "depth"))
    }

    fn errors<'a>(&'a self, queue: &'a str, max: usize) -> BoxFuture<'a, Result<Vec<Row>, TransportError>> {
        Box::pin(self.records(sql::ERRORS, queue, Some(max)))
    }

    fn redrive<'a>(&'a self, queue: &'a str, ids: Vec<RowId>) -> BoxFuture<'a, Result<usize, TransportError>> {
        Box::pin(self.redrive_rows(queue, ids))
    }

    fn error_depth<'a>(&'a self, queue: &'a str) -> BoxFuture<'a, Result<u64, TransportError>> {
        Box::pin(self.count(sql::ERROR_DEPTH, queue, "dead-letter depth"))
    }

    fn rows<'a>(&'a self, queue: &'a str) -> BoxFuture<'a, Result<Vec<Row>, TransportError>> {
        Box::pin(self.records(sql::ROWS, queue, None))
    }

    fn previous<'a>(
        &'a self,
        queue: &'a str,
        identity: &'a str,
    ) -> BoxFuture<'a, Result<Option<Vec<u8>>, TransportError>> {
        Box::pin(self.previous_of(queue, identity))
    }

    fn purge_claims(&self, before: i64) -> BoxFuture<'_, Result<u64, TransportError>> {
        Box::pin(self.purge(before))
    }

    fn idempotency_store(&self) -> Option<std::sync::Arc<dyn crate::idempotency::IdempotencyStore>> {
        Some(std::sync::Arc::new(super::claims::SqlIdempotencyStore::<D>::on(self)))
    }

    fn changes(&self) -> Option<tokio::sync::broadcast::Receiver<String>> {
        D::changes(&self.state)
    }
}
