//! Recurring messages (`#[messaging::schedule]`), in a binary of their own:
//! every app started in a test binary runs the schedules registered in it
//! (that its queues keep), so these stay away from the rest of the suite.
//!
//! - `ticks`: cron and interval ticks under a paused clock, and daylight
//!   saving time in Europe/Oslo;
//! - `catch_up`: each catch-up policy after a simulated outage, pauses, a
//!   failing schedule function;
//! - `processes`: three processes of one app on PostgreSQL and on SQLite
//!   publish each tick once;
//! - `sqs`: two processes on SQS (moto), FIFO and standard, through an
//!   outbox in PostgreSQL; and what a deployment without a shared database
//!   gets.
//!
//! The multi-process tests run this binary as the app's processes (ignored
//! entry points named with [`fixtures::entry_point`]).

mod fixtures;

#[path = "schedules/catch_up.rs"]
mod catch_up;
#[path = "schedules/processes.rs"]
mod processes;
#[path = "schedules/sqs.rs"]
mod sqs;
#[path = "schedules/ticks.rs"]
mod ticks;

use std::sync::{Arc, Mutex};

use messaging::prelude::*;
use messaging::schedule::{SCHEDULE_ATTRIBUTE, TICK_ATTRIBUTE};

/// The message every test schedule publishes: the tick's local time.
#[messaging::message(name = "test.beat", v = 1)]
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Beat {
    /// The tick's local time (RFC 3339).
    pub local: String,
    /// Whether it was published by a catch-up.
    pub catch_up: bool,
}

/// What the handlers of the test queues saw: (schedule, tick in ms, local time, catch-up).
#[derive(Debug, Default)]
pub struct Seen(Mutex<Vec<(String, i64, String, bool)>>);

impl Seen {
    /// Records a delivery of `beat`.
    pub fn record(&self, beat: &Beat, ctx: &MessageContext) {
        let schedule = ctx.attribute(SCHEDULE_ATTRIBUTE).unwrap_or_default().to_owned();
        let tick = ctx.attribute(TICK_ATTRIBUTE).and_then(|t| t.parse().ok()).unwrap_or_default();
        self.0.lock().unwrap().push((schedule, tick, beat.local.clone(), beat.catch_up));
    }

    /// The local times seen, in order.
    pub fn locals(&self) -> Vec<String> {
        self.0.lock().unwrap().iter().map(|(_, _, local, _)| local.clone()).collect()
    }

    /// Everything seen, in order.
    pub fn all(&self) -> Vec<(String, i64, String, bool)> {
        self.0.lock().unwrap().clone()
    }
}

/// The state the test handlers take.
pub type Sink = Arc<Seen>;

/// Milliseconds since the Unix epoch of an RFC 3339 time.
pub fn ms(text: &str) -> i64 {
    text.parse::<jiff::Timestamp>().unwrap_or_else(|e| panic!("{text}: {e}")).as_millisecond()
}

/// The time `text` (RFC 3339).
pub fn at(text: &str) -> std::time::SystemTime {
    std::time::UNIX_EPOCH + std::time::Duration::from_millis(ms(text) as u64)
}
