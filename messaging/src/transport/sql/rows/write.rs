//! Writes: enqueues, row transitions and completions.

use std::collections::HashMap;

use super::*;
use crate::transport::sql::machine::{EnqueueOutcome, Status};
use crate::transport::MessageId;

/// An identity's row while a run of enqueues is decided in memory.
enum Slot {
    /// In the database (locked): `changed` when it must be stored.
    Stored { row: Row, changed: bool },
    /// To be inserted, with the versions that made it (index in the run,
    /// sequence, message), in case its identity turns out to exist.
    New { row: Row, versions: Vec<(usize, u64, Enqueue)> },
}

impl Slot {
    /// Enqueues message `i` of the run onto this row.
    fn enqueue(&mut self, i: usize, now: i64, seq: u64, e: Enqueue, idempotent: bool) -> Enqueued {
        let row = match self {
            Slot::Stored { row, .. } => row,
            Slot::New { row, versions } => {
                versions.push((i, seq, e.clone()));
                row
            }
        };
        let outcome = row.enqueue(now, seq, e, idempotent);
        let message_id = match (&row.status, &row.deferred) {
            (Status::AwaitingRelease, Some(d)) => MessageId::from(d.message_id.as_str()),
            _ => MessageId::from(row.message_id.as_str()),
        };
        if let Slot::Stored { changed, .. } = self {
            *changed |= !matches!(outcome, EnqueueOutcome::Discarded(_));
        }
        Enqueued { outcome, message_id }
    }
}

/// What an append of `items` stores: a new row each, its id not read back.
/// Taken before the append, which may take the message ids' text: SQLite
/// then binds it without a copy. Callgrind of the benchmark's `send_batch`
/// on SQLite: the transport's instructions a message went from 1,838 to
/// 1,423 (the driver's copy of each id and the id turned back from a
/// `String` afterwards); the publish, eight pairs in turn, 0.848 → 0.862
/// of the shaped insert (medians).
fn appending(items: &[Enqueue]) -> impl Iterator<Item = Enqueued> + '_ {
    items
        .iter()
        .map(|e| Enqueued { outcome: EnqueueOutcome::Appended, message_id: MessageId::from(e.message_id.as_str()) })
}

impl<D: Dialect> SqlStore<D> {
    /// Enqueues a batch on `w`, in input order: each run of messages without
    /// identity in one multi-row insert, each run with identities in a few
    /// statements whatever its length (see [`Self::enqueue_identities`]).
    /// Other processes are told on `w`, so when it commits: by each insert
    /// itself, and once more for new versions of existing rows.
    pub(super) async fn enqueue_in(
        &self,
        w: &mut Write<'_, D>,
        queue: &str,
        now: i64,
        items: Vec<Enqueue>,
        idempotent: bool,
    ) -> Result<Vec<Enqueued>, TransportError> {
        let mut out = Vec::with_capacity(items.len());
        let mut versions = false;
        let mut items = items.into_iter().peekable();
        while let Some(first) = items.next() {
            let plain = first.identity.is_none();
            let mut run = vec![first];
            while let Some(e) = items.next_if(|e| e.identity.is_none() == plain) {
                run.push(e);
            }
            if plain {
                self.insert_plain(w, queue, now, run, &mut out).await?;
            } else {
                out.extend(self.enqueue_identities(w, queue, now, run, idempotent).await?);
                versions = true;
            }
        }
        if versions {
            // PostgreSQL folds this with the inserts' own notifications.
            D::notify_in(w.conn(), queue).await;
        }
        Ok(out)
    }

    /// Enqueues plain messages (no identity) as one transaction of their own.
    pub(super) async fn enqueue_plain(
        &self,
        queue: &str,
        now: i64,
        mut items: Vec<Enqueue>,
    ) -> Result<Vec<Enqueued>, TransportError> {
        let out = appending(&items).collect();
        D::enqueue_plain(self, queue, now, &mut items).await?;
        Ok(out)
    }

    async fn insert_plain(
        &self,
        w: &mut Write<'_, D>,
        queue: &str,
        now: i64,
        mut run: Vec<Enqueue>,
        out: &mut Vec<Enqueued>,
    ) -> Result<(), TransportError> {
        // On failure the caller drops `out` with the error.
        out.extend(appending(&run));
        let wait = w.answer_within();
        within::<D, _, _>(wait, D::append(w.conn(), &self.tables, queue, now, &mut run), fail::<D>("enqueue")).await
    }

