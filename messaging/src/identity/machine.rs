//! The transitions of DESIGN.md §4, on an in-memory table of rows.

use std::collections::{BTreeMap, HashMap, HashSet};

use super::Status;

/// A row's id (insertion order within the table).
pub type RowId = u64;

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
    /// The last failure.
    pub error: Option<String>,
}

/// What an enqueue did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EnqueueOutcome {
    /// A new row.
    Inserted(RowId),
    /// An existing row got the new version.
    Updated(RowId),
    /// The row is leased; the new version waits for the release.
    Deferred(RowId),
    /// The payload equals the newest version on an idempotent queue.
    Discarded(RowId),
}

impl EnqueueOutcome {
    /// The row concerned.
    pub fn row(self) -> RowId {
        match self {
            EnqueueOutcome::Inserted(id)
            | EnqueueOutcome::Updated(id)
            | EnqueueOutcome::Deferred(id)
            | EnqueueOutcome::Discarded(id) => id,
        }
    }
}

/// A leased row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Leased {
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
}

/// A call with a token that no longer holds the lease (it expired, or the row
/// was settled or leased again). Nothing changed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the lease was lost: it expired or the message was settled or leased again")]
pub struct LeaseLost;

/// The rows of one queue and the transitions between their states.
#[derive(Debug, Clone, Default)]
pub struct IdentityQueue {
    rules: QueueRules,
    rows: BTreeMap<RowId, Row>,
    by_identity: HashMap<String, RowId>,
    previous: HashMap<String, Vec<u8>>,
    next_id: RowId,
    next_seq: u64,
    next_token: u64,
}

impl IdentityQueue {
    /// An empty queue with the given rules.
    pub fn new(rules: QueueRules) -> Self {
        IdentityQueue { rules, next_id: 1, next_seq: 1, next_token: 1, ..Default::default() }
    }

    /// The rules.
    pub fn rules(&self) -> &QueueRules {
        &self.rules
    }

    /// Every row, by id.
    pub fn rows(&self) -> impl Iterator<Item = &Row> {
        self.rows.values()
    }

    /// One row.
    pub fn row(&self, id: RowId) -> Option<&Row> {
        self.rows.get(&id)
    }

    /// The row of an identity.
    pub fn by_identity(&self, identity: &str) -> Option<&Row> {
        self.by_identity.get(identity).and_then(|id| self.rows.get(id))
    }

    /// The last processed version's payload of an identity.
    pub fn previous(&self, identity: &str) -> Option<&[u8]> {
        self.previous.get(identity).map(Vec::as_slice)
    }

    fn seq(&mut self) -> u64 {
        let s = self.next_seq;
        self.next_seq += 1;
        s
    }

    /// Pending, or Sleeping when process-at is in the future.
    fn landing(process_at: Option<i64>, now: i64) -> Status {
        match process_at {
            Some(at) if at > now => Status::Sleeping,
            _ => Status::Pending,
        }
    }

