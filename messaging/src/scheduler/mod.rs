//! Runs the app's schedules: one task per schedule, in every process that
//! runs the app. Each task asks the pure plan (`schedule::plan`) what is due,
//! then the ledger (`transport::schedules`) whose turn a tick is:
//!
//! ```text
//! loop
//!   row   = ledger.row(name)                      last tick over, paused, claim
//!   due   = timing.due(row.last_tick, now)        what to skip, what to publish
//!   skip  → ledger.skip(through)                  counted once, by the process that moved it
//!   each tick to publish:
//!     ledger.begin(tick, token, LEASE)            Claimed | Done | Held | Paused
//!       Claimed → the schedule function builds the message (no lock held)
//!               → ledger.finish(tick, token, writer): the message is written
//!                 and the tick recorded in one transaction (database ledgers),
//!                 or Lost when the claim was taken over meanwhile
//!   sleep until the next tick is due (with its jitter), a held claim ends,
//!   or shutdown
//! ```

mod clock;

use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::Duration;

use futures_util::FutureExt as _;
use tokio::task::JoinSet;
use tracing::Instrument as _;

pub(crate) use clock::Clock;

use crate::boxed::BoxFuture;
use crate::error::PublishError;
use crate::extract::Resources;
use crate::publish::{EncodedSend, Publisher};
use crate::registry::Scheduled;
use crate::schedule::{BoxError, Tick, SCHEDULE_ATTRIBUTE, TICK_ATTRIBUTE};
use crate::shutdown::Shutdown;
use crate::telemetry::Telemetry;
use crate::transport::schedules::{Begin, Finish, ScheduleLedger, TickWriter};
use crate::transport::{Attributes, MessageId, Outgoing};

/// How long a claim on a tick lasts: the schedule function must build the
/// message within it, or the tick counts as failed.
pub(crate) const LEASE: Duration = Duration::from_secs(10);

/// What the schedules of one app share.
pub(crate) struct Scheduler {
    pub(crate) ledger: Arc<dyn ScheduleLedger>,
    pub(crate) publisher: Publisher,
    pub(crate) resources: Arc<Resources>,
    pub(crate) clock: Clock,
    pub(crate) telemetry: Arc<Telemetry>,
}

/// How a tick's turn ended in this process.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Turn {
    /// Published (or nothing to publish, or the function failed: the
    /// tick's turn is over either way).
    Over,
    /// Another process's claim holds the schedule for this long.
    Held(i64),
}

impl Scheduler {
    /// Starts one task per schedule; they stop when `stop` is triggered.
    pub(crate) fn start(self, schedules: &[Arc<Scheduled>], stop: Shutdown) -> JoinSet<()> {
        let shared = Arc::new(self);
        let mut tasks = JoinSet::new();
        for scheduled in schedules {
            tasks.spawn(shared.clone().run(scheduled.clone(), stop.clone()));
        }
        tasks
    }

    async fn run(self: Arc<Self>, scheduled: Arc<Scheduled>, stop: Shutdown) {
        let name = scheduled.entry.name;
        let token = fastrand::i64(1..i64::MAX);
        let mut backoff = Backoff::default();
        loop {
            let wake = match self.round(&scheduled, token).await {
                Ok(wake) => {
                    backoff.reset();
                    wake
                }
                Err(e) => {
                    let wait = backoff.next();
                    tracing::warn!(
                        target: "messaging",
                        schedule = name,
                        "schedule `{name}`: {e}; trying again in {}",
                        crate::duration::format_duration(wait.as_millis() as u64)
                    );
                    self.clock.now_ms() + wait.as_millis() as i64
                }
            };
            tokio::select! {
                _ = self.clock.sleep_until(wake) => {}
                _ = stop.wait() => break,
            }
        }
        // A claim this process holds would keep the tick from the others
        // until it ends; give it back.
        let _ = self.ledger.release(name, token).await;
    }

