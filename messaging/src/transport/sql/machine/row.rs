//! The transitions of database queue rows, on an in-memory table of rows.

#[cfg(test)]
use std::collections::{BTreeMap, HashMap, HashSet};

use super::Status;
use crate::transport::FailedAttempt;

/// The error of an attempt whose lease expired while its handler ran alone
/// in its process (counted).
pub(crate) const LEASE_EXPIRED: &str =
    "the lease expired before the message was settled, while its handler ran alone (the process stopped, the \
     handler outlived the visibility timeout, or the heartbeat could not extend the lease in time)";

/// The error of a lease that expired for the first time while its consumer
/// held other messages too (not counted: any of them may have stopped the
/// process, or none did).
pub(crate) const LEASE_EXPIRED_ONCE: &str =
    "the lease expired before the message was settled, while its consumer held other messages too (not counted \
     as an attempt; if its lease runs out like this again, the message runs alone)";

/// The error of a lease that expired again while its consumer held other
/// messages too (not counted: the message is run alone next).
pub(crate) const LEASE_EXPIRED_SHARED: &str =
    "the lease expired before the message was settled, while its consumer held other messages too (not counted \
     as an attempt: the message is run alone next)";

/// What a row's leases say about its message: whether it may have stopped
/// the process that held it. A consumer that dies (an `abort`, a segfault,
/// the OOM killer, a `SIGKILL`) lets every lease it held run out, and
/// nothing tells the message that killed it from the others it held; so a
/// lease that runs out is not counted as an attempt at take-back, unless
/// its message ran alone. A message whose lease ran out twice (in two
/// crashes, say) is a suspect, which the worker runs alone.
///
/// Why twice and not once: most processes that die were not killed by a
/// message (a deploy's `SIGKILL` after its grace period, the OOM killer
/// under load, a lost machine), and after such a crash every message it
/// held would have run alone, one at a time in the whole process: 1,000
/// messages held with handlers of 100 ms, over a minute and a half of one
/// handler at a time. A message that does stop its process costs one crash
/// more to find this way.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Suspect {
    /// No lease of the current version ran out (or its handler answered since).
    #[default]
    No,
    /// A lease ran out once, while its consumer held other messages too: it
    /// is handled as usual.
    Once,
    /// Leases ran out at least twice (or once while it ran alone): its
    /// handler runs alone in its process.
    Yes,
    /// Leased as a suspect, and its handler runs alone in its process now.
    Alone,
}

impl Suspect {
    /// The value stored in the `suspect` column.
    pub(crate) fn code(self) -> i32 {
        match self {
            Suspect::No => 0,
            Suspect::Yes => 1,
            Suspect::Alone => 2,
            Suspect::Once => 3,
        }
    }

    /// The mark of a stored value (anything unknown reads as a suspect: the
    /// cautious side).
    pub(crate) fn of_code(code: i32) -> Suspect {
        match code {
            0 => Suspect::No,
            2 => Suspect::Alone,
            3 => Suspect::Once,
            _ => Suspect::Yes,
        }
    }

    /// Whether its handler runs alone when it is next received
    /// ([`Delivery::suspect`](crate::transport::Delivery::suspect)).
    pub(crate) fn runs_alone(self) -> bool {
        matches!(self, Suspect::Yes | Suspect::Alone)
    }
}

/// A row's id (insertion order within the table).
pub(crate) type RowId = u64;

/// Per-queue rules of the state machine.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QueueRules {
    /// Discard an enqueue whose payload equals the newest stored version.
    pub idempotent: bool,
    /// Attempts before a failing message goes to `Error`.
    pub max_attempts: u32,
    /// Whether an abandoned (expired) lease goes back to `Pending` (attempt
    /// counted) rather than to `Error`.
    pub retry_abandoned: bool,
    /// How long `Processed` rows are kept, in milliseconds (0 deletes at once).
    pub retention_ms: i64,
    /// One leased message per group at a time, in enqueue order.
    pub fifo: bool,
}

impl Default for QueueRules {
    fn default() -> Self {
        QueueRules { idempotent: false, max_attempts: 5, retry_abandoned: true, retention_ms: 0, fifo: false }
    }
}

