//! Database queues: `sqlite://` and `postgres://`.
//!
//! [`SqlTransport`] implements the transport seam once, over [`SqlStore`],
//! the one store, over either database; its [`Dialect`] holds what
//! PostgreSQL and SQLite do differently. Rows
//! follow the row state machine of [`machine`]: the status
//! `Error` is the queue's dead letters, a lease expiry is an abandonment, a
//! message's identity keeps one row per (queue, identity).
//!
//! Layers, bottom up: `statements` (the shared SQL) and `driver` (running it
//! on any sqlx driver) and `record` (decoding rows); `dialect` (what
//! differs), `postgres` and `sqlite` (the two dialects); `rows` (the store)
//! and `claims` (the idempotency store); this module (the transport).

mod claims;
mod clock;
mod dialect;
mod driver;
mod held;
pub(crate) mod machine;
mod migrate;
mod options;
pub(crate) mod outbox;
#[cfg(feature = "postgres")]
pub(crate) mod postgres;
mod record;
mod rows;
pub(crate) mod schedules;
mod schema;
#[cfg(feature = "sqlite")]
pub(crate) mod sqlite;
mod stalls;
pub(crate) mod statements;
mod store;
#[cfg(all(test, feature = "postgres", feature = "sqlite"))]
mod tests;

use std::collections::HashMap;
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tokio::sync::Notify;

#[cfg(feature = "postgres")]
pub use claims::PostgresIdempotencyStore;
pub use claims::SqlIdempotencyStore;
#[cfg(feature = "sqlite")]
pub use claims::SqliteIdempotencyStore;
pub(crate) use clock::local_ms;
pub use dialect::Dialect;
pub(crate) use dialect::SqlStore;
pub(crate) use driver::Driver;
pub(crate) use options::SqlOptions;
pub(crate) use record::LeasedRow;
use record::Tuple;
#[cfg(feature = "sqlite")]
pub(crate) use sqlite::{directory_problem as sqlite_directory_problem, missing_file as missing_sqlite_file};
pub(crate) use statements::Tables;
pub(crate) use store::RowOp;

use crate::boxed::BoxFuture;
use crate::error::TransportError;
use crate::queue::QueueSpec;
use crate::throttle::Throttle;
use crate::transport::schedules::ScheduleLedger;
use crate::transport::sql::machine::{Enqueue, EnqueueOutcome, QueueRules, Row, RowId, Status, Take};
use crate::transport::{
    Attributes, Browse, DeadLetter, DeadLetters, Delivery, FailedAttempt, Listing, MessageId, MessagePage,
    MessageReport, MessageStatus, Outgoing, PurgeOutcome, QueueCounts, Receipt, RedriveOptions, RedriveOutcome,
    Transport,
};

/// A queue known to the transport.
struct SqlQueue {
    spec: QueueSpec,
    rules: QueueRules,
    local: Notify,
    /// Bumped by `interrupt_receives`: a waiting receive that sees it change returns.
    interrupts: std::sync::atomic::AtomicU64,
    maintained: Throttle,
    /// Which partition the next lease of a standard queue takes.
    turn: std::sync::atomic::AtomicU32,
    /// The queue's pause flag as last read, and when: read again once it is
    /// a poll interval old, so that every process honours a pause within
    /// one poll interval at the cost of one read per interval.
    paused: Mutex<Option<(std::time::Instant, bool)>>,
}

/// The transport over a database: one [`SqlStore`] and the queues declared on it.
pub(crate) struct SqlTransport<D: Dialect> {
    store: Arc<SqlStore<D>>,
    /// The store's database, which a caller's transaction must be on.
    home: dialect::Home,
    options: SqlOptions,
    claims_purged: Throttle,
    /// When a settlement last said it waits for a row another transaction
    /// holds ([`held`]).
    held_warned: Throttle,
    queues: Arc<QueueMap>,
}

type QueueMap = RwLock<HashMap<String, Arc<SqlQueue>>>;

/// How often at most a receiver runs housekeeping unless woken by time.
const MAINTAIN_EVERY: Duration = Duration::from_millis(100);

impl<D: Dialect> std::fmt::Debug for SqlTransport<D> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SqlTransport").field("options", &self.options).finish_non_exhaustive()
    }
}

/// Connects to a database URL (`sqlite://FILE?...`, `postgres://...?...`):
/// takes the framework's options out, opens the store, and runs the
/// migrations when the URL asks for them (`migrate=true`).
pub(crate) async fn connect<D: Dialect>(url: &str) -> Result<SqlTransport<D>, crate::error::Error> {
    let (store, options) = open::<D>(url).await?;
    Ok(SqlTransport::new(store, options))
}

