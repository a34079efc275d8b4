//! The outbox's table, `messaging_outbox`, written once for both databases.
//!
//! A relay claims rows with a lease (a token and an expiry), sends them, then
//! deletes them; it holds no transaction while it talks to the broker, so a
//! slow broker keeps no locks and a crashed relay's rows come back when the
//! lease ends. Claims of one queue take turns (an advisory lock on
//! PostgreSQL, the write lock on SQLite), which is what lets the claim see
//! exactly which FIFO groups another relay is sending: a FIFO row is claimed
//! only when no earlier row of its group is claimed or waiting for a retry,
//! so a group's rows leave in order whatever the number of relays.

use std::any::Any;
use std::time::Duration;

use super::dialect::{fail, Dialect, Home, SqlStore, Write};
use super::driver::Value;
use crate::boxed::BoxFuture;
use crate::error::TransportError;
use crate::transport::outbox_store::{Claimed, FailedOutboxRow, OutboxQueue, OutboxStore, OutboxWrite, Settle, WAKE};
use crate::transport::{MessageId, Outgoing};

const INSERT: &str = "INSERT INTO messaging_outbox (queue, message_id, fifo, group_id, dedup_id, identity, payload, \
    attributes, priority, delay_ms, created_at, next_at) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $11)";

/// Claims (`$1` queue, `$2` token, `$3` now, `$4` lease, `$5` at most) the
/// first rows of a queue that may leave now. Integers are cast so that both
/// drivers decode them as BIGINT.
const CLAIM: &str = "UPDATE messaging_outbox SET lease_token = $2, lease_expires = $3 + $4, attempts = attempts + 1 \
    WHERE id IN (SELECT o.id FROM messaging_outbox o WHERE o.queue = $1 AND o.status = 'pending' \
        AND o.next_at <= $3 AND (o.lease_expires IS NULL OR o.lease_expires <= $3) \
        AND NOT (o.fifo AND EXISTS (SELECT 1 FROM messaging_outbox p WHERE p.queue = o.queue AND p.fifo \
            AND p.group_id = o.group_id AND p.status = 'pending' AND p.id < o.id \
            AND (p.next_at > $3 OR p.lease_expires > $3))) \
        ORDER BY o.id LIMIT $5) \
    RETURNING id, message_id, fifo, group_id, dedup_id, identity, payload, attributes, \
        CAST(priority AS BIGINT), delay_ms, CAST(attempts AS BIGINT)";

/// Rows deleted per statement once sent: a fixed list of ids (the last one
/// repeated to fill it), so that one prepared statement serves every batch.
const DELETE_EACH: usize = 10;

const RETRY: &str = "UPDATE messaging_outbox SET lease_token = NULL, lease_expires = NULL, next_at = $3, error = $4 \
    WHERE id = $1 AND lease_token = $2";
const FAILED: &str = "UPDATE messaging_outbox SET status = 'failed', lease_token = NULL, lease_expires = NULL, \
    error = $3 WHERE id = $1 AND lease_token = $2";
const UNTRIED: &str = "UPDATE messaging_outbox SET lease_token = NULL, lease_expires = NULL, \
    attempts = attempts - 1 WHERE id = $1 AND lease_token = $2";
const STATS: &str = "SELECT queue, status, count(*), min(created_at) FROM messaging_outbox \
    GROUP BY queue, status ORDER BY queue";
const LIST_FAILED: &str = "SELECT queue, message_id, CAST(attempts AS BIGINT), error, created_at \
    FROM messaging_outbox WHERE status = 'failed' ORDER BY id LIMIT $1";
const RETRY_FAILED: &str = "UPDATE messaging_outbox SET status = 'pending', attempts = 0, next_at = $1, \
    error = NULL, lease_token = NULL, lease_expires = NULL WHERE status = 'failed' AND (queue = $2 OR $3)";