/// An enqueue request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Enqueue {
    /// The message's identity: at most one row per identity.
    pub identity: Option<String>,
    /// The id of this version of the message (fresh for every enqueue).
    pub message_id: String,
    /// The encoded body.
    pub payload: Vec<u8>,
    /// Higher is leased first.
    pub priority: i32,
    /// Not leased before this time (ms).
    pub process_at: Option<i64>,
    /// A custom status to land in instead of Pending/Sleeping.
    pub status: Option<Status>,
    /// FIFO message group.
    pub group: Option<String>,
    /// Message attributes, as JSON text (opaque here).
    pub attributes: String,
}

#[cfg(test)]
impl Enqueue {
    /// A message for tests, every option at its default.
    pub(crate) fn test(message_id: &str, identity: Option<&str>, payload: &str) -> Enqueue {
        Enqueue {
            identity: identity.map(str::to_owned),
            message_id: message_id.into(),
            payload: payload.as_bytes().to_vec(),
            priority: 0,
            process_at: None,
            status: None,
            group: None,
            attributes: String::new(),
        }
    }
}

/// A newer version stored while the row is leased.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Deferred {
    /// The new version's id.
    pub message_id: String,
    /// Its payload.
    pub payload: Vec<u8>,
    /// Its priority.
    pub priority: i32,
    /// Its process-at time.
    pub process_at: Option<i64>,
    /// A custom status to apply on release.
    pub status_after_release: Option<Status>,
    /// Its enqueue order.
    pub seq: u64,
    /// Its attributes.
    pub attributes: String,
    /// When it was enqueued (ms).
    pub sent_at: i64,
}

/// One message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Row {
    /// The row's id.
    pub id: RowId,
    /// The identity, if any.
    pub identity: Option<String>,
    /// FIFO group.
    pub group: Option<String>,
    /// The current version's id.
    pub message_id: String,
    /// The current version's payload.
    pub payload: Vec<u8>,
    /// Priority.
    pub priority: i32,
    /// Process-at time (ms).
    pub process_at: Option<i64>,
    /// Status.
    pub status: Status,
    /// Leases of the current version so far.
    pub attempts: u32,
    /// Enqueue order (of the current version).
    pub seq: u64,
    /// The current lease's token.
    pub lease_token: Option<u64>,
    /// When the current lease expires (ms).
    pub lease_expires: Option<i64>,
    /// A newer version waiting for the lease to end.
    pub deferred: Option<Deferred>,
    /// When it was processed (ms), for retention.
    pub processed_at: Option<i64>,
    /// The last failure (a dead letter's reason).
    pub error: Option<String>,
    /// The current version's failed attempts, oldest first (the last
    /// [`FailedAttempt::KEPT`]).
    pub history: Vec<FailedAttempt>,
    /// The current version's attributes.
    pub attributes: String,
    /// When the current version was enqueued (ms).
    pub sent_at: i64,
    /// Whether a lease of the current version ran out (see [`Suspect`]).
    pub suspect: Suspect,
}

impl Enqueue {
    /// The status a new row of this message lands in at `now`.
    pub(crate) fn landing(&self, now: i64) -> Status {
        self.status.unwrap_or_else(|| landing(self.process_at, now))
    }

    /// What an insert of this message as a new row at `now` writes
    /// ([`Row::new`]'s values), without building the [`Row`]: an append of
    /// plain messages needs nothing else, and a thousand rows built for it
    /// were 430 KB written, moved and freed per `send_batch`. (SQLite's
    /// append binds from the message itself, moving the payload out.)
    #[cfg(feature = "postgres")]
    pub(crate) fn written(&self, now: i64) -> Written<'_> {
        Written {
            identity: self.identity.as_deref(),
            group: self.group.as_deref(),
            message_id: &self.message_id,
            payload: &self.payload,
            attributes: &self.attributes,
            priority: self.priority,
            process_at: self.process_at,
            status: self.landing(now),
        }
    }
}

/// The values an insert writes of one new row (the rest start at their
/// defaults: no attempts, no lease, no history).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Written<'a> {
    pub identity: Option<&'a str>,
    pub group: Option<&'a str>,
    pub message_id: &'a str,
    pub payload: &'a [u8],
    pub attributes: &'a str,
    pub priority: i32,
    pub process_at: Option<i64>,
    pub status: Status,
}