/// Opens the store a database URL names, with the framework's options taken
/// out (what the transport and the outbox share): the tables in the
/// `schema=` the URL names, migrated when it asks (`migrate=true`).
pub(crate) async fn open<D: Dialect>(url: &str) -> Result<(SqlStore<D>, SqlOptions), crate::error::Error> {
    let (options, driver_url) = SqlOptions::parse(url)?;
    if options.schema.is_some() && !D::SCHEMAS {
        return Err(crate::error::Error::Config {
            url: url.to_owned(),
            reason: format!(
                "`schema=` is a PostgreSQL option; {} keeps the tables in its database file (name another file instead)",
                D::SYSTEM
            ),
        });
    }
    let mut store = SqlStore::<D>::connect_sized(&driver_url, options.max_connections).await?;
    store.tables = Tables::in_schema(options.schema.as_deref());
    if options.migrate {
        store.migrate().await?;
    }
    Ok((store, options))
}

impl<D: Dialect> SqlTransport<D> {
    /// A transport over `store`.
    pub(crate) fn new(store: SqlStore<D>, options: SqlOptions) -> Self {
        let transport = SqlTransport {
            store: Arc::new(store),
            home: dialect::Home::default(),
            options,
            claims_purged: Throttle::default(),
            held_warned: Throttle::default(),
            queues: Arc::default(),
        };
        transport.forward_changes();
        transport
    }

    /// Wakes local receivers when another process enqueues (PostgreSQL NOTIFY).
    fn forward_changes(&self) {
        let Some(mut changes) = D::changes(&self.store.state) else { return };
        let weak = Arc::downgrade(&self.queues);
        tokio::spawn(async move {
            loop {
                let changed = changes.recv().await;
                let Some(map) = weak.upgrade() else { return };
                let map = map.read().unwrap_or_else(|p| p.into_inner());
                match changed {
                    Ok(queue) => {
                        if let Some(q) = map.get(&queue) {
                            q.local.notify_waiters();
                        }
                    }
                    Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => {
                        map.values().for_each(|q| q.local.notify_waiters());
                    }
                    Err(tokio::sync::broadcast::error::RecvError::Closed) => return,
                }
            }
        });
    }

    fn queue(&self, name: &str) -> Result<Arc<SqlQueue>, TransportError> {
        self.queues
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .get(name)
            .cloned()
            .ok_or_else(|| TransportError::QueueNotFound(name.to_owned()))
    }

    fn enqueue_of(&self, message: Outgoing, now: i64) -> Enqueue {
        Enqueue {
            identity: message.identity,
            message_id: MessageId::random_text(),
            // The encoder's vector back without a copy (the body is its
            // only owner).
            payload: Vec::from(message.body),
            priority: message.priority,
            process_at: message.delay.filter(|d| !d.is_zero()).map(|d| now + d.as_millis() as i64),
            status: None,
            group: message.group_id,
            attributes: encode_attributes(&message.attributes),
        }
    }

    /// Runs housekeeping at most every 100 ms per queue (always when `force`).
    async fn maintain(&self, q: &SqlQueue, force: bool) -> Result<(), TransportError> {
        if q.maintained.due(MAINTAIN_EVERY, force) {
            self.store.maintain_after_stalls(q.spec.name, self.store.now(), q.rules).await?;
            self.purge_claims().await;
        }
        Ok(())
    }

    /// Deletes completed idempotency claims past their retention, at most once
    /// a minute (or once per retention period, when that is shorter).
    async fn purge_claims(&self) {
        if !self.claims_purged.due(self.options.claims_retention.min(Duration::from_secs(60)), false) {
            return;
        }
        let before = self.store.now() - self.options.claims_retention.as_millis() as i64;
        match self.store.purge_claims(before).await {
            Ok(0) => {}
            Ok(n) => tracing::debug!(purged = n, "purged completed idempotency claims"),
            Err(e) => tracing::warn!("could not purge idempotency claims: {e}"),
        }
    }

    /// One lease. Where the store allows concurrent leases, the worker keeps
    /// that many receives going and each takes its turn's partition (two
    /// leases of the same rows lock each other's fresh rows while they
    /// re-check them: measured five times slower than one); an empty
    /// partition falls back to the whole queue.
    async fn lease(&self, q: &SqlQueue, n: usize, lease_ms: i64) -> Result<Vec<LeasedRow>, TransportError> {
        let (name, fifo, of) = (q.spec.name, q.spec.fifo, D::CONCURRENT_LEASES);
        let n = if fifo { n.min(FIFO_LEASE) } else { n };
        let take = Take { rows: n, bytes: LEASE_BODIES, at_least: q.spec.concurrency };
        if !fifo && of > 1 {
            let part = q.turn.fetch_add(1, std::sync::atomic::Ordering::Relaxed) % of;
            let rows = D::lease(&self.store, name, self.store.now(), take, lease_ms, None, Some((part, of))).await?;
            if !rows.is_empty() {
                return Ok(rows);
            }
        }
        self.store.lease_taking(name, self.store.now(), take, lease_ms, fifo).await
    }

