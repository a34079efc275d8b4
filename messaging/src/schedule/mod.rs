//! Recurring messages: what `#[messaging::schedule]` declares.
//!
//! A schedule is a function that returns the message to publish, with a
//! cadence (a cron expression in a time zone, or a fixed interval), a
//! queue, and a policy for ticks missed while no process ran. `run` starts
//! every registered schedule; each tick is published once, keyed by its UTC
//! instant, however many processes run the app (see the README's
//! "Schedules" for where that holds).
//!
//! ```no_run
//! use messaging::prelude::*;
//! use messaging::schedule::Tick;
//!
//! #[messaging::queue("reports")]
//! pub struct Reports;
//!
//! #[messaging::message(name = "reports.due", v = 1)]
//! #[derive(Debug, Clone, Serialize, Deserialize)]
//! pub struct ReportDue { pub at: String }
//!
//! // 02:30 every night, Oslo time; a night missed while no process ran is
//! // published once when one starts.
//! #[messaging::schedule("30 2 * * *", queue = Reports, tz = "Europe/Oslo", catch_up = "last")]
//! fn nightly_report(tick: Tick) -> ReportDue {
//!     ReportDue { at: tick.local_time().to_owned() }
//! }
//! ```
//!
//! The function may be `async`, takes any of [`Tick`], `State<T>` and
//! `Publisher` ([`FromTick`]), and returns the message (`M`), maybe none
//! (`Option<M>`), or either behind a `Result` whose error converts into a
//! boxed error ([`ScheduleOutput`]). It builds the message; do the work in
//! the message's handler, which has retries and dead letters.

pub(crate) mod cadence;
pub(crate) mod plan;

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

pub(crate) use cadence::Cadence;

use crate::extract::{Requirement, Resources, State};
use crate::message::Message;
use crate::publish::Publisher;

/// The attribute naming the schedule a message was published by
/// (`ctx.attribute(SCHEDULE_ATTRIBUTE)` in its handler).
pub const SCHEDULE_ATTRIBUTE: &str = "messaging.schedule";

/// The attribute carrying the tick a message was published for, in
/// milliseconds since the Unix epoch: one message per value per schedule.
pub const TICK_ATTRIBUTE: &str = "messaging.schedule.tick";

/// The error a schedule function may fail with.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// What happens to ticks whose time passed while no process ran the
/// schedule (`catch_up = ".."`). A tick counts as missed once a minute has
/// passed since its time, or its next tick is due, whichever is sooner.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum CatchUp {
    /// Missed ticks are skipped (counted, not published): the default.
    #[default]
    Skip,
    /// The newest missed tick is published, once; older ones are skipped.
    Last,
    /// Every missed tick is published, oldest first, up to the newest
    /// [`CatchUp::MAX_TICKS`]; older ones are skipped.
    All,
}

impl CatchUp {
    /// The most missed ticks `All` publishes at once.
    pub const MAX_TICKS: usize = 100;

    /// `skip`, `last` or `all`.
    pub fn as_str(self) -> &'static str {
        match self {
            CatchUp::Skip => "skip",
            CatchUp::Last => "last",
            CatchUp::All => "all",
        }
    }
}

/// One tick of a schedule, as its function sees it.
#[derive(Debug, Clone)]
pub struct Tick {
    pub(crate) schedule: &'static str,
    pub(crate) at_ms: i64,
    pub(crate) local: String,
    pub(crate) catch_up: bool,
}

impl Tick {
    /// The tick's instant: when it was due (its key: one publish per instant).
    pub fn at(&self) -> SystemTime {
        UNIX_EPOCH + Duration::from_millis(u64::try_from(self.at_ms).unwrap_or(0))
    }

    /// The tick's instant in milliseconds since the Unix epoch.
    pub fn unix_ms(&self) -> i64 {
        self.at_ms
    }

    /// The tick's time in the schedule's zone (UTC without one), RFC 3339:
    /// `2026-03-29T03:00:00+02:00`.
    pub fn local_time(&self) -> &str {
        &self.local
    }

    /// The schedule's name.
    pub fn schedule(&self) -> &'static str {
        self.schedule
    }

    /// Whether the tick is published late, by a catch-up after it was
    /// missed (`catch_up = "last"` or `"all"`).
    pub fn is_catch_up(&self) -> bool {
        self.catch_up
    }
}

/// An argument of a schedule function.
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot be an argument of a schedule function",
    label = "not something a schedule function can take",
    note = "a schedule function takes only `Tick` (the tick's time), `State<T>` (provided with `setup.provide(..)`) and `Publisher`"
)]
pub trait FromTick: Sized + Send + 'static {
    /// Builds the argument for one tick.
    fn from_tick(tick: &Tick, resources: &Resources) -> Result<Self, BoxError>;

    /// What must be set up for this argument (checked before anything runs).
    fn requirement() -> Option<Requirement> {
        None
    }
}

impl FromTick for Tick {
    fn from_tick(tick: &Tick, _: &Resources) -> Result<Self, BoxError> {
        Ok(tick.clone())
    }
}

impl FromTick for Publisher {
    fn from_tick(_: &Tick, resources: &Resources) -> Result<Self, BoxError> {
        Ok(resources.publisher().clone())
    }
}

impl<T: Send + Sync + 'static> FromTick for State<T> {
    fn from_tick(_: &Tick, resources: &Resources) -> Result<Self, BoxError> {
        resources.state::<T>().map(State).ok_or_else(|| {
            format!("no state of type `{}` was provided; call `setup.provide(..)` with one", std::any::type_name::<T>())
                .into()
        })
    }

    fn requirement() -> Option<Requirement> {
        <State<T> as crate::extract::FromContext>::requirement()
    }
}

/// What a schedule function returns: the message, maybe none, maybe
/// behind a `Result`.
#[diagnostic::on_unimplemented(
    message = "a schedule function cannot return `{Self}`",
    label = "not a message to publish",
    note = "return the message to publish: `M`, `Option<M>` (`None` publishes nothing this tick), or `Result<M, E>` / `Result<Option<M>, E>` whose error converts into `Box<dyn Error + Send + Sync>` (anyhow's does); `M` is a type with `#[messaging::message]`"
)]
pub trait ScheduleOutput: Send + 'static {
    /// The message type.
    type Message: Message;

    /// The message to publish, if any.
    fn into_message(self) -> Result<Option<Self::Message>, BoxError>;
}

impl<M: Message> ScheduleOutput for M {
    type Message = M;
    fn into_message(self) -> Result<Option<M>, BoxError> {
        Ok(Some(self))
    }
}

impl<M: Message> ScheduleOutput for Option<M> {
    type Message = M;
    fn into_message(self) -> Result<Option<M>, BoxError> {
        Ok(self)
    }
}

impl<M: Message, E: Into<BoxError> + Send + 'static> ScheduleOutput for Result<M, E> {
    type Message = M;
    fn into_message(self) -> Result<Option<M>, BoxError> {
        self.map(Some).map_err(Into::into)
    }
}

impl<M: Message, E: Into<BoxError> + Send + 'static> ScheduleOutput for Result<Option<M>, E> {
    type Message = M;
    fn into_message(self) -> Result<Option<M>, BoxError> {
        self.map_err(Into::into)
    }
}

/// Builds a tick's message: the generated code behind a schedule function.
pub type Build =
    fn(Tick, Arc<Resources>) -> crate::boxed::BoxFuture<'static, Result<Option<crate::envelope::Encoded>, BoxError>>;