    /// Enqueues a message (see the transition table).
    pub fn enqueue(&mut self, now: i64, e: Enqueue) -> EnqueueOutcome {
        let existing = e.identity.as_ref().and_then(|k| self.by_identity.get(k).copied());
        let Some(id) = existing else {
            let id = self.next_id;
            self.next_id += 1;
            let seq = self.seq();
            let status = e.status.unwrap_or_else(|| Self::landing(e.process_at, now));
            if let Some(k) = &e.identity {
                self.by_identity.insert(k.clone(), id);
            }
            self.rows.insert(
                id,
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
                },
            );
            return EnqueueOutcome::Inserted(id);
        };
        let seq = self.seq();
        let idempotent = self.rules.idempotent;
        let Some(row) = self.rows.get_mut(&id) else { return EnqueueOutcome::Discarded(id) };
        let newest = match (&row.status, &row.deferred) {
            (Status::AwaitingRelease, Some(d)) => &d.payload,
            _ => &row.payload,
        };
        if idempotent && *newest == e.payload {
            return EnqueueOutcome::Discarded(id);
        }
        match row.status {
            Status::Processing | Status::AwaitingRelease => {
                row.status = Status::AwaitingRelease;
                row.deferred = Some(Deferred {
                    message_id: e.message_id,
                    payload: e.payload,
                    priority: e.priority,
                    process_at: e.process_at,
                    status_after_release: e.status,
                    seq,
                });
                EnqueueOutcome::Deferred(id)
            }
            Status::Pending | Status::Sleeping | Status::Error | Status::Processed => {
                row.message_id = e.message_id;
                row.payload = e.payload;
                row.priority = e.priority;
                row.process_at = e.process_at;
                row.status = e.status.unwrap_or_else(|| Self::landing(e.process_at, now));
                row.attempts = 0;
                row.seq = seq;
                row.processed_at = None;
                row.error = None;
                if e.group.is_some() {
                    row.group = e.group;
                }
                EnqueueOutcome::Updated(id)
            }
        }
    }

    fn eligible(row: &Row, now: i64) -> bool {
        match row.status {
            Status::Pending => true,
            Status::Sleeping => row.process_at.is_none_or(|at| at <= now),
            _ => false,
        }
    }

    /// Leases up to `n` rows for `lease_ms`: highest priority first, then
    /// enqueue order. On a FIFO queue only the first waiting row of a group
    /// with nothing leased is eligible.
    pub fn lease(&mut self, now: i64, n: usize, lease_ms: i64) -> Vec<Leased> {
        self.expire(now);
        let mut blocked: HashSet<Option<String>> = HashSet::new();
        let mut candidates: Vec<&Row> = Vec::new();
        if self.rules.fifo {
            for row in self.rows.values() {
                if row.status.is_leased() {
                    blocked.insert(row.group.clone());
                }
            }
            // The head of each group: its earliest waiting (P or S) row.
            let mut heads: HashMap<Option<String>, &Row> = HashMap::new();
            for row in self.rows.values().filter(|r| matches!(r.status, Status::Pending | Status::Sleeping)) {
                let head = heads.entry(row.group.clone()).or_insert(row);
                if row.seq < head.seq {
                    *head = row;
                }
            }
            candidates.extend(heads.into_values().filter(|r| !blocked.contains(&r.group) && Self::eligible(r, now)));
            candidates.sort_by_key(|r| r.seq);
        } else {
            candidates.extend(self.rows.values().filter(|r| Self::eligible(r, now)));
            candidates.sort_by(|a, b| b.priority.cmp(&a.priority).then(a.seq.cmp(&b.seq)));
        }
        let chosen: Vec<RowId> = candidates.into_iter().take(n).map(|r| r.id).collect();
        let mut out = Vec::with_capacity(chosen.len());
        for id in chosen {
            let token = self.next_token;
            self.next_token += 1;
            let Some(row) = self.rows.get_mut(&id) else { continue };
            row.status = Status::Processing;
            row.lease_token = Some(token);
            row.lease_expires = Some(now + lease_ms);
            row.attempts += 1;
            out.push(Leased {
                id,
                token,
                message_id: row.message_id.clone(),
                payload: row.payload.clone(),
                attempts: row.attempts,
                group: row.group.clone(),
            });
        }
        out
    }

    /// The row, if `token` holds its unexpired lease.
    fn held(&mut self, now: i64, id: RowId, token: u64) -> Result<&mut Row, LeaseLost> {
        match self.rows.get_mut(&id) {
            Some(row)
                if row.status.is_leased()
                    && row.lease_token == Some(token)
                    && row.lease_expires.is_some_and(|e| e > now) =>
            {
                Ok(row)
            }
            _ => Err(LeaseLost),
        }
    }

    /// Applies the deferred version of an `AwaitingRelease` row.
    fn apply_deferred(row: &mut Row, now: i64) {
        row.lease_token = None;
        row.lease_expires = None;
        if let Some(d) = row.deferred.take() {
            row.message_id = d.message_id;
            row.payload = d.payload;
            row.priority = d.priority;
            row.process_at = d.process_at;
            row.status = d.status_after_release.unwrap_or_else(|| Self::landing(d.process_at, now));
            row.seq = d.seq;
            row.attempts = 0;
            row.error = None;
        } else {
            row.status = Status::Pending;
        }
    }

    /// Completes a leased row.
    pub fn complete(&mut self, now: i64, id: RowId, token: u64) -> Result<(), LeaseLost> {
        let retention = self.rules.retention_ms;
        let row = self.held(now, id, token)?;
        let processed = (row.identity.clone(), row.payload.clone());
        let delete = match row.status {
            Status::AwaitingRelease => {
                Self::apply_deferred(row, now);
                false
            }
            _ => {
                row.status = Status::Processed;
                row.lease_token = None;
                row.lease_expires = None;
                row.processed_at = Some(now);
                retention <= 0
            }
        };
        if let (Some(identity), payload) = processed {
            self.previous.insert(identity.clone(), payload);
            if delete {
                self.by_identity.remove(&identity);
            }
        }
        if delete {
            self.rows.remove(&id);
        }
        Ok(())
    }

    /// A failed attempt: Sleeping until `retry_at` while attempts remain, else Error.
    pub fn fail(&mut self, now: i64, id: RowId, token: u64, retry_at: i64, error: &str) -> Result<(), LeaseLost> {
        let max = self.rules.max_attempts;
        let row = self.held(now, id, token)?;
        if row.status == Status::AwaitingRelease {
            Self::apply_deferred(row, now);
            return Ok(());
        }
        row.lease_token = None;
        row.lease_expires = None;
        row.error = Some(error.to_owned());
        if row.attempts < max {
            row.process_at = Some(retry_at);
            row.status = Self::landing(Some(retry_at), now);
        } else {
            row.status = Status::Error;
        }
        Ok(())
    }

    /// A permanent failure: Error at once (unless a newer version waits).
    pub fn dead_letter(&mut self, now: i64, id: RowId, token: u64, error: &str) -> Result<(), LeaseLost> {
        let row = self.held(now, id, token)?;
        if row.status == Status::AwaitingRelease {
            Self::apply_deferred(row, now);
            return Ok(());
        }
        row.lease_token = None;
        row.lease_expires = None;
        row.error = Some(error.to_owned());
        row.status = Status::Error;
        Ok(())
    }

    /// Gives the lease back without charging the attempt (shutdown).
    pub fn release(&mut self, now: i64, id: RowId, token: u64) -> Result<(), LeaseLost> {
        let row = self.held(now, id, token)?;
        if row.status == Status::AwaitingRelease {
            Self::apply_deferred(row, now);
        } else {
            row.lease_token = None;
            row.lease_expires = None;
            row.attempts = row.attempts.saturating_sub(1);
            row.status = Status::Pending;
        }
        Ok(())
    }

    /// Pushes the lease's expiry out (heartbeat).
    pub fn extend(&mut self, now: i64, id: RowId, token: u64, lease_ms: i64) -> Result<(), LeaseLost> {
        let row = self.held(now, id, token)?;
        row.lease_expires = Some(now + lease_ms);
        Ok(())
    }

    /// Abandons every expired lease; returns the rows concerned.
    pub fn expire(&mut self, now: i64) -> Vec<RowId> {
        let rules = self.rules;
        let mut abandoned = Vec::new();
        for row in self.rows.values_mut() {
            if !row.status.is_leased() || row.lease_expires.is_none_or(|e| e > now) {
                continue;
            }
            abandoned.push(row.id);
            if row.status == Status::AwaitingRelease {
                Self::apply_deferred(row, now);
                continue;
            }
            row.lease_token = None;
            row.lease_expires = None;
            row.error = Some("lease expired (processor abandoned the message)".to_owned());
            row.status = if rules.retry_abandoned && row.attempts < rules.max_attempts {
                Status::Pending
            } else {
                Status::Error
            };
        }
        abandoned
    }

    /// Moves an `Error` row back to `Pending` with its attempts reset.
    pub fn redrive(&mut self, id: RowId) -> bool {
        match self.rows.get_mut(&id) {
            Some(row) if row.status == Status::Error => {
                row.status = Status::Pending;
                row.attempts = 0;
                row.process_at = None;
                row.seq = self.next_seq;
                self.next_seq += 1;
                true
            }
            _ => false,
        }
    }

    /// Deletes `Processed` rows older than the retention period.
    pub fn purge(&mut self, now: i64) -> usize {
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