    /// Gives a lease back: at once without charging the attempt, or after
    /// `delay` as a failed attempt (recorded in the row's history; a `nack`
    /// with a delay and no failure records that).
    async fn give_back(
        &self,
        queue: &str,
        receipt: Receipt,
        delay: Duration,
        failure: Option<FailedAttempt>,
    ) -> Result<(), TransportError> {
        let q = self.queue(queue)?;
        let now = self.store.now();
        let op = match (delay.is_zero(), failure) {
            (true, None) => RowOp::Release,
            (_, failure) => RowOp::Fail {
                retry_at: now + delay.as_millis() as i64,
                failure: failure
                    .unwrap_or_else(|| FailedAttempt::new(0, "Nack", &format!("given back for a retry in {delay:?}"))),
                max_attempts: q.rules.max_attempts,
            },
        };
        let what = if matches!(op, RowOp::Release) { "a release" } else { "scheduling a retry" };
        self.settle(queue, &receipt, op, what).await?;
        q.local.notify_waiters();
        Ok(())
    }

    /// Applies `op` to the rows of `receipts` in one transaction; after a
    /// release, wakes this process's receivers to lease the rows it freed.
    async fn apply_to_all(&self, queue: &str, receipts: Vec<Receipt>, op: RowOp) -> Vec<Result<(), TransportError>> {
        let q = match self.queue(queue) {
            Ok(q) => q,
            Err(e) => return vec![Err(e); receipts.len()],
        };
        let items: Vec<(RowId, u64)> = receipts.iter().map(|r| (r.key, r.token)).collect();
        let results = self
            .store
            .apply_all(queue, self.store.now(), &items, &op)
            .await
            .unwrap_or_else(|e| vec![Err(e); items.len()]);
        if op == RowOp::Release {
            q.local.notify_waiters();
        }
        results
    }

    async fn receive_from(&self, name: &str, max: usize, wait: Duration) -> Result<Vec<Delivery>, TransportError> {
        let q = self.queue(name)?;
        let deadline = tokio::time::Instant::now() + wait;
        let lease_ms = q.spec.visibility.as_millis() as i64;
        let mut force = false;
        let interrupts = q.interrupts.load(std::sync::atomic::Ordering::Acquire);
        loop {
            let notified = q.local.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if q.interrupts.load(std::sync::atomic::Ordering::Acquire) != interrupts {
                return Ok(Vec::new());
            }
            let looked = self.store.now();
            self.maintain(&q, force).await?;
            if !self.is_paused(&q).await? {
                let rows = self.lease(&q, max.max(1), lease_ms).await?;
                if !rows.is_empty() {
                    return Ok(rows.into_iter().map(delivery).collect());
                }
            }
            let now = tokio::time::Instant::now();
            if now >= deadline {
                return Ok(Vec::new());
            }
            // Sleep until something can change: a local or remote enqueue, a
            // sleeper or lease coming due, the poll interval, or the deadline.
            let mut wake = deadline.min(now + self.options.poll);
            if let Some(at) = self.store.next_due(name).await? {
                // Due when housekeeping last looked, and still there: a row
                // it could not change (one another transaction holds) is
                // looked at again after housekeeping's pause, not at once.
                // At once, a 2 s receive ran 2,605 transactions while an
                // application held a due sleeper.
                let in_ms = if at <= looked { MAINTAIN_EVERY.as_millis() as i64 } else { at - self.store.now() };
                wake = wake.min(now + Duration::from_millis(in_ms.max(0) as u64));
            }
            tokio::select! {
                _ = &mut notified => force = false,
                _ = tokio::time::sleep_until(wake) => force = true,
            }
        }
    }
}

impl<D: Dialect> SqlTransport<D> {
    /// Whether `q` is paused, from the flag read at most a poll interval ago.
    async fn is_paused(&self, q: &SqlQueue) -> Result<bool, TransportError> {
        let cached = *q.paused.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((at, paused)) = cached {
            if at.elapsed() < self.options.poll {
                return Ok(paused);
            }
        }
        let paused = self.store.paused(q.spec.name).await?;
        *q.paused.lock().unwrap_or_else(|p| p.into_inner()) = Some((std::time::Instant::now(), paused));
        Ok(paused)
    }

    /// A page of `listing`: rows read a page at a time in lease order,
    /// those passing the type filter kept (it needs the body), until the
    /// page is full or the rows run out.
    async fn list_rows(&self, queue: &str, listing: &Listing) -> Result<MessagePage, TransportError> {
        let status = stored(listing.status).as_str();
        let mut after = match listing.after.as_deref() {
            None => (i64::MAX, i64::MIN),
            Some(text) => parse_cursor(text)?,
        };
        let limit = listing.limit.max(1);
        let (identity, group) = (listing.identity.as_deref(), listing.group.as_deref());
        let mut page = MessagePage::default();
        loop {
            let read = if listing.type_name.is_some() { DEAD_LETTER_PAGE } else { limit + 1 };
            let rows = self.store.page(queue, status, after, read, identity, group).await?;
            let full = rows.len() == read;
            for row in rows {
                after = (i64::from(row.priority), row.seq as i64);
                let report = report_of(queue, row);
                if !listing.matches(&report) {
                    continue;
                }
                if page.messages.len() == limit {
                    // One more than the page: there is a next page, which
                    // starts after the page's last message.
                    page.next = page.messages.last().map(|m| m.cursor.clone());
                    return Ok(page);
                }
                page.messages.push(report);
            }
            if !full {
                return Ok(page);
            }
        }
    }
}