/// Reads nothing: fails when the table is missing.
const PROBE: &str = "SELECT count(*) FROM messaging_outbox WHERE 1 = 0";

/// The statement deleting [`DELETE_EACH`] sent rows of a claim.
fn delete_statement() -> String {
    let ids: Vec<String> = (0..DELETE_EACH).map(|i| format!("${}", i + 2)).collect();
    format!("DELETE FROM messaging_outbox WHERE lease_token = $1 AND id IN ({})", ids.join(", "))
}

/// The outbox's rows in a database.
pub(crate) struct SqlOutbox<D: Dialect> {
    pub(crate) store: SqlStore<D>,
    /// The outbox's database, which a caller's transaction must be on.
    home: Home,
}

impl<D: Dialect> SqlOutbox<D> {
    /// Fails with a sentence naming the fix when the table is missing.
    pub(crate) async fn check(&self) -> Result<(), TransportError> {
        match self.store.query("reading the outbox", &[PROBE], &[]).await {
            Ok(_) => Ok(()),
            Err(e) if e.to_string().contains(D::MISSING_TABLE) => Err(TransportError::Backend(format!(
                "{}: the outbox's table `messaging_outbox` is missing: run the `migrate` command (or add \
                 `?migrate=true` to the outbox's URL)",
                D::SYSTEM
            ))),
            Err(e) => Err(e),
        }
    }

    async fn claim_rows(
        &self,
        queue: &str,
        max: usize,
        lease: Duration,
    ) -> Result<(i64, Vec<Claimed>), TransportError> {
        let token = fastrand::i64(1..i64::MAX);
        let now = self.store.now();
        let lock = format!("messaging:outbox:{}:{queue}", self.store.tables.schema().as_deref().unwrap_or(""));
        let mut w = Write::begin(&self.store).await?;
        let claimed = async {
            self.store.query_in(&mut w, "locking the outbox", &[D::OUTBOX_LOCK], &[lock.as_str().into()]).await?;
            let args = [queue.into(), token.into(), now.into(), (lease.as_millis() as i64).into(), (max as i64).into()];
            let rows = self.store.query_in(&mut w, "claiming outbox rows", &[CLAIM], &args).await?;
            rows.iter().map(|r| claimed::<D>(r).map_err(fail::<D>("reading an outbox row"))).collect()
        }
        .await;
        let mut claimed: Vec<Claimed> = w.finish(claimed).await?;
        claimed.sort_by_key(|c| c.id);
        Ok((token, claimed))
    }

    async fn settle_rows(&self, token: i64, outcomes: Vec<(i64, Settle)>) -> Result<(), TransportError> {
        if outcomes.is_empty() {
            return Ok(());
        }
        let mut w = Write::begin(&self.store).await?;
        let done = async {
            let sent: Vec<i64> = outcomes.iter().filter(|(_, s)| *s == Settle::Sent).map(|(id, _)| *id).collect();
            let delete = delete_statement();
            for chunk in sent.chunks(DELETE_EACH) {
                let mut args: Vec<Value<'_>> = vec![token.into()];
                args.extend((0..DELETE_EACH).map(|i| Value::from(chunk[i.min(chunk.len() - 1)])));
                self.store.exec_in(&mut w, "deleting sent outbox rows", &[&delete], &args).await?;
            }
            for (id, outcome) in &outcomes {
                match outcome {
                    Settle::Sent => {}
                    Settle::Retry { at_ms, error } => {
                        let args = [(*id).into(), token.into(), (*at_ms).into(), error.as_str().into()];
                        self.store.exec_in(&mut w, "releasing an outbox row", &[RETRY], &args).await?;
                    }
                    Settle::Failed { error } => {
                        let args = [(*id).into(), token.into(), error.as_str().into()];
                        self.store.exec_in(&mut w, "setting an outbox row aside", &[FAILED], &args).await?;
                    }
                    Settle::Untried => {
                        let args = [(*id).into(), token.into()];
                        self.store.exec_in(&mut w, "releasing an outbox row", &[UNTRIED], &args).await?;
                    }
                }
            }
            Ok(())
        }
        .await;
        w.finish(done).await
    }

