//! `dlq peek`, `redrive`, `delete` and `purge`: dead letters from the command
//! line, on any transport with the dead-letter capability.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use clap::Subcommand;

use super::interrupt::{self, Ended};
use crate::app::App;
use crate::error::Error;
use crate::transport::{DeadLetter, DeadLetterFilter, DeadLetters, MessageId, RedriveOptions};

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
        /// Count what would move; move nothing.
        #[arg(long)]
        dry_run: bool,
        /// Print the counts as one JSON object.
        #[arg(long)]
        json: bool,
    },
    /// Delete dead letters of QUEUE by message id, for good.
    Delete {
        /// The source queue.
        queue: String,
        /// The message ids (as `dlq peek` shows them).
        #[arg(required = true)]
        ids: Vec<String>,
        /// Print the counts as one JSON object.
        #[arg(long)]
        json: bool,
    },
    /// Delete dead letters of QUEUE for good: all, or those of a type or older than an age.
    Purge {
        /// The source queue.
        queue: String,
        /// Only messages of this envelope type name.
        #[arg(long = "type")]
        type_name: Option<String>,
        /// Only letters whose last failure is older than this (`7d`, `12h`).
        #[arg(long, value_parser = crate::duration::parse_duration)]
        older_than: Option<std::time::Duration>,
        /// Count what would be deleted; delete nothing.
        #[arg(long)]
        dry_run: bool,
        /// Delete without asking (required unless --dry-run).
        #[arg(long)]
        yes: bool,
        /// Print the counts as one JSON object.
        #[arg(long)]
        json: bool,
    },
}

/// A filter on the envelope's type name, which must be a registered one.
fn type_filter(type_name: Option<&str>) -> Result<Option<DeadLetterFilter>, Error> {
    let Some(wanted) = type_name else { return Ok(None) };
    if !crate::registry::message_type_names().contains(&wanted) {
        return Err(Error::Command(format!(
            "`{wanted}` is not a registered message type; registered: {}",
            crate::registry::message_type_names().join(", ")
        )));
    }
    let wanted = wanted.to_owned();
    Ok(Some(Arc::new(move |l: &DeadLetter| l.type_name().as_deref() == Some(wanted.as_str()))))
}

/// A progress bar of `len` steps with its rate and the time left.
fn progress(len: u64, message: String) -> indicatif::ProgressBar {
    let bar = indicatif::ProgressBar::new(len);
    bar.set_style(
        indicatif::ProgressStyle::with_template("{msg} [{bar:30}] {pos}/{len} {per_sec} eta {eta}")
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
    );
    bar.set_message(message);
    bar
}

/// A filter that also moves `bar` by each letter it looks at, and refuses
/// every letter once `stopped` is set (a shutdown signal came).
fn counting(
    filter: Option<DeadLetterFilter>,
    bar: &indicatif::ProgressBar,
    stopped: &Arc<AtomicBool>,
) -> DeadLetterFilter {
    let (bar, stopped) = (bar.clone(), stopped.clone());
    Arc::new(move |l: &DeadLetter| {
        bar.inc(1);
        !stopped.load(Ordering::SeqCst) && filter.as_ref().is_none_or(|f| f(l))
    })
}

/// Runs a redrive or purge (`work`, whose filter is [`counting`]'s with
/// `gate`) until it ends or a shutdown signal (Ctrl-C, SIGTERM) comes.
async fn until_signal<T>(work: impl std::future::Future<Output = T>, gate: &AtomicBool) -> Ended<T> {
    interrupt::until_signal(work, super::wait_for_signal, gate, interrupt::AFTER_SIGNAL).await
}

/// A walk over the dead letters of `queue` (a redrive or purge, `command`,
/// whose letters are `done` when taken), of `before` letters when it began.
struct Walk<'a> {
    dlq: &'a dyn DeadLetters,
    queue: &'a str,
    before: u64,
    command: &'static str,
    done: &'static str,
    /// A dry run: counted, nothing changed.
    dry_run: bool,
    json: bool,
}

