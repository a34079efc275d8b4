//! The state of one in-memory queue: visibility, receive counts, delays,
//! FIFO groups and deduplication, as on Amazon SQS. Pure data; the caller
//! holds the lock and passes the time in.
//!
//! Messages live in a slab (a vector with a free list), so lookups cost no
//! hashing; receipts carry a per-receive token, so a reused slot never
//! accepts a stale receipt.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use rustc_hash::FxHashMap as HashMap;
use tokio::time::Instant;

use crate::error::TransportError;
use crate::queue::QueueSpec;
use crate::transport::{Attributes, Delivery, MessageId, Outgoing, Receipt};

/// How long a FIFO deduplication id is remembered.
pub(super) const DEDUP_WINDOW: Duration = Duration::from_secs(5 * 60);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Status {
    /// Can be received.
    Visible,
    /// Delayed or backing off until the instant.
    Hidden(Instant),
    /// Received; invisible until the instant unless settled first.
    InFlight { token: u64, until: Instant },
}

/// One stored message.
#[derive(Debug, Clone)]
pub(super) struct Stored {
    pub(super) id: MessageId,
    pub(super) body: Bytes,
    pub(super) group: Option<String>,
    pub(super) attributes: Arc<Attributes>,
    pub(super) sent_at: SystemTime,
    pub(super) receive_count: u32,
    /// What went wrong with it, once something has: most messages never
    /// fail, and a box keeps the 48 bytes of a reason and a history out of
    /// every queued message.
    failures: Option<Box<Failures>>,
    status: Status,
    /// Bumped on every status change; timer entries with another epoch are stale.
    epoch: u64,
    /// Arrival order in this queue.
    seq: u64,
}

/// A message's failures.
#[derive(Debug, Clone, Default)]
pub(super) struct Failures {
    /// Why it was dead-lettered.
    pub(super) reason: Option<String>,
    /// Failed attempts, oldest first (the last `FailedAttempt::KEPT`).
    pub(super) history: Vec<crate::transport::FailedAttempt>,
}

impl Stored {
    /// Why it was dead-lettered, if it was.
    pub(super) fn reason(&self) -> Option<&str> {
        self.failures.as_ref().and_then(|f| f.reason.as_deref())
    }

    /// Its failed attempts, oldest first.
    pub(super) fn history(&self) -> &[crate::transport::FailedAttempt] {
        self.failures.as_ref().map_or(&[], |f| &f.history)
    }

    /// Its failures, to add to.
    pub(super) fn failures_mut(&mut self) -> &mut Failures {
        self.failures.get_or_insert_with(Box::default)
    }

    /// The message as `app show` reports it, in `queue` with `status` when
    /// given (a dead letter's), else its own.
    pub(super) fn report(&self, queue: &str, status: Option<&str>) -> crate::transport::MessageReport {
        let ms = |t: SystemTime| t.duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as i64);
        let own = match self.status {
            Status::Visible => "visible",
            Status::Hidden(_) => "delayed",
            Status::InFlight { .. } => "in_flight",
        };
        crate::transport::MessageReport {
            queue: queue.to_owned(),
            message_id: self.id.clone(),
            status: status.unwrap_or(own).to_owned(),
            attempts: self.receive_count,
            identity: None,
            group_id: self.group.clone(),
            sent_at_ms: ms(self.sent_at),
            process_at_ms: match self.status {
                Status::Hidden(at) => Some(wall_ms(at)),
                _ => None,
            },
            held_until_ms: match self.status {
                Status::InFlight { until, .. } => Some(wall_ms(until)),
                _ => None,
            },
            reason: self.reason().map(str::to_owned),
            suspect: false,
            history: self.history().to_vec(),
            attributes: (*self.attributes).clone(),
            body: self.body.clone(),
            deferred: None,
            cursor: self.seq.to_string(),
        }
    }

    /// Where it stands, as the console groups messages (a dead letter is
    /// `Pending` in its dead-letter queue).
    pub(super) fn browse_status(&self) -> crate::transport::MessageStatus {
        match self.status {
            Status::Visible => crate::transport::MessageStatus::Pending,
            Status::Hidden(_) => crate::transport::MessageStatus::Sleeping,
            Status::InFlight { .. } => crate::transport::MessageStatus::InFlight,
        }
    }

    /// Whether it is in flight past its visibility timeout at `now` (taken
    /// back at the queue's next receive).
    pub(super) fn expired(&self, now: Instant) -> bool {
        matches!(self.status, Status::InFlight { until, .. } if until <= now)
    }

    /// When it was sent, in milliseconds since the Unix epoch.
    pub(super) fn sent_at_ms(&self) -> i64 {
        self.sent_at.duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as i64)
    }

    /// Its arrival order in the queue.
    pub(super) fn seq(&self) -> u64 {
        self.seq
    }
}

