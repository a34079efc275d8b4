//! Recurring messages: a report every night at 02:30 Oslo time (a night
//! missed while no process ran is published once, when one starts), and a
//! heartbeat every five seconds. Each tick is published once however many
//! processes run this app on one database; the handlers print what they get.
//!
//! ```text
//! cargo run --example schedules                              # runs until Ctrl-C
//! cargo run --example schedules -- schedules                 # each schedule: last published, next three
//! cargo run --example schedules -- schedules pause heartbeat # every process skips its ticks
//! cargo run --example schedules -- schedules resume heartbeat
//! ```

use messaging::prelude::*;
use messaging::schedule::Tick;

/// The reports' queue: two message types, routed by name.
#[messaging::queue("reports")]
pub struct Reports;

/// A night's report is due.
#[messaging::message(name = "reports.nightly", v = 1)]
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct NightlyReport {
    /// The night's date in Oslo (YYYY-MM-DD).
    pub day: String,
    /// Published after its time, because no process ran at 02:30.
    pub late: bool,
}

/// The app is alive.
#[messaging::message(name = "reports.heartbeat", v = 1)]
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Heartbeat {
    /// The tick's time (RFC 3339, UTC).
    pub at: String,
}

#[messaging::schedule("30 2 * * *", queue = Reports, tz = "Europe/Oslo", catch_up = "last")]
fn nightly_report(tick: Tick) -> NightlyReport {
    NightlyReport { day: tick.local_time()[..10].to_owned(), late: tick.is_catch_up() }
}

#[messaging::schedule(every = "5s", queue = Reports, name = "heartbeat")]
fn heartbeat(tick: Tick) -> Heartbeat {
    Heartbeat { at: tick.local_time().to_owned() }
}

#[messaging::handler(queue = Reports)]
async fn report(report: NightlyReport) {
    let late = if report.late { " (caught up)" } else { "" };
    println!("nightly report for {}{late}", report.day);
}

#[messaging::handler(queue = Reports)]
async fn beat(beat: Heartbeat) {
    println!("heartbeat of {}", beat.at);
}

#[messaging::main]
async fn main() {}