    async fn stats_rows(&self) -> Result<Vec<OutboxQueue>, TransportError> {
        let rows = self.store.query("reading the outbox", &[STATS], &[]).await?;
        let now = self.store.now();
        let mut queues: Vec<OutboxQueue> = Vec::new();
        for r in &rows {
            let read = fail::<D>("reading the outbox");
            let queue = D::text(r, 0).map_err(&read)?.unwrap_or_default();
            let status = D::text(r, 1).map_err(&read)?.unwrap_or_default();
            let count = D::int(r, 2).map_err(&read)?.unwrap_or(0).max(0) as u64;
            let oldest = D::int(r, 3).map_err(&read)?;
            if queues.last().is_none_or(|q| q.queue != queue) {
                queues.push(OutboxQueue { queue, pending: 0, failed: 0, oldest_pending_ms: None });
            }
            let Some(q) = queues.last_mut() else { continue };
            if status == "failed" {
                q.failed = count;
            } else {
                q.pending = count;
                q.oldest_pending_ms = oldest.map(|at| (now - at).max(0) as u64);
            }
        }
        Ok(queues)
    }

    async fn failed_rows(&self, max: usize) -> Result<Vec<FailedOutboxRow>, TransportError> {
        let rows = self.store.query("reading the outbox", &[LIST_FAILED], &[(max as i64).into()]).await?;
        let read = fail::<D>("reading the outbox");
        rows.iter()
            .map(|r| {
                Ok(FailedOutboxRow {
                    queue: D::text(r, 0).map_err(&read)?.unwrap_or_default(),
                    message_id: D::text(r, 1).map_err(&read)?.unwrap_or_default(),
                    attempts: D::int(r, 2).map_err(&read)?.unwrap_or(0).max(0) as u32,
                    error: D::text(r, 3).map_err(&read)?,
                    created_at_ms: D::int(r, 4).map_err(&read)?.unwrap_or(0),
                })
            })
            .collect()
    }
}

/// A claimed row, as [`CLAIM`] returns it.
fn claimed<D: Dialect>(r: &D::Row) -> Result<Claimed, sqlx::Error> {
    let attributes = D::text(r, 7)?.unwrap_or_default();
    Ok(Claimed {
        id: D::int(r, 0)?.unwrap_or_default(),
        message_id: MessageId::from(D::text(r, 1)?.unwrap_or_default()),
        fifo: D::flag(r, 2)?,
        outgoing: Outgoing {
            group_id: D::text(r, 3)?,
            dedup_id: D::text(r, 4)?,
            identity: D::text(r, 5)?,
            body: D::bytes(r, 6)?.unwrap_or_default().into(),
            attributes: super::decode_attributes(&attributes),
            priority: D::int(r, 8)?.unwrap_or(0) as i32,
            delay: D::int(r, 9)?.filter(|ms| *ms > 0).map(|ms| Duration::from_millis(ms as u64)),
        },
        attempts: D::int(r, 10)?.unwrap_or(0).max(0) as u32,
    })
}