impl Walk<'_> {
    /// Runs the walk that `start` begins with the options (`max`, `filter`
    /// counted on a progress bar `doing` the letters, the dry run) until it
    /// ends or a signal comes: its outcome (as [`Walk::outcome`]) and the
    /// dead letters left after it.
    async fn run<O, F>(
        &self,
        doing: &str,
        max: Option<usize>,
        filter: Option<DeadLetterFilter>,
        start: impl FnOnce(RedriveOptions) -> F,
        count: impl Fn(&O) -> usize,
    ) -> Result<(O, Option<u64>), Error>
    where
        F: std::future::Future<Output = Result<O, crate::error::TransportError>>,
    {
        let bar = progress(self.before, format!("{doing} `{}`", self.queue));
        let gate = Arc::new(AtomicBool::new(false));
        let options = RedriveOptions { max, filter: Some(counting(filter, &bar, &gate)), dry_run: self.dry_run };
        let ended = until_signal(start(options), &gate).await;
        bar.finish_and_clear();
        let outcome = self.outcome(ended, count).await?;
        Ok((outcome, self.dlq.depth(self.queue).await.ok()))
    }

    /// With `--json`, prints the walk's report (`done` letters taken,
    /// `skipped` by the filter, `left`) and says so.
    fn printed_json(&self, done: usize, skipped: usize, left: Option<u64>) -> bool {
        if self.json {
            let value = serde_json::json!({
                "queue": self.queue, "dry_run": self.dry_run, self.done: done, "skipped": skipped, "left": left,
            });
            out!("{value}");
        }
        self.json
    }

    /// The outcome of a walk that `ended` on its own; else the error that
    /// says where a failed or interrupted one stands (`count` reads how
    /// many letters an outcome took).
    async fn outcome<O>(
        &self,
        ended: Ended<Result<O, crate::error::TransportError>>,
        count: impl Fn(&O) -> usize,
    ) -> Result<O, Error> {
        match ended {
            Ended::Done(Ok(outcome)) => Ok(outcome),
            // Refused as a whole: nothing was done, and running it again
            // would be refused again.
            Ended::Done(Err(e @ crate::error::TransportError::Unsupported(_))) => Err(Error::Command(e.to_string())),
            Ended::Done(Err(e)) => Err(stopped(self.dlq, self.queue, self.before, e, self.command, self.done).await),
            Ended::Interrupted(ended) => Err(self.interrupted(ended.and_then(Result::ok).map(|o| count(&o))).await),
        }
    }

    /// What a walk stopped by a signal says: how many letters it took
    /// (`count`, when it ended with one; else read from the dead letters'
    /// depth against `before`), how many are left, and how to go on; as
    /// JSON on standard output with `json`. The command then exits 130.
    async fn interrupted(&self, count: Option<usize>) -> Error {
        let left = if self.dry_run { None } else { self.dlq.depth(self.queue).await.ok() };
        let (value, text) = self.stopped_by_signal(count, left);
        if self.json {
            out!("{value}");
        } else {
            eprintln!("{text}");
        }
        Error::Interrupted
    }

    /// [`Walk::interrupted`]'s report, as JSON and as text, given the
    /// letters `left` (read after it stopped; none on a dry run).
    fn stopped_by_signal(&self, count: Option<usize>, left: Option<u64>) -> (serde_json::Value, String) {
        let (queue, done, command) = (self.queue, self.done, self.command);
        if self.dry_run {
            // Nothing changed; the count is of the letters looked at
            // before the signal.
            let value = serde_json::json!({ "queue": queue, "dry_run": true, done: count, "interrupted": true });
            let count = count.map_or_else(|| "an unknown number of".to_owned(), |n| n.to_string());
            let text = format!(
                "stopped by a signal: a dry run, nothing was changed; {count} dead letter(s) of `{queue}` would \
                 have been {done} of those it looked at"
            );
            return (value, text);
        }
        let count = count.map(|n| n as u64).or_else(|| left.map(|left| self.before.saturating_sub(left)));
        let value = serde_json::json!({ "queue": queue, done: count, "left": left, "interrupted": true });
        let count = count.map_or_else(|| "some".to_owned(), |n| n.to_string());
        let left = left.map_or_else(|| "?".to_owned(), |n| n.to_string());
        let text = format!(
            "stopped by a signal: {count} {done} before it stopped, {left} left in the dead letters of `{queue}`; \
             run `dlq {command} {queue}` again to go on with the rest"
        );
        (value, text)
    }
}

