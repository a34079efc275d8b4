//! The bodies of the write transactions: enqueue, lease, complete, abandon
//! and redrive, each given the connection of a `BEGIN IMMEDIATE` transaction.

use super::*;

impl SqliteStore {
    /// Enqueues a batch in one transaction, in input order: messages without
    /// identity in multi-row inserts, the others one by one (each may meet
    /// an existing row, or one made earlier in the batch).
    pub(super) async fn enqueue_in(
        conn: &mut SqliteConnection,
        queue: &str,
        now: i64,
        items: Vec<Enqueue>,
        idempotent: bool,
    ) -> Result<Vec<Enqueued>, TransportError> {
        let first = reserve(conn, items.len()).await?;
        let mut out: Vec<Option<Enqueued>> = (0..items.len()).map(|_| None).collect();
        let mut plain = Vec::new();
        for (i, (seq, e)) in (first..).zip(items).enumerate() {
            let Some(identity) = &e.identity else {
                plain.push((i, Row::new(0, seq, now, e)));
                continue;
            };
            let Some(mut row) = load_identity(conn, queue, identity).await? else {
                let message_id = e.message_id.clone();
                let id = insert(conn, queue, e, seq, now).await?;
                out[i] = Some(Enqueued { outcome: EnqueueOutcome::Inserted(id), message_id });
                continue;
            };
            let outcome = row.enqueue(now, seq, e, idempotent);
            if !matches!(outcome, EnqueueOutcome::Discarded(_)) {
                store_row(conn, &row).await?;
            }
            let message_id = match (&row.status, &row.deferred) {
                (Status::AwaitingRelease, Some(d)) => d.message_id.clone(),
                _ => row.message_id.clone(),
            };
            out[i] = Some(Enqueued { outcome, message_id });
        }
        let ids = insert_many(conn, queue, plain.iter().map(|(_, row)| row), now).await?;
        for (i, row) in plain {
            let id = ids.get(&row.seq).copied().ok_or_else(|| {
                TransportError::Backend(format!("sqlite: the insert returned no row for sequence {}", row.seq))
            })?;
            out[i] = Some(Enqueued { outcome: EnqueueOutcome::Inserted(id), message_id: row.message_id });
        }
        Ok(out.into_iter().flatten().collect())
    }

    /// Leases the rows that `pick` (one of [`PICK_STANDARD`], [`PICK_FIFO`];
    /// `?1` the queue, `?2` the limit) selects, in its order.
    pub(super) async fn lease_in(
        conn: &mut SqliteConnection,
        pick: &str,
        queue: &str,
        now: i64,
        n: usize,
        lease_ms: i64,
    ) -> Result<Vec<LeasedRow>, TransportError> {
        let ids: Vec<i64> = sqlx::query_scalar(pick)
            .bind(queue)
            .bind(int(n))
            .fetch_all(&mut *conn)
            .await
            .map_err(|e| backend("lease", e))?;
        lease_ids(conn, &ids, now, lease_ms).await
    }