/// The row status that holds the messages of `status`.
fn stored(status: MessageStatus) -> Status {
    match status {
        MessageStatus::Pending => Status::Pending,
        MessageStatus::Sleeping => Status::Sleeping,
        MessageStatus::InFlight => Status::Processing,
        MessageStatus::AwaitingRelease => Status::AwaitingRelease,
        MessageStatus::Dead => Status::Error,
    }
}

/// The cursor of a row: its priority and enqueue position.
fn cursor_of(priority: i32, seq: u64) -> String {
    format!("{priority}.{seq}")
}

fn parse_cursor(text: &str) -> Result<(i64, i64), TransportError> {
    let parsed = text.split_once('.').and_then(|(p, s)| Some((p.parse::<i32>().ok()?, s.parse::<u64>().ok()?)));
    let (priority, seq) = parsed.ok_or_else(|| crate::transport::bad_cursor(text))?;
    Ok((i64::from(priority), i64::try_from(seq).unwrap_or(i64::MAX)))
}

/// What a walk over the dead letters does with the ones it chooses.
#[derive(Debug, Clone, Copy)]
enum Act {
    Redrive,
    Delete,
}

/// Dead letters read per page by a redrive or a purge. Paging by enqueue
/// position makes a walk over n letters O(n): each page is one index range
/// read, where reading every letter again per step made 20,000 take minutes.
const DEAD_LETTER_PAGE: usize = 500;

/// The bodies one lease of a standard queue brings, at most
/// ([`RECEIVE_BODIES`](crate::transport::RECEIVE_BODIES), beyond one
/// message per handler of the queue, which it brings whatever their size,
/// and one body more), by the bodies' lengths in the rows ([`Take`]). The
/// worker asks for about this much by the average body it has received (its
/// pace), which lags when bodies grow. Tried from outside (a consumer of
/// concurrency 8 that had handled 4,000 bodies of 1 KiB, then 1,000 of 512
/// KiB published in one call, debug build): peak memory 785 and 667 MB on
/// PostgreSQL before this bound, 62 and 64 MB with it, the 1,000 handled in
/// 5.1 against 4.0-4.7 s from the publish; on SQLite 1,047 against 45 MB,
/// 9.3 against 7.6 s.
const LEASE_BODIES: i64 = crate::transport::RECEIVE_BODIES as i64;

/// The most heads a FIFO queue's lease takes. Its walk reads four times as
/// many pending rows (`FifoSearch::for_lease`), which a queue of few groups
/// pays in full whatever the lease finds: kept at the size the FIFO
/// benchmark measured when standard leases grew to 1,000.
const FIFO_LEASE: usize = 300;

impl<D: Dialect> SqlTransport<D> {
    /// Walks the dead letters of `queue` a page at a time, oldest first,
    /// taking those `options` choose (at most `max`, passing the filter) and
    /// redriving or deleting each page's in one transaction (a dry run only
    /// counts them); returns (taken, skipped by the filter).
    ///
    /// The walk ends at the newest letter there was when it began. A
    /// redriven letter goes to the back of the queue, so if it fails again
    /// while the walk goes on (its bug not fixed yet, a worker running), it
    /// comes back behind that end: without it, a redrive met its own letters
    /// again (22,420 moves for 20,000 letters, tried from outside with a
    /// failing worker on SQLite) and could chase them for as long as the
    /// worker kept up.
    async fn walk_dead_letters(
        &self,
        queue: &str,
        options: &RedriveOptions,
        act: Act,
    ) -> Result<(usize, usize), TransportError> {
        let max = options.max.unwrap_or(usize::MAX);
        let Some(end) = self.store.last_dead_letter_seq(queue).await? else { return Ok((0, 0)) };
        let (mut taken, mut skipped, mut after) = (0, 0, i64::MIN);
        while taken < max && after < end {
            let page = self.store.dead_letters_after(queue, after, DEAD_LETTER_PAGE).await?;
            let full = page.len() == DEAD_LETTER_PAGE;
            let Some(last) = page.last() else { break };
            after = last.seq as i64;
            let mut chosen = Vec::new();
            for row in page {
                if taken + chosen.len() >= max || row.seq as i64 > end {
                    break;
                }
                let id = row.id;
                if options.filter.as_ref().is_none_or(|f| f(&dead_letter_of(row))) {
                    chosen.push(id);
                } else {
                    skipped += 1;
                }
            }
            taken += match act {
                _ if options.dry_run => chosen.len(),
                Act::Redrive => self.store.redrive(queue, chosen).await?,
                Act::Delete => self.store.delete_dead(queue, &chosen, &[]).await?,
            };
            if !full {
                break;
            }
        }
        Ok((taken, skipped))
    }
}