    /// Enqueues messages with an identity, in order, as if one by one: each
    /// is a new version of its identity's row (locked, or created), or
    /// discarded on an idempotent queue when equal to the newest version or,
    /// with no row, to the last processed one (processed rows are deleted at
    /// once by default). Statements for the whole run: the sequence values,
    /// the rows locked, the previous versions, one insert of the new rows,
    /// then the existing rows that changed ([`Self::store_rows`]). The transitions run in
    /// memory, so a later message of the run sees an earlier one's row.
    async fn enqueue_identities(
        &self,
        w: &mut Write<'_, D>,
        queue: &str,
        now: i64,
        run: Vec<Enqueue>,
        idempotent: bool,
    ) -> Result<Vec<Enqueued>, TransportError> {
        let wait = w.answer_within();
        let seqs =
            within::<D, _, _>(wait, D::next_seqs(w.conn(), &self.tables, run.len()), fail::<D>("nextval")).await?;
        if seqs.len() != run.len() {
            return Err(TransportError::Backend(format!("{}: too few sequence values", D::SYSTEM)));
        }
        let mut keys: Vec<&str> = run.iter().filter_map(|e| e.identity.as_deref()).collect();
        keys.sort_unstable();
        keys.dedup();
        let list = text_list(keys);
        let mut slots: HashMap<String, Slot> = HashMap::new();
        for row in self.by_identities(w, queue, &list).await? {
            slots.insert(row.identity.clone().unwrap_or_default(), Slot::Stored { row, changed: false });
        }
        let previous = if idempotent { self.previous_of(w, queue, &list).await? } else { HashMap::new() };
        let mut out: Vec<Enqueued> = Vec::with_capacity(run.len());
        let mut new: Vec<String> = Vec::new();
        for (i, (e, seq)) in run.into_iter().zip(seqs).enumerate() {
            let key = e.identity.clone().unwrap_or_default();
            let enqueued = match slots.get_mut(&key) {
                Some(slot) => slot.enqueue(i, now, seq, e, idempotent),
                None => match previous.get(&key) {
                    Some((message_id, payload)) if *payload == e.payload => Enqueued {
                        outcome: EnqueueOutcome::Unchanged,
                        message_id: MessageId::from(message_id.as_str()),
                    },
                    _ => {
                        let message_id = MessageId::from(e.message_id.as_str());
                        let row = Row::new(0, seq, now, e.clone());
                        slots.insert(key.clone(), Slot::New { row, versions: vec![(i, seq, e)] });
                        new.push(key);
                        Enqueued { outcome: EnqueueOutcome::Inserted(0), message_id }
                    }
                },
            };
            out.push(enqueued);
        }
        self.store_identities(w, queue, now, idempotent, slots, &new, &mut out).await?;
        Ok(out)
    }

    /// Writes what [`Self::enqueue_identities`] decided: the new rows in one
    /// insert (their ids into `out`), the stored rows that changed one by
    /// one. A new row whose identity another process inserted meanwhile gets
    /// its versions replayed onto that row, as one by one would have done.
    #[allow(clippy::too_many_arguments)]
    async fn store_identities(
        &self,
        w: &mut Write<'_, D>,
        queue: &str,
        now: i64,
        idempotent: bool,
        mut slots: HashMap<String, Slot>,
        new: &[String],
        out: &mut [Enqueued],
    ) -> Result<(), TransportError> {
        let (rows, created): (Vec<Row>, Vec<_>) = new
            .iter()
            .filter_map(|key| match slots.remove(key) {
                Some(Slot::New { row, versions }) => Some((row, versions)),
                _ => None,
            })
            .unzip();
        if !rows.is_empty() {
            let wait = w.answer_within();
            let insert = D::insert(w.conn(), &self.tables, queue, now, &rows);
            let ids = within::<D, _, _>(wait, insert, fail::<D>("enqueue")).await?;
            for (versions, id) in created.into_iter().zip(ids) {
                match id {
                    Some(id) => {
                        for &(i, _, _) in &versions {
                            out[i].outcome = out[i].outcome.on_row(id);
                        }
                    }
                    None => self.replay(w, queue, now, idempotent, versions, out).await?,
                }
            }
        }
        let changed: Vec<&Row> = slots
            .values()
            .filter_map(|slot| match slot {
                Slot::Stored { row, changed: true } => Some(row),
                _ => None,
            })
            .collect();
        self.store_rows(w, &changed).await
    }

