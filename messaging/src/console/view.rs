//! What the API serves and the pages show, read once from the transport:
//! a queue's summary with its counts, rates, pause and capabilities, and
//! the actions both call.

use std::sync::Arc;

use serde::Serialize;

use super::Failure;
use crate::app::Operations;
use crate::control::Rates;
use crate::queue::QueueSpec;
use crate::transport::{
    DeadLetter, DeadLetterFilter, Listing, MessageId, MessagePage, MessageReport, MessageStatus, PauseScope,
    QueueCounts, RedriveOptions,
};

/// What the console can do with a queue on its transport.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct Capabilities {
    /// Messages can be listed by status (not on SQS, where reading a
    /// message is receiving it).
    pub(crate) list: bool,
    /// One message can be looked up by id.
    pub(crate) inspect: bool,
    /// Sleeping messages can be made due now.
    pub(crate) retry_now: bool,
    /// Waiting messages and dead letters can be deleted by id.
    pub(crate) delete: bool,
    /// The queue keeps dead letters that can be read (SQS: the first of each
    /// FIFO group) and redriven.
    pub(crate) dead_letters: bool,
    /// Dead letters can be purged by filter.
    pub(crate) purge: bool,
    /// Listings filter by identity (database queues).
    pub(crate) identities: bool,
    /// Who a pause stops.
    pub(crate) pause: PauseScope,
    /// The statuses a listing takes.
    pub(crate) statuses: Vec<MessageStatus>,
}

/// One queue as the overview shows it.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct QueueView {
    pub(crate) name: &'static str,
    pub(crate) kind: &'static str,
    pub(crate) dead_letter_queue: Option<&'static str>,
    pub(crate) visibility_secs: u64,
    pub(crate) concurrency: usize,
    pub(crate) max_receives: u32,
    pub(crate) counts: Option<QueueCounts>,
    /// Why the counts could not be read, when they could not.
    pub(crate) counts_error: Option<String>,
    /// How long the oldest message that is not a dead letter has waited.
    pub(crate) oldest_age_ms: Option<i64>,
    pub(crate) paused: bool,
    pub(crate) rates: Rates,
    pub(crate) capabilities: Capabilities,
}

/// Milliseconds since the Unix epoch, now.
pub(crate) fn now_ms() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as i64)
}

impl Operations {
    /// The declared queue `name`, or a 404 naming the declared ones.
    pub(crate) fn spec(&self, name: &str) -> Result<&QueueSpec, Failure> {
        if let Some(spec) = self.specs.iter().find(|s| s.name == name) {
            return Ok(spec);
        }
        if let Some(source) = self.specs.iter().find(|s| s.dlq == Some(name)) {
            return Err(Failure::not_found(format!(
                "`{name}` is the dead-letter queue of `{}`: its dead letters are read through that queue \
                 (status=dead)",
                source.name
            )));
        }
        let known: Vec<&str> = self.specs.iter().map(|s| s.name).collect();
        Err(Failure::not_found(format!("`{name}` is not a declared queue; declared: {}", known.join(", "))))
    }

    pub(crate) fn capabilities(&self, spec: &QueueSpec) -> Capabilities {
        let browse = self.transport.browse();
        let dead_letters = self.transport.keeps_dead_letters(spec);
        let mut statuses: Vec<MessageStatus> = browse
            .map(|b| b.statuses().iter().copied().filter(|&s| s != MessageStatus::Dead).collect())
            .unwrap_or_default();
        if dead_letters {
            statuses.push(MessageStatus::Dead);
        }
        let shared = browse.is_some_and(|b| b.shares_pauses());
        Capabilities {
            list: browse.is_some(),
            inspect: browse.is_some(),
            retry_now: browse.is_some(),
            delete: browse.is_some(),
            identities: browse.is_some_and(|b| b.identities()),
            dead_letters,
            purge: browse.is_some() && dead_letters,
            pause: if shared { PauseScope::AllProcesses } else { PauseScope::ThisProcess },
            statuses,
        }
    }

    /// Whether `queue` is paused: for every process (the database's flag),
    /// or this process's workers.
    pub(crate) async fn is_paused(&self, queue: &str) -> Result<bool, Failure> {
        let shared = match self.transport.browse() {
            Some(browse) => browse.paused(queue).await?.unwrap_or(false),
            None => false,
        };
        Ok(shared || self.pauses.is_paused(queue))
    }

    /// The summary of one queue; a transport that does not answer leaves
    /// its counts empty with the error, so the overview still shows the rest.
    pub(crate) async fn queue_view(&self, spec: &QueueSpec) -> QueueView {
        let (counted, paused) = tokio::join!(self.transport.counts(spec.name), self.is_paused(spec.name));
        let (counts, counts_error) = match counted {
            Ok(counts) => (Some(counts), None),
            Err(e) => (None, Some(e.to_string())),
        };
        let oldest_age_ms = counts.as_ref().and_then(|c| c.oldest_sent_at_ms).map(|sent| (now_ms() - sent).max(0));
        QueueView {
            name: spec.name,
            kind: if spec.fifo { "fifo" } else { "standard" },
            dead_letter_queue: spec.dlq,
            visibility_secs: spec.visibility.as_secs(),
            concurrency: spec.concurrency,
            max_receives: spec.max_receives,
            counts,
            counts_error,
            oldest_age_ms,
            paused: paused.unwrap_or(false),
            rates: self.counters.rates(spec.name),
            capabilities: self.capabilities(spec),
        }
    }