/// Attributes as stored: a JSON object, or '' for none.
fn encode_attributes(attributes: &Attributes) -> String {
    if attributes.is_empty() {
        String::new()
    } else {
        serde_json::to_string(attributes).unwrap_or_default()
    }
}

fn decode_attributes(text: &str) -> Attributes {
    if text.is_empty() {
        Attributes::new()
    } else {
        serde_json::from_str(text).unwrap_or_default()
    }
}

fn time_of(ms: i64) -> SystemTime {
    UNIX_EPOCH + Duration::from_millis(ms.max(0) as u64)
}

/// The refusal of a message to a FIFO queue without a group id, if it is one.
fn missing_group(spec: &QueueSpec, message: &Outgoing) -> Option<TransportError> {
    (spec.fifo && message.group_id.as_deref().is_none_or(str::is_empty))
        .then(|| TransportError::Rejected(format!("FIFO queue `{}` needs a message group id", spec.name)))
}

fn delivery(row: LeasedRow) -> Delivery {
    Delivery {
        message_id: MessageId::from(row.message_id),
        body: row.payload.into(),
        receipt: Receipt { key: row.id, token: row.token, locator: row.tuple.0, handle: None },
        receive_count: row.attempts,
        group_id: row.group,
        attributes: Arc::new(decode_attributes(&row.attributes)),
        sent_at: time_of(row.sent_at),
        suspect: row.suspect.runs_alone(),
    }
}

fn report_of(queue: &str, row: Row) -> MessageReport {
    let status = match row.status {
        crate::transport::sql::machine::Status::Error => "dead_letter",
        other => other.as_str(),
    };
    MessageReport {
        queue: queue.to_owned(),
        message_id: MessageId::from(row.message_id),
        status: status.to_owned(),
        attempts: row.attempts,
        identity: row.identity,
        group_id: row.group,
        sent_at_ms: row.sent_at,
        process_at_ms: row.process_at,
        held_until_ms: if row.status.is_leased() { row.lease_expires } else { None },
        reason: row.error,
        suspect: row.suspect.runs_alone(),
        history: row.history,
        attributes: decode_attributes(&row.attributes),
        body: row.payload.into(),
        deferred: row.deferred.map(|d| crate::transport::DeferredVersion {
            message_id: d.message_id,
            sent_at_ms: Some(d.sent_at),
            body: d.payload.into(),
        }),
        cursor: cursor_of(row.priority, row.seq),
    }
}

fn dead_letter_of(row: Row) -> DeadLetter {
    DeadLetter {
        message_id: MessageId::from(row.message_id),
        body: row.payload.into(),
        group_id: row.group,
        attributes: Arc::new(decode_attributes(&row.attributes)),
        receive_count: row.attempts,
        reason: row.error,
        history: row.history,
    }
}

