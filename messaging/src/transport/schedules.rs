//! The ledger of recurring messages: per schedule, the last tick whose
//! turn is over (published, or skipped), the claim of a tick being built,
//! and the schedule's pause flag. It is what makes a tick publish once
//! whatever number of processes run the schedule.
//!
//! [`LedgerRow`] is the pure state machine of one schedule's row, with the
//! time passed in: [`MemoryLedger`] keeps rows in the process, the SQL
//! ledger (`sql::schedules`) loads a row under a lock, calls the same
//! method and stores it, and the model test holds the two to the same
//! answers.
//!
//! A tick goes through two steps. [`ScheduleLedger::begin`] claims it for a
//! short lease (the schedule function then builds the message, holding no
//! lock); [`ScheduleLedger::finish`] writes the message and moves the last
//! tick forward in one transaction, if the claim is still this process's.
//! A process that dies between the two leaves a claim that ends with its
//! lease; another process then takes the tick over. A tick is never
//! published twice: only the holder of the claim finishes it, and only once.

use std::any::Any;
use std::collections::HashMap;
use std::sync::Mutex;

use crate::boxed::BoxFuture;
use crate::error::{PublishError, TransportError};
use crate::transport::MessageId;

/// A claim on a tick: who builds it, until when.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct TickClaim {
    /// The tick claimed, in milliseconds since the Unix epoch.
    pub(crate) tick_ms: i64,
    /// The claimant's token.
    pub(crate) token: i64,
    /// When the claim ends (the ledger's clock).
    pub(crate) expires_ms: i64,
}

/// One schedule's row.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct LedgerRow {
    /// The last tick whose turn is over: published or skipped. Ticks after
    /// it are still to come.
    pub(crate) last_tick_ms: i64,
    /// The last tick that published a message.
    pub(crate) last_published_ms: Option<i64>,
    /// Paused: ticks are skipped, not published, until resumed.
    pub(crate) paused: bool,
    /// A tick being built.
    pub(crate) claim: Option<TickClaim>,
}

/// What [`LedgerRow::begin`] answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Begin {
    /// The tick is this claimant's to build and publish.
    Claimed,
    /// Its turn is over: another process published or skipped it.
    Done,
    /// Another claim holds the schedule for `for_ms` more milliseconds.
    Held {
        /// How long the other claim lasts.
        for_ms: i64,
    },
    /// The schedule is paused: the tick is to be skipped.
    Paused,
}

impl LedgerRow {
    /// A new row, whose ticks up to `baseline_ms` are over.
    pub(crate) fn new(baseline_ms: i64) -> LedgerRow {
        LedgerRow { last_tick_ms: baseline_ms, last_published_ms: None, paused: false, claim: None }
    }

    /// Claims tick `tick_ms` for `token` until `now + lease_ms`. A live
    /// claim of any tick holds the whole schedule, so ticks are published
    /// in order; an expired one is taken over.
    pub(crate) fn begin(&mut self, tick_ms: i64, token: i64, now_ms: i64, lease_ms: i64) -> Begin {
        if tick_ms <= self.last_tick_ms {
            return Begin::Done;
        }
        if self.paused {
            return Begin::Paused;
        }
        if let Some(claim) = self.claim {
            if claim.expires_ms > now_ms && claim.token != token {
                return Begin::Held { for_ms: claim.expires_ms - now_ms };
            }
        }
        self.claim = Some(TickClaim { tick_ms, token, expires_ms: now_ms.saturating_add(lease_ms) });
        Begin::Claimed
    }

    /// Ends the turn of tick `tick_ms` if `token` still claims it: the last
    /// tick moves to it (and the last published one, when it `published` a
    /// message). Whether it did (false: the claim was taken over, or the
    /// tick is over already).
    pub(crate) fn finish(&mut self, tick_ms: i64, token: i64, published: bool) -> bool {
        if !self.holds(tick_ms, token) {
            return false;
        }
        self.last_tick_ms = tick_ms;
        if published {
            self.last_published_ms = Some(tick_ms);
        }
        self.claim = None;
        true
    }

    /// Whether `token` claims tick `tick_ms`, whose turn is not over.
    pub(crate) fn holds(&self, tick_ms: i64, token: i64) -> bool {
        tick_ms > self.last_tick_ms && self.claim.is_some_and(|c| c.token == token && c.tick_ms == tick_ms)
    }

    /// Ends the turn of every tick up to `through_ms` without publishing;
    /// whether the row changed. A claim of one of those ticks ends too.
    pub(crate) fn skip(&mut self, through_ms: i64) -> bool {
        if through_ms <= self.last_tick_ms {
            return false;
        }
        self.last_tick_ms = through_ms;
        if self.claim.is_some_and(|c| c.tick_ms <= through_ms) {
            self.claim = None;
        }
        true
    }