/// The wall-clock time (ms since the Unix epoch) of a monotonic instant.
fn wall_ms(at: Instant) -> i64 {
    let now = Instant::now();
    let wall = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as i64);
    if at >= now {
        wall + at.duration_since(now).as_millis() as i64
    } else {
        wall - now.duration_since(at).as_millis() as i64
    }
}

/// Attributes behind an `Arc`, sharing one allocation for the common empty case.
fn shared_attributes(attributes: Attributes) -> Arc<Attributes> {
    static EMPTY: std::sync::OnceLock<Arc<Attributes>> = std::sync::OnceLock::new();
    if attributes.is_empty() {
        EMPTY.get_or_init(Default::default).clone()
    } else {
        Arc::new(attributes)
    }
}

/// The time of one call, each clock read once and only if needed: a send
/// to a standard queue without delay needs only the wall clock, and a batch
/// one reading of each (clock reads were 3 % of the memory benchmark).
#[derive(Debug, Default)]
pub(super) struct Clock {
    now: Option<Instant>,
    wall: Option<SystemTime>,
}

impl Clock {
    /// The monotonic time (tokio's, so that tests can pause it).
    pub(super) fn now(&mut self) -> Instant {
        *self.now.get_or_insert_with(Instant::now)
    }

    /// The wall-clock time.
    pub(super) fn wall(&mut self) -> SystemTime {
        *self.wall.get_or_insert_with(SystemTime::now)
    }
}

/// A message published to a standard queue and not yet in its state: its
/// id, and the time of its send (the monotonic one when it has a delay).
#[derive(Debug)]
pub(super) struct Posted {
    id: MessageId,
    message: Outgoing,
    clock: Clock,
}

impl Posted {
    /// `message`, published now under `id`.
    pub(super) fn new(id: MessageId, message: Outgoing) -> Self {
        let mut clock = Clock::default();
        if message.delay.is_some_and(|d| !d.is_zero()) {
            clock.now();
        }
        clock.wall();
        Posted { id, message, clock }
    }
}

/// What a receive did besides returning deliveries.
pub(super) struct Received {
    pub(super) deliveries: Vec<Delivery>,
    /// Messages that exceeded the receive limit, to move to the dead-letter queue.
    pub(super) expired: Vec<Stored>,
}

#[derive(Debug, Default)]
struct Group {
    /// Keys of the group's messages in send order (the in-flight ones first).
    keys: VecDeque<u64>,
    in_flight: usize,
    queued: bool,
}

/// One queue's messages.
#[derive(Debug)]
pub(super) struct QueueState {
    pub(super) spec: QueueSpec,
    slots: Vec<Option<Stored>>,
    free: Vec<u64>,
    live: usize,
    next_seq: u64,
    next_token: u64,
    next_epoch: u64,
    /// Standard queues: visible keys in arrival order (may hold stale keys).
    ready: VecDeque<u64>,
    /// FIFO queues: the groups, and those that can hand out their head.
    groups: HashMap<String, Group>,
    ready_groups: VecDeque<String>,
    /// Delays, backoffs and extended visibilities, earliest first.
    timers: BinaryHeap<Reverse<(Instant, u64, u64)>>,
    /// Visibility timeouts set at receive: all `now + visibility`, so they
    /// arrive in deadline order and need no heap.
    leases: VecDeque<(Instant, u64, u64)>,
    dedup: HashMap<String, (Instant, MessageId)>,
    dedup_order: VecDeque<(Instant, String)>,
    /// The buffer that trades places with the queue's inbox (empty between calls).
    posted: Vec<Posted>,
}

