//! [`SqlStore`]: the one [`RowStore`] over PostgreSQL and SQLite. Each
//! operation loads rows, runs their transition in [`crate::transport::sql::machine::Row`]
//! and stores them, in a transaction; only what the databases do differently
//! goes through the [`Dialect`].

mod write;

use super::dialect::{each, fail, int, rows, Dialect, SqlStore, Write};
use super::statements as sql;
use super::store::{Enqueued, LeasedRow, RowOp, RowStore};
use crate::boxed::BoxFuture;
use crate::error::TransportError;
use crate::transport::sql::machine::{Enqueue, QueueRules, Row, RowId};

impl<D: Dialect> SqlStore<D> {
    /// A count.
    async fn count(&self, template: &str, queue: &str, what: &str) -> Result<u64, TransportError> {
        let rows = self.query(what, &[template], &[queue.into()]).await?;
        Ok(int::<D>(&rows, 0, what)?.unwrap_or(0).max(0) as u64)
    }

    /// Whole rows.
    async fn records(&self, template: &str, queue: &str, limit: Option<usize>) -> Result<Vec<Row>, TransportError> {
        let limit = limit.map(|n| i64::try_from(n).unwrap_or(i64::MAX));
        let args = [queue.into(), limit.into()];
        rows::<D>(&self.query("reading messages", &[template], &args[..1 + usize::from(limit.is_some())]).await?)
    }

    /// Checks the tables and columns (see [`super::schema`]).
    async fn check(&self) -> Result<(), TransportError> {
        let what = "reading the schema";
        let rows = self.query(what, &[D::SCHEMA_COLUMNS], &[]).await?;
        let found = rows
            .iter()
            .map(|r| Ok((D::text(r, 0)?.unwrap_or_default(), D::text(r, 1)?.unwrap_or_default())))
            .collect::<Result<Vec<_>, sqlx::Error>>()
            .map_err(fail::<D>(what))?;
        super::schema::compare(D::SYSTEM, &found)
    }

    /// Records `queue` with its kind.
    async fn declare_queue(&self, queue: &str, fifo: bool, now: i64) -> Result<(), TransportError> {
        self.check().await?;
        let what = "declaring a queue";
        self.exec(what, &[sql::DECLARE], &[queue.into(), fifo.into(), now.into()]).await?;
        let rows = self.query(what, &[sql::QUEUE_KIND], &[queue.into()]).await?;
        let stored = rows.first().map(|r| D::flag(r, 0)).transpose().map_err(fail::<D>(what))?;
        super::schema::check_kind(queue, fifo, stored.unwrap_or(fifo))
    }

    /// Housekeeping: wakes due sleepers, abandons expired leases, purges
    /// processed rows past retention. Looks first, without writing: usually
    /// there is nothing to do, and on SQLite taking the write lock every
    /// 100 ms would hold up publishers.
    async fn housekeeping(&self, queue: &str, now: i64, rules: QueueRules) -> Result<(), TransportError> {
        let (what, cutoff) = ("housekeeping", now - rules.retention_ms);
        let args = [queue.into(), now.into(), (rules.retention_ms > 0).into(), cutoff.into()];
        let rows = self.query(what, &[sql::HOUSEKEEPING_DUE], &args).await?;
        let due = |i| rows.first().map(|r| D::flag(r, i)).transpose().map(Option::unwrap_or_default);
        let (sleepers, expired, purgeable) =
            (due(0).map_err(fail::<D>(what))?, due(1).map_err(fail::<D>(what))?, due(2).map_err(fail::<D>(what))?);
        if sleepers {
            self.exec("waking sleeping messages", &[sql::WAKE], &[queue.into(), now.into()]).await?;
        }
        if expired {
            let mut w = Write::begin(self).await?;
            let done = self.abandon_in(&mut w, queue, now, &rules).await;
            w.finish(done).await?;
        }
        if purgeable {
            self.exec("purging processed messages", &[sql::PURGE_PROCESSED], &[queue.into(), cutoff.into()]).await?;
        }
        Ok(())
    }

    /// Abandons the expired leases of `queue` (rows another transaction
    /// holds are being settled: skipped).
    async fn abandon_in(
        &self,
        w: &mut Write<D>,
        queue: &str,
        now: i64,
        rules: &QueueRules,
    ) -> Result<(), TransportError> {
        let args = [queue.into(), now.into()];
        let found = self.query_in(w, "finding expired leases", &[sql::EXPIRED, D::LOCK_SKIP], &args).await?;
        for mut row in rows::<D>(&found)? {
            if row.is_abandoned(now) {
                row.abandon(now, rules);
                self.store_row(w, &row).await?;
            }
        }
        Ok(())
    }

    /// The earliest sleeper or lease expiry.
    async fn next(&self, queue: &str) -> Result<Option<i64>, TransportError> {
        let what = "next due time";
        let rows = self.query(what, &[sql::NEXT_DUE], &[queue.into()]).await?;
        Ok(match (int::<D>(&rows, 0, what)?, int::<D>(&rows, 1, what)?) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        })
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

    #[cfg(test)]
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

    fn dead_letters<'a>(&'a self, queue: &'a str, max: usize) -> BoxFuture<'a, Result<Vec<Row>, TransportError>> {
        Box::pin(self.records(sql::ERRORS, queue, Some(max)))
    }

    fn redrive<'a>(&'a self, queue: &'a str, ids: Vec<RowId>) -> BoxFuture<'a, Result<usize, TransportError>> {
        Box::pin(self.redrive_rows(queue, ids))
    }

    fn error_depth<'a>(&'a self, queue: &'a str) -> BoxFuture<'a, Result<u64, TransportError>> {
        Box::pin(self.count(sql::ERROR_DEPTH, queue, "dead-letter depth"))
    }

    #[cfg(test)]
    fn rows<'a>(&'a self, queue: &'a str) -> BoxFuture<'a, Result<Vec<Row>, TransportError>> {
        Box::pin(self.records(sql::ROWS, queue, None))
    }

    #[cfg(test)]
    fn previous<'a>(
        &'a self,
        queue: &'a str,
        identity: &'a str,
    ) -> BoxFuture<'a, Result<Option<Vec<u8>>, TransportError>> {
        Box::pin(async move {
            let what = "reading the previous message";
            let rows = self.query(what, &[sql::PREVIOUS], &[queue.into(), identity.into()]).await?;
            Ok(rows.first().map(|r| D::bytes(r, 1)).transpose().map_err(fail::<D>(what))?.flatten())
        })
    }

    fn purge_claims(&self, before: i64) -> BoxFuture<'_, Result<u64, TransportError>> {
        Box::pin(async move { self.exec("purging idempotency claims", &[sql::CLAIMS_PURGE], &[before.into()]).await })
    }

    fn idempotency_store(&self) -> Option<std::sync::Arc<dyn crate::claims::IdempotencyStore>> {
        Some(std::sync::Arc::new(super::claims::SqlIdempotencyStore::<D>::on(self)))
    }

    fn changes(&self) -> Option<tokio::sync::broadcast::Receiver<String>> {
        D::changes(&self.state)
    }
}