impl<D: Dialect> Transport for SqlTransport<D> {
    fn system(&self) -> &'static str {
        D::SYSTEM
    }

    fn declare<'a>(&'a self, spec: &'a QueueSpec) -> BoxFuture<'a, Result<(), TransportError>> {
        Box::pin(async move {
            self.store.declare(spec.name, spec.fifo, self.store.now()).await?;
            let rules = QueueRules {
                idempotent: spec.idempotent,
                max_attempts: spec.max_receives,
                retry_abandoned: self.options.retry_abandoned,
                retention_ms: self.options.retention.as_millis() as i64,
                fifo: spec.fifo,
            };
            let queue = Arc::new(SqlQueue {
                spec: spec.clone(),
                rules,
                local: Notify::new(),
                interrupts: std::sync::atomic::AtomicU64::new(0),
                maintained: Throttle::default(),
                turn: Default::default(),
                paused: Mutex::new(None),
            });
            self.queues.write().unwrap_or_else(|p| p.into_inner()).insert(spec.name.to_owned(), queue);
            Ok(())
        })
    }

    fn send<'a>(&'a self, queue: &'a str, message: Outgoing) -> BoxFuture<'a, Result<MessageId, TransportError>> {
        Box::pin(async move {
            let mut results = self.send_batch(queue, vec![message]).await;
            results.pop().unwrap_or(Err(TransportError::Backend("no result from the database".into())))
        })
    }

    fn send_batch<'a>(
        &'a self,
        queue: &'a str,
        messages: Vec<Outgoing>,
    ) -> BoxFuture<'a, Vec<Result<MessageId, TransportError>>> {
        Box::pin(async move {
            let q = match self.queue(queue) {
                Ok(q) => q,
                Err(_) => return crate::transport::unknown_queue(queue, &messages),
            };
            let now = self.store.now();
            let refused: Vec<Option<TransportError>> = messages.iter().map(|m| missing_group(&q.spec, m)).collect();
            // Converted in place: the messages' vector holds the rows to
            // store (a fresh one of 1,000 was 150 KB of new pages per call).
            let items: Vec<Enqueue> = messages
                .into_iter()
                .enumerate()
                .filter_map(|(i, message)| refused[i].is_none().then(|| self.enqueue_of(message, now)))
                .collect();
            let mut stored = self.store.enqueue(queue, now, items, q.rules.idempotent).await.into_iter();
            q.local.notify_waiters();
            let result = |refused: Option<TransportError>| match refused.map_or_else(|| stored.next(), |r| Some(Err(r)))
            {
                Some(Ok(e)) => {
                    if let EnqueueOutcome::Discarded(_) | EnqueueOutcome::Unchanged = e.outcome {
                        tracing::debug!(queue, "enqueue discarded: the payload equals the stored version");
                    }
                    Ok(e.message_id)
                }
                Some(Err(e)) => Err(e),
                None => Err(TransportError::Backend("the database returned too few results".into())),
            };
            refused.into_iter().map(result).collect()
        })
    }

    fn send_in<'a>(
        &'a self,
        queue: &'a str,
        messages: Vec<Outgoing>,
        conn: &'a mut (dyn std::any::Any + Send),
    ) -> BoxFuture<'a, Result<Vec<MessageId>, TransportError>> {
        Box::pin(async move {
            let Some(conn) = conn.downcast_mut::<D::Connection>() else {
                return Err(TransportError::Rejected(format!(
                    "the transaction is not on {}, where queue `{queue}` is: publish inside a transaction on the \
                     queue's own database",
                    D::SYSTEM
                )));
            };
            let q = self.queue(queue)?;
            self.home.check(&self.store, conn, &format!("queue `{queue}`")).await?;
            let now = self.store.now();
            let mut items = Vec::with_capacity(messages.len());
            for message in messages {
                if let Some(missing) = missing_group(&q.spec, &message) {
                    return Err(missing);
                }
                items.push(self.enqueue_of(message, now));
            }
            let stored = self.store.enqueue_on(conn, queue, now, items, q.rules.idempotent).await?;
            Ok(stored.into_iter().map(|e| e.message_id).collect())
        })
    }

    fn takes_transaction(&self, conn: &dyn std::any::Any) -> bool {
        conn.is::<D::Connection>()
    }

    fn receive<'a>(
        &'a self,
        queue: &'a str,
        max: usize,
        wait: Duration,
    ) -> BoxFuture<'a, Result<Vec<Delivery>, TransportError>> {
        Box::pin(self.receive_from(queue, max, wait))
    }

    fn ack<'a>(&'a self, queue: &'a str, receipts: Vec<Receipt>) -> BoxFuture<'a, Vec<Result<(), TransportError>>> {
        Box::pin(async move {
            let retention = match self.queue(queue) {
                Ok(q) => q.rules.retention_ms,
                Err(_) => return crate::transport::unknown_queue(queue, &receipts),
            };
            let items = receipts.iter().map(|r| (r.key, r.token, Tuple(r.locator))).collect();
            let results = self.store.complete(queue, self.store.now(), items, retention).await;
            // A completion can unlock a FIFO group or apply a deferred version,
            // and it frees rows that a receiver may have skipped as locked.
            if let Ok(q) = self.queue(queue) {
                q.local.notify_waiters();
            }
            results
        })
    }

    fn nack<'a>(
        &'a self,
        queue: &'a str,
        receipt: Receipt,
        delay: Duration,
    ) -> BoxFuture<'a, Result<(), TransportError>> {
        Box::pin(self.give_back(queue, receipt, delay, None))
    }

    fn postpone<'a>(
        &'a self,
        queue: &'a str,
        receipt: Receipt,
        delay: Duration,
        reason: &'a str,
    ) -> BoxFuture<'a, Result<(), TransportError>> {
        Box::pin(async move {
            self.queue(queue)?;
            let now = self.store.now();
            let retry_at = now.saturating_add(delay.as_millis().min(i64::MAX as u128) as i64);
            let op = RowOp::Postpone { retry_at, reason: reason.to_owned() };
            self.settle(queue, &receipt, op, "postponing a message").await
        })
    }

    fn release<'a>(&'a self, queue: &'a str, receipts: Vec<Receipt>) -> BoxFuture<'a, Vec<Result<(), TransportError>>> {
        // One transaction for the lot: at 3 ms a row on PostgreSQL, a
        // FIFO worker's prefetched batch of 300 took about a second to
        // give back one row at a time.
        Box::pin(self.apply_to_all(queue, receipts, RowOp::Release))
    }

    fn extend_all<'a>(
        &'a self,
        queue: &'a str,
        receipts: Vec<Receipt>,
        visibility: Duration,
    ) -> BoxFuture<'a, Vec<Result<(), TransportError>>> {
        // One statement per batch of the heartbeat: one at a time, a
        // batch of 300 took longer to extend than a short visibility.
        let lease_ms = visibility.as_millis().min(i64::MAX as u128) as i64;
        Box::pin(self.apply_to_all(queue, receipts, RowOp::Extend { lease_ms }))
    }

    fn fail<'a>(
        &'a self,
        queue: &'a str,
        receipt: Receipt,
        delay: Duration,
        failure: FailedAttempt,
    ) -> BoxFuture<'a, Result<(), TransportError>> {
        Box::pin(self.give_back(queue, receipt, delay, Some(failure)))
    }

    fn record_failure<'a>(
        &'a self,
        queue: &'a str,
        receipt: &'a Receipt,
        failure: FailedAttempt,
    ) -> BoxFuture<'a, Result<(), TransportError>> {
        Box::pin(async move {
            self.queue(queue)?;
            let op = RowOp::Note { failure };
            self.settle(queue, receipt, op, "recording a failed attempt").await
        })
    }

    fn isolate<'a>(&'a self, queue: &'a str, receipt: &'a Receipt) -> BoxFuture<'a, Result<(), TransportError>> {
        Box::pin(async move {
            self.queue(queue)?;
            self.store.isolate(queue, receipt.key, receipt.token).await
        })
    }

    fn rejoin<'a>(&'a self, queue: &'a str, receipt: &'a Receipt) -> BoxFuture<'a, Result<(), TransportError>> {
        Box::pin(async move {
            self.queue(queue)?;
            self.store.rejoin(queue, receipt.key, receipt.token).await
        })
    }

    fn extend<'a>(
        &'a self,
        queue: &'a str,
        receipt: &'a Receipt,
        visibility: Duration,
    ) -> BoxFuture<'a, Result<(), TransportError>> {
        Box::pin(async move {
            let op = RowOp::Extend { lease_ms: visibility.as_millis() as i64 };
            self.store.apply(queue, self.store.now(), receipt.key, receipt.token, op).await
        })
    }

    fn concurrent_receives(&self) -> usize {
        D::CONCURRENT_LEASES as usize
    }

    fn max_send_batch(&self) -> usize {
        // An enqueue of 1,000 plain rows is one statement on either database
        // and one round trip: split at the lease size
        // of 300 it took four, and a batch of 1,000 was published at 0.36 of
        // a raw insert into a table of the same shape.
        1_000
    }

    fn max_batch(&self) -> usize {
        // A lease or a completion costs about as much per statement as for
        // 100 rows: 300 rows per statement cut the drain time by a third,
        // and 1,000 more than 300. Part of a PostgreSQL lease's cost is its
        // walk to the first pending row, past the index entries of the rows
        // leased just before; the larger the lease, the fewer walks. The
        // framework's drain of 200,000 alone, three runs each in turn: 300
        // 91,000-94,000 msgs/s, 600 101,000-111,000, 1,000 108,000-116,000
        // on PostgreSQL; 131,000-135,000, 142,000-155,000, 149,000-157,000 on
        // SQLite. The worker asks for fewer when handlers are slow (about
        // 200 ms of work per lane, `worker::pace`), and a FIFO queue's lease
        // stays at `FIFO_LEASE` heads.
        1_000
    }

    fn max_delay(&self) -> Duration {
        Duration::from_secs(365 * 24 * 3600)
    }

    fn depth<'a>(&'a self, queue: &'a str) -> BoxFuture<'a, Result<u64, TransportError>> {
        Box::pin(self.store.depth(queue))
    }

    fn dead_letters(&self) -> Option<&dyn DeadLetters> {
        Some(self)
    }

    fn browse(&self) -> Option<&dyn Browse> {
        Some(self)
    }

    fn interrupt_receives(&self, queue: &str) {
        if let Ok(q) = self.queue(queue) {
            q.interrupts.fetch_add(1, std::sync::atomic::Ordering::AcqRel);
            q.local.notify_waiters();
        }
    }

    fn wake_receivers(&self) {
        for q in self.queues.read().unwrap_or_else(|p| p.into_inner()).values() {
            q.local.notify_waiters();
        }
    }

    fn postpones(&self, _spec: &QueueSpec) -> bool {
        true
    }

    fn keeps_dead_letters(&self, _spec: &QueueSpec) -> bool {
        true // rows in `error`, with or without a declared `dlq`
    }

    fn migrate(&self) -> BoxFuture<'_, Result<(), TransportError>> {
        Box::pin(self.store.migrate())
    }

    fn inspect<'a>(
        &'a self,
        queue: &'a str,
        id: &'a MessageId,
    ) -> BoxFuture<'a, Result<Option<MessageReport>, TransportError>> {
        Box::pin(
            async move { Ok(self.store.by_message_id(queue, id.as_str()).await?.map(|row| report_of(queue, row))) },
        )
    }

    fn idempotency_store(&self) -> Option<Arc<dyn crate::claims::IdempotencyStore>> {
        Some(self.store.idempotency_store())
    }

    fn schedule_ledger(&self) -> Option<Arc<dyn ScheduleLedger>> {
        Some(Arc::new(schedules::SqlLedger::on(&self.store)))
    }
}

