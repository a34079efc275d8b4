use messaging::prelude::*;

#[messaging::queue("reports")]
pub struct Reports;

#[messaging::message(name = "reports.due", v = 1)]
#[derive(Serialize, Deserialize)]
pub struct ReportDue {}

// No cadence.
#[messaging::schedule(queue = Reports)]
fn no_cadence() -> ReportDue {
    ReportDue {}
}

// An interval has no time zone, and a jitter shorter than the interval.
#[messaging::schedule(every = "5m", queue = Reports, tz = "Europe/Oslo", jitter = "10m")]
fn every_five_minutes() -> ReportDue {
    ReportDue {}
}

// Nothing to publish.
#[messaging::schedule(every = "1h", queue = Reports)]
fn returns_nothing() {}

// The expression is positional.
#[messaging::schedule(cron = "0 * * * *", queue = Reports)]
fn keyed_cron() -> ReportDue {
    ReportDue {}
}

// Misspelt options, and a policy that does not exist.
#[messaging::schedule("0 * * * *", queue = Reports, catchup = "all", timezone = "UTC")]
fn hourly() -> ReportDue {
    ReportDue {}
}

#[messaging::schedule("0 * * * *", queue = Reports, catch_up = "everything")]
fn hourly_too() -> ReportDue {
    ReportDue {}
}

fn main() {}