    /// The versions of a new identity whose row another process inserted
    /// meanwhile: onto that row, in order.
    async fn replay(
        &self,
        w: &mut Write<'_, D>,
        queue: &str,
        now: i64,
        idempotent: bool,
        versions: Vec<(usize, u64, Enqueue)>,
        out: &mut [Enqueued],
    ) -> Result<(), TransportError> {
        let Some((_, _, first)) = versions.first() else { return Ok(()) };
        let list = text_list(first.identity.as_deref());
        let Some(row) = self.by_identities(w, queue, &list).await?.pop() else {
            return Err(TransportError::Backend(format!("{}: the identity's row vanished during enqueue", D::SYSTEM)));
        };
        let mut slot = Slot::Stored { row, changed: false };
        for (i, seq, e) in versions {
            out[i] = slot.enqueue(i, now, seq, e, idempotent);
        }
        if let Slot::Stored { row, changed: true } = slot {
            self.store_row(w, &row).await?;
        }
        Ok(())
    }

    /// The rows (locked) of the identities in `list` ([`text_list`]).
    async fn by_identities(&self, w: &mut Write<'_, D>, queue: &str, list: &str) -> Result<Vec<Row>, TransportError> {
        rows::<D>(&self.query_in(w, "enqueue", &[D::BY_IDENTITIES], &[queue.into(), list.into()]).await?)
    }

    /// The last processed versions of the identities in `list`: identity →
    /// (message id, payload).
    async fn previous_of(
        &self,
        w: &mut Write<'_, D>,
        queue: &str,
        list: &str,
    ) -> Result<HashMap<String, (String, Vec<u8>)>, TransportError> {
        let what = "reading the previous message";
        let found = self.query_in(w, what, &[D::PREVIOUS_OF], &[queue.into(), list.into()]).await?;
        found
            .iter()
            .map(|r| {
                let text = |i| D::text(r, i).map(Option::unwrap_or_default);
                Ok((text(0)?, (text(1)?, D::bytes(r, 2)?.unwrap_or_default())))
            })
            .collect::<Result<_, sqlx::Error>>()
            .map_err(fail::<D>(what))
    }

    /// Stores every column of `row` (which exists).
    pub(super) async fn store_row(&self, w: &mut Write<'_, D>, row: &Row) -> Result<(), TransportError> {
        self.store_rows(w, &[row]).await
    }

    /// Stores every column of `rows` (which exist), up to
    /// [`Dialect::STORE_ROWS`] per call: a batch of new versions of pending
    /// rows is a few calls, not one per row.
    pub(super) async fn store_rows(&self, w: &mut Write<'_, D>, rows: &[&Row]) -> Result<(), TransportError> {
        self.store_rows_of(w, rows, true).await
    }