impl<D: Dialect> DeadLetters for SqlTransport<D> {
    fn dead_letter<'a>(
        &'a self,
        queue: &'a str,
        delivery: &'a Delivery,
        failure: FailedAttempt,
    ) -> BoxFuture<'a, Result<(), TransportError>> {
        Box::pin(async move {
            let op = RowOp::DeadLetter { failure };
            self.settle(queue, &delivery.receipt, op, "dead-lettering a message").await
        })
    }

    fn peek<'a>(&'a self, queue: &'a str, max: usize) -> BoxFuture<'a, Result<Vec<DeadLetter>, TransportError>> {
        Box::pin(
            async move { Ok(self.store.dead_letters(queue, max).await?.into_iter().map(dead_letter_of).collect()) },
        )
    }

    fn redrive<'a>(
        &'a self,
        queue: &'a str,
        options: RedriveOptions,
    ) -> BoxFuture<'a, Result<RedriveOutcome, TransportError>> {
        Box::pin(async move {
            let (moved, skipped) = self.walk_dead_letters(queue, &options, Act::Redrive).await?;
            if let Ok(q) = self.queue(queue) {
                q.local.notify_waiters();
            }
            Ok(RedriveOutcome { moved, skipped })
        })
    }

    fn delete<'a>(&'a self, queue: &'a str, ids: &'a [MessageId]) -> BoxFuture<'a, Result<usize, TransportError>> {
        Box::pin(async move {
            let ids: Vec<&str> = ids.iter().map(MessageId::as_str).collect();
            self.store.delete_dead(queue, &[], &ids).await
        })
    }

    fn purge<'a>(
        &'a self,
        queue: &'a str,
        options: RedriveOptions,
    ) -> BoxFuture<'a, Result<PurgeOutcome, TransportError>> {
        Box::pin(async move {
            let (deleted, skipped) = self.walk_dead_letters(queue, &options, Act::Delete).await?;
            Ok(PurgeOutcome { deleted, skipped })
        })
    }

    fn depth<'a>(&'a self, queue: &'a str) -> BoxFuture<'a, Result<u64, TransportError>> {
        Box::pin(self.store.error_depth(queue))
    }
}