/// What an enqueue did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EnqueueOutcome {
    /// A new row.
    Inserted(RowId),
    /// A new row of a message without identity, its id not read back: the
    /// stores insert such messages without returning their rows (on
    /// PostgreSQL, returning them cost a tenth of the insert). Never an
    /// outcome of the state machine, which always knows its ids.
    Appended,
    /// An existing row got the new version.
    Updated(RowId),
    /// The row is leased; the new version waits for the release.
    Deferred(RowId),
    /// The payload equals the newest version on an idempotent queue.
    Discarded(RowId),
    /// No row exists, and the payload equals the identity's last processed
    /// version on an idempotent queue: nothing to do (the "send everything,
    /// process what changed" use, with processed rows deleted).
    Unchanged,
}

impl EnqueueOutcome {
    /// The same outcome on row `id` (a new row's id, known once inserted).
    pub(crate) fn on_row(self, id: RowId) -> Self {
        match self {
            EnqueueOutcome::Inserted(_) | EnqueueOutcome::Appended => EnqueueOutcome::Inserted(id),
            EnqueueOutcome::Updated(_) => EnqueueOutcome::Updated(id),
            EnqueueOutcome::Deferred(_) => EnqueueOutcome::Deferred(id),
            EnqueueOutcome::Discarded(_) => EnqueueOutcome::Discarded(id),
            EnqueueOutcome::Unchanged => EnqueueOutcome::Unchanged,
        }
    }

    /// The row concerned, when known (none when the message was
    /// [`EnqueueOutcome::Unchanged`], or [`EnqueueOutcome::Appended`]).
    pub fn row(self) -> Option<RowId> {
        match self {
            EnqueueOutcome::Inserted(id)
            | EnqueueOutcome::Updated(id)
            | EnqueueOutcome::Deferred(id)
            | EnqueueOutcome::Discarded(id) => Some(id),
            EnqueueOutcome::Unchanged | EnqueueOutcome::Appended => None,
        }
    }
}

/// A leased row (of the test oracle).
#[cfg(test)]
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Leased {
    /// The row.
    pub id: RowId,
    /// The lease's token: every later call must present it.
    pub token: u64,
    /// The version's id.
    pub message_id: String,
    /// The payload.
    pub payload: Vec<u8>,
    /// Attempts including this one.
    pub attempts: u32,
    /// FIFO group.
    pub group: Option<String>,
    /// Whether the message is a suspect (see [`Suspect`]).
    pub suspect: Suspect,
}

/// A call with a token that no longer holds the lease (it expired, or the row
/// was settled or leased again). Nothing changed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the lease was lost: it expired or the message was settled or leased again")]
pub struct LeaseLost;

/// What completing a row asks of its storage.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Completed {
    /// Delete the row (retention 0 and no newer version).
    pub delete: bool,
    /// Record this as the identity's previous message: (identity, message id, payload).
    pub previous: Option<(String, String, Vec<u8>)>,
}

/// Pending, or Sleeping when process-at is in the future.
fn landing(process_at: Option<i64>, now: i64) -> Status {
    match process_at {
        Some(at) if at > now => Status::Sleeping,
        _ => Status::Pending,
    }
}

/// The transitions of one row. Storage backends load a row, call one of
/// these, and store the result; `IdentityQueue` (tests) does the same in memory.
impl Row {
    /// A new row for an enqueue.
    pub fn new(id: RowId, seq: u64, now: i64, e: Enqueue) -> Row {
        let status = e.landing(now);
        Row {
            id,
            identity: e.identity,
            group: e.group,
            message_id: e.message_id,
            payload: e.payload,
            priority: e.priority,
            process_at: e.process_at,
            status,
            attempts: 0,
            seq,
            lease_token: None,
            lease_expires: None,
            deferred: None,
            processed_at: None,
            error: None,
            history: Vec::new(),
            attributes: e.attributes,
            sent_at: now,
            suspect: Suspect::No,
        }
    }