    /// Gives up `token`'s claim (the process stops); whether it held one.
    pub(crate) fn release(&mut self, token: i64) -> bool {
        if self.claim.is_some_and(|c| c.token == token) {
            self.claim = None;
            return true;
        }
        false
    }
}

/// Writes a tick's message: on the ledger's transaction (`Some`: the
/// connection of a `sqlx::Transaction` on the ledger's database), or by
/// itself (`None`: an in-process ledger).
pub(crate) trait TickWriter: Send + Sync {
    /// Publishes; the ids of what was written.
    fn write<'c>(
        &'c self,
        conn: Option<&'c mut (dyn Any + Send)>,
    ) -> BoxFuture<'c, Result<Vec<MessageId>, PublishError>>;
}

/// What became of a finished tick.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Finish {
    /// Written (with the ids of the messages; none when there was nothing
    /// to write), and the last tick moved to it.
    Done(Vec<MessageId>),
    /// The claim was lost (it expired and another process took the tick
    /// over): nothing was written.
    Lost,
}

/// Where a deployment keeps its schedules' rows.
pub(crate) trait ScheduleLedger: Send + Sync + 'static {
    /// What keeps the rows: `postgresql`, `sqlite`, or `this process`.
    fn describe(&self) -> &'static str;

    /// Whether every process of the deployment reads the same rows (a
    /// database): then a tick publishes once across processes, and a pause
    /// holds for all of them.
    fn shared(&self) -> bool;

    /// The row of `name`, made with `baseline_ms` as its last tick if it has none.
    fn row<'a>(&'a self, name: &'a str, baseline_ms: i64) -> BoxFuture<'a, Result<LedgerRow, TransportError>>;

    /// [`LedgerRow::begin`] with the ledger's clock.
    fn begin<'a>(
        &'a self,
        name: &'a str,
        tick_ms: i64,
        token: i64,
        lease_ms: i64,
    ) -> BoxFuture<'a, Result<Begin, TransportError>>;

    /// Writes the tick's message with `writer` (none: there is nothing to
    /// publish) and [`LedgerRow::finish`]es it, all at once: when the claim
    /// is lost nothing is written, and when the write fails the tick stays
    /// claimed.
    fn finish<'a>(
        &'a self,
        name: &'a str,
        tick_ms: i64,
        token: i64,
        writer: Option<&'a dyn TickWriter>,
    ) -> BoxFuture<'a, Result<Finish, PublishError>>;

    /// [`LedgerRow::skip`].
    fn skip<'a>(&'a self, name: &'a str, through_ms: i64) -> BoxFuture<'a, Result<bool, TransportError>>;

    /// [`LedgerRow::release`].
    fn release<'a>(&'a self, name: &'a str, token: i64) -> BoxFuture<'a, Result<bool, TransportError>>;

    /// Pauses or resumes `name`; false when it has no row (it never ran).
    fn set_paused<'a>(&'a self, name: &'a str, paused: bool) -> BoxFuture<'a, Result<bool, TransportError>>;

    /// Every row, by name.
    fn rows(&self) -> BoxFuture<'_, Result<Vec<(String, LedgerRow)>, TransportError>>;
}

/// The rows of a process's own schedules: each tick once per process (for
/// `memory://`, and for a deployment without a database the processes
/// share).
#[derive(Debug, Default)]
pub(crate) struct MemoryLedger {
    rows: Mutex<HashMap<String, LedgerRow>>,
    /// Held while a tick is written, so that a finish is one step.
    writing: tokio::sync::Mutex<()>,
}

impl MemoryLedger {
    fn with<T>(&self, f: impl FnOnce(&mut HashMap<String, LedgerRow>) -> T) -> T {
        f(&mut self.rows.lock().unwrap_or_else(|p| p.into_inner()))
    }

    fn now() -> i64 {
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as i64)
    }
}

