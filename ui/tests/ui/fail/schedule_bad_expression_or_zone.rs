use messaging::prelude::*;

#[messaging::queue("reports")]
pub struct Reports;

#[messaging::message(name = "reports.due", v = 1)]
#[derive(Serialize, Deserialize)]
pub struct ReportDue {}

#[messaging::schedule("61 * * * *", queue = Reports)]
fn out_of_range() -> ReportDue {
    ReportDue {}
}

// Quartz's dialect: `?` and a 1-7 day of week.
#[messaging::schedule("0 0 12 ? * 2", queue = Reports)]
fn quartz() -> ReportDue {
    ReportDue {}
}

#[messaging::schedule("0 0 30 2 *", queue = Reports)]
fn february_thirtieth() -> ReportDue {
    ReportDue {}
}

// A zone that does not exist.
#[messaging::schedule("30 2 * * *", queue = Reports, tz = "Europe/Olso")]
fn nightly_in_a_misspelt_zone() -> ReportDue {
    ReportDue {}
}

fn main() {}