    /// What an insert of this (new) row writes.
    pub(crate) fn written(&self) -> Written<'_> {
        Written {
            identity: self.identity.as_deref(),
            group: self.group.as_deref(),
            message_id: &self.message_id,
            payload: &self.payload,
            attributes: &self.attributes,
            priority: self.priority,
            process_at: self.process_at,
            status: self.status,
        }
    }

    /// The newest version's payload: the deferred one while awaiting release.
    pub fn newest_payload(&self) -> &[u8] {
        match (&self.status, &self.deferred) {
            (Status::AwaitingRelease, Some(d)) => &d.payload,
            _ => &self.payload,
        }
    }

    /// Enqueues a new version onto this (existing) row.
    pub fn enqueue(&mut self, now: i64, seq: u64, e: Enqueue, idempotent: bool) -> EnqueueOutcome {
        if idempotent && self.newest_payload() == e.payload.as_slice() {
            return EnqueueOutcome::Discarded(self.id);
        }
        if self.status.is_leased() {
            self.status = Status::AwaitingRelease;
            self.deferred = Some(Deferred {
                message_id: e.message_id,
                payload: e.payload,
                priority: e.priority,
                process_at: e.process_at,
                status_after_release: e.status,
                seq,
                attributes: e.attributes,
                sent_at: now,
            });
            return EnqueueOutcome::Deferred(self.id);
        }
        self.message_id = e.message_id;
        self.payload = e.payload;
        self.priority = e.priority;
        self.process_at = e.process_at;
        self.status = e.status.unwrap_or_else(|| landing(e.process_at, now));
        self.attempts = 0;
        self.seq = seq;
        self.processed_at = None;
        self.error = None;
        self.history.clear();
        self.attributes = e.attributes;
        self.sent_at = now;
        self.suspect = Suspect::No;
        if e.group.is_some() {
            self.group = e.group;
        }
        EnqueueOutcome::Updated(self.id)
    }

    /// Whether the row can be leased now.
    pub fn is_eligible(&self, now: i64) -> bool {
        match self.status {
            Status::Pending => true,
            Status::Sleeping => self.process_at.is_none_or(|at| at <= now),
            _ => false,
        }
    }

    /// Leases the row with `token` until `now + lease_ms`.
    pub fn lease(&mut self, now: i64, token: u64, lease_ms: i64) {
        self.status = Status::Processing;
        self.lease_token = Some(token);
        self.lease_expires = Some(now + lease_ms);
        self.attempts += 1;
    }

    /// Whether `token` holds the row's lease: until the lease is taken back
    /// (`IdentityQueue::expire`, housekeeping), which clears the token, or settled,
    /// even once its time has run out. Nothing else can take the row
    /// meanwhile (a take-back and a settlement of the same row are
    /// serialized by the database), so a late outcome settles a message
    /// that would otherwise come back and run twice: a handler slower than
    /// its visibility while no receive ran, a heartbeat held up by a stalled
    /// database, or a row an application's transaction held past the
    /// visibility (tried from outside: one row held 15 s on a 1 s
    /// visibility ran twice, its acknowledgement refused as late although
    /// nothing had taken it back). The memory queue fences the same way.
    pub fn holds(&self, token: u64) -> bool {
        self.status.is_leased() && self.lease_token == Some(token)
    }

    fn check(&self, token: u64) -> Result<(), LeaseLost> {
        if self.holds(token) {
            Ok(())
        } else {
            Err(LeaseLost)
        }
    }

    fn clear_lease(&mut self) {
        self.lease_token = None;
        self.lease_expires = None;
    }

    /// Applies the deferred version of an `AwaitingRelease` row.
    fn apply_deferred(&mut self, now: i64) {
        self.clear_lease();
        match self.deferred.take() {
            Some(d) => {
                self.message_id = d.message_id;
                self.payload = d.payload;
                self.priority = d.priority;
                self.process_at = d.process_at;
                self.status = d.status_after_release.unwrap_or_else(|| landing(d.process_at, now));
                self.seq = d.seq;
                self.attempts = 0;
                self.error = None;
                self.history.clear();
                self.attributes = d.attributes;
                self.sent_at = d.sent_at;
                self.suspect = Suspect::No;
            }
            None => self.status = Status::Pending,
        }
    }

    /// Completes the leased row.
    pub fn complete(&mut self, now: i64, token: u64, retention_ms: i64) -> Result<Completed, LeaseLost> {
        self.check(token)?;
        let previous = self.identity.clone().map(|k| (k, self.message_id.clone(), self.payload.clone()));
        let delete = if self.status == Status::AwaitingRelease {
            self.apply_deferred(now);
            false
        } else {
            self.status = Status::Processed;
            self.clear_lease();
            self.processed_at = Some(now);
            self.suspect = Suspect::No;
            retention_ms <= 0
        };
        Ok(Completed { delete, previous })
    }

    /// Records a failed attempt of the current version (its number: the
    /// caller's, or the leases so far when that is more, since a FIFO message
    /// may be tried again within one lease; its time: `now`); the reason a
    /// dead letter shows.
    /// A recorded failure is the handler's answer: the message did not stop
    /// its process this time, and is a suspect no more.
    fn record(&mut self, now: i64, attempt: u32, error_type: &str, message: &str) {
        self.suspect = Suspect::No;
        let attempt = attempt.max(self.attempts);
        let failure = FailedAttempt { at_ms: now, ..FailedAttempt::new(attempt, error_type, message) };
        self.error = Some(failure.reason());
        failure.push_onto(&mut self.history);
    }

    /// A failed attempt: Sleeping until `retry_at` while attempts remain, else Error.
    pub fn fail(
        &mut self,
        now: i64,
        token: u64,
        retry_at: i64,
        failure: &FailedAttempt,
        max_attempts: u32,
    ) -> Result<(), LeaseLost> {
        self.check(token)?;
        if self.status == Status::AwaitingRelease {
            self.apply_deferred(now);
            return Ok(());
        }
        self.clear_lease();
        self.record(now, failure.attempt, &failure.error_type, &failure.message);
        if self.attempts < max_attempts {
            self.process_at = Some(retry_at);
            self.status = landing(Some(retry_at), now);
        } else {
            self.status = Status::Error;
        }
        Ok(())
    }

    /// A failed attempt that the lease's holder tries again itself (a FIFO
    /// message, whose group waits for it): recorded in the history and as the
    /// last error, and the next try charged now, as a lease charges its
    /// first (a release gives that charge back if the try is never made, and
    /// an expired lease keeps it). The lease and the status stay.
    pub fn note(&mut self, now: i64, token: u64, failure: &FailedAttempt) -> Result<(), LeaseLost> {
        self.check(token)?;
        let attempt = failure.attempt.max(self.attempts);
        self.record(now, attempt, &failure.error_type, &failure.message);
        self.attempts = attempt + 1;
        Ok(())
    }

    /// A permanent failure: Error at once (unless a newer version waits).
    pub fn dead_letter(&mut self, now: i64, token: u64, failure: &FailedAttempt) -> Result<(), LeaseLost> {
        self.check(token)?;
        if self.status == Status::AwaitingRelease {
            self.apply_deferred(now);
            return Ok(());
        }
        self.clear_lease();
        self.record(now, failure.attempt, &failure.error_type, &failure.message);
        self.status = Status::Error;
        Ok(())
    }

    /// Gives the lease back without charging the attempt about to be made
    /// (shutdown). Attempts made under the lease and noted stay charged.
    pub fn release(&mut self, now: i64, token: u64) -> Result<(), LeaseLost> {
        self.check(token)?;
        if self.status == Status::AwaitingRelease {
            self.apply_deferred(now);
        } else {
            self.clear_lease();
            self.attempts = self.attempts.saturating_sub(1);
            self.status = Status::Pending;
            if self.suspect == Suspect::Alone {
                self.suspect = Suspect::Yes;
            }
        }
        Ok(())
    }

    /// Gives the lease back without charging the attempt, to be leased
    /// again at `retry_at` (Sleeping until then): a consumer that cannot
    /// read this version yet leaves it for a newer one. As a release, it
    /// made no attempt, and the history stays as it was; `reason` is its
    /// last error, what `show` and the console say of it meanwhile.
    pub fn postpone(&mut self, now: i64, token: u64, retry_at: i64, reason: &str) -> Result<(), LeaseLost> {
        let deferred = self.status == Status::AwaitingRelease;
        self.release(now, token)?;
        if !deferred {
            self.process_at = Some(retry_at);
            self.status = landing(Some(retry_at), now);
            self.error = Some(reason.to_owned());
        }
        Ok(())
    }

    /// Marks the leased row as run alone in its process from now (a
    /// suspect's handler about to start with nothing else running): if
    /// this lease runs out, the attempt counts. (The worker asks for it
    /// only for suspects; any leased row takes it.)
    pub fn isolate(&mut self, token: u64) -> Result<(), LeaseLost> {
        self.check(token)?;
        self.suspect = Suspect::Alone;
        Ok(())
    }

    /// Takes back [`Row::isolate`]'s mark while the lease is still held: the
    /// suspect's handler did not run after all (another delivery holds its
    /// idempotency claim), and the worker keeps the message to try again
    /// later while other handlers run. A lease that runs out now is not
    /// counted against it: it is one of many held, as before it was marked.
    pub fn rejoin(&mut self, token: u64) -> Result<(), LeaseLost> {
        self.check(token)?;
        if self.suspect == Suspect::Alone {
            self.suspect = Suspect::Yes;
        }
        Ok(())
    }

    /// Pushes the lease's expiry out (heartbeat).
    pub fn extend(&mut self, now: i64, token: u64, lease_ms: i64) -> Result<(), LeaseLost> {
        self.check(token)?;
        self.lease_expires = Some(now + lease_ms);
        Ok(())
    }

    /// Whether the row's lease has expired (it was abandoned).
    pub fn is_abandoned(&self, now: i64) -> bool {
        self.status.is_leased() && self.lease_expires.is_some_and(|e| e <= now)
    }

    /// Abandonment of an expired lease. The attempt counts only if the
    /// message ran alone ([`Suspect::Alone`]): then it is what stopped its
    /// consumer, or the handler outlived its lease. Otherwise its consumer
    /// held other messages too, any of which may have stopped it: the
    /// lease's charge is given back, as a release gives it back, and the
    /// message is marked: [`Suspect::Once`] the first time, a suspect run
    /// alone next ([`Suspect::Yes`]) the second. The mark stays until its
    /// handler answers.
    pub fn abandon(&mut self, now: i64, rules: &QueueRules) {
        if self.status == Status::AwaitingRelease {
            self.apply_deferred(now);
            return;
        }
        self.clear_lease();
        // What the expiry says, whether its attempt counts, and the mark after it.
        let (error, counted, mark) = match self.suspect {
            Suspect::Alone => (LEASE_EXPIRED, true, Suspect::Yes),
            Suspect::No => (LEASE_EXPIRED_ONCE, false, Suspect::Once),
            Suspect::Once | Suspect::Yes => (LEASE_EXPIRED_SHARED, false, Suspect::Yes),
        };
        self.record(now, 0, "LeaseExpired", error);
        if !counted {
            self.attempts = self.attempts.saturating_sub(1);
        }
        self.suspect = mark;
        self.status =
            if rules.retry_abandoned && self.attempts < rules.max_attempts { Status::Pending } else { Status::Error };
    }

    /// An operator's "retry now": a sleeping row (a delay, a retry's
    /// backoff) is due at once; a pending one already is. Whether the row
    /// was either. (The store does it set-based: `RETRY_NOW`.)
    pub fn retry_now(&mut self) -> bool {
        if !matches!(self.status, Status::Sleeping | Status::Pending) {
            return false;
        }
        self.status = Status::Pending;
        self.process_at = None;
        true
    }

    /// Whether an operator may delete the row: nobody holds it (pending,
    /// sleeping, or a dead letter). (The store: `DELETE_WAITING`.)
    pub fn deletable(&self) -> bool {
        matches!(self.status, Status::Pending | Status::Sleeping | Status::Error)
    }

    /// `Error` → `Pending` with attempts reset, at the back of the queue.
    pub fn redrive(&mut self, seq: u64) -> bool {
        if self.status != Status::Error {
            return false;
        }
        self.status = Status::Pending;
        self.attempts = 0;
        self.process_at = None;
        self.seq = seq;
        true
    }
}