impl ScheduleLedger for MemoryLedger {
    fn describe(&self) -> &'static str {
        "this process"
    }

    fn shared(&self) -> bool {
        false
    }

    fn row<'a>(&'a self, name: &'a str, baseline_ms: i64) -> BoxFuture<'a, Result<LedgerRow, TransportError>> {
        let row = self.with(|rows| *rows.entry(name.to_owned()).or_insert_with(|| LedgerRow::new(baseline_ms)));
        Box::pin(async move { Ok(row) })
    }

    fn begin<'a>(
        &'a self,
        name: &'a str,
        tick_ms: i64,
        token: i64,
        lease_ms: i64,
    ) -> BoxFuture<'a, Result<Begin, TransportError>> {
        let now = Self::now();
        let begun = self.with(|rows| match rows.get_mut(name) {
            Some(row) => Ok(row.begin(tick_ms, token, now, lease_ms)),
            None => Err(no_row(name)),
        });
        Box::pin(async move { begun })
    }

    fn finish<'a>(
        &'a self,
        name: &'a str,
        tick_ms: i64,
        token: i64,
        writer: Option<&'a dyn TickWriter>,
    ) -> BoxFuture<'a, Result<Finish, PublishError>> {
        Box::pin(async move {
            let _writing = self.writing.lock().await;
            let still_ours = self.with(|rows| rows.get(name).is_some_and(|r| r.holds(tick_ms, token)));
            if !still_ours {
                return Ok(Finish::Lost);
            }
            let ids = match writer {
                Some(writer) => writer.write(None).await?,
                None => Vec::new(),
            };
            let published = !ids.is_empty();
            self.with(|rows| rows.get_mut(name).map(|r| r.finish(tick_ms, token, published)));
            Ok(Finish::Done(ids))
        })
    }

    fn skip<'a>(&'a self, name: &'a str, through_ms: i64) -> BoxFuture<'a, Result<bool, TransportError>> {
        let skipped = self.with(|rows| rows.get_mut(name).is_some_and(|r| r.skip(through_ms)));
        Box::pin(async move { Ok(skipped) })
    }

    fn release<'a>(&'a self, name: &'a str, token: i64) -> BoxFuture<'a, Result<bool, TransportError>> {
        let released = self.with(|rows| rows.get_mut(name).is_some_and(|r| r.release(token)));
        Box::pin(async move { Ok(released) })
    }

    fn set_paused<'a>(&'a self, name: &'a str, paused: bool) -> BoxFuture<'a, Result<bool, TransportError>> {
        let found = self.with(|rows| rows.get_mut(name).map(|r| r.paused = paused).is_some());
        Box::pin(async move { Ok(found) })
    }

    fn rows(&self) -> BoxFuture<'_, Result<Vec<(String, LedgerRow)>, TransportError>> {
        let mut rows: Vec<(String, LedgerRow)> = self.with(|rows| rows.iter().map(|(k, v)| (k.clone(), *v)).collect());
        rows.sort_by(|a, b| a.0.cmp(&b.0));
        Box::pin(async move { Ok(rows) })
    }
}

/// A schedule without a row (it is made when the schedule first runs).
pub(crate) fn no_row(name: &str) -> TransportError {
    TransportError::Backend(format!("schedule `{name}` has no row in the ledger"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tick_is_claimed_once_and_finished_by_its_claimant() {
        let mut row = LedgerRow::new(1_000);
        assert_eq!(row.begin(1_000, 1, 0, 30), Begin::Done, "the baseline's turn is over");
        assert_eq!(row.begin(2_000, 1, 0, 30), Begin::Claimed);
        assert_eq!(row.begin(2_000, 2, 10, 30), Begin::Held { for_ms: 20 });
        assert!(!row.finish(2_000, 2, true), "not the claimant");
        assert!(row.finish(2_000, 1, true));
        assert_eq!((row.last_tick_ms, row.last_published_ms), (2_000, Some(2_000)));
        assert!(!row.finish(2_000, 1, true), "once");
        assert_eq!(row.begin(2_000, 2, 20, 30), Begin::Done);
    }

    #[test]
    fn an_expired_claim_is_taken_over_and_its_holder_cannot_finish() {
        let mut row = LedgerRow::new(0);
        assert_eq!(row.begin(10, 1, 0, 30), Begin::Claimed);
        assert_eq!(row.begin(10, 2, 30, 30), Begin::Claimed, "expired at 30");
        assert!(!row.finish(10, 1, true));
        assert!(row.finish(10, 2, false));
        assert_eq!((row.last_tick_ms, row.last_published_ms), (10, None), "nothing to publish");
    }

    #[test]
    fn skips_and_pauses() {
        let mut row = LedgerRow::new(0);
        assert!(row.skip(50));
        assert!(!row.skip(40));
        assert_eq!(row.begin(50, 1, 0, 30), Begin::Done);
        row.paused = true;
        assert_eq!(row.begin(60, 1, 0, 30), Begin::Paused);
        row.paused = false;
        assert_eq!(row.begin(60, 1, 0, 30), Begin::Claimed);
        assert!(row.skip(60), "a skip ends the claim of a tick it covers");
        assert_eq!(row.claim, None);
        assert_eq!(row.begin(70, 1, 0, 30), Begin::Claimed);
        assert!(row.release(1));
        assert_eq!(row.begin(70, 2, 0, 30), Begin::Claimed);
    }
}
