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

/// The notification channel enqueues signal on (payload: the queue name).
const CHANNEL: &str = "messaging_enqueued";

/// Every column of `messaging_messages`, in the order [`row_of`] reads them.
const COLUMNS: &str = "id, queue, identity, group_id, message_id, payload, attributes, priority, process_at, status, \
    attempts, seq, lease_token, lease_expires, deferred_message_id, deferred_payload, deferred_attributes, \
    deferred_priority, deferred_process_at, deferred_status, deferred_seq, deferred_sent_at, sent_at, processed_at, error";

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

    /// Stores every column of `row` (which exists).
    async fn store_row(tx: &mut Transaction<'static, Postgres>, row: &Row) -> Result<(), TransportError> {
        let d = row.deferred.as_ref();
        sqlx::query(
            "UPDATE messaging_messages SET identity = $2, group_id = $3, message_id = $4, payload = $5, attributes = $6, \
             priority = $7, process_at = $8, status = $9, attempts = $10, seq = $11, lease_token = $12, lease_expires = $13, \
             deferred_message_id = $14, deferred_payload = $15, deferred_attributes = $16, deferred_priority = $17, \
             deferred_process_at = $18, deferred_status = $19, deferred_seq = $20, deferred_sent_at = $21, sent_at = $22, \
             processed_at = $23, error = $24 WHERE id = $1",
        )
        .bind(row.id as i64)
        .bind(&row.identity)
        .bind(&row.group)
        .bind(&row.message_id)
        .bind(&row.payload)
        .bind(&row.attributes)
        .bind(row.priority)
        .bind(row.process_at)
        .bind(row.status.as_str())
        .bind(row.attempts as i32)
        .bind(row.seq as i64)
        .bind(row.lease_token.map(|t| t as i64))
        .bind(row.lease_expires)
        .bind(d.map(|d| d.message_id.clone()))
        .bind(d.map(|d| d.payload.clone()))
        .bind(d.map(|d| d.attributes.clone()))
        .bind(d.map(|d| d.priority))
        .bind(d.and_then(|d| d.process_at))
        .bind(d.and_then(|d| d.status_after_release).map(Status::as_str))
        .bind(d.map(|d| d.seq as i64))
        .bind(d.map(|d| d.sent_at))
        .bind(row.sent_at)
        .bind(row.processed_at)
        .bind(&row.error)
        .execute(&mut **tx)
        .await
        .map_err(|e| backend("storing a message", e))?;
        Ok(())
    }

    async fn next_seq(tx: &mut Transaction<'static, Postgres>) -> Result<u64, TransportError> {
        let seq: i64 = sqlx::query_scalar("SELECT nextval('messaging_seq')")
            .fetch_one(&mut **tx)
            .await
            .map_err(|e| backend("nextval", e))?;
        Ok(seq as u64)
    }

    /// Enqueues one message with an identity: lock its row (or create it), run
    /// the transition, store.
    async fn enqueue_identity(
        &self,
        queue: &str,
        now: i64,
        e: Enqueue,
        idempotent: bool,
    ) -> Result<Enqueued, TransportError> {
        let mut tx = self.begin().await?;
        let result = Self::enqueue_identity_in(&mut tx, queue, now, e, idempotent).await;
        finish(tx, result).await
    }

    async fn enqueue_identity_in(
        tx: &mut Transaction<'static, Postgres>,
        queue: &str,
        now: i64,
        e: Enqueue,
        idempotent: bool,
    ) -> Result<Enqueued, TransportError> {
        let identity = e.identity.clone().unwrap_or_default();
        let seq = Self::next_seq(tx).await?;
        let select = format!("SELECT {COLUMNS} FROM messaging_messages WHERE queue = $1 AND identity = $2 FOR UPDATE");
        let mut existing = sqlx::query(&select)
            .bind(queue)
            .bind(&identity)
            .fetch_optional(&mut **tx)
            .await
            .map_err(|e| backend("enqueue", e))?;
        if existing.is_none() {
            if let Some(id) = insert(tx, queue, &e, seq, now, true).await? {
                return Ok(Enqueued { outcome: EnqueueOutcome::Inserted(id), message_id: e.message_id });
            }
            // Someone inserted the identity meanwhile: lock theirs.
            existing = sqlx::query(&select)
                .bind(queue)
                .bind(&identity)
                .fetch_optional(&mut **tx)
                .await
                .map_err(|e| backend("enqueue", e))?;
        }
        let Some(found) = existing else {
            return Err(TransportError::Backend("postgresql: the identity's row vanished during enqueue".into()));
        };
        let mut row = row_of(&found)?;
        let outcome = row.enqueue(now, seq, e, idempotent);
        if !matches!(outcome, EnqueueOutcome::Discarded(_)) {
            Self::store_row(tx, &row).await?;
        }
        let message_id = match (&row.status, &row.deferred) {
            (Status::AwaitingRelease, Some(d)) => d.message_id.clone(),
            _ => row.message_id.clone(),
        };
        Ok(Enqueued { outcome, message_id })
    }

    /// Loads and locks one row of `queue` (`StaleReceipt` when it is gone).
    async fn lock_row(tx: &mut Transaction<'static, Postgres>, queue: &str, id: RowId) -> Result<Row, TransportError> {
        let select = format!("SELECT {COLUMNS} FROM messaging_messages WHERE id = $1 AND queue = $2 FOR UPDATE");
        let found = sqlx::query(&select)
            .bind(id as i64)
            .bind(queue)
            .fetch_optional(&mut **tx)
            .await
            .map_err(|e| backend("loading a message", e))?
            .ok_or(TransportError::StaleReceipt)?;
        row_of(&found)
    }

    /// Writes a row back after its transition, or deletes it.
    async fn store_or_delete(
        tx: &mut Transaction<'static, Postgres>,
        row: &Row,
        delete: bool,
    ) -> Result<(), TransportError> {
        if delete {
            sqlx::query("DELETE FROM messaging_messages WHERE id = $1")
                .bind(row.id as i64)
                .execute(&mut **tx)
                .await
                .map_err(|e| backend("deleting a message", e))?;
            Ok(())
        } else {
            Self::store_row(tx, row).await
        }
    }

    /// Loads a row for update, applies `f`, stores the row (or deletes it).
    async fn with_row<R>(
        &self,
        queue: &str,
        id: RowId,
        f: impl FnOnce(&mut Row) -> Result<(R, bool), TransportError>,
    ) -> Result<R, TransportError> {
        let mut tx = self.begin().await?;
        let result = async {
            let mut row = Self::lock_row(&mut tx, queue, id).await?;
            let (result, delete) = f(&mut row)?;
            Self::store_or_delete(&mut tx, &row, delete).await?;
            Ok(result)
        }
        .await;
        finish(tx, result).await
    }

    async fn complete_one(
        &self,
        queue: &str,
        now: i64,
        id: RowId,
        token: u64,
        retention_ms: i64,
    ) -> Result<(), TransportError> {
        let mut tx = self.begin().await?;
        let result = async {
            let mut row = Self::lock_row(&mut tx, queue, id).await?;
            let done = row.complete(now, token, retention_ms).map_err(|_| TransportError::StaleReceipt)?;
            Self::store_or_delete(&mut tx, &row, done.delete).await?;
            // The processed version becomes the previous message, in the same transaction.
            if let Some((identity, message_id, payload)) = done.previous {
                sqlx::query(
                    "INSERT INTO messaging_previous (queue, identity, message_id, payload, processed_at) VALUES ($1, $2, $3, $4, $5) \
                     ON CONFLICT (queue, identity) DO UPDATE SET message_id = EXCLUDED.message_id, payload = EXCLUDED.payload, \
                     processed_at = EXCLUDED.processed_at",
                )
                .bind(queue)
                .bind(identity)
                .bind(message_id)
                .bind(payload)
                .bind(now)
                .execute(&mut *tx)
                .await
                .map_err(|e| backend("recording the previous message", e))?;
            }
        Ok(())
        }
        .await;
        finish(tx, result).await
    }

    /// Inserts messages without identity with one multi-row INSERT.
    async fn insert_plain(&self, queue: &str, now: i64, plain: Vec<Enqueue>) -> Vec<Result<Enqueued, TransportError>> {
        let rows: Vec<Row> = plain.iter().map(|e| Row::new(0, 0, now, e.clone())).collect();
        let inserted = sqlx::query(
            "INSERT INTO messaging_messages (queue, group_id, message_id, payload, attributes, priority, process_at, \
             status, attempts, seq, sent_at) \
             SELECT $1, g, m, p, a, pr, pa, s, 0, nextval('messaging_seq'), $2 \
             FROM UNNEST($3::text[], $4::text[], $5::bytea[], $6::text[], $7::int[], $8::bigint[], $9::text[]) \
                WITH ORDINALITY AS t(g, m, p, a, pr, pa, s, ord) ORDER BY ord \
             RETURNING id, message_id",
        )
        .bind(queue)
        .bind(now)
        .bind(rows.iter().map(|r| r.group.clone()).collect::<Vec<_>>())
        .bind(rows.iter().map(|r| r.message_id.clone()).collect::<Vec<_>>())
        .bind(rows.iter().map(|r| r.payload.clone()).collect::<Vec<_>>())
        .bind(rows.iter().map(|r| r.attributes.clone()).collect::<Vec<_>>())
        .bind(rows.iter().map(|r| r.priority).collect::<Vec<_>>())
        .bind(rows.iter().map(|r| r.process_at).collect::<Vec<_>>())
        .bind(rows.iter().map(|r| r.status.as_str()).collect::<Vec<_>>())
        .fetch_all(&self.pool)
        .await;
        let inserted = match inserted {
            Ok(inserted) => inserted,
            Err(err) => {
                let message = format!("postgresql: enqueue failed: {err}");
                return plain.iter().map(|_| Err(TransportError::Backend(message.clone()))).collect();
            }
        };
        let ids: std::collections::HashMap<String, i64> = inserted
            .iter()
            .filter_map(|r| Some((r.try_get::<String, _>("message_id").ok()?, r.try_get::<i64, _>("id").ok()?)))
            .collect();
        plain
            .into_iter()
            .map(|e| match ids.get(&e.message_id) {
                Some(id) => Ok(Enqueued { outcome: EnqueueOutcome::Inserted(*id as RowId), message_id: e.message_id }),
                None => Err(TransportError::Backend("postgresql: enqueue returned no id".into())),
            })
            .collect()
    }

    /// Leases up to `n` pending rows, from partition `id % of == part` only
    /// when given (`of` is then at least 1).
    async fn lease_standard(
        &self,
        queue: &str,
        now: i64,
        n: usize,
        lease_ms: i64,
        partition: Option<(u32, u32)>,
    ) -> Result<Vec<LeasedRow>, TransportError> {
        // One token for the whole lease: fencing compares (row, token), and a
        // later lease of any of these rows draws a newer token.
        const WHOLE: &str = "WITH picked AS ( \
                SELECT id FROM messaging_messages WHERE queue = $1 AND status = 'pending' \
                ORDER BY priority DESC, seq LIMIT $2 FOR UPDATE SKIP LOCKED), \
             token AS (SELECT nextval('messaging_seq') AS value) \
             UPDATE messaging_messages m SET status = 'processing', lease_token = token.value, \
                lease_expires = $3, attempts = m.attempts + 1 \
             FROM picked, token WHERE m.id = picked.id \
             RETURNING m.id, m.lease_token, m.message_id, m.payload, m.attempts, m.group_id, m.attributes, m.sent_at, \
                m.priority, m.seq";
        // The partition filter applies before rows are locked, so concurrent
        // leases of different partitions never lock each other's rows.
        const PART: &str = "WITH picked AS ( \
                SELECT id FROM messaging_messages WHERE queue = $1 AND status = 'pending' AND id % $5 = $4 \
                ORDER BY priority DESC, seq LIMIT $2 FOR UPDATE SKIP LOCKED), \
             token AS (SELECT nextval('messaging_seq') AS value) \
             UPDATE messaging_messages m SET status = 'processing', lease_token = token.value, \
                lease_expires = $3, attempts = m.attempts + 1 \
             FROM picked, token WHERE m.id = picked.id \
             RETURNING m.id, m.lease_token, m.message_id, m.payload, m.attempts, m.group_id, m.attributes, m.sent_at, \
                m.priority, m.seq";
        let query = match partition {
            None => sqlx::query(WHOLE).bind(queue).bind(n as i64).bind(now + lease_ms),
            Some((part, of)) => sqlx::query(PART)
                .bind(queue)
                .bind(n as i64)
                .bind(now + lease_ms)
                .bind(i64::from(part))
                .bind(i64::from(of.max(1))),
        };
        let rows = query.fetch_all(&self.pool).await.map_err(|e| backend("lease", e))?;
        let mut leased = rows.iter().map(leased_of).collect::<Result<Vec<_>, _>>()?;
        leased.sort_by(|a, b| b.1.cmp(&a.1).then(a.2.cmp(&b.2)));
        Ok(leased.into_iter().map(|(l, _, _)| l).collect())
    }

    /// FIFO: the head of each group with nothing leased, one per group, in
    /// enqueue order. Leasing is serialized per queue with an advisory lock.
    async fn lease_fifo(
        &self,
        queue: &str,
        now: i64,
        n: usize,
        lease_ms: i64,
    ) -> Result<Vec<LeasedRow>, TransportError> {
        let mut tx = self.begin().await?;
        let result = async {
            sqlx::query("SELECT pg_advisory_xact_lock(hashtext('messaging:' || $1))")
                .bind(queue)
                .execute(&mut *tx)
                .await
                .map_err(|e| backend("lease lock", e))?;
            let heads: Vec<i64> = sqlx::query_scalar(
                "SELECT id FROM ( \
                    SELECT DISTINCT ON (group_id) id, group_id, status, seq FROM messaging_messages \
                    WHERE queue = $1 AND group_id IS NOT NULL AND status IN ('pending', 'sleeping') \
                    ORDER BY group_id, seq) heads \
                 WHERE status = 'pending' AND NOT EXISTS ( \
                    SELECT 1 FROM messaging_messages l WHERE l.queue = $1 \
                    AND l.group_id = heads.group_id \
                    AND l.status IN ('processing', 'awaiting_release')) \
                 ORDER BY seq LIMIT $2",
            )
            .bind(queue)
            .bind(n as i64)
            .fetch_all(&mut *tx)
            .await
            .map_err(|e| backend("lease", e))?;
            let rows = sqlx::query(
                "UPDATE messaging_messages SET status = 'processing', \
                    lease_token = (SELECT nextval('messaging_seq')), lease_expires = $2, attempts = attempts + 1 \
                 WHERE id = ANY($1) AND status = 'pending' \
                 RETURNING id, lease_token, message_id, payload, attempts, group_id, attributes, sent_at, priority, seq",
            )
            .bind(&heads)
            .bind(now + lease_ms)
            .fetch_all(&mut *tx)
            .await
            .map_err(|e| backend("lease", e))?;
        Ok(rows)
        }
        .await;
        let rows = finish(tx, result).await?;
        let mut leased = rows.iter().map(leased_of).collect::<Result<Vec<_>, _>>()?;
        leased.sort_by_key(|(_, _, seq)| *seq);
        Ok(leased.into_iter().map(|(l, _, _)| l).collect())
    }
}

