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
        println!("{}", report.to_json());
        return Ok(());
    }
    let body = decoded(&report.body);
    println!("message   {}", report.message_id);
    println!("queue     {}", report.queue);
    println!("status    {}", report.status);
    println!("attempts  {}", report.attempts);
    if let Some(identity) = &report.identity {
        println!("identity  {identity}");
    }
    if let Some(group) = &report.group_id {
        println!("group     {group}");
    }
    println!("sent      {}", rfc3339(report.sent_at_ms));
    // A due time matters only while the message waits for it.
    if let (Some(at), "sleeping" | "pending" | "delayed") = (report.process_at_ms, report.status.as_str()) {
        println!("due       {}", rfc3339(at));
    }
    if let Some(at) = report.held_until_ms {
        println!("held till {} (then it comes back, unless settled)", rfc3339(at));
    }
    if let Some(reason) = &report.reason {
        println!("reason    {reason}");
    }
    if report.suspect {
        println!("suspect   an earlier lease ran out before it was settled: it runs alone when next received");
    }
    for a in &report.history {
        println!("{a}");
    }
    for (key, value) in &report.attributes {
        println!("attribute {key} = {value}");
    }
    println!("{}", serde_json::to_string_pretty(&body).unwrap_or_default());
    Ok(())
}