    /// One look: skips what was missed, publishes what is due; returns when
    /// to look again.
    async fn round(&self, scheduled: &Scheduled, token: i64) -> Result<i64, PublishError> {
        let (entry, timing) = (scheduled.entry, &scheduled.timing);
        let now = self.clock.now_ms();
        let baseline = timing.cadence.last_at_or_before(now).unwrap_or(now);
        let row = self.ledger.row(entry.name, baseline).await?;
        let due = timing.due(row.last_tick_ms, now);
        if let Some(through) = due.skip_through {
            if self.ledger.skip(entry.name, through).await? {
                self.telemetry.ticked(entry.name, scheduled.spec.name, "skipped", due.skipped);
                tracing::info!(
                    target: "messaging",
                    schedule = entry.name,
                    "schedule `{}`: skipped {}{} tick(s) missed while no process ran it, through {} (catch_up = {})",
                    entry.name,
                    if due.skipped >= 10_000 { "at least " } else { "" },
                    due.skipped,
                    timing.cadence.local(through),
                    timing.catch_up.as_str()
                );
            }
        }
        for &(tick, late) in &due.publish {
            if let Turn::Held(for_ms) = self.tick(scheduled, tick, late, token).await? {
                return Ok(self.clock.now_ms() + for_ms.max(1));
            }
        }
        Ok(due.next.map_or(now + clock::MAX_SLEEP.as_millis() as i64, |(_, at)| at))
    }

    /// The turn of one tick, in its span.
    async fn tick(&self, scheduled: &Scheduled, tick: i64, late: bool, token: i64) -> Result<Turn, PublishError> {
        let (entry, timing) = (scheduled.entry, &scheduled.timing);
        let local = timing.cadence.local(tick);
        let span = crate::telemetry::schedule_span(entry.name, scheduled.spec.name, &local, late);
        let lease = LEASE.as_millis() as i64;
        async {
            let outcome = match self.ledger.begin(entry.name, tick, token, lease).await? {
                Begin::Done => "elsewhere",
                Begin::Held { for_ms } => {
                    tracing::Span::current().record("messaging.schedule.outcome", "elsewhere");
                    return Ok(Turn::Held(for_ms));
                }
                Begin::Paused => {
                    if self.ledger.skip(entry.name, tick).await? {
                        self.telemetry.ticked(entry.name, scheduled.spec.name, "skipped", 1);
                        tracing::debug!(target: "messaging", schedule = entry.name, tick = %local, "paused: tick skipped");
                    }
                    "skipped"
                }
                Begin::Claimed => {
                    let tick = Tick { schedule: entry.name, at_ms: tick, local: local.clone(), catch_up: late };
                    self.build_and_finish(scheduled, tick, token).await?
                }
            };
            tracing::Span::current().record("messaging.schedule.outcome", outcome);
            Ok(Turn::Over)
        }
        .instrument(span)
        .await
    }

    /// Calls the schedule function, then finishes the tick with what it
    /// returned; the outcome's name.
    async fn build_and_finish(
        &self,
        scheduled: &Scheduled,
        tick: Tick,
        token: i64,
    ) -> Result<&'static str, PublishError> {
        let (entry, spec) = (scheduled.entry, &scheduled.spec);
        let at = tick.at_ms;
        let local = tick.local.clone();
        let key = tick_key(entry.name, at);
        let writer = match build(entry.build, tick, self.resources.clone()).await {
            Ok(Some(encoded)) => {
                let dedup_id = encoded.identity.is_none().then(|| key.clone());
                let attributes: Attributes = [
                    (SCHEDULE_ATTRIBUTE.to_owned(), entry.name.to_owned()),
                    (TICK_ATTRIBUTE.to_owned(), at.to_string()),
                ]
                .into_iter()
                .collect();
                let send =
                    EncodedSend { group: entry.group.map(str::to_owned), dedup_id, attributes, ..Default::default() };
                match self.publisher.outgoing_encoded(spec, encoded, send) {
                    Ok(outgoing) => Ok(Some(Writer { publisher: &self.publisher, spec, outgoing })),
                    Err(e) => Err(e.to_string()),
                }
            }
            Ok(None) => Ok(None),
            Err(e) => Err(e.to_string()),
        };
        let failure = writer.as_ref().err().cloned();
        let writer = writer.ok().flatten();
        let finished = self.ledger.finish(entry.name, at, token, writer.as_ref().map(|w| w as &dyn TickWriter)).await;
        let finished = match finished {
            Ok(finished) => finished,
            Err(e) => {
                // Nothing was written; the tick stays due. Give the claim
                // back so that any process may try again at once.
                let _ = self.ledger.release(entry.name, token).await;
                crate::telemetry::record_failure(&tracing::Span::current(), e.kind());
                return Err(e);
            }
        };
        let queue = spec.name;
        Ok(match (finished, failure) {
            (Finish::Lost, _) => "elsewhere",
            (Finish::Done(_), Some(failure)) => {
                self.telemetry.ticked(entry.name, queue, "failed", 1);
                crate::telemetry::record_failure(&tracing::Span::current(), "ScheduleFailed");
                tracing::error!(
                    target: "messaging",
                    schedule = entry.name,
                    tick = %local,
                    "schedule `{}`: the tick of {local} published nothing: {failure}",
                    entry.name
                );
                "failed"
            }
            (Finish::Done(ids), None) if ids.is_empty() => {
                self.telemetry.ticked(entry.name, queue, "skipped", 1);
                "skipped"
            }
            (Finish::Done(ids), None) => {
                self.telemetry.ticked(entry.name, queue, "published", 1);
                // What was written in the ledger's transaction announces
                // itself only at commit (PostgreSQL); wake this process's
                // receivers and relay now.
                self.publisher.transport().wake_receivers();
                if let Some(outbox) = self.publisher.outbox() {
                    outbox.wake();
                }
                tracing::debug!(
                    target: "messaging",
                    schedule = entry.name,
                    tick = %local,
                    message_id = %ids[0],
                    queue,
                    "published the tick"
                );
                "published"
            }
        })
    }
}