impl QueueState {
    pub(super) fn new(spec: QueueSpec) -> Self {
        QueueState {
            spec,
            slots: Vec::new(),
            free: Vec::new(),
            live: 0,
            next_seq: 0,
            next_token: 1,
            next_epoch: 1,
            ready: VecDeque::new(),
            groups: HashMap::default(),
            ready_groups: VecDeque::new(),
            timers: BinaryHeap::new(),
            leases: VecDeque::new(),
            dedup: HashMap::default(),
            dedup_order: VecDeque::new(),
            posted: Vec::new(),
        }
    }

    pub(super) fn len(&self) -> usize {
        self.live
    }

    fn get(&self, key: u64) -> Option<&Stored> {
        self.slots.get(key as usize).and_then(Option::as_ref)
    }

    fn get_mut(&mut self, key: u64) -> Option<&mut Stored> {
        self.slots.get_mut(key as usize).and_then(Option::as_mut)
    }

    /// Stores a message; a FIFO duplicate within the window returns the first id.
    pub(super) fn send(&mut self, msg: Outgoing, clock: &mut Clock) -> Result<MessageId, TransportError> {
        if self.spec.fifo {
            if msg.delay.is_some_and(|d| !d.is_zero()) {
                return Err(TransportError::Rejected(format!(
                    "FIFO queue `{}` does not accept a per-message delay",
                    self.spec.name
                )));
            }
            if msg.group_id.as_deref().is_none_or(str::is_empty) {
                return Err(TransportError::Rejected(format!(
                    "FIFO queue `{}` needs a message group id",
                    self.spec.name
                )));
            }
            self.forget_old_dedup_ids(clock.now());
            if let Some(dedup) = &msg.dedup_id {
                if let Some((_, id)) = self.dedup.get(dedup) {
                    return Ok(id.clone());
                }
            }
        }
        let id = MessageId::random();
        if self.spec.fifo {
            if let Some(dedup) = msg.dedup_id.clone() {
                let now = clock.now();
                self.dedup.insert(dedup.clone(), (now, id.clone()));
                self.dedup_order.push_back((now, dedup));
            }
        }
        self.admit(id.clone(), msg, clock);
        Ok(id)
    }

    /// Stores a new message that passed the queue's rules, under `id`, as
    /// sent at the clock's time.
    pub(super) fn admit(&mut self, id: MessageId, msg: Outgoing, clock: &mut Clock) {
        let status = match msg.delay.filter(|d| !d.is_zero()) {
            Some(delay) => Status::Hidden(clock.now() + delay),
            None => Status::Visible,
        };
        self.insert(
            Stored {
                id,
                body: msg.body,
                group: msg.group_id,
                attributes: shared_attributes(msg.attributes),
                sent_at: clock.wall(),
                receive_count: 0,
                failures: None,
                status: Status::Visible,
                epoch: 0,
                seq: 0,
            },
            status,
        );
    }

    /// Takes what `inbox` holds, leaving it empty: the two buffers trade
    /// places, so that neither reallocates in the steady state. The caller
    /// holds the inbox's lock for this swap only, then calls
    /// [`QueueState::admit_posted`].
    pub(super) fn take_posted(&mut self, inbox: &mut Vec<Posted>) {
        std::mem::swap(inbox, &mut self.posted);
    }

    /// Stores the messages taken from the inbox, in order.
    pub(super) fn admit_posted(&mut self) {
        let mut posted = std::mem::take(&mut self.posted);
        for Posted { id, message, mut clock } in posted.drain(..) {
            self.admit(id, message, &mut clock);
        }
        self.posted = posted;
    }

