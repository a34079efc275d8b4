//! Row transitions, enqueues and leases: the statements behind `RowStore`.

use super::*;

impl PostgresStore {
    /// Stores every column of `row` (which exists).
    pub(super) async fn store_row(tx: &mut Transaction<'static, Postgres>, row: &Row) -> Result<(), TransportError> {
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

    pub(super) async fn next_seq(tx: &mut Transaction<'static, Postgres>) -> Result<u64, TransportError> {
        let seq: i64 = sqlx::query_scalar("SELECT nextval('messaging_seq')")
            .fetch_one(&mut **tx)
            .await
            .map_err(|e| backend("nextval", e))?;
        Ok(seq as u64)
    }

    /// Enqueues one message with an identity: lock its row (or create it), run
    /// the transition, store.
    pub(super) async fn enqueue_identity(
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

    pub(super) async fn enqueue_identity_in(
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
    pub(super) async fn lock_row(
        tx: &mut Transaction<'static, Postgres>,
        queue: &str,
        id: RowId,
    ) -> Result<Row, TransportError> {
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
    pub(super) async fn store_or_delete(
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
    pub(super) async fn with_row<R>(
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

    pub(super) async fn complete_one(
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
    pub(super) async fn insert_plain(
        &self,
        queue: &str,
        now: i64,
        plain: Vec<Enqueue>,
    ) -> Vec<Result<Enqueued, TransportError>> {
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
    pub(super) async fn lease_standard(
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
    pub(super) async fn lease_fifo(
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
