//! `show QUEUE ID`: one message, where it stands, its attempts and their
//! errors, and its decoded body.

use crate::app::App;
use crate::error::Error;
use crate::transport::{decoded, rfc3339, MessageId};

/// Arguments of `show`.
#[derive(Debug, clap::Args)]
pub(super) struct ShowArgs {
    /// The queue (a dead letter is found under its source queue).
    queue: String,
    /// The message id (as `dlq peek` and the logs show it).
    id: String,
    /// One JSON object instead of text.
    #[arg(long)]
    json: bool,
}

pub(super) async fn run(app: &App, args: ShowArgs) -> Result<(), Error> {
    let ShowArgs { queue, id, json } = args;
    super::declared(app, &queue)?;
    let found = app.setup_transport().inspect(&queue, &MessageId::from(id.as_str())).await?;
    let Some(report) = found else {
        return Err(Error::Command(format!(
            "no message `{id}` in `{queue}` or its dead letters (processed messages are kept only with `retention=`)"
        )));
    };
    if json {
        out!("{}", report.to_json());
        return Ok(());
    }
    let body = decoded(&report.body);
    out!("message   {}", report.message_id);
    out!("queue     {}", report.queue);
    out!("status    {}", report.status);
    out!("attempts  {}", report.attempts);
    if let Some(identity) = &report.identity {
        out!("identity  {identity}");
    }
    if let Some(group) = &report.group_id {
        out!("group     {group}");
    }
    out!("sent      {}", rfc3339(report.sent_at_ms));
    // A due time matters only while the message waits for it.
    if let (Some(at), "sleeping" | "pending" | "delayed") = (report.process_at_ms, report.status.as_str()) {
        out!("due       {}", rfc3339(at));
    }
    if let Some(at) = report.held_until_ms {
        out!("held till {} (then it comes back, unless settled)", rfc3339(at));
    }
    if let Some(reason) = &report.reason {
        out!("reason    {reason}");
    }
    if report.suspect {
        out!("suspect   leases of it ran out before it was settled: it runs alone when next received");
    }
    for a in &report.history {
        out!("{a}");
    }
    for (key, value) in &report.attributes {
        out!("attribute {key} = {value}");
    }
    out!("{}", serde_json::to_string_pretty(&body).unwrap_or_default());
    Ok(())
}