    /// Adds a message (new, redriven or dead-lettered) at the back.
    pub(super) fn insert(&mut self, mut stored: Stored, status: Status) {
        stored.status = Status::Visible;
        stored.seq = self.next_seq;
        self.next_seq += 1;
        let group = self.spec.fifo.then(|| stored.group.clone().unwrap_or_default());
        let key = match self.free.pop() {
            Some(key) => {
                self.slots[key as usize] = Some(stored);
                key
            }
            None => {
                self.slots.push(Some(stored));
                (self.slots.len() - 1) as u64
            }
        };
        self.live += 1;
        if let Some(group) = group {
            self.groups.entry(group).or_default().keys.push_back(key);
        }
        self.set_status(key, status);
        if !self.spec.fifo && status == Status::Visible {
            self.ready.push_back(key);
        }
    }

    fn forget_old_dedup_ids(&mut self, now: Instant) {
        while let Some((at, _)) = self.dedup_order.front() {
            if now.duration_since(*at) < DEDUP_WINDOW {
                break;
            }
            if let Some((_, dedup)) = self.dedup_order.pop_front() {
                self.dedup.remove(&dedup);
            }
        }
    }

    fn set_status(&mut self, key: u64, status: Status) {
        self.set_status_with(key, status, false);
    }

    /// Changes a message's status; `monotonic` deadlines (visibility set at
    /// receive) go to the lease queue instead of the heap.
    fn set_status_with(&mut self, key: u64, status: Status, monotonic: bool) {
        let epoch = self.next_epoch;
        self.next_epoch += 1;
        let fifo = self.spec.fifo;
        let Some(msg) = self.slots.get_mut(key as usize).and_then(Option::as_mut) else { return };
        let was_in_flight = matches!(msg.status, Status::InFlight { .. });
        msg.status = status;
        msg.epoch = epoch;
        let group = if fifo { Some(msg.group.clone().unwrap_or_default()) } else { None };
        match status {
            Status::InFlight { until, .. } if monotonic => self.leases.push_back((until, key, epoch)),
            Status::Hidden(at) | Status::InFlight { until: at, .. } => self.timers.push(Reverse((at, key, epoch))),
            Status::Visible => {}
        }
        if let Some(name) = group {
            let is_in_flight = matches!(status, Status::InFlight { .. });
            if let Some(group) = self.groups.get_mut(&name) {
                match (was_in_flight, is_in_flight) {
                    (false, true) => group.in_flight += 1,
                    (true, false) => group.in_flight -= 1,
                    _ => {}
                }
            }
            self.requeue_group(&name);
        }
    }

    /// Puts a FIFO group on the ready list if its head can be handed out.
    fn requeue_group(&mut self, name: &str) {
        let head = match self.groups.get(name) {
            Some(group) if !group.queued && group.in_flight == 0 => group.keys.front().copied(),
            _ => return,
        };
        let head_visible = head.and_then(|k| self.get(k)).is_some_and(|m| m.status == Status::Visible);
        if head_visible {
            if let Some(group) = self.groups.get_mut(name) {
                group.queued = true;
            }
            self.ready_groups.push_back(name.to_owned());
        }
    }

    /// Applies every timer that is due: delays end, visibility timeouts expire.
    pub(super) fn tick(&mut self, now: Instant) {
        while let Some(Reverse((at, key, epoch))) = self.timers.peek().copied() {
            if at > now {
                break;
            }
            self.timers.pop();
            self.expire(key, epoch);
        }
        while let Some((at, key, epoch)) = self.leases.front().copied() {
            if at > now {
                break;
            }
            self.leases.pop_front();
            self.expire(key, epoch);
        }
    }

    /// A timer fired: the message becomes visible unless it changed since.
    fn expire(&mut self, key: u64, epoch: u64) {
        if self.get(key).is_some_and(|m| m.epoch == epoch) {
            self.set_status(key, Status::Visible);
            if !self.spec.fifo {
                self.ready.push_back(key);
            }
        }
    }