/// Inserts a new row; `None` when the identity exists already (ON CONFLICT).
async fn insert(
    tx: &mut Transaction<'static, Postgres>,
    queue: &str,
    e: &Enqueue,
    seq: u64,
    now: i64,
    guard_identity: bool,
) -> Result<Option<RowId>, TransportError> {
    let row = Row::new(0, seq, now, e.clone());
    let sql = if guard_identity {
        "INSERT INTO messaging_messages (queue, identity, group_id, message_id, payload, attributes, priority, process_at, \
         status, attempts, seq, sent_at) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, 0, $10, $11) \
         ON CONFLICT (queue, identity) WHERE identity IS NOT NULL DO NOTHING RETURNING id"
    } else {
        "INSERT INTO messaging_messages (queue, identity, group_id, message_id, payload, attributes, priority, process_at, \
         status, attempts, seq, sent_at) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, 0, $10, $11) RETURNING id"
    };
    let id: Option<i64> = sqlx::query_scalar(sql)
        .bind(queue)
        .bind(&row.identity)
        .bind(&row.group)
        .bind(&row.message_id)
        .bind(&row.payload)
        .bind(&row.attributes)
        .bind(row.priority)
        .bind(row.process_at)
        .bind(row.status.as_str())
        .bind(seq as i64)
        .bind(now)
        .fetch_optional(&mut **tx)
        .await
        .map_err(|e| backend("enqueue", e))?;
    Ok(id.map(|id| id as RowId))
}