/// The rows of one queue and the transitions between their states: the
/// oracle the stores are tested against.
#[cfg(test)]
#[derive(Debug, Clone, Default)]
pub(crate) struct IdentityQueue {
    rules: QueueRules,
    rows: BTreeMap<RowId, Row>,
    by_identity: HashMap<String, RowId>,
    previous: HashMap<String, Vec<u8>>,
    next_id: RowId,
    next_seq: u64,
    next_token: u64,
}

#[cfg(test)]
impl IdentityQueue {
    /// An empty queue with the given rules.
    pub(crate) fn new(rules: QueueRules) -> Self {
        IdentityQueue { rules, next_id: 1, next_seq: 1, next_token: 1, ..Default::default() }
    }

    /// Every row, by id.
    pub(crate) fn rows(&self) -> impl Iterator<Item = &Row> {
        self.rows.values()
    }

    /// One row.
    pub(crate) fn row(&self, id: RowId) -> Option<&Row> {
        self.rows.get(&id)
    }

    /// The row of an identity.
    pub(crate) fn by_identity(&self, identity: &str) -> Option<&Row> {
        self.by_identity.get(identity).and_then(|id| self.rows.get(id))
    }

    /// The last processed version's payload of an identity.
    pub(crate) fn previous(&self, identity: &str) -> Option<&[u8]> {
        self.previous.get(identity).map(Vec::as_slice)
    }