    /// When the next timer fires, if any. Stale lease entries at the front
    /// (settled messages) are dropped first so that they cause no wake-ups.
    pub(super) fn next_timer(&mut self) -> Option<Instant> {
        while let Some((_, key, epoch)) = self.leases.front().copied() {
            if self.get(key).is_some_and(|m| m.epoch == epoch) {
                break;
            }
            self.leases.pop_front();
        }
        let lease = self.leases.front().map(|(at, _, _)| *at);
        let timer = self.timers.peek().map(|Reverse((at, _, _))| *at);
        match (lease, timer) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Hands out up to `max` visible messages, making them in flight.
    pub(super) fn receive(&mut self, max: usize, now: Instant) -> Received {
        self.tick(now);
        let mut out = Received { deliveries: Vec::with_capacity(max.min(self.live)), expired: Vec::new() };
        if self.spec.fifo {
            self.receive_fifo(max, now, &mut out);
        } else {
            while out.deliveries.len() < max {
                let Some(key) = self.ready.pop_front() else { break };
                self.take(key, now, &mut out);
            }
        }
        out
    }

    fn receive_fifo(&mut self, max: usize, now: Instant, out: &mut Received) {
        // Share a batch between the ready groups so that they can run in parallel.
        let per_group = (max / self.ready_groups.len().clamp(1, max.max(1))).max(1);
        while out.deliveries.len() < max {
            let Some(name) = self.ready_groups.pop_front() else { break };
            if let Some(group) = self.groups.get_mut(&name) {
                group.queued = false;
            }
            let mut taken = 0;
            let keys: Vec<u64> = self.groups.get(&name).map(|g| g.keys.iter().copied().collect()).unwrap_or_default();
            for key in keys {
                if taken >= per_group || out.deliveries.len() >= max {
                    break;
                }
                if !self.get(key).is_some_and(|m| m.status == Status::Visible) {
                    break;
                }
                if self.take(key, now, out) {
                    taken += 1;
                }
            }
            if self.groups.get(&name).is_some_and(|g| g.keys.is_empty()) {
                self.groups.remove(&name);
            } else {
                self.requeue_group(&name);
            }
        }
    }

    /// Delivers one visible message, or moves it out when over the receive limit.
    /// Returns whether it was delivered.
    fn take(&mut self, key: u64, now: Instant, out: &mut Received) -> bool {
        let Some(msg) = self.get(key) else { return false };
        if msg.status != Status::Visible {
            return false; // a stale entry of `ready`
        }
        if self.spec.dlq.is_some() && msg.receive_count >= self.spec.redrive_after() {
            if let Some(mut stored) = self.remove(key) {
                let reason = Some(match stored.history().last() {
                    Some(last) => format!("{} (after {} attempts)", last.message, stored.receive_count),
                    None => format!("received {} times without success", stored.receive_count),
                });
                stored.failures_mut().reason = reason;
                out.expired.push(stored);
            }
            return false;
        }
        let token = self.next_token;
        self.next_token += 1;
        let until = now + self.spec.visibility;
        self.set_status_with(key, Status::InFlight { token, until }, true);
        let Some(msg) = self.get_mut(key) else { return false };
        msg.receive_count += 1;
        out.deliveries.push(Delivery {
            message_id: msg.id.clone(),
            body: msg.body.clone(),
            receipt: Receipt { key, token, locator: 0, handle: None },
            receive_count: msg.receive_count,
            group_id: msg.group.clone(),
            attributes: msg.attributes.clone(),
            sent_at: msg.sent_at,
            // The queue lives and dies with its process.
            suspect: false,
        });
        true
    }

    fn check(&self, receipt: &Receipt) -> Result<(), TransportError> {
        match self.get(receipt.key).map(|m| m.status) {
            Some(Status::InFlight { token, .. }) if token == receipt.token => Ok(()),
            _ => Err(TransportError::StaleReceipt),
        }
    }

    /// Deletes a settled message.
    /// Returns the message, for the caller to drop once the lock is released.
    pub(super) fn ack(&mut self, receipt: &Receipt) -> Result<Stored, TransportError> {
        self.check(receipt)?;
        self.remove(receipt.key).ok_or(TransportError::StaleReceipt)
    }

    /// Takes a message out of the queue whatever its state.
    pub(super) fn remove(&mut self, key: u64) -> Option<Stored> {
        let stored = self.slots.get_mut(key as usize)?.take()?;
        self.free.push(key);
        self.live -= 1;
        if self.spec.fifo {
            let name = stored.group.clone().unwrap_or_default();
            if let Some(group) = self.groups.get_mut(&name) {
                if let Some(pos) = group.keys.iter().position(|k| *k == key) {
                    group.keys.remove(pos);
                }
                if matches!(stored.status, Status::InFlight { .. }) {
                    group.in_flight -= 1;
                }
                if group.keys.is_empty() && !group.queued {
                    self.groups.remove(&name);
                } else {
                    self.requeue_group(&name);
                }
            }
        }
        Some(stored)
    }

    /// Removes an in-flight message for dead-lettering.
    pub(super) fn take_in_flight(&mut self, receipt: &Receipt) -> Result<Stored, TransportError> {
        self.check(receipt)?;
        self.remove(receipt.key).ok_or(TransportError::StaleReceipt)
    }

    /// Adds a failed attempt to an in-flight message's history.
    pub(super) fn record(
        &mut self,
        receipt: &Receipt,
        failure: crate::transport::FailedAttempt,
    ) -> Result<(), TransportError> {
        self.check(receipt)?;
        if let Some(m) = self.get_mut(receipt.key) {
            failure.push_onto(&mut m.failures_mut().history);
        }
        Ok(())
    }

    /// Makes an in-flight message visible again after `delay`.
    pub(super) fn nack(&mut self, receipt: &Receipt, delay: Duration, now: Instant) -> Result<(), TransportError> {
        self.check(receipt)?;
        if delay.is_zero() {
            self.set_status(receipt.key, Status::Visible);
            if !self.spec.fifo {
                self.ready.push_back(receipt.key);
            }
        } else if self.spec.fifo {
            // The message stays in flight (its group locked) until it is due again.
            self.set_status(receipt.key, Status::InFlight { token: receipt.token, until: now + delay });
        } else {
            self.set_status(receipt.key, Status::Hidden(now + delay));
        }
        Ok(())
    }

    /// Extends the visibility timeout of an in-flight message.
    pub(super) fn extend(
        &mut self,
        receipt: &Receipt,
        visibility: Duration,
        now: Instant,
    ) -> Result<(), TransportError> {
        self.check(receipt)?;
        self.set_status(receipt.key, Status::InFlight { token: receipt.token, until: now + visibility });
        Ok(())
    }

    /// Messages in arrival order (for dead-letter peeking), with their keys.
    pub(super) fn iter_ordered(&self) -> Vec<(u64, &Stored)> {
        let mut all: Vec<(u64, &Stored)> =
            self.slots.iter().enumerate().filter_map(|(k, m)| m.as_ref().map(|m| (k as u64, m))).collect();
        all.sort_unstable_by_key(|(_, m)| m.seq);
        all
    }

    /// Makes a delayed message visible now (the console's "retry now");
    /// whether it was delayed or visible already.
    pub(super) fn due_now(&mut self, key: u64) -> bool {
        match self.get(key).map(|m| (m.status, m.epoch)) {
            Some((Status::Hidden(_), epoch)) => {
                self.expire(key, epoch);
                true
            }
            Some((Status::Visible, _)) => true,
            _ => false,
        }
    }

    /// Takes a message out unless a consumer holds it; whether it did.
    pub(super) fn remove_waiting(&mut self, key: u64) -> bool {
        let held = self.get(key).is_none_or(|m| matches!(m.status, Status::InFlight { .. }));
        !held && self.remove(key).is_some()
    }

    /// A visible status, for messages added from outside.
    pub(super) fn visible() -> Status {
        Status::Visible
    }
}