/// A leased row, with its priority and seq for ordering.
fn leased_of(r: &PgRow) -> Result<(LeasedRow, i32, i64), TransportError> {
    let get = |e: sqlx::Error| backend("reading a leased row", e);
    Ok((
        LeasedRow {
            id: r.try_get::<i64, _>("id").map_err(get)? as RowId,
            token: r.try_get::<i64, _>("lease_token").map_err(get)? as u64,
            message_id: r.try_get("message_id").map_err(get)?,
            payload: r.try_get("payload").map_err(get)?,
            attempts: r.try_get::<i32, _>("attempts").map_err(get)? as u32,
            group: r.try_get("group_id").map_err(get)?,
            attributes: r.try_get("attributes").map_err(get)?,
            sent_at: r.try_get("sent_at").map_err(get)?,
        },
        r.try_get("priority").map_err(get)?,
        r.try_get("seq").map_err(get)?,
    ))
}

/// Reads a whole row (columns as in [`COLUMNS`]).
fn row_of(r: &PgRow) -> Result<Row, TransportError> {
    let get = |e: sqlx::Error| backend("reading a message", e);
    let status = |text: Option<String>| -> Result<Option<Status>, TransportError> {
        match text {
            None => Ok(None),
            Some(t) => Status::parse(&t).map(Some).ok_or_else(|| {
                TransportError::Backend(format!("postgresql: unknown status `{t}` in messaging_messages"))
            }),
        }
    };
    let deferred_payload: Option<Vec<u8>> = r.try_get("deferred_payload").map_err(get)?;
    let deferred = match deferred_payload {
        None => None,
        Some(payload) => Some(Deferred {
            message_id: r.try_get::<Option<String>, _>("deferred_message_id").map_err(get)?.unwrap_or_default(),
            payload,
            priority: r.try_get::<Option<i32>, _>("deferred_priority").map_err(get)?.unwrap_or_default(),
            process_at: r.try_get("deferred_process_at").map_err(get)?,
            status_after_release: status(r.try_get("deferred_status").map_err(get)?)?,
            seq: r.try_get::<Option<i64>, _>("deferred_seq").map_err(get)?.unwrap_or_default() as u64,
            attributes: r.try_get::<Option<String>, _>("deferred_attributes").map_err(get)?.unwrap_or_default(),
            sent_at: r.try_get::<Option<i64>, _>("deferred_sent_at").map_err(get)?.unwrap_or_default(),
        }),
    };
    Ok(Row {
        id: r.try_get::<i64, _>("id").map_err(get)? as RowId,
        identity: r.try_get("identity").map_err(get)?,
        group: r.try_get("group_id").map_err(get)?,
        message_id: r.try_get("message_id").map_err(get)?,
        payload: r.try_get("payload").map_err(get)?,
        priority: r.try_get("priority").map_err(get)?,
        process_at: r.try_get("process_at").map_err(get)?,
        status: status(Some(r.try_get("status").map_err(get)?))?.unwrap_or(Status::Pending),
        attempts: r.try_get::<i32, _>("attempts").map_err(get)? as u32,
        seq: r.try_get::<i64, _>("seq").map_err(get)? as u64,
        lease_token: r.try_get::<Option<i64>, _>("lease_token").map_err(get)?.map(|t| t as u64),
        lease_expires: r.try_get("lease_expires").map_err(get)?,
        deferred,
        processed_at: r.try_get("processed_at").map_err(get)?,
        error: r.try_get("error").map_err(get)?,
        attributes: r.try_get("attributes").map_err(get)?,
        sent_at: r.try_get("sent_at").map_err(get)?,
    })
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
