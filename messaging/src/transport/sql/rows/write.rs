//! Writes: enqueues, row transitions and completions.

use super::*;
use crate::transport::sql::machine::{EnqueueOutcome, Status};

impl<D: Dialect> SqlStore<D> {
    /// Enqueues a batch on `w`, in input order: runs of messages without
    /// identity in one multi-row insert each, the others one by one (each may
    /// meet an existing row, or one made earlier in the batch).
    pub(super) async fn enqueue_in(
        &self,
        w: &mut Write<'_, D>,
        queue: &str,
        now: i64,
        items: Vec<Enqueue>,
        idempotent: bool,
    ) -> Result<Vec<Enqueued>, TransportError> {
        let mut out = Vec::with_capacity(items.len());
        let mut run: Vec<Row> = Vec::new();
        for e in items {
            if e.identity.is_none() {
                run.push(Row::new(0, 0, now, e));
                continue;
            }
            self.insert_run(w, queue, now, &mut run, &mut out).await?;
            out.push(self.enqueue_identity(w, queue, now, e, idempotent).await?);
        }
        self.insert_run(w, queue, now, &mut run, &mut out).await?;
        Ok(out)
    }

    async fn insert_run(
        &self,
        w: &mut Write<'_, D>,
        queue: &str,
        now: i64,
        run: &mut Vec<Row>,
        out: &mut Vec<Enqueued>,
    ) -> Result<(), TransportError> {
        if run.is_empty() {
            return Ok(());
        }
        let ids = D::insert_plain(w.conn(), &self.tables, queue, now, run).await?;
        if ids.len() != run.len() {
            return Err(TransportError::Backend(format!("{}: the insert returned too few ids", D::SYSTEM)));
        }
        out.extend(
            run.drain(..)
                .zip(ids)
                .map(|(row, id)| Enqueued { outcome: EnqueueOutcome::Inserted(id), message_id: row.message_id }),
        );
        Ok(())
    }

    /// Enqueues one message with an identity: lock its row (or create it),
    /// run the transition, store. On an idempotent queue a message equal to
    /// the identity's last processed version is discarded, also when its row
    /// is gone (processed rows are deleted at once by default).
    async fn enqueue_identity(
        &self,
        w: &mut Write<'_, D>,
        queue: &str,
        now: i64,
        e: Enqueue,
        idempotent: bool,
    ) -> Result<Enqueued, TransportError> {
        let identity = e.identity.clone().unwrap_or_default();
        let seq = D::next_seq(w.conn(), &self.tables).await?;
        let mut existing = self.by_identity(w, queue, &identity).await?;
        if existing.is_none() {
            if idempotent {
                if let Some((message_id, payload)) = self.previous_in(w, queue, &identity).await? {
                    if payload == e.payload {
                        return Ok(Enqueued { outcome: EnqueueOutcome::Unchanged, message_id });
                    }
                }
            }
            if let Some(id) = self.insert_identity(w, queue, &e, seq, now).await? {
                return Ok(Enqueued { outcome: EnqueueOutcome::Inserted(id), message_id: e.message_id });
            }
            // Another process inserted the identity meanwhile: lock theirs.
            existing = self.by_identity(w, queue, &identity).await?;
        }
        let Some(mut row) = existing else {
            return Err(TransportError::Backend(format!("{}: the identity's row vanished during enqueue", D::SYSTEM)));
        };
        let outcome = row.enqueue(now, seq, e, idempotent);
        if !matches!(outcome, EnqueueOutcome::Discarded(_)) {
            self.store_row(w, &row).await?;
        }
        let message_id = match (&row.status, &row.deferred) {
            (Status::AwaitingRelease, Some(d)) => d.message_id.clone(),
            _ => row.message_id.clone(),
        };
        Ok(Enqueued { outcome, message_id })
    }

    async fn by_identity(
        &self,
        w: &mut Write<'_, D>,
        queue: &str,
        identity: &str,
    ) -> Result<Option<Row>, TransportError> {
        let found = self.query_in(w, "enqueue", &[sql::BY_IDENTITY, D::LOCK], &[queue.into(), identity.into()]).await?;
        Ok(rows::<D>(&found)?.pop())
    }

    /// The identity's last processed version: (message id, payload).
    async fn previous_in(
        &self,
        w: &mut Write<'_, D>,
        queue: &str,
        identity: &str,
    ) -> Result<Option<(String, Vec<u8>)>, TransportError> {
        let what = "reading the previous message";
        let found = self.query_in(w, what, &[sql::PREVIOUS], &[queue.into(), identity.into()]).await?;
        let Some(row) = found.first() else { return Ok(None) };
        let (id, payload) = (D::text(row, 0).map_err(fail::<D>(what))?, D::bytes(row, 1).map_err(fail::<D>(what))?);
        Ok(Some((id.unwrap_or_default(), payload.unwrap_or_default())))
    }

    /// A new row for an identity; `None` when it exists already.
    async fn insert_identity(
        &self,
        w: &mut Write<'_, D>,
        queue: &str,
        e: &Enqueue,
        seq: u64,
        now: i64,
    ) -> Result<Option<RowId>, TransportError> {
        let r = Row::new(0, seq, now, e.clone());
        let args = [
            queue.into(),
            r.identity.as_deref().into(),
            r.group.as_deref().into(),
            r.message_id.as_str().into(),
            r.payload.as_slice().into(),
            r.attributes.as_str().into(),
            r.priority.into(),
            r.process_at.into(),
            r.status.as_str().into(),
            (seq as i64).into(),
            now.into(),
        ];
        let inserted = self.query_in(w, "enqueue", &[sql::INSERT_IDENTITY], &args).await?;
        Ok(int::<D>(&inserted, 0, "enqueue")?.map(|id| id as RowId))
    }