/// The error of a redrive or purge that stopped part way (a page of letters
/// at a time: the database went away, say), with what it had done by then,
/// read from the dead letters' depth, so that the operator knows where it
/// stands and that running it again goes on with the rest.
async fn stopped(
    dlq: &dyn DeadLetters,
    queue: &str,
    before: u64,
    error: crate::error::TransportError,
    command: &str,
    done: &str,
) -> Error {
    // The error may have closed every pooled connection (a server restart):
    // a few tries over two seconds let the count through once it is back.
    let mut left = dlq.depth(queue).await;
    for _ in 0..4 {
        if left.is_ok() {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(500)).await;
        left = dlq.depth(queue).await;
    }
    let progress = match left {
        Ok(left) => format!(
            "{} {done} before it stopped, {left} left in the dead letters of `{queue}`",
            before.saturating_sub(left)
        ),
        Err(e) => format!("what is left could not be counted ({e}); `dlq peek {queue}` shows it"),
    };
    Error::Command(format!("{error}\n{progress}; run `dlq {command} {queue}` again to go on with the rest"))
}

fn capability<'a>(app: &'a App, queue: &str) -> Result<&'a dyn DeadLetters, Error> {
    super::declared(app, queue)?;
    app.setup_transport()
        .dead_letters()
        .ok_or_else(|| Error::Command(format!("the {} transport has no dead letters", app.setup_transport().system())))
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
                    out!("{}", letter.to_json());
                }
                if hidden > 0 {
                    // Not on stdout, which carries one JSON object per line.
                    eprintln!("{note}");
                }
                return Ok(());
            }
            if letters.is_empty() && hidden == 0 {
                out!("no dead letters for `{queue}`");
            }
            for letter in &letters {
                let body = String::from_utf8_lossy(&letter.body);
                let short: String = body.chars().take(120).collect();
                out!(
                    "{}  type={}  receives={}  reason={}\n    {short}{}",
                    letter.message_id,
                    letter.type_name().unwrap_or_else(|| "-".into()),
                    letter.receive_count,
                    letter.reason.as_deref().unwrap_or("-"),
                    if body.chars().count() > 120 { "…" } else { "" }
                );
                for attempt in &letter.history {
                    out!("    {attempt}");
                }
            }
            if hidden > 0 {
                out!("{note}");
            }
            Ok(())
        }
        DlqCommand::Redrive { queue, max, type_name, dry_run, json } => {
            let dlq = capability(app, &queue)?;
            let filter = type_filter(type_name.as_deref())?;
            let total = dlq.depth(&queue).await?;
            let walk = Walk { dlq, queue: &queue, before: total, command: "redrive", done: "moved", dry_run, json };
            let (outcome, left) =
                walk.run("redriving", max, filter, |options| dlq.redrive(&queue, options), |o| o.moved).await?;
            if walk.printed_json(outcome.moved, outcome.skipped, left) {
                return Ok(());
            }
            let left = left.map_or_else(|| "?".to_owned(), |n| n.to_string());
            if dry_run {
                out!(
                    "would redrive {} message(s) of `{queue}` ({} skipped by the filter); nothing was moved",
                    outcome.moved,
                    outcome.skipped
                );
            } else {
                out!(
                    "redrove {} message(s) of `{queue}`; {} skipped by the filter; {left} left in its dead letters",
                    outcome.moved,
                    outcome.skipped
                );
            }
            // On a FIFO dead-letter queue of SQS a letter the filter leaves
            // keeps the rest of its group with it (SQS hands out a group's
            // letters only in order, and moving them would put them ahead of
            // it), so more may be left than the filter refused: say so, and how
            // many. (Database transports read their dead letters directly and
            // move every letter the filter chooses.)
            let sqs = app.setup_transport().system() == "aws_sqs";
            if type_name.is_some() && outcome.skipped > 0 && sqs && is_fifo(app, &queue) {
                let left = dlq.depth(&queue).await.map_or_else(|_| "some".to_owned(), |n| n.to_string());
                out!(
                    "on a FIFO dead-letter queue a letter that does not match the filter blocks the letters behind it \
                     in its group, matching or not: {left} letter(s) are left in the dead letters of `{queue}`"
                );
            }
            Ok(())
        }
        DlqCommand::Delete { queue, ids, json } => {
            let dlq = capability(app, &queue)?;
            let ids: Vec<MessageId> = ids.into_iter().map(MessageId::from).collect();
            let deleted = dlq.delete(&queue, &ids).await?;
            if json {
                out!("{}", serde_json::json!({ "queue": queue, "requested": ids.len(), "deleted": deleted }));
                return Ok(());
            }
            out!("deleted {deleted} of {} dead letter(s) of `{queue}`", ids.len());
            if deleted < ids.len() {
                out!("the others are not dead letters of `{queue}` (see `dlq peek {queue}`)");
            }
            Ok(())
        }
        DlqCommand::Purge { queue, type_name, older_than, dry_run, yes, json } => {
            let dlq = capability(app, &queue)?;
            let by_type = type_filter(type_name.as_deref())?;
            let cutoff = older_than.map(|age| {
                let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
                now.saturating_sub(age).as_millis() as i64
            });
            // A letter's age is the time of its last failure; one without an
            // error history (SQS) has no age and is never "older".
            let filter: Option<DeadLetterFilter> = match (by_type, cutoff) {
                (None, None) => None,
                (by_type, cutoff) => Some(Arc::new(move |l: &DeadLetter| {
                    by_type.as_ref().is_none_or(|f| f(l))
                        && cutoff.is_none_or(|c| l.history.last().is_some_and(|a| a.at_ms < c))
                })),
            };
            let total = dlq.depth(&queue).await?;
            if !dry_run && !yes {
                return Err(Error::Command(format!(
                    "`dlq purge` deletes dead letters of `{queue}` ({total} now) for good: add --yes, \
                     or --dry-run to count what it would delete"
                )));
            }
            let walk = Walk { dlq, queue: &queue, before: total, command: "purge", done: "deleted", dry_run, json };
            let (outcome, left) =
                walk.run("purging", None, filter, |options| dlq.purge(&queue, options), |o| o.deleted).await?;
            if walk.printed_json(outcome.deleted, outcome.skipped, left) {
                return Ok(());
            }
            let left = left.map_or_else(|| "?".to_owned(), |n| n.to_string());
            if dry_run {
                out!(
                    "would delete {} dead letter(s) of `{queue}` ({} skipped by the filter); nothing was deleted",
                    outcome.deleted,
                    outcome.skipped
                );
            } else {
                out!(
                    "deleted {} dead letter(s) of `{queue}`; {} skipped by the filter; {left} left",
                    outcome.deleted,
                    outcome.skipped
                );
            }
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::{stopped, Walk};
    use crate::error::TransportError;
    use crate::queue::QueueSpec;
    use crate::transport::memory::MemoryTransport;
    use crate::transport::{FailedAttempt, Outgoing, Transport};

    #[test]
    fn a_walk_stopped_by_a_signal_says_what_it_did_and_a_dry_run_that_nothing_changed() {
        let t = MemoryTransport::new();
        let dlq = t.dead_letters().unwrap();
        let walk =
            |dry_run| Walk { dlq, queue: "q", before: 10, command: "redrive", done: "moved", dry_run, json: false };
        let (value, text) = walk(false).stopped_by_signal(Some(4), Some(6));
        assert_eq!(value, serde_json::json!({"queue": "q", "moved": 4, "left": 6, "interrupted": true}));
        assert_eq!(
            text,
            "stopped by a signal: 4 moved before it stopped, 6 left in the dead letters of `q`; run `dlq redrive q` \
             again to go on with the rest"
        );
        // Cut off before it ended: counted from the dead letters left.
        let (value, _) = walk(false).stopped_by_signal(None, Some(7));
        assert_eq!(value["moved"], 3);
        let (value, text) = walk(true).stopped_by_signal(Some(4), None);
        assert_eq!(value, serde_json::json!({"queue": "q", "dry_run": true, "moved": 4, "interrupted": true}));
        assert!(
            text.contains("a dry run, nothing was changed; 4 dead letter(s) of `q` would have been moved"),
            "{text}"
        );
    }

    #[tokio::test]
    async fn a_stopped_redrive_says_what_it_moved_what_is_left_and_how_to_go_on() {
        let t = MemoryTransport::new();
        t.declare(&QueueSpec { dlq: Some("dead"), ..QueueSpec::standard("q") }).await.unwrap();
        let dlq = t.dead_letters().unwrap();
        for text in ["a", "b", "c"] {
            t.send("q", Outgoing { body: text.as_bytes().to_vec().into(), ..Outgoing::default() }).await.unwrap();
            let d = t.receive("q", 1, Duration::ZERO).await.unwrap().remove(0);
            dlq.dead_letter("q", &d, FailedAttempt::new(1, "Error", "bad")).await.unwrap();
        }
        let error = TransportError::Backend("postgresql: redrive failed: the server went away".into());
        let text = stopped(dlq, "q", 10, error, "redrive", "moved").await.to_string();
        assert!(text.contains("the server went away"), "{text}");
        assert!(
            text.contains("7 moved before it stopped, 3 left in the dead letters of `q`; run `dlq redrive q` again"),
            "{text}"
        );
    }
}
