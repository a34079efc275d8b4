//! [`SqlStore`]'s operations on message rows, over PostgreSQL and SQLite.
//! Each loads rows, runs their transition in [`crate::transport::sql::machine::Row`]
//! and stores them, in a transaction; only what the databases do differently
//! goes through the [`Dialect`]. Every operation takes the time (ms since the
//! Unix epoch), so that tests can drive the clock.

mod browse;
mod write;

use super::dialect::{fail, flag, int, rows, within, Dialect, SkipLocked, SqlStore, Write};
use super::driver::Value;
use super::record::{Held, LeasedRow};
use super::stalls::Lapse;
use super::statements::{self as sql, FifoSearch};
use super::store::{Enqueued, RowOp};
use crate::error::TransportError;
use crate::transport::sql::machine::{Enqueue, QueueRules, Row, RowId, Status, Suspect, Take};

/// Texts as the JSON array that [`Dialect::BY_IDENTITIES`] reads: one parameter for
/// a list of any length.
fn text_list<'a>(items: impl IntoIterator<Item = &'a str>) -> String {
    serde_json::to_string(&items.into_iter().collect::<Vec<_>>()).unwrap_or_else(|_| "[]".to_owned())
}

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

    /// Checks the tables and columns, and the sequence's step where there is
    /// one (see [`super::schema`]).
    pub(crate) async fn check(&self) -> Result<(), TransportError> {
        let what = "reading the schema";
        // A named schema is a checked identifier (`options::schema_name`),
        // safe to write as a literal. Run as written: qualifying table names
        // would also rewrite a schema name that contains `messaging_`.
        let in_schema = |sql: &str| match self.tables.schema() {
            Some(schema) => sql.replace("current_schema()", &format!("'{schema}'")),
            None => sql.to_owned(),
        };
        let mut conn = self.acquire(what).await?;
        let rows = D::fetch_all(&mut conn, &in_schema(D::SCHEMA_COLUMNS), &[]).await.map_err(fail::<D>(what))?;
        let found = rows
            .iter()
            .map(|r| Ok((D::text(r, 0)?.unwrap_or_default(), D::text(r, 1)?.unwrap_or_default())))
            .collect::<Result<Vec<_>, sqlx::Error>>()
            .map_err(fail::<D>(what))?;
        let step = match D::SEQUENCE_STEP {
            Some((read, least)) => {
                let rows = D::fetch_all(&mut conn, &in_schema(read), &[]).await.map_err(fail::<D>(what))?;
                let step = rows.first().map(|r| D::int(r, 0)).transpose().map_err(fail::<D>(what))?.flatten();
                Some((step, least))
            }
            None => None,
        };
        super::schema::compare(D::SYSTEM, &found, step)
    }

    /// Records `queue` with its kind; fails if it exists with the other kind.
    pub(crate) async fn declare(&self, queue: &str, fifo: bool, now: i64) -> Result<(), TransportError> {
        self.check().await?;
        let what = "declaring a queue";
        // Looked up first, without writing: every process declares every
        // queue as it starts, and the queue is there but the first time. On
        // SQLite a write waits for the write lock, which an application
        // sharing the file may hold for a while (a publisher waited out the
        // busy timeout once per queue before failing, tried from outside).
        let kind = || async { flag::<D>(&self.query(what, &[sql::QUEUE_KIND], &[queue.into()]).await?, 0, what) };
        let stored = match kind().await? {
            Some(stored) => stored,
            None => {
                self.exec(what, &[sql::DECLARE], &[queue.into(), fifo.into(), now.into()]).await?;
                kind().await?.unwrap_or(fifo)
            }
        };
        super::schema::check_kind(queue, fifo, stored)
    }

    /// Housekeeping as of `now`: wakes due sleepers, abandons the leases
    /// expired by then, purges processed rows past retention (tests drive
    /// the clock with it).
    #[cfg(test)]
    pub(crate) async fn maintain(&self, queue: &str, now: i64, rules: QueueRules) -> Result<(), TransportError> {
        self.housekeep(queue, now, rules, false).await
    }

    /// Housekeeping as of `now`, taking back a lease that expired while this
    /// process's writes stalled only the stall's length after it expired
    /// ([`super::stalls`]): its holder could not extend it meanwhile.
    pub(crate) async fn maintain_after_stalls(
        &self,
        queue: &str,
        now: i64,
        rules: QueueRules,
    ) -> Result<(), TransportError> {
        self.housekeep(queue, now, rules, true).await
    }

    /// Which expired leases are taken back (see
    /// [`Self::maintain_after_stalls`]).
    fn lapse(&self, now: i64, after_stalls: bool) -> Lapse {
        if after_stalls {
            self.stalls.lapse(now)
        } else {
            Lapse::exact(now)
        }
    }

    /// Looks first, without writing: usually there is nothing to do, and on
    /// SQLite taking the write lock every 100 ms would hold up publishers.
    async fn housekeep(
        &self,
        queue: &str,
        now: i64,
        rules: QueueRules,
        after_stalls: bool,
    ) -> Result<(), TransportError> {
        let (what, cutoff) = ("housekeeping", now - rules.retention_ms);
        let lapse = self.lapse(now, after_stalls);
        let args = [
            queue.into(),
            now.into(),
            (rules.retention_ms > 0).into(),
            cutoff.into(),
            lapse.from.into(),
            lapse.to.into(),
            lapse.shift.into(),
        ];
        let rows = self.query(what, &[sql::HOUSEKEEPING_DUE], &args).await?;
        let due = |i| flag::<D>(&rows, i, what).map(Option::unwrap_or_default);
        let (sleepers, expired, purgeable) = (due(0)?, due(1)?, due(2)?);
        if sleepers {
            self.exec("waking sleeping messages", &[sql::WAKE, D::LOCK_SKIP, ")"], &[queue.into(), now.into()]).await?;
        }
        if expired {
            let mut w = Write::begin(self).await?;
            // Reckoned again once the write went through: if it waited for
            // the database, so could the leases' holders.
            let lapse = self.lapse(now, after_stalls);
            let done = self.abandon_in(&mut w, queue, now, lapse, &rules).await;
            // Told once committed: a commit that failed (a full disk) took
            // nothing back, and the next round tries again.
            w.finish(done).await?.tell(queue);
        }
        if purgeable {
            self.exec("purging processed messages", &[sql::PURGE_PROCESSED], &[queue.into(), cutoff.into()]).await?;
        }
        Ok(())
    }

    /// Abandons the expired leases of `queue` that `lapse` takes (rows
    /// another transaction holds are being settled: skipped); what it took
    /// back.
    async fn abandon_in(
        &self,
        w: &mut Write<'_, D>,
        queue: &str,
        now: i64,
        lapse: Lapse,
        rules: &QueueRules,
    ) -> Result<TakenBack, TransportError> {
        let args = [queue.into(), lapse.now.into(), lapse.from.into(), lapse.to.into(), lapse.shift.into()];
        let found = self.query_in(w, "finding expired leases", &[sql::EXPIRED, D::LOCK_SKIP], &args).await?;
        let taken_back = |row: &Row| row.is_abandoned(now) && row.lease_expires.is_some_and(|e| lapse.takes(e));
        let mut taken: Vec<Row> = rows::<D>(&found)?.into_iter().filter(taken_back).collect();
        // Those whose handler ran alone are what stopped their consumer
        // (or outlived the lease): their attempt counts.
        let alone = taken.iter().filter(|row| row.suspect == Suspect::Alone).count();
        for row in &mut taken {
            row.abandon(now, rules);
        }
        // Written back a few statements at a time: a consumer that died
        // holding 1,500 leases left 1,500 single-row updates to the next
        // receive, on the write turn.
        self.store_rows(w, &taken.iter().collect::<Vec<_>>()).await?;
        Ok(TakenBack {
            count: taken.len(),
            alone,
            dead: taken.iter().filter(|row| row.status == Status::Error).count(),
            suspects: taken.iter().filter(|row| row.status != Status::Error && row.suspect.runs_alone()).count(),
        })
    }

    /// The earliest time something becomes due (a sleeper or a lease expiry).
    pub(crate) async fn next_due(&self, queue: &str) -> Result<Option<i64>, TransportError> {
        let what = "next due time";
        let rows = self.query(what, &[sql::NEXT_DUE], &[queue.into()]).await?;
        Ok(match (int::<D>(&rows, 0, what)?, int::<D>(&rows, 1, what)?) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        })
    }

    /// Error → Pending with attempts reset, in the order given; how many moved.
    pub(crate) async fn redrive(&self, queue: &str, ids: Vec<RowId>) -> Result<usize, TransportError> {
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

impl<D: Dialect> SqlStore<D> {
    /// Milliseconds since the Unix epoch by the clock every process of the
    /// database agrees on (PostgreSQL's; the machine's for SQLite).
    pub(crate) fn now(&self) -> i64 {
        D::now(&self.state)
    }

    /// Creates or upgrades the tables (the `migrate` command).
    pub(crate) async fn migrate(&self) -> Result<(), TransportError> {
        super::migrate::run(self).await
    }

    /// Enqueues messages; one result per input, in order.
    pub(crate) async fn enqueue(
        &self,
        queue: &str,
        now: i64,
        items: Vec<Enqueue>,
        idempotent: bool,
    ) -> Vec<Result<Enqueued, TransportError>> {
        if items.is_empty() {
            return Vec::new();
        }
        let n = items.len();
        let results = if items.iter().all(|e| e.identity.is_none()) {
            self.enqueue_plain(queue, now, items).await
        } else {
            match Write::begin(self).await {
                Ok(mut w) => {
                    let stored = self.enqueue_in(&mut w, queue, now, items, idempotent).await;
                    w.finish(stored).await
                }
                Err(e) => Err(e),
            }
        };
        match results {
            Ok(stored) => stored.into_iter().map(Ok).collect(),
            Err(e) => vec![Err(e); n], // a batch fails as a whole
        }
    }

    /// Enqueues inside the caller's open transaction `conn`: the rows are
    /// visible when it commits and gone if it rolls back; receivers are
    /// told at its commit (PostgreSQL), once per transaction.
    pub(crate) async fn enqueue_on(
        &self,
        conn: &mut D::Connection,
        queue: &str,
        now: i64,
        items: Vec<Enqueue>,
        idempotent: bool,
    ) -> Result<Vec<Enqueued>, TransportError> {
        if items.is_empty() {
            return Ok(Vec::new());
        }
        self.enqueue_in(&mut Write::on(conn), queue, now, items, idempotent).await
    }

    /// Leases up to `n` rows that can go now, whatever their bodies:
    /// [`SqlStore::lease_taking`] by rows alone.
    #[cfg_attr(not(test), allow(dead_code))]
    pub(crate) async fn lease(
        &self,
        queue: &str,
        now: i64,
        n: usize,
        lease_ms: i64,
        fifo: bool,
    ) -> Result<Vec<LeasedRow>, TransportError> {
        self.lease_taking(queue, now, Take::rows(n), lease_ms, fifo).await
    }

    /// Leases the rows that can go now, as many as `take` says: by priority
    /// then enqueue order, or on a FIFO queue the head of each group with
    /// nothing leased.
    pub(crate) async fn lease_taking(
        &self,
        queue: &str,
        now: i64,
        take: Take,
        lease_ms: i64,
        fifo: bool,
    ) -> Result<Vec<LeasedRow>, TransportError> {
        let search = fifo.then(|| FifoSearch::for_lease(take.rows));
        self.lease_searching(queue, now, take, lease_ms, search).await
    }

    /// [`SqlStore::lease`], a FIFO queue's heads looked for as far as
    /// `search` says (the model test tries every way of [`sql::PICK_FIFO`]).
    pub(crate) async fn lease_searching(
        &self,
        queue: &str,
        now: i64,
        take: Take,
        lease_ms: i64,
        search: Option<FifoSearch>,
    ) -> Result<Vec<LeasedRow>, TransportError> {
        if take.rows == 0 {
            return Ok(Vec::new());
        }
        D::lease(self, queue, now, take, lease_ms, search, None).await
    }
    /// Completes leased rows; one result per item (`StaleReceipt` for a lost lease).
    pub(crate) async fn complete(
        &self,
        queue: &str,
        now: i64,
        items: Vec<Held>,
        retention_ms: i64,
    ) -> Vec<Result<(), TransportError>> {
        if items.is_empty() {
            return Vec::new();
        }
        self.complete_all(queue, now, &items, retention_ms).await.unwrap_or_else(|e| vec![Err(e); items.len()])
    }

    /// Marks a leased row as run alone ([`Row::isolate`]): one statement,
    /// where the transition through [`SqlStore::apply`] read the row and
    /// wrote it whole in a transaction of its own, four round trips for
    /// every suspect (a consumer killed holding 4,000 messages leaves 4,000
    /// of them, run one at a time).
    pub(crate) async fn isolate(&self, queue: &str, id: RowId, token: u64) -> Result<(), TransportError> {
        self.mark(queue, id, token, sql::ISOLATE, "marking a suspect as running alone").await
    }

    /// Takes a leased row's mark of running alone back ([`Row::rejoin`]).
    pub(crate) async fn rejoin(&self, queue: &str, id: RowId, token: u64) -> Result<(), TransportError> {
        self.mark(queue, id, token, sql::REJOIN, "taking back a suspect's mark of running alone").await
    }

    /// Runs `statement` (`ISOLATE`, `REJOIN`) on the row `token` holds.
    async fn mark(
        &self,
        queue: &str,
        id: RowId,
        token: u64,
        statement: &str,
        what: &str,
    ) -> Result<(), TransportError> {
        let args = [(id as i64).into(), (token as i64).into(), queue.into()];
        // A row another transaction holds fails as held after a moment
        // (waited for without a bound, it stalled the process's gate for a
        // suspect for up to the 30 s answer limit, then was taken for a
        // lost connection).
        let bound = D::SKIP_LOCKED.map_or("", |skip| skip.waiting_here);
        match self.exec(what, &[statement, bound], &args).await? {
            0 => Err(TransportError::StaleReceipt),
            _ => Ok(()),
        }
    }

    /// Applies a transition to one leased row.
    pub(crate) async fn apply(
        &self,
        queue: &str,
        now: i64,
        id: RowId,
        token: u64,
        op: RowOp,
    ) -> Result<(), TransportError> {
        self.apply_all(queue, now, &[(id, token)], &op).await?.pop().unwrap_or(Err(TransportError::StaleReceipt))
    }

    /// Applies one transition to many leased rows in one transaction: the
    /// rows read in one statement, the changed ones written back in a few
    /// (`StaleReceipt` for a row gone or leased again; the same receipt
    /// twice finds its lease already given up). One result per item, in
    /// order; the outer error fails them all.
    pub(crate) async fn apply_all(
        &self,
        queue: &str,
        now: i64,
        items: &[(RowId, u64)],
        op: &RowOp,
    ) -> Result<Vec<Result<(), TransportError>>, TransportError> {
        if items.is_empty() {
            return Ok(Vec::new());
        }
        if let Some(skip) = D::SKIP_LOCKED {
            return self.apply_all_bounded(queue, now, items, op, skip).await;
        }
        let mut w = Write::begin(self).await?;
        let done = self.transition_all(&mut w, queue, now, items, op, None).await;
        w.finish(done).await
    }

    /// [`Self::apply_all`] never held up for long by a row another
    /// transaction holds (an application's): the rows not held are changed
    /// at once; the others are waited for a moment
    /// ([`SkipLocked::wait_briefly`], as long as a completion of ours
    /// takes) and then fail alone as [`TransportError::Held`], for the
    /// caller to try again. Waited for without a bound, one such row held
    /// up the heartbeat's whole round, and every other message's lease ran
    /// out; and the retry of a failed message whose row was held waited 30
    /// s, to be taken for a lost connection (the pool's connections closed,
    /// the attempt left uncounted), tried from outside.
    async fn apply_all_bounded(
        &self,
        queue: &str,
        now: i64,
        items: &[(RowId, u64)],
        op: &RowOp,
        skip: SkipLocked,
    ) -> Result<Vec<Result<(), TransportError>>, TransportError> {
        let mut w = Write::begin(self).await?;
        let done = self.transition_all(&mut w, queue, now, items, op, Some(skip)).await;
        let mut results = w.finish(done).await?;
        // Not found while skipping: gone, leased again, or held.
        let missed: Vec<usize> = (0..results.len()).filter(|&i| results[i].is_err()).collect();
        if missed.is_empty() {
            return Ok(results);
        }
        let again: Vec<(RowId, u64)> = missed.iter().map(|&i| items[i]).collect();
        // The first pass is committed: whatever happens to the second, its
        // results stand (a second transaction that cannot begin fails the
        // missed rows, not the whole call).
        let second = async {
            let mut w = Write::begin(self).await?;
            let done = async {
                self.exec_in(&mut w, "bounding lock waits", &[skip.wait_briefly], &[]).await?;
                self.transition_all(&mut w, queue, now, &again, op, None).await
            }
            .await;
            // A row still held fails with SQLSTATE 55P03, whose hint says why.
            w.finish(done).await
        }
        .await
        .unwrap_or_else(|e| vec![Err(e); again.len()]);
        for (i, result) in missed.into_iter().zip(second) {
            results[i] = result;
        }
        Ok(results)
    }

    /// Applies `op` to the rows of `items` on `w`: read by primary key and
    /// locked (skipping rows another transaction holds with `skip`), changed,
    /// written back. Rows read without their bodies when `op` keeps them
    /// ([`RowOp::keeps_bodies`]) are written back without them, decided here
    /// once for both: written with them, their bodies would be emptied.
    async fn transition_all(
        &self,
        w: &mut Write<'_, D>,
        queue: &str,
        now: i64,
        items: &[(RowId, u64)],
        op: &RowOp,
        skip: Option<SkipLocked>,
    ) -> Result<Vec<Result<(), TransportError>>, TransportError> {
        let bodies = !op.keeps_bodies();
        let by_ids = match (skip, bodies) {
            (None, true) => D::BY_IDS,
            (None, false) => D::BY_IDS_WITHOUT_BODIES,
            (Some(skip), true) => skip.by_ids,
            (Some(skip), false) => skip.by_ids_without_bodies,
        };
        let ids: Vec<RowId> = items.iter().map(|&(id, _)| id).collect();
        let list = serde_json::to_string(&ids).unwrap_or_else(|_| "[]".to_owned());
        let found = self.query_in(w, "loading messages", &[by_ids], &[queue.into(), list.as_str().into()]).await?;
        // Kept in id order, the order the rows were locked in.
        let mut loaded: std::collections::BTreeMap<RowId, (Row, bool)> =
            rows::<D>(&found)?.into_iter().map(|row| (row.id, (row, false))).collect();
        let results = items
            .iter()
            .map(|&(id, token)| {
                let (row, changed) = loaded.get_mut(&id).ok_or(TransportError::StaleReceipt)?;
                op.apply(row, now, token).map_err(|_| TransportError::StaleReceipt)?;
                *changed = true;
                Ok(())
            })
            .collect();
        let changed: Vec<&Row> = loaded.values().filter(|(_, changed)| *changed).map(|(row, _)| row).collect();
        self.store_rows_of(w, &changed, bodies).await?;
        Ok(results)
    }

    /// Up to `max` dead letters (rows in `Error`), oldest first.
    pub(crate) async fn dead_letters(&self, queue: &str, max: usize) -> Result<Vec<Row>, TransportError> {
        self.records(sql::ERRORS, queue, Some(max)).await
    }

    /// The row holding message `id` (as its current or its waiting version).
    pub(crate) async fn by_message_id(&self, queue: &str, id: &str) -> Result<Option<Row>, TransportError> {
        Ok(rows::<D>(&self.query("looking up a message", &[sql::BY_MESSAGE_ID], &[queue.into(), id.into()]).await?)?
            .pop())
    }

    /// Up to `max` dead letters after enqueue position `after`, oldest first.
    pub(crate) async fn dead_letters_after(
        &self,
        queue: &str,
        after: i64,
        max: usize,
    ) -> Result<Vec<Row>, TransportError> {
        let args = [queue.into(), i64::try_from(max).unwrap_or(i64::MAX).into(), after.into()];
        rows::<D>(&self.query("reading dead letters", &[sql::ERRORS_AFTER], &args).await?)
    }

    /// Deletes dead letters, by row id or by message id, in one transaction;
    /// how many there were.
    pub(crate) async fn delete_dead(
        &self,
        queue: &str,
        rows: &[RowId],
        messages: &[&str],
    ) -> Result<usize, TransportError> {
        if rows.is_empty() && messages.is_empty() {
            return Ok(0);
        }
        let mut w = Write::begin(self).await?;
        let done = async {
            let mut deleted = 0;
            for &id in rows {
                let args = [(id as i64).into(), queue.into()];
                deleted += self.exec_in(&mut w, "deleting a dead letter", &[sql::DELETE_DEAD], &args).await?;
            }
            for &id in messages {
                let args = [id.into(), queue.into()];
                deleted +=
                    self.exec_in(&mut w, "deleting a dead letter", &[sql::DELETE_DEAD_BY_MESSAGE_ID], &args).await?;
            }
            Ok(deleted as usize)
        }
        .await;
        w.finish(done).await
    }

    /// Rows waiting or in progress (not Error, not Processed).
    pub(crate) async fn depth(&self, queue: &str) -> Result<u64, TransportError> {
        self.count(sql::DEPTH, queue, "depth").await
    }

    /// Number of dead letters.
    pub(crate) async fn error_depth(&self, queue: &str) -> Result<u64, TransportError> {
        self.count(sql::ERROR_DEPTH, queue, "dead-letter depth").await
    }

    /// The enqueue position of the newest dead letter, if there is one.
    pub(crate) async fn last_dead_letter_seq(&self, queue: &str) -> Result<Option<i64>, TransportError> {
        let what = "reading dead letters";
        int::<D>(&self.query(what, &[sql::LAST_ERROR_SEQ], &[queue.into()]).await?, 0, what)
    }

    /// Every row of the queue.
    #[cfg(all(test, feature = "sqlite"))]
    pub(crate) async fn rows(&self, queue: &str) -> Result<Vec<Row>, TransportError> {
        self.records(sql::ROWS, queue, None).await
    }

    /// The last processed payload of an identity.
    #[cfg(all(test, feature = "sqlite"))]
    pub(crate) async fn previous(&self, queue: &str, identity: &str) -> Result<Option<Vec<u8>>, TransportError> {
        let what = "reading the previous message";
        let list = text_list([identity]);
        let rows = self.query(what, &[D::PREVIOUS_OF], &[queue.into(), (&list).into()]).await?;
        Ok(rows.first().map(|r| D::bytes(r, 2)).transpose().map_err(fail::<D>(what))?.flatten())
    }

    /// Deletes completed idempotency claims completed before `before` (ms).
    pub(crate) async fn purge_claims(&self, before: i64) -> Result<u64, TransportError> {
        // Looked at first, as housekeeping does: usually nothing is due, and
        // the delete would take SQLite's write lock for nothing (and wait for
        // an application's write transaction on the same file).
        let what = "purging idempotency claims";
        let due = self.query(what, &[sql::CLAIMS_PURGE_DUE], &[before.into()]).await?;
        if !flag::<D>(&due, 0, what)?.unwrap_or(false) {
            return Ok(0);
        }
        self.exec(what, &[sql::CLAIMS_PURGE], &[before.into()]).await
    }

    /// An idempotency store on the same database and clock, so that claims
    /// live beside the messages.
    pub(crate) fn idempotency_store(&self) -> std::sync::Arc<dyn crate::claims::IdempotencyStore> {
        std::sync::Arc::new(super::claims::SqlIdempotencyStore::<D>::on(self))
    }
}

/// Expired leases taken back by one round of housekeeping.
struct TakenBack {
    count: usize,
    /// Of them, those whose handler ran alone: their attempt counts.
    alone: usize,
    /// Of them, those out of attempts: now dead letters.
    dead: usize,
    /// Of them, those that will run alone, one at a time.
    suspects: usize,
}

impl TakenBack {
    /// Logs what was taken back, if anything.
    fn tell(&self, queue: &str) {
        let TakenBack { count, alone, dead, suspects } = *self;
        if count > 0 {
            tracing::warn!(
                queue,
                count,
                ran_alone = alone,
                suspects,
                dead_lettered = dead,
                "took back {count} message(s) whose lease ran out: their consumer stopped or did not extend them in \
                 time. {alone} had run alone (the attempt counts), the others were held together (not counted); \
                 {suspects} will run alone, one at a time, as suspects (a lease of theirs had run out before); \
                 {dead} out of attempts are dead letters"
            );
        }
    }
}
