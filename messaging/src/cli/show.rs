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
    let transport = app.setup_transport();
    if let (None, Some(dead)) = (transport.browse(), transport.dead_letters()) {
        // SQS: a message in the queue cannot be read without receiving it,
        // but a dead letter can be peeked, as the console does.
        return show_dead_letter(dead, &queue, &id, json).await;
    }
    let found = transport.inspect(&queue, &MessageId::from(id.as_str())).await?;
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

/// How many dead letters `show` peeks for one on a transport that cannot
/// look one up (SQS: ten receives of ten).
const PEEKED: usize = 100;

/// `show` on a transport whose queues cannot be browsed: the dead letter
/// `id` of `queue`, found among the first [`PEEKED`].
async fn show_dead_letter(
    dead: &dyn crate::transport::DeadLetters,
    queue: &str,
    id: &str,
    json: bool,
) -> Result<(), Error> {
    let letters = dead.peek(queue, PEEKED).await?;
    let Some(letter) = letters.iter().find(|l| l.message_id.as_str() == id) else {
        return Err(Error::Command(format!(
            "no dead letter `{id}` among the {} of `{queue}` looked at (the first {PEEKED}); on this transport \
             `show` finds dead letters only: a message still in the queue cannot be read without receiving it",
            letters.len()
        )));
    };
    if json {
        out!("{}", letter.to_json());
        return Ok(());
    }
    out!("message   {}", letter.message_id);
    out!("queue     {queue}");
    out!("status    dead");
    out!("receives  {}", letter.receive_count);
    if let Some(group) = &letter.group_id {
        out!("group     {group}");
    }
    if let Some(reason) = &letter.reason {
        out!("reason    {reason}");
    }
    for a in &letter.history {
        out!("{a}");
    }
    for (key, value) in letter.attributes.iter() {
        out!("attribute {key} = {value}");
    }
    out!("{}", serde_json::to_string_pretty(&decoded(&letter.body)).unwrap_or_default());
    Ok(())
}
