//! `outbox`: what waits in the outbox per queue, what the transport refused,
//! and `outbox retry` to send the refused rows again.

use clap::{Args, Subcommand};

use crate::error::Error;
use crate::transport::Outbox;

/// `outbox [--json]`, `outbox retry [--queue Q]`.
#[derive(Debug, Args)]
pub(super) struct OutboxArgs {
    #[command(subcommand)]
    action: Option<OutboxAction>,
    /// Print JSON instead of text (one object).
    #[arg(long, global = true)]
    json: bool,
}

#[derive(Debug, Subcommand)]
enum OutboxAction {
    /// Make the rows the transport refused pending again, for the relays to send.
    Retry {
        /// Only the rows of this queue.
        #[arg(long)]
        queue: Option<String>,
    },
}

/// How many refused rows `outbox` lists.
const LISTED: usize = 20;

pub(super) async fn run(outbox: Option<&Outbox>, args: OutboxArgs) -> Result<(), Error> {
    let Some(outbox) = outbox else {
        return Err(Error::Command(
            "no outbox is configured: name its database with --outbox URL or MESSAGING_OUTBOX_URL, or give the app \
             one in `main` with setup.outbox(..)"
                .into(),
        ));
    };
    match args.action {
        Some(OutboxAction::Retry { queue }) => {
            let n = outbox.retry_failed(queue.as_deref()).await?;
            if args.json {
                out!("{}", serde_json::json!({ "retried": n }));
            } else {
                out!("{n} failed row(s) made pending again; a running relay sends them");
            }
            Ok(())
        }
        None => show(outbox, args.json).await,
    }
}

async fn show(outbox: &Outbox, json: bool) -> Result<(), Error> {
    let queues = outbox.stats().await?;
    let failed = outbox.failed(LISTED).await?;
    let problem = crate::health::outbox_problem(outbox, &queues);
    if json {
        let value = serde_json::json!({
            "database": outbox.system(),
            "max_age_secs": outbox.max_age.as_secs(),
            "queues": queues,
            "failed": failed,
            "problem": problem,
        });
        out!("{value}");
        return Ok(());
    }
    let pending: u64 = queues.iter().map(|q| q.pending).sum();
    let refused: u64 = queues.iter().map(|q| q.failed).sum();
    out!("outbox on {}: {pending} pending, {refused} failed", outbox.system());
    if !queues.is_empty() {
        out!("{:<40} {:>8} {:>7} {:>12}", "queue", "pending", "failed", "oldest");
        for q in &queues {
            let oldest = q.oldest_pending_ms.map_or_else(|| "-".to_owned(), age);
            out!("{:<40} {:>8} {:>7} {:>12}", q.queue, q.pending, q.failed, oldest);
        }
    }
    if !failed.is_empty() {
        out!("refused by the transport (`outbox retry` sends them again):");
        for row in &failed {
            out!(
                "  {} {} after {} attempt(s): {}",
                row.queue,
                row.message_id,
                row.attempts,
                row.error.as_deref().unwrap_or("no reason recorded")
            );
        }
    }
    if let Some(problem) = problem {
        out!("warning: {problem}");
    }
    Ok(())
}

/// An age for people: tenths of a second up to two minutes, then minutes,
/// hours, days.
fn age(ms: u64) -> String {
    let secs = ms / 1000;
    match secs {
        0..120 => format!("{:.1} s", ms as f64 / 1000.0),
        120..7_200 => format!("{} min", secs / 60),
        7_200..172_800 => format!("{} h", secs / 3600),
        _ => format!("{} d", secs / 86_400),
    }
}

#[cfg(test)]
mod tests {
    use super::age;

    #[test]
    fn ages_read_in_the_unit_that_fits() {
        assert_eq!(age(1_234), "1.2 s");
        assert_eq!(age(119_900), "119.9 s");
        assert_eq!(age(600_000), "10 min");
        assert_eq!(age(3 * 3_600_000), "3 h");
        assert_eq!(age(5 * 86_400_000), "5 d");
    }
}