    /// Every declared queue's summary, the queues asked at once: one after
    /// the other, an unreachable database held the overview for the pool's
    /// wait (5 s) twice per queue.
    pub(crate) async fn queue_views(&self) -> Vec<QueueView> {
        futures_util::future::join_all(self.specs.iter().map(|spec| self.queue_view(spec))).await
    }

    /// A page of a queue's messages. Dead letters of a transport that cannot
    /// list (SQS) come from a peek: the first ones, without further pages.
    pub(crate) async fn list(&self, spec: &QueueSpec, listing: &Listing) -> Result<Listed, Failure> {
        let caps = self.capabilities(spec);
        if !caps.statuses.contains(&listing.status) {
            return Err(Failure::unsupported(format!(
                "the {} transport cannot list the {} messages of `{}` (it lists: {})",
                self.transport.system(),
                listing.status,
                spec.name,
                names(&caps.statuses)
            )));
        }
        if let Some(browse) = self.transport.browse() {
            let MessagePage { messages, next } = browse.list(spec.name, listing).await?;
            return Ok(Listed { messages: messages.iter().map(MessageReport::to_json).collect(), next });
        }
        let dead = self.transport.dead_letters().ok_or_else(|| Failure::unsupported("no dead letters here"))?;
        let letters = dead.peek(spec.name, listing.limit.clamp(1, 100)).await?;
        let messages = letters
            .iter()
            .filter(|l| listing.type_name.as_ref().is_none_or(|t| l.type_name().as_deref() == Some(t.as_str())))
            .filter(|l| listing.group.as_ref().is_none_or(|g| l.group_id.as_ref() == Some(g)))
            .map(DeadLetter::to_json)
            .collect();
        Ok(Listed { messages, next: None })
    }

    /// One message of `queue` by id (a dead letter too), as JSON.
    pub(crate) async fn message(&self, spec: &QueueSpec, id: &str) -> Result<serde_json::Value, Failure> {
        let missing = || Failure::not_found(format!("no message `{id}` in `{}` or its dead letters", spec.name));
        if self.transport.browse().is_some() {
            let found = self.transport.inspect(spec.name, &MessageId::from(id)).await?;
            return found.map(|report| report.to_json()).ok_or_else(missing);
        }
        // SQS: only dead letters can be read without receiving them.
        let dead = self.transport.dead_letters().ok_or_else(missing)?;
        let letters = dead.peek(spec.name, 100).await?;
        letters.iter().find(|l| l.message_id.as_str() == id).map(DeadLetter::to_json).ok_or_else(missing)
    }

    fn browse_for(&self, spec: &QueueSpec, what: &str) -> Result<&dyn crate::transport::Browse, Failure> {
        self.transport.browse().ok_or_else(|| {
            Failure::unsupported(format!(
                "the {} transport cannot {what} the messages of `{}` (reading one means receiving it)",
                self.transport.system(),
                spec.name
            ))
        })
    }

    /// Carries out `action` on `queue`; what it did, as JSON.
    pub(crate) async fn act(&self, spec: &QueueSpec, action: Action) -> Result<serde_json::Value, Failure> {
        let queue = spec.name;
        let caps = self.capabilities(spec);
        let dead_letters = || {
            self.transport
                .dead_letters()
                .filter(|_| caps.dead_letters)
                .ok_or_else(|| Failure::unsupported(format!("`{queue}` keeps no dead letters")))
        };
        let value = match action {
            Action::RetryNow { ids } => {
                let retried = self.browse_for(spec, "retry")?.retry_now(queue, &ids).await?;
                serde_json::json!({ "queue": queue, "requested": ids.len(), "retried": retried })
            }
            Action::Delete { ids } => {
                let deleted = self.browse_for(spec, "delete")?.delete(queue, &ids).await?;
                serde_json::json!({ "queue": queue, "requested": ids.len(), "deleted": deleted })
            }
            Action::Redrive { ids: Some(ids), .. } => {
                dead_letters()?;
                let moved = match self.transport.browse() {
                    Some(browse) => browse.redrive_ids(queue, &ids).await?,
                    None => dead_letters()?.redrive(queue, RedriveOptions::of_ids(&ids)).await?.moved,
                };
                serde_json::json!({ "queue": queue, "requested": ids.len(), "moved": moved })
            }
            Action::Redrive { ids: None, filter, max, dry_run } => {
                let dlq = dead_letters()?;
                let options = RedriveOptions { max, filter: filter.predicate()?, dry_run };
                let outcome = dlq.redrive(queue, options).await?;
                let left = dlq.depth(queue).await.ok();
                serde_json::json!({
                    "queue": queue, "dry_run": dry_run, "moved": outcome.moved, "skipped": outcome.skipped, "left": left,
                })
            }
            Action::Purge { filter, dry_run } => {
                if !caps.purge {
                    return Err(Failure::unsupported(format!(
                        "the {} transport cannot purge the dead letters of `{queue}`",
                        self.transport.system()
                    )));
                }
                let dlq = dead_letters()?;
                let options = RedriveOptions { max: None, filter: filter.predicate()?, dry_run };
                let outcome = dlq.purge(queue, options).await?;
                let left = dlq.depth(queue).await.ok();
                serde_json::json!({
                    "queue": queue, "dry_run": dry_run, "deleted": outcome.deleted, "skipped": outcome.skipped, "left": left,
                })
            }
            Action::Pause(paused) => {
                let shared = match self.transport.browse() {
                    Some(browse) => browse.set_paused(queue, paused).await?,
                    None => false,
                };
                if !shared {
                    self.pauses.set(queue, paused);
                }
                let scope = if shared { PauseScope::AllProcesses } else { PauseScope::ThisProcess };
                serde_json::json!({ "queue": queue, "paused": paused, "scope": scope })
            }
        };
        Ok(value)
    }
}