impl<D: Dialect> OutboxStore for SqlOutbox<D> {
    fn system(&self) -> &'static str {
        D::SYSTEM
    }

    fn write<'a>(
        &'a self,
        conn: &'a mut (dyn Any + Send),
        rows: Vec<OutboxWrite>,
    ) -> BoxFuture<'a, Result<Vec<MessageId>, TransportError>> {
        Box::pin(async move {
            let Some(conn) = conn.downcast_mut::<D::Connection>() else {
                return Err(TransportError::Rejected(format!(
                    "the transaction is not on {}, where the outbox is: publish inside a transaction on the \
                     outbox's database",
                    D::SYSTEM
                )));
            };
            self.home.check(&self.store, conn, "the outbox").await?;
            let now = self.store.now();
            let mut ids = Vec::with_capacity(rows.len());
            let mut w = Write::on(conn);
            for row in &rows {
                let id = MessageId::random();
                let m = &row.outgoing;
                let attributes = super::encode_attributes(&m.attributes);
                let delay = m.delay.filter(|d| !d.is_zero()).map(|d| d.as_millis() as i64);
                let args = [
                    row.queue.into(),
                    id.as_str().into(),
                    row.fifo.into(),
                    m.group_id.as_deref().into(),
                    m.dedup_id.as_deref().into(),
                    m.identity.as_deref().into(),
                    m.body.as_ref().into(),
                    attributes.as_str().into(),
                    m.priority.into(),
                    delay.into(),
                    now.into(),
                ];
                self.store.exec_in(&mut w, "writing to the outbox", &[INSERT], &args).await?;
                ids.push(id);
            }
            drop(w);
            D::notify_in(conn, WAKE).await;
            Ok(ids)
        })
    }

    fn claim<'a>(
        &'a self,
        queue: &'a str,
        max: usize,
        lease: Duration,
    ) -> BoxFuture<'a, Result<(i64, Vec<Claimed>), TransportError>> {
        Box::pin(self.claim_rows(queue, max, lease))
    }

    fn settle(&self, token: i64, outcomes: Vec<(i64, Settle)>) -> BoxFuture<'_, Result<(), TransportError>> {
        Box::pin(self.settle_rows(token, outcomes))
    }

    fn stats(&self) -> BoxFuture<'_, Result<Vec<OutboxQueue>, TransportError>> {
        Box::pin(self.stats_rows())
    }

    fn failed(&self, max: usize) -> BoxFuture<'_, Result<Vec<FailedOutboxRow>, TransportError>> {
        Box::pin(self.failed_rows(max))
    }

    fn retry_failed<'a>(&'a self, queue: Option<&'a str>) -> BoxFuture<'a, Result<u64, TransportError>> {
        Box::pin(async move {
            let args = [self.store.now().into(), queue.unwrap_or("").into(), queue.is_none().into()];
            self.store.exec("retrying failed outbox rows", &[RETRY_FAILED], &args).await
        })
    }

    fn now(&self) -> i64 {
        self.store.now()
    }

    fn changes(&self) -> Option<tokio::sync::broadcast::Receiver<String>> {
        D::changes(&self.store.state)
    }

    fn migrate(&self) -> BoxFuture<'_, Result<(), TransportError>> {
        Box::pin(self.store.migrate())
    }

    fn schedule_ledger(&self) -> std::sync::Arc<dyn crate::transport::schedules::ScheduleLedger> {
        std::sync::Arc::new(super::schedules::SqlLedger::on(&self.store))
    }
}

/// Opens the outbox a database URL names (`postgres://…`, `sqlite://FILE`),
/// with the framework's `migrate=true`, `schema=NAME` (PostgreSQL), `poll=`
/// and `max_connections=` options.
pub(crate) async fn connect<D: Dialect>(
    url: &str,
) -> Result<(std::sync::Arc<dyn OutboxStore>, std::time::Duration), crate::error::Error> {
    let (store, options) = super::open::<D>(url).await?;
    let outbox = SqlOutbox { store, home: Home::default() };
    outbox.check().await?;
    Ok((std::sync::Arc::new(outbox), options.poll))
}

/// An outbox on a pool the application opened, its table in the
/// connection's schema.
pub(crate) fn on_pool<D: Dialect>(pool: sqlx::Pool<D>) -> std::sync::Arc<dyn OutboxStore> {
    let state = D::adopt(&pool);
    let store = SqlStore::new(pool, state);
    std::sync::Arc::new(SqlOutbox { store, home: Home::default() })
}