    fn seq(&mut self) -> u64 {
        let s = self.next_seq;
        self.next_seq += 1;
        s
    }

    /// Enqueues a message (see the transition table).
    pub(crate) fn enqueue(&mut self, now: i64, e: Enqueue) -> EnqueueOutcome {
        let seq = self.seq();
        let existing = e.identity.as_ref().and_then(|k| self.by_identity.get(k).copied());
        if let Some(row) = existing.and_then(|id| self.rows.get_mut(&id)) {
            return row.enqueue(now, seq, e, self.rules.idempotent);
        }
        if self.rules.idempotent
            && e.identity.as_ref().and_then(|k| self.previous.get(k)).is_some_and(|p| *p == e.payload)
        {
            return EnqueueOutcome::Unchanged;
        }
        let id = self.next_id;
        self.next_id += 1;
        if let Some(k) = &e.identity {
            self.by_identity.insert(k.clone(), id);
        }
        self.rows.insert(id, Row::new(id, seq, now, e));
        EnqueueOutcome::Inserted(id)
    }

    /// Leases up to `n` rows for `lease_ms`: highest priority first, then
    /// enqueue order. On a FIFO queue only the first waiting row of a group
    /// with nothing leased is eligible; every row of a FIFO queue has a group
    /// (the transport refuses a message without one), and a row without one
    /// is never leased.
    pub(crate) fn lease(&mut self, now: i64, n: usize, lease_ms: i64) -> Vec<Leased> {
        self.lease_taking(now, super::Take::rows(n), lease_ms)
    }

