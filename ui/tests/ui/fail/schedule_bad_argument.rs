use messaging::prelude::*;

#[messaging::queue("reports")]
pub struct Reports;

#[messaging::message(name = "reports.due", v = 1)]
#[derive(Serialize, Deserialize)]
pub struct ReportDue {}

#[messaging::schedule(every = "1h", queue = Reports)]
async fn hourly(ctx: MessageContext) -> ReportDue {
    let _ = ctx;
    ReportDue {}
}

pub struct NotAMessage;

#[messaging::schedule(every = "1h", queue = Reports)]
fn wrong_output() -> NotAMessage {
    NotAMessage
}

fn main() {}
