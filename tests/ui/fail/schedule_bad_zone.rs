use messaging::prelude::*;

#[messaging::queue("reports")]
pub struct Reports;

#[messaging::message(name = "reports.due", v = 1)]
#[derive(Serialize, Deserialize)]
pub struct ReportDue {}

#[messaging::schedule("30 2 * * *", queue = Reports, tz = "Europe/Olso")]
fn nightly() -> ReportDue {
    ReportDue {}
}

fn main() {}