/// A page of messages, as JSON.
pub(crate) struct Listed {
    pub(crate) messages: Vec<serde_json::Value>,
    pub(crate) next: Option<String>,
}

/// The names of `statuses`, for messages.
fn names(statuses: &[MessageStatus]) -> String {
    if statuses.is_empty() {
        return "none".to_owned();
    }
    statuses.iter().map(|s| s.as_str()).collect::<Vec<_>>().join(", ")
}

/// Which dead letters a bulk action takes.
#[derive(Debug, Clone, Default)]
pub(crate) struct Filter {
    /// Only letters of this envelope type (a registered one).
    pub(crate) type_name: Option<String>,
    /// Only letters of this FIFO group.
    pub(crate) group: Option<String>,
    /// Only letters whose last failure is older than this (`7d`).
    pub(crate) older_than: Option<String>,
}

impl Filter {
    fn predicate(self) -> Result<Option<DeadLetterFilter>, Failure> {
        let Filter { type_name, group, older_than } = self;
        if let Some(wanted) = &type_name {
            let names = crate::registry::message_type_names();
            if !names.contains(&wanted.as_str()) {
                return Err(Failure::bad_request(format!(
                    "`{wanted}` is not a registered message type; registered: {}",
                    names.join(", ")
                )));
            }
        }
        let cutoff = match older_than.as_deref().map(crate::duration::parse_duration) {
            None => None,
            Some(Ok(age)) => Some(now_ms() - age.as_millis() as i64),
            Some(Err(e)) => return Err(Failure::bad_request(format!("older_than: {e}"))),
        };
        if type_name.is_none() && group.is_none() && cutoff.is_none() {
            return Ok(None);
        }
        Ok(Some(Arc::new(move |l: &DeadLetter| {
            type_name.as_ref().is_none_or(|t| l.type_name().as_deref() == Some(t.as_str()))
                && group.as_ref().is_none_or(|g| l.group_id.as_ref() == Some(g))
                && cutoff.is_none_or(|c| l.history.last().is_some_and(|a| a.at_ms < c))
        })))
    }
}

/// What an operator asks of a queue.
#[derive(Debug, Clone)]
pub(crate) enum Action {
    /// Sleeping messages become due now.
    RetryNow { ids: Vec<MessageId> },
    /// Waiting messages or dead letters are deleted.
    Delete { ids: Vec<MessageId> },
    /// Dead letters go back to the queue: these, or those the filter takes.
    Redrive { ids: Option<Vec<MessageId>>, filter: Filter, max: Option<usize>, dry_run: bool },
    /// Dead letters the filter takes are deleted.
    Purge { filter: Filter, dry_run: bool },
    /// The queue is paused (`true`) or resumed.
    Pause(bool),
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use crate::app::Operations;
    use crate::queue::QueueSpec;
    use crate::transport::stub::{Stub, STALL};

    #[tokio::test(start_paused = true)]
    async fn the_overview_of_an_unreachable_database_waits_once_for_all_queues() {
        let operations = Operations {
            transport: Arc::new(Stub::away()),
            specs: vec![QueueSpec::standard("a"), QueueSpec::standard("b"), QueueSpec::standard("c")],
            pauses: Default::default(),
            counters: Default::default(),
        };
        let started = tokio::time::Instant::now();
        let views = operations.queue_views().await;
        assert_eq!(started.elapsed(), STALL, "the queues are asked at once");
        assert_eq!(views.iter().map(|v| v.name).collect::<Vec<_>>(), ["a", "b", "c"]);
        assert!(views
            .iter()
            .all(|v| v.counts.is_none() && v.counts_error.as_deref().is_some_and(|e| e.contains("refused"))));
    }
}
