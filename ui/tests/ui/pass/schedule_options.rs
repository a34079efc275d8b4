// Every option of `#[messaging::schedule]`: both cadences, every argument,
// every return type, and the three ways a FIFO queue gets its group.
use messaging::prelude::*;
use messaging::schedule::Tick;

#[messaging::queue("reports")]
pub struct Reports;

#[messaging::queue("ledger.fifo", fifo)]
pub struct LedgerQueue;

#[messaging::queue("audit.fifo", fifo, default_group = "audit")]
pub struct Audit;

#[messaging::message(name = "reports.due", v = 1)]
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ReportDue {
    pub at: String,
}

#[messaging::message(name = "ledger.close", v = 1, group = book)]
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct CloseBook {
    pub book: String,
}

pub struct Db;

#[messaging::schedule("30 2 * * *", queue = Reports, tz = "Europe/Oslo", catch_up = "last", jitter = "1m")]
fn nightly(tick: Tick) -> ReportDue {
    ReportDue { at: tick.local_time().to_owned() }
}

#[messaging::schedule("*/10 * * * * *", queue = Reports, name = "ten-seconds", catch_up = "all")]
async fn every_ten_seconds(tick: Tick, _db: State<Db>, _publisher: Publisher) -> Option<ReportDue> {
    (!tick.is_catch_up()).then(|| ReportDue { at: tick.local_time().to_owned() })
}

#[messaging::schedule(every = "5m", queue = LedgerQueue, group = "books")]
async fn close_books() -> Result<ReportDue, std::io::Error> {
    Ok(ReportDue { at: String::new() })
}

// The message names its group.
#[messaging::schedule("@daily", queue = LedgerQueue)]
fn close_main_book() -> anyhow::Result<Option<CloseBook>> {
    Ok(Some(CloseBook { book: "main".into() }))
}

// The queue has a default group.
#[messaging::schedule("0 0 L * *", queue = Audit)]
fn month_end() -> ReportDue {
    ReportDue { at: "month end".into() }
}

fn main() {
    // The functions stay callable as written.
    let _ = month_end();
    // The name is the function's path (the crate's name first), unless `name` says otherwise.
    let registry = messaging::registry::Registry::from_inventory().unwrap();
    let names: Vec<&str> = registry.schedules().map(|s| s.name.split_once("::").map_or(s.name, |(_, f)| f)).collect();
    assert_eq!(names, ["ten-seconds", "close_books", "close_main_book", "month_end", "nightly"]);
}
