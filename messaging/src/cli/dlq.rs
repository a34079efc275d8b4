//! `dlq peek` and `dlq redrive`: dead letters from the command line, on any
//! transport with the dead-letter capability.

use std::sync::Arc;

use clap::Subcommand;

use crate::app::App;
use crate::error::Error;
use crate::transport::{DeadLetter, DeadLetters, RedriveOptions};

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
        "attributes": &*letter.attributes,
        "body": String::from_utf8_lossy(&letter.body),
    })
}

pub(super) async fn run(app: &App, command: DlqCommand) -> Result<(), Error> {
    match command {
        DlqCommand::Peek { queue, max, json } => {
            let letters = capability(app, &queue)?.peek(&queue, max).await?;
            if json {
                for letter in &letters {
                    println!("{}", json_of(letter));
                }
                return Ok(());
            }
            if letters.is_empty() {
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
            let filter = type_name.clone().map(|wanted| {
                Arc::new(move |l: &DeadLetter| l.type_name().as_deref() == Some(wanted.as_str()))
                    as crate::transport::DeadLetterFilter
            });
            let (mut moved, mut skipped) = (0usize, 0usize);
            // In rounds of 10, so that the bar moves.
            loop {
                let left = max.map_or(usize::MAX, |m| m.saturating_sub(moved));
                if left == 0 {
                    break;
                }
                let round = RedriveOptions { max: Some(left.min(10)), filter: filter.clone() };
                let outcome = dlq.redrive(&queue, round).await?;
                moved += outcome.moved;
                skipped = outcome.skipped;
                bar.inc(outcome.moved as u64);
                if outcome.moved == 0 {
                    break;
                }
            }
            bar.finish_and_clear();
            println!("redrove {moved} message(s) of `{queue}`; {skipped} left in its dead letters by the filter");
            Ok(())
        }
    }
}