    /// Completes a batch in one transaction: plain rows with two statements
    /// for the whole batch (find those whose lease matches, then delete or
    /// mark them), the others (identity rows, deferred versions, lost leases)
    /// through [`Row::complete`]. The outer error fails the whole batch.
    pub(super) async fn complete_in(
        conn: &mut SqliteConnection,
        queue: &str,
        now: i64,
        items: &[(RowId, u64)],
        retention_ms: i64,
    ) -> Result<Vec<Result<(), TransportError>>, TransportError> {
        let held: Vec<(i64, i64)> = sqlx::query_as(
            "SELECT id, lease_token FROM messaging_messages WHERE id IN (SELECT value FROM json_each(?1)) \
             AND queue = ?2 AND status = 'processing' AND identity IS NULL AND lease_expires > ?3",
        )
        .bind(json_ids(items.iter().map(|&(id, _)| id as i64)))
        .bind(queue)
        .bind(now)
        .fetch_all(&mut *conn)
        .await
        .map_err(|e| backend("completing messages", e))?;
        let mut held: std::collections::HashMap<i64, i64> = held.into_iter().collect();
        let plain: Vec<i64> = items
            .iter()
            .filter(|&&(id, token)| held.get(&(id as i64)) == Some(&(token as i64)))
            .map(|&(id, _)| id as i64)
            .collect();
        if !plain.is_empty() {
            let fast = if retention_ms <= 0 {
                "DELETE FROM messaging_messages WHERE id IN (SELECT value FROM json_each(?1))"
            } else {
                "UPDATE messaging_messages SET status = 'processed', processed_at = ?2, lease_token = NULL, \
                 lease_expires = NULL WHERE id IN (SELECT value FROM json_each(?1))"
            };
            sqlx::query(fast)
                .bind(json_ids(plain.iter().copied()))
                .bind(now)
                .execute(&mut *conn)
                .await
                .map_err(|e| backend("completing messages", e))?;
        }
        let mut results = Vec::with_capacity(items.len());
        for &(id, token) in items {
            if held.get(&(id as i64)) == Some(&(token as i64)) {
                // Once: the same receipt twice in a batch finds the row gone.
                held.remove(&(id as i64));
                results.push(Ok(()));
                continue;
            }
            let mut previous = None;
            let outcome = transition(conn, queue, id, |row| {
                let done = row.complete(now, token, retention_ms).map_err(|_| TransportError::StaleReceipt)?;
                previous = done.previous;
                Ok(((), done.delete))
            })
            .await;
            match outcome {
                Ok(()) => {
                    if let Some((identity, message_id, payload)) = previous {
                        record_previous(conn, queue, &identity, &message_id, &payload, now).await?;
                    }
                    results.push(Ok(()));
                }
                Err(TransportError::StaleReceipt) => results.push(Err(TransportError::StaleReceipt)),
                Err(e) => return Err(e),
            }
        }
        Ok(results)
    }

    /// Abandons the expired leases of `queue`.
    pub(super) async fn abandon_in(
        conn: &mut SqliteConnection,
        queue: &str,
        now: i64,
        rules: &QueueRules,
    ) -> Result<(), TransportError> {
        let select = format!(
            "SELECT {COLUMNS} FROM messaging_messages WHERE queue = ?1 \
             AND status IN ('processing', 'awaiting_release') AND lease_expires <= ?2"
        );
        let expired = sqlx::query(&select)
            .bind(queue)
            .bind(now)
            .fetch_all(&mut *conn)
            .await
            .map_err(|e| backend("finding expired leases", e))?;
        for found in &expired {
            let mut row = row_of(found)?;
            if row.is_abandoned(now) {
                row.abandon(now, rules);
                store_row(conn, &row).await?;
            }
        }
        Ok(())
    }

    /// Error → Pending with attempts reset, at the back of the queue, in the order given.
    pub(super) async fn redrive_in(
        conn: &mut SqliteConnection,
        queue: &str,
        ids: &[RowId],
    ) -> Result<usize, TransportError> {
        let first = reserve(conn, ids.len()).await?;
        let mut moved = 0;
        for (seq, &id) in (first..).zip(ids) {
            let done = sqlx::query(
                "UPDATE messaging_messages SET status = 'pending', attempts = 0, process_at = NULL, seq = ?1 \
                 WHERE id = ?2 AND queue = ?3 AND status = 'error'",
            )
            .bind(seq as i64)
            .bind(id as i64)
            .bind(queue)
            .execute(&mut *conn)
            .await
            .map_err(|e| backend("redrive", e))?;
            moved += done.rows_affected() as usize;
        }
        Ok(moved)
    }
}

/// Standard queues: the first pending rows by priority, then enqueue order.
pub(super) const PICK_STANDARD: &str = "SELECT id FROM messaging_messages WHERE queue = ?1 AND status = 'pending' \
     ORDER BY priority DESC, seq LIMIT ?2";

/// FIFO: the head of each group with nothing leased, one per group, in
/// enqueue order. The head of a group (rows without a group form one) is its
/// earliest pending or sleeping row; a sleeping head holds the group back.
/// With min(), SQLite takes the bare columns from the row holding the minimum.
pub(super) const PICK_FIFO: &str = "SELECT id FROM ( \
        SELECT id, group_id, status, min(seq) AS seq FROM messaging_messages \
        WHERE queue = ?1 AND status IN ('pending', 'sleeping') GROUP BY group_id) heads \
     WHERE status = 'pending' AND NOT EXISTS ( \
        SELECT 1 FROM messaging_messages l WHERE l.queue = ?1 AND l.group_id IS heads.group_id \
        AND l.status IN ('processing', 'awaiting_release')) \
     ORDER BY seq LIMIT ?2";