/// Pauses or resumes `scheduled` in `ledger`, making its row (from now) if
/// it never ran.
pub(crate) async fn set_paused(
    ledger: &dyn ScheduleLedger,
    scheduled: &Scheduled,
    paused: bool,
) -> Result<(), crate::error::TransportError> {
    let now = Clock::System.now_ms();
    let baseline = scheduled.timing.cadence.last_at_or_before(now).unwrap_or(now);
    ledger.row(scheduled.entry.name, baseline).await?;
    ledger.set_paused(scheduled.entry.name, paused).await?;
    Ok(())
}

/// Runs the schedule function: at most [`LEASE`], a panic contained.
async fn build(
    build: crate::schedule::Build,
    tick: Tick,
    resources: Arc<Resources>,
) -> Result<Option<crate::envelope::Encoded>, BoxError> {
    let running = AssertUnwindSafe(build(tick, resources)).catch_unwind();
    match tokio::time::timeout(LEASE, running).await {
        Ok(Ok(built)) => built,
        Ok(Err(panic)) => {
            let text = panic
                .downcast_ref::<&str>()
                .map(|s| (*s).to_owned())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "a panic".to_owned());
            Err(format!("the schedule function panicked: {text}").into())
        }
        Err(_) => Err(format!("the schedule function did not return within {}s", LEASE.as_secs()).into()),
    }
}

/// The deduplication id of a tick's message: `name@tick_ms`, or the name's
/// hash when the name is no valid id (SQS takes 128 printable ASCII
/// characters).
pub(crate) fn tick_key(name: &str, tick_ms: i64) -> String {
    let key = format!("{name}@{tick_ms}");
    if key.len() <= crate::publish::MAX_ID_LEN && key.chars().all(|c| c.is_ascii_graphic()) {
        return key;
    }
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in name.bytes() {
        hash ^= u64::from(byte);
        hash = hash.wrapping_mul(0x0100_0000_01b3);
    }
    format!("schedule-{hash:016x}@{tick_ms}")
}

/// Writes a tick's message on the ledger's transaction, or by itself.
struct Writer<'a> {
    publisher: &'a Publisher,
    spec: &'a crate::queue::QueueSpec,
    outgoing: Outgoing,
}

impl TickWriter for Writer<'_> {
    fn write<'c>(
        &'c self,
        conn: Option<&'c mut (dyn std::any::Any + Send)>,
    ) -> BoxFuture<'c, Result<Vec<MessageId>, PublishError>> {
        Box::pin(self.publisher.send_outgoing(self.spec, self.outgoing.clone(), conn))
    }
}

/// The wait after a failed round: 1 s, doubling up to 30 s.
#[derive(Debug, Default)]
struct Backoff(u32);

impl Backoff {
    fn next(&mut self) -> Duration {
        let wait = Duration::from_secs(1 << self.0.min(5)).min(Duration::from_secs(30));
        self.0 = self.0.saturating_add(1);
        wait
    }

    fn reset(&mut self) {
        self.0 = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tick_key_is_a_valid_id() {
        assert_eq!(tick_key("shop::reports::nightly", 1_000), "shop::reports::nightly@1000");
        let long = "x".repeat(200);
        let key = tick_key(&long, 1_000);
        assert!(key.starts_with("schedule-") && key.ends_with("@1000") && key.len() <= 128, "{key}");
        assert_ne!(tick_key("ünïcode", 1), "ünïcode@1");
        assert_eq!(tick_key(&long, 1), tick_key(&long, 1), "stable");
    }
}
