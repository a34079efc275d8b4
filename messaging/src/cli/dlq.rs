//! `dlq peek` and `dlq redrive`: dead letters from the command line, on any
//! transport with the dead-letter capability.

use std::sync::Arc;

use clap::Subcommand;

use crate::app::App;
use crate::error::Error;
use crate::transport::{DeadLetter, DeadLetterFilter, DeadLetters, RedriveOptions};

/// Dead-letter commands.
#[derive(Debug, Subcommand)]
pub(super) enum DlqCommand {
    /// Show dead letters of QUEUE without removing them.
    Peek {
        /// The source queue (its dead-letter queue is read).
        queue: String,
        /// At most this many.
        #[arg(long, default_value_t = 10)]
        max: usize,
        /// One JSON object per line instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Move dead letters of QUEUE back to it (republish, then delete).
    Redrive {
        /// The source queue.
        queue: String,
        /// At most this many.
        #[arg(long)]
        max: Option<usize>,
        /// Only messages of this envelope type name.
        #[arg(long = "type")]
        type_name: Option<String>,
    },
}

fn capability<'a>(app: &'a App, queue: &str) -> Result<&'a dyn DeadLetters, Error> {
    if !app.registry().queues().iter().any(|q| q.name == queue) {
        let known: Vec<&str> = app.registry().queues().iter().map(|q| q.name).collect();
        return Err(Error::Command(format!("`{queue}` is not a declared queue; declared: {}", known.join(", "))));
    }
    app.setup_transport()
        .dead_letters()
        .ok_or_else(|| Error::Command(format!("the {} transport has no dead letters", app.setup_transport().system())))
}

fn json_of(letter: &DeadLetter) -> serde_json::Value {
    serde_json::json!({
        "message_id": letter.message_id.as_str(),
        "type": letter.type_name(),
        "group_id": letter.group_id,
        "receive_count": letter.receive_count,
        "reason": letter.reason,
        "history": letter.history,
        "attributes": &*letter.attributes,
        "body": String::from_utf8_lossy(&letter.body),
    })
}

/// A time in milliseconds since the Unix epoch, as RFC 3339 in UTC.
fn rfc3339(ms: i64) -> String {
    let at = std::time::UNIX_EPOCH + std::time::Duration::from_millis(u64::try_from(ms).unwrap_or(0));
    humantime::format_rfc3339_millis(at).to_string()
}

/// Whether `queue` is declared FIFO: its dead letters are then read a group
/// head at a time, which the commands explain when it shows.
fn is_fifo(app: &App, queue: &str) -> bool {
    app.registry().queues().iter().any(|q| q.name == queue && q.fifo)
}

pub(super) async fn run(app: &App, command: DlqCommand) -> Result<(), Error> {
    match command {
        DlqCommand::Peek { queue, max, json } => {
            let dlq = capability(app, &queue)?;
            let letters = dlq.peek(&queue, max).await?;
            // A peek of a FIFO dead-letter queue on SQS sees only the first
            // letters of each group: the others are not handed out while those
            // are reserved, and a peek may not delete them. Say how many it
            // could not show rather than let the list pass for all of them.
            let hidden = if is_fifo(app, &queue) && letters.len() < max {
                dlq.depth(&queue).await.map_or(0, |depth| depth.saturating_sub(letters.len() as u64))
            } else {
                0
            };
            let note = format!(
                "{hidden} more dead letter(s) of `{queue}` are hidden behind the ones shown in their FIFO groups \
                 (a group's later letters cannot be read without removing the earlier ones); \
                 `dlq redrive` moves them all"
            );
            if json {
                for letter in &letters {
                    println!("{}", json_of(letter));
                }
                if hidden > 0 {
                    // Not on stdout, which carries one JSON object per line.
                    eprintln!("{note}");
                }
                return Ok(());
            }
            if letters.is_empty() && hidden == 0 {
                println!("no dead letters for `{queue}`");
            }
            for letter in &letters {
                let body = String::from_utf8_lossy(&letter.body);
                let short: String = body.chars().take(120).collect();
                println!(
                    "{}  type={}  receives={}  reason={}\n    {short}{}",
                    letter.message_id,
                    letter.type_name().unwrap_or_else(|| "-".into()),
                    letter.receive_count,
                    letter.reason.as_deref().unwrap_or("-"),
                    if body.chars().count() > 120 { "…" } else { "" }
                );
                for attempt in &letter.history {
                    println!(
                        "    attempt {} at {}: {}: {}",
                        attempt.attempt,
                        rfc3339(attempt.at_ms),
                        attempt.error_type,
                        attempt.message
                    );
                }
            }
            if hidden > 0 {
                println!("{note}");
            }
            Ok(())
        }
        DlqCommand::Redrive { queue, max, type_name } => {
            let dlq = capability(app, &queue)?;
            let total = dlq.depth(&queue).await?;
            let limit = max.map_or(total, |m| (m as u64).min(total));
            let bar = indicatif::ProgressBar::new(limit);
            bar.set_style(
                indicatif::ProgressStyle::with_template("{msg} [{bar:30}] {pos}/{len}")
                    .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
            );
            bar.set_message(format!("redriving `{queue}`"));
            // One run, not one per bar step: a run sees each letter once, where
            // runs of a few letters each would receive the letters they leave
            // over and over. The bar moves as the filter chooses letters.
            let chosen = bar.clone();
            let wanted = type_name.clone();
            let filter: DeadLetterFilter = Arc::new(move |l: &DeadLetter| {
                let yes = wanted.as_deref().is_none_or(|w| l.type_name().as_deref() == Some(w));
                if yes {
                    chosen.inc(1);
                }
                yes
            });
            let outcome = dlq.redrive(&queue, RedriveOptions { max, filter: Some(filter) }).await;
            bar.finish_and_clear();
            let outcome = outcome?;
            println!(
                "redrove {} message(s) of `{queue}`; {} left in its dead letters by the filter",
                outcome.moved, outcome.skipped
            );
            // On a FIFO dead-letter queue of SQS a letter the filter leaves
            // keeps the rest of its group with it (SQS hands out a group's
            // letters only in order, and moving them would put them ahead of
            // it), so more may be left than the filter refused: say so, and how
            // many. (Database transports read their dead letters directly and
            // move every letter the filter chooses.)
            let sqs = app.setup_transport().system() == "aws_sqs";
            if type_name.is_some() && outcome.skipped > 0 && sqs && is_fifo(app, &queue) {
                let left = dlq.depth(&queue).await.map_or_else(|_| "some".to_owned(), |n| n.to_string());
                println!(
                    "on a FIFO dead-letter queue a letter that does not match the filter blocks the letters behind it \
                     in its group, matching or not: {left} letter(s) are left in the dead letters of `{queue}`"
                );
            }
            Ok(())
        }
    }
}