impl<D: Dialect> Browse for SqlTransport<D> {
    fn counts<'a>(&'a self, queue: &'a str) -> BoxFuture<'a, Result<QueueCounts, TransportError>> {
        Box::pin(async move {
            let found = self.store.counts(queue, self.store.now()).await?;
            let mut counts = QueueCounts {
                oldest_sent_at_ms: SqlStore::<D>::oldest_live(&found),
                oldest_pending_since_ms: found.iter().filter_map(|c| c.due_since).min(),
                expired: Some(found.iter().map(|c| c.expired).sum()),
                ..QueueCounts::zeros()
            };
            for c in &found {
                // Processed rows, kept for retention, are none of the console's statuses.
                let row = Status::parse(&c.status);
                if let Some(status) = MessageStatus::ALL.into_iter().find(|&s| Some(stored(s)) == row) {
                    counts.set(status, c.count);
                }
            }
            Ok(counts)
        })
    }

    fn list<'a>(&'a self, queue: &'a str, listing: &'a Listing) -> BoxFuture<'a, Result<MessagePage, TransportError>> {
        Box::pin(self.list_rows(queue, listing))
    }

    fn retry_now<'a>(&'a self, queue: &'a str, ids: &'a [MessageId]) -> BoxFuture<'a, Result<usize, TransportError>> {
        Box::pin(async move {
            let ids: Vec<&str> = ids.iter().map(MessageId::as_str).collect();
            let changed = self.store.retry_now(queue, &ids).await?;
            if let Ok(q) = self.queue(queue) {
                q.local.notify_waiters();
            }
            Ok(changed)
        })
    }

    fn delete<'a>(&'a self, queue: &'a str, ids: &'a [MessageId]) -> BoxFuture<'a, Result<usize, TransportError>> {
        Box::pin(async move {
            let ids: Vec<&str> = ids.iter().map(MessageId::as_str).collect();
            self.store.delete_waiting(queue, &ids).await
        })
    }

    fn redrive_ids<'a>(&'a self, queue: &'a str, ids: &'a [MessageId]) -> BoxFuture<'a, Result<usize, TransportError>> {
        Box::pin(async move {
            let ids: Vec<&str> = ids.iter().map(MessageId::as_str).collect();
            let rows = self.store.dead_rows(queue, &ids).await?;
            let moved = self.store.redrive(queue, rows).await?;
            if let Ok(q) = self.queue(queue) {
                q.local.notify_waiters();
            }
            Ok(moved)
        })
    }

    fn set_paused<'a>(&'a self, queue: &'a str, paused: bool) -> BoxFuture<'a, Result<bool, TransportError>> {
        Box::pin(async move {
            self.store.set_paused(queue, paused).await?;
            if let Ok(q) = self.queue(queue) {
                *q.paused.lock().unwrap_or_else(|p| p.into_inner()) = Some((std::time::Instant::now(), paused));
                q.local.notify_waiters();
            }
            Ok(true)
        })
    }

    fn paused<'a>(&'a self, queue: &'a str) -> BoxFuture<'a, Result<Option<bool>, TransportError>> {
        Box::pin(async move { Ok(Some(self.store.paused(queue).await?)) })
    }
}