    /// [`IdentityQueue::lease`] of as much as `take` says (a FIFO queue's
    /// heads by its rows only).
    pub(crate) fn lease_taking(&mut self, now: i64, take: super::Take, lease_ms: i64) -> Vec<Leased> {
        self.expire(now);
        let mut candidates: Vec<&Row> = Vec::new();
        if self.rules.fifo {
            let blocked: HashSet<Option<String>> =
                self.rows.values().filter(|r| r.status.is_leased()).map(|r| r.group.clone()).collect();
            // The head of each group: its earliest waiting (P or S) row.
            let mut heads: HashMap<Option<String>, &Row> = HashMap::new();
            let waiting = |r: &&Row| matches!(r.status, Status::Pending | Status::Sleeping) && r.group.is_some();
            for row in self.rows.values().filter(waiting) {
                let head = heads.entry(row.group.clone()).or_insert(row);
                if row.seq < head.seq {
                    *head = row;
                }
            }
            candidates.extend(heads.into_values().filter(|r| !blocked.contains(&r.group) && r.is_eligible(now)));
        } else {
            candidates.extend(self.rows.values().filter(|r| r.is_eligible(now)));
        }
        candidates.sort_by(|a, b| b.priority.cmp(&a.priority).then(a.seq.cmp(&b.seq)));
        let take = if self.rules.fifo { super::Take::rows(take.rows) } else { take };
        let mut before = 0i64;
        let chosen: Vec<RowId> = candidates
            .into_iter()
            .enumerate()
            .take_while(|(i, r)| {
                let taken = take.takes(i + 1, before);
                before = before.saturating_add(r.payload.len() as i64);
                taken
            })
            .map(|(_, r)| r.id)
            .collect();
        let mut out = Vec::with_capacity(chosen.len());
        for id in chosen {
            let token = self.next_token;
            self.next_token += 1;
            let Some(row) = self.rows.get_mut(&id) else { continue };
            row.lease(now, token, lease_ms);
            out.push(Leased {
                id,
                token,
                message_id: row.message_id.clone(),
                payload: row.payload.clone(),
                attempts: row.attempts,
                group: row.group.clone(),
                suspect: row.suspect,
            });
        }
        out
    }

    fn row_mut(&mut self, id: RowId) -> Result<&mut Row, LeaseLost> {
        self.rows.get_mut(&id).ok_or(LeaseLost)
    }

    /// Completes a leased row.
    pub(crate) fn complete(&mut self, now: i64, id: RowId, token: u64) -> Result<(), LeaseLost> {
        let retention = self.rules.retention_ms;
        let done = self.row_mut(id)?.complete(now, token, retention)?;
        if let Some((identity, _, payload)) = done.previous {
            if done.delete {
                self.by_identity.remove(&identity);
            }
            self.previous.insert(identity, payload);
        }
        if done.delete {
            self.rows.remove(&id);
        }
        Ok(())
    }