    /// [`Self::store_rows`], leaving both bodies as stored when `bodies` is
    /// false (rows read without them, `statements::columns_without_bodies!`).
    pub(super) async fn store_rows_of(
        &self,
        w: &mut Write<'_, D>,
        rows: &[&Row],
        bodies: bool,
    ) -> Result<(), TransportError> {
        let mut rest = rows;
        for size in sql::power_of_two_chunks(rows.len(), D::STORE_ROWS.0) {
            let (chunk, after) = rest.split_at(size);
            rest = after;
            let histories: Vec<String> = chunk
                .iter()
                .map(|row| {
                    if row.history.is_empty() {
                        String::new()
                    } else {
                        serde_json::to_string(&row.history).unwrap_or_default()
                    }
                })
                .collect();
            let mut args = Vec::with_capacity(chunk.len() * sql::STORED_COLUMNS);
            for (row, history) in chunk.iter().zip(&histories) {
                let d = row.deferred.as_ref();
                let values: [Value<'_>; sql::STORED_COLUMNS] = [
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
                    row.suspect.code().into(),
                ];
                let kept = values.into_iter().enumerate().filter(|&(i, _)| sql::writes_column(i, bodies));
                args.extend(kept.map(|(_, value)| value));
            }
            let statement = sql::store_rows(chunk.len(), D::STORE_ROWS.1, bodies);
            self.exec_in(w, "storing messages", &[&statement], &args).await?;
        }
        Ok(())
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
    /// the others (identity rows, deferred versions, rows whose lease was
    /// extended or lost) through [`Row::complete`] in a transaction, whose
    /// failure fails those others alone. The outer error fails the batch.
    ///
    /// Where another transaction can hold a row (PostgreSQL: an
    /// application's), its lock is waited for a moment
    /// ([`Dialect::SKIP_LOCKED`]); when a row is still held then, the
    /// others are completed again without it ([`Self::not_held`]), and it
    /// fails alone as [`TransportError::Held`], for the worker to try again.
    pub(super) async fn complete_all(
        &self,
        queue: &str,
        now: i64,
        items: &[Held],
        retention_ms: i64,
    ) -> Result<Vec<Result<(), TransportError>>, TransportError> {
        let mut done = D::complete_plain(self, queue, now, items, retention_ms).await?;
        if done.len() == items.len() {
            return Ok(items.iter().map(|_| Ok(())).collect());
        }
        // Completed already, whatever happens to the rest; each receipt once
        // (the same one twice in a batch finds its row gone).
        let mut results: Vec<Option<Result<(), TransportError>>> =
            items.iter().map(|&(id, token, _)| done.remove(&(id, token)).then_some(Ok(()))).collect();
        let rest: Vec<usize> = (0..items.len()).filter(|&i| results[i].is_none()).collect();
        let wait = D::SKIP_LOCKED.map(|skip| skip.wait_briefly);
        let subset = |group: &[usize]| group.iter().map(|&i| items[i]).collect::<Vec<Held>>();
        let completed = self.complete_rest_in_turn(queue, now, &subset(&rest), retention_ms, wait).await;
        let held = completed.iter().find(|r| matches!(r, Err(TransportError::Held(_)))).cloned();
        if let (Some(skip), Some(held)) = (D::SKIP_LOCKED, held) {
            // A held row failed the transaction: the others again without
            // it (or them), which fail as held, to be tried again.
            let free = self.not_held(skip, queue, rest.iter().map(|&i| items[i].0)).await;
            let free: Vec<usize> =
                rest.into_iter().filter(|&i| free.as_ref().is_some_and(|free| free.contains(&items[i].0))).collect();
            let again = self.complete_rest_in_turn(queue, now, &subset(&free), retention_ms, wait).await;
            for (i, result) in free.into_iter().zip(again) {
                results[i] = Some(result);
            }
            return Ok(results.into_iter().map(|r| r.unwrap_or_else(|| held.clone())).collect());
        }
        for (i, result) in rest.into_iter().zip(completed) {
            results[i] = Some(result);
        }
        Ok(results.into_iter().map(|r| r.unwrap_or(Err(TransportError::StaleReceipt))).collect())
    }

    /// Which of the rows `ids` of `queue` no other transaction holds now
    /// (`None`: not known, the look failed).
    async fn not_held(
        &self,
        skip: SkipLocked,
        queue: &str,
        ids: impl Iterator<Item = RowId>,
    ) -> Option<std::collections::HashSet<RowId>> {
        let ids: Vec<RowId> = ids.collect();
        let list = serde_json::to_string(&ids).ok()?;
        // Locked only for the look: the completion that follows locks them
        // again (a row taken meanwhile is waited for a moment, as any).
        let found = self.query("looking for held rows", &[skip.by_ids], &[queue.into(), list.as_str().into()]).await;
        Some(rows::<D>(&found.ok()?).ok()?.into_iter().map(|row| row.id).collect())
    }

    /// [`Self::complete_rest`] of `items` in a transaction of its own, its
    /// row locks waited for as `wait` bounds them (`None`: as the database
    /// does); one result per item, a failure of the transaction failing
    /// each.
    async fn complete_rest_in_turn(
        &self,
        queue: &str,
        now: i64,
        items: &[Held],
        retention_ms: i64,
        wait: Option<&'static str>,
    ) -> Vec<Result<(), TransportError>> {
        if items.is_empty() {
            return Vec::new();
        }
        let mut w = match Write::begin(self).await {
            Ok(w) => w,
            Err(e) => return vec![Err(e); items.len()],
        };
        let results = async {
            if let Some(wait) = wait {
                self.exec_in(&mut w, "bounding lock waits", &[wait], &[]).await?;
            }
            self.complete_rest(&mut w, queue, now, items, &mut Default::default(), retention_ms).await
        }
        .await;
        w.finish(results).await.unwrap_or_else(|e| vec![Err(e); items.len()])
    }

    async fn complete_rest(
        &self,
        w: &mut Write<'_, D>,
        queue: &str,
        now: i64,
        items: &[Held],
        done: &mut std::collections::HashSet<(RowId, u64)>,
        retention_ms: i64,
    ) -> Result<Vec<Result<(), TransportError>>, TransportError> {
        let mut results = Vec::with_capacity(items.len());
        for &(id, token, _) in items {
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
