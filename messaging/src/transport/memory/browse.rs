//! The console's view of the in-memory transport: counts, listings, retry
//! now, delete, and redrive by id. A queue's dead letters are the messages
//! of its dead-letter queue.

use super::MemoryTransport;
use crate::boxed::BoxFuture;
use crate::error::TransportError;
use crate::transport::{Browse, DeadLetters, Listing, MessageId, MessagePage, MessageStatus, QueueCounts};

impl MemoryTransport {
    /// The queue whose messages `status` lists: the dead-letter queue for
    /// dead letters (none declared: an empty listing).
    fn holding(&self, queue: &str, status: MessageStatus) -> Result<Option<String>, TransportError> {
        if status != MessageStatus::Dead {
            self.queue(queue)?;
            return Ok(Some(queue.to_owned()));
        }
        let dlq = self.queue(queue)?.lock().spec.dlq;
        Ok(dlq.map(str::to_owned))
    }

    /// Applies `f` to the messages with these ids of queue `name`; how many it took.
    fn each(&self, name: &str, ids: &[MessageId], f: impl Fn(&mut super::state::QueueState, u64) -> bool) -> usize {
        let Ok(q) = self.queue(name) else { return 0 };
        let mut state = q.lock();
        let keys: Vec<u64> =
            state.iter_ordered().into_iter().filter(|(_, m)| ids.contains(&m.id)).map(|(key, _)| key).collect();
        let done = keys.into_iter().filter(|&key| f(&mut state, key)).count();
        drop(state);
        q.notify.notify_waiters();
        done
    }
}

impl Browse for MemoryTransport {
    fn statuses(&self) -> &'static [MessageStatus] {
        // No identities, so nothing waits for a release.
        &[MessageStatus::Pending, MessageStatus::Sleeping, MessageStatus::InFlight, MessageStatus::Dead]
    }

    fn identities(&self) -> bool {
        false // identity is the FIFO deduplication id here, as on SQS
    }

    fn shares_pauses(&self) -> bool {
        false // one process: the console pauses this process's workers
    }

    fn counts<'a>(&'a self, queue: &'a str) -> BoxFuture<'a, Result<QueueCounts, TransportError>> {
        Box::pin(async move {
            let mut counts = QueueCounts::zeros();
            let q = self.queue(queue)?;
            let dlq = {
                let state = q.lock();
                let now = tokio::time::Instant::now();
                let mut expired = 0;
                for (_, m) in state.iter_ordered() {
                    let status = m.browse_status();
                    counts.set(status, counts.of(status).unwrap_or(0) + 1);
                    expired += u64::from(m.expired(now));
                    let sent = m.sent_at_ms();
                    counts.oldest_sent_at_ms = Some(counts.oldest_sent_at_ms.map_or(sent, |o| o.min(sent)));
                }
                counts.expired = Some(expired);
                state.spec.dlq
            };
            if let Some(dlq) = dlq {
                counts.dead = Some(self.queue(dlq).map_or(0, |d| d.lock().len() as u64));
            }
            Ok(counts)
        })
    }

    fn list<'a>(&'a self, queue: &'a str, listing: &'a Listing) -> BoxFuture<'a, Result<MessagePage, TransportError>> {
        Box::pin(async move {
            let Some(name) = self.holding(queue, listing.status)? else { return Ok(MessagePage::default()) };
            let after = match listing.after.as_deref() {
                None => None,
                Some(text) => Some(text.parse::<u64>().map_err(|_| crate::transport::bad_cursor(text))?),
            };
            let q = self.queue(&name)?;
            let state = q.lock();
            let dead = listing.status == MessageStatus::Dead;
            let limit = listing.limit.max(1);
            let mut page = MessagePage::default();
            for (_, m) in state.iter_ordered() {
                if after.is_some_and(|a| m.seq() <= a) || (!dead && m.browse_status() != listing.status) {
                    continue;
                }
                let report = m.report(queue, dead.then_some("dead_letter"));
                if !listing.matches(&report) {
                    continue;
                }
                if page.messages.len() == limit {
                    page.next = page.messages.last().map(|m| m.cursor.clone());
                    break;
                }
                page.messages.push(report);
            }
            Ok(page)
        })
    }

    fn retry_now<'a>(&'a self, queue: &'a str, ids: &'a [MessageId]) -> BoxFuture<'a, Result<usize, TransportError>> {
        Box::pin(async move {
            self.queue(queue)?;
            Ok(self.each(queue, ids, |state, key| state.due_now(key)))
        })
    }

    fn delete<'a>(&'a self, queue: &'a str, ids: &'a [MessageId]) -> BoxFuture<'a, Result<usize, TransportError>> {
        Box::pin(async move {
            let mut deleted = self.each(queue, ids, |state, key| state.remove_waiting(key));
            if self.holding(queue, MessageStatus::Dead)?.is_some() {
                deleted += DeadLetters::delete(self, queue, ids).await?;
            }
            Ok(deleted)
        })
    }

    fn redrive_ids<'a>(&'a self, queue: &'a str, ids: &'a [MessageId]) -> BoxFuture<'a, Result<usize, TransportError>> {
        Box::pin(async move {
            let options = crate::transport::RedriveOptions::of_ids(ids);
            Ok(DeadLetters::redrive(self, queue, options).await?.moved)
        })
    }
}