    /// A failed attempt: Sleeping until `retry_at` while attempts remain, else Error.
    pub(crate) fn fail(
        &mut self,
        now: i64,
        id: RowId,
        token: u64,
        retry_at: i64,
        error: &str,
    ) -> Result<(), LeaseLost> {
        let max = self.rules.max_attempts;
        self.row_mut(id)?.fail(now, token, retry_at, &FailedAttempt::new(0, "Error", error), max)
    }

    /// A failed attempt that the lease's holder tries again: noted only.
    pub(crate) fn note(&mut self, now: i64, id: RowId, token: u64, error: &str) -> Result<(), LeaseLost> {
        self.row_mut(id)?.note(now, token, &FailedAttempt::new(0, "Error", error))
    }

    /// A permanent failure: Error at once (unless a newer version waits).
    pub(crate) fn dead_letter(&mut self, now: i64, id: RowId, token: u64, error: &str) -> Result<(), LeaseLost> {
        self.row_mut(id)?.dead_letter(now, token, &FailedAttempt::new(0, "Error", error))
    }

    /// Gives the lease back without charging the attempt (shutdown).
    pub(crate) fn release(&mut self, now: i64, id: RowId, token: u64) -> Result<(), LeaseLost> {
        self.row_mut(id)?.release(now, token)
    }

    /// Gives the lease back uncharged until `retry_at` (see [`Row::postpone`]).
    pub(crate) fn postpone(
        &mut self,
        now: i64,
        id: RowId,
        token: u64,
        retry_at: i64,
        reason: &str,
    ) -> Result<(), LeaseLost> {
        self.row_mut(id)?.postpone(now, token, retry_at, reason)
    }

    /// Pushes the lease's expiry out (heartbeat).
    pub(crate) fn extend(&mut self, now: i64, id: RowId, token: u64, lease_ms: i64) -> Result<(), LeaseLost> {
        self.row_mut(id)?.extend(now, token, lease_ms)
    }

    /// Marks a leased row as run alone (see [`Row::isolate`]).
    pub(crate) fn isolate(&mut self, id: RowId, token: u64) -> Result<(), LeaseLost> {
        self.row_mut(id)?.isolate(token)
    }

    /// Takes back a leased row's mark of running alone (see [`Row::rejoin`]).
    pub(crate) fn rejoin(&mut self, id: RowId, token: u64) -> Result<(), LeaseLost> {
        self.row_mut(id)?.rejoin(token)
    }

    /// Abandons every expired lease; returns the rows concerned.
    pub(crate) fn expire(&mut self, now: i64) -> Vec<RowId> {
        let rules = self.rules;
        let mut abandoned = Vec::new();
        for row in self.rows.values_mut().filter(|r| r.is_abandoned(now)) {
            abandoned.push(row.id);
            row.abandon(now, &rules);
        }
        abandoned
    }

    /// Moves an `Error` row back to `Pending` with its attempts reset.
    pub(crate) fn redrive(&mut self, id: RowId) -> bool {
        let seq = self.seq();
        self.rows.get_mut(&id).is_some_and(|row| row.redrive(seq))
    }

    /// An operator's "retry now" of row `id` (see [`Row::retry_now`]).
    /// (Only the model test, which runs on both stores, asks for it.)
    #[cfg(all(feature = "postgres", feature = "sqlite"))]
    pub(crate) fn retry_now(&mut self, id: RowId) -> bool {
        self.rows.get_mut(&id).is_some_and(Row::retry_now)
    }

    /// An operator's delete of row `id`, when nobody holds it. (Only the
    /// model test asks for it.)
    #[cfg(all(feature = "postgres", feature = "sqlite"))]
    pub(crate) fn delete(&mut self, id: RowId) -> bool {
        let Some(row) = self.rows.get(&id).filter(|r| r.deletable()) else { return false };
        if let Some(k) = row.identity.clone() {
            self.by_identity.remove(&k);
        }
        self.rows.remove(&id);
        true
    }

    /// Deletes `Processed` rows older than the retention period.
    pub(crate) fn purge(&mut self, now: i64) -> usize {
        let retention = self.rules.retention_ms;
        let old: Vec<(RowId, Option<String>)> = self
            .rows
            .values()
            .filter(|r| r.status == Status::Processed && r.processed_at.is_some_and(|at| at + retention <= now))
            .map(|r| (r.id, r.identity.clone()))
            .collect();
        for (id, identity) in &old {
            self.rows.remove(id);
            if let Some(k) = identity {
                self.by_identity.remove(k);
            }
        }
        old.len()
    }
}