    /// Stores every column of `row` (which exists).
    pub(super) async fn store_row(&self, w: &mut Write<'_, D>, row: &Row) -> Result<(), TransportError> {
        let d = row.deferred.as_ref();
        let history = if row.history.is_empty() {
            String::new()
        } else {
            serde_json::to_string(&row.history).unwrap_or_default()
        };
        let args = [
            (row.id as i64).into(),
            row.identity.as_deref().into(),
            row.group.as_deref().into(),
            row.message_id.as_str().into(),
            row.payload.as_slice().into(),
            row.attributes.as_str().into(),
            row.priority.into(),
            row.process_at.into(),
            row.status.as_str().into(),
            (row.attempts.min(i32::MAX as u32) as i32).into(),
            (row.seq as i64).into(),
            row.lease_token.map(|t| t as i64).into(),
            row.lease_expires.into(),
            d.map(|d| d.message_id.as_str()).into(),
            d.map(|d| d.payload.as_slice()).into(),
            d.map(|d| d.attributes.as_str()).into(),
            d.map(|d| d.priority).into(),
            d.and_then(|d| d.process_at).into(),
            d.and_then(|d| d.status_after_release).map(Status::as_str).into(),
            d.map(|d| d.seq as i64).into(),
            d.map(|d| d.sent_at).into(),
            row.sent_at.into(),
            row.processed_at.into(),
            row.error.as_deref().into(),
            history.as_str().into(),
        ];
        self.exec_in(w, "storing a message", &[sql::STORE_ROW], &args).await.map(drop)
    }

    /// Loads (and locks) a row of `queue`, applies `f`, stores the row or
    /// deletes it (`f` returns whether to). A row that is gone is a lost lease.
    pub(super) async fn transition<R>(
        &self,
        w: &mut Write<'_, D>,
        queue: &str,
        id: RowId,
        f: impl FnOnce(&mut Row) -> Result<(R, bool), TransportError>,
    ) -> Result<R, TransportError> {
        let args = [(id as i64).into(), queue.into()];
        let found = self.query_in(w, "loading a message", &[sql::BY_ID, D::LOCK], &args).await?;
        let mut row = rows::<D>(&found)?.pop().ok_or(TransportError::StaleReceipt)?;
        let (result, delete) = f(&mut row)?;
        if delete {
            self.exec_in(w, "deleting a message", &[sql::DELETE_ROW], &[(id as i64).into()]).await?;
        } else {
            self.store_row(w, &row).await?;
        }
        Ok(result)
    }

    /// Completes a batch: the plain rows whose lease matches in one statement,
    /// the others (identity rows, deferred versions, lost leases) through
    /// [`Row::complete`] in one transaction. The outer error fails the batch.
    pub(super) async fn complete_all(
        &self,
        queue: &str,
        now: i64,
        items: &[(RowId, u64)],
        retention_ms: i64,
    ) -> Result<Vec<Result<(), TransportError>>, TransportError> {
        let mut w = Write::single(self).await?;
        let mut done = match D::complete_plain(w.conn(), &self.tables, queue, now, items, retention_ms).await {
            Ok(done) => done,
            Err(e) => return w.finish(Err(e)).await,
        };
        if done.len() == items.len() {
            w.finish(Ok(())).await?;
            return Ok(items.iter().map(|_| Ok(())).collect());
        }
        if !w.is_transaction() {
            w.finish(Ok(())).await?;
            w = Write::begin(self).await?;
        }
        let results = self.complete_rest(&mut w, queue, now, items, &mut done, retention_ms).await;
        w.finish(results).await
    }

    async fn complete_rest(
        &self,
        w: &mut Write<'_, D>,
        queue: &str,
        now: i64,
        items: &[(RowId, u64)],
        done: &mut std::collections::HashSet<(RowId, u64)>,
        retention_ms: i64,
    ) -> Result<Vec<Result<(), TransportError>>, TransportError> {
        let mut results = Vec::with_capacity(items.len());
        for &(id, token) in items {
            // Once: the same receipt twice in a batch finds the row gone.
            if done.remove(&(id, token)) {
                results.push(Ok(()));
                continue;
            }
            let mut previous = None;
            let outcome = self
                .transition(w, queue, id, |row| {
                    let done = row.complete(now, token, retention_ms).map_err(|_| TransportError::StaleReceipt)?;
                    previous = done.previous;
                    Ok(((), done.delete))
                })
                .await;
            match outcome {
                Ok(()) => {
                    if let Some((identity, message_id, payload)) = previous {
                        let args = [
                            queue.into(),
                            (&identity).into(),
                            (&message_id).into(),
                            payload.as_slice().into(),
                            now.into(),
                        ];
                        self.exec_in(w, "recording the previous message", &[sql::RECORD_PREVIOUS], &args).await?;
                    }
                    results.push(Ok(()));
                }
                Err(TransportError::StaleReceipt) => results.push(Err(TransportError::StaleReceipt)),
                Err(e) => return Err(e),
            }
        }
        Ok(results)
    }
}
