use messaging::prelude::*;

#[messaging::queue("reports")]
pub struct Reports;

#[messaging::message(name = "reports.due", v = 1)]
#[derive(Serialize, Deserialize)]
pub struct ReportDue {}

#[messaging::schedule("0 * * * *", queue = Reports, catchup = "all", timezone = "UTC")]
fn hourly() -> ReportDue {
    ReportDue {}
}

#[messaging::schedule("0 * * * *", queue = Reports, catch_up = "everything")]
fn hourly_too() -> ReportDue {
    ReportDue {}
}

fn main() {}
