//! Dead letters on SQS: moving a message to its DLQ, peeking without losing
//! anything, redriving (republish first, then delete), depth.
//!
//! Peek and redrive read a DLQ by receiving its letters, which reserves them
//! (hides them from other receives) until they are deleted or made visible
//! again. On a FIFO DLQ that has a consequence: while any letter of a message
//! group is reserved, SQS hands out no more letters of that group. A peek, which
//! must not delete anything, therefore sees only the first letters of each group
//! (what one receive returned); a redrive works in rounds, deleting the letters
//! it moved back before it receives again, so that the groups unlock.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use aws_sdk_sqs::types::MessageSystemAttributeName;

use super::{delivery_of, handle, sdk, SqsQueue, SqsTransport, MAX_BATCH};
use crate::boxed::BoxFuture;
use crate::error::TransportError;
use crate::transport::{
    DeadLetter, DeadLetters, Delivery, FailedAttempt, MessageId, Outgoing, RedriveOptions, RedriveOutcome,
};

/// How long messages stay reserved while a peek or redrive looks at them.
const RESERVE: Duration = Duration::from_secs(30);
/// How long a receive of dead letters waits for some. Not 0: a short poll asks
/// only some of the SQS servers and may come back empty while letters remain,
/// and an empty receive is how peek and redrive know they have seen them all. A
/// long poll returns as soon as there are letters, so only the last receive of
/// a run waits this long.
const WAIT: Duration = Duration::from_secs(1);
/// The attribute carrying why a message was dead-lettered.
const REASON: &str = "messaging.dead_letter_reason";

/// The dead letters a peek or redrive holds reserved, each once.
#[derive(Default)]
struct Held {
    letters: Vec<Delivery>,
    index: HashMap<MessageId, usize>,
}

impl Held {
    fn len(&self) -> usize {
        self.letters.len()
    }

    fn contains(&self, id: &MessageId) -> bool {
        self.index.contains_key(id)
    }

    /// Holds `d`; returns false when it was held already. A letter received
    /// again (its reservation ran out, or a standard queue delivered a copy)
    /// keeps its place but takes the new receipt: only the latest receipt can
    /// make it visible again at the end.
    fn hold(&mut self, d: Delivery) -> bool {
        match self.index.get(&d.message_id) {
            Some(&at) => {
                self.letters[at] = d;
                false
            }
            None => {
                self.index.insert(d.message_id.clone(), self.letters.len());
                self.letters.push(d);
                true
            }
        }
    }
}

/// What one redrive has done so far.
#[derive(Default)]
struct Run {
    outcome: RedriveOutcome,
    /// Letters seen and left in the DLQ. They stay reserved until the run
    /// ends, so that no later receive of the run hands them out again; on a
    /// FIFO DLQ that also keeps the rest of their group out of reach.
    held: Held,
    /// Letters moved back, to recognise a copy of one received again (a
    /// standard queue delivers at least once).
    moved: HashSet<MessageId>,
    /// FIFO groups with a held letter: the letters behind it stay too, as
    /// moving them would put them back ahead of it.
    blocked: HashSet<String>,
    /// Letters seen (moved or held), against the run's budget.
    seen: u64,
}

impl SqsTransport {
    fn dlq(&self, queue: &str) -> Result<(SqsQueue, String), TransportError> {
        let q = self.queue(queue)?;
        let dlq = q.dlq_url.clone().ok_or_else(|| {
            TransportError::Rejected(format!("queue `{queue}` has no dead-letter queue (declare `dlq = \"...\"`)"))
        })?;
        Ok((q, dlq))
    }

    /// Receives up to 10 messages of the DLQ, reserving them.
    async fn reserve(&self, dlq_url: &str, max: usize) -> Result<Vec<Delivery>, TransportError> {
        let request = self
            .client
            .receive_message()
            .queue_url(dlq_url)
            .max_number_of_messages(max.clamp(1, MAX_BATCH) as i32)
            .wait_time_seconds(WAIT.as_secs() as i32)
            .visibility_timeout(RESERVE.as_secs() as i32)
            .message_system_attribute_names(MessageSystemAttributeName::ApproximateReceiveCount)
            .message_system_attribute_names(MessageSystemAttributeName::MessageGroupId)
            .message_system_attribute_names(MessageSystemAttributeName::SentTimestamp)
            .message_attribute_names("All")
            .send();
        let what = "ReceiveMessage (dead letters)";
        let out = self.call(what, dlq_url, WAIT, request).await.map_err(|e| sdk(what, e))?;
        Ok(out.messages().iter().filter_map(delivery_of).collect())
    }

    /// Makes reserved messages visible again at once.
    async fn unreserve(&self, dlq_url: &str, deliveries: &[Delivery]) {
        for d in deliveries {
            let Ok(h) = handle(&d.receipt) else { continue };
            let request = self
                .client
                .change_message_visibility()
                .queue_url(dlq_url)
                .receipt_handle(h)
                .visibility_timeout(0)
                .send();
            let result = self.call("ChangeMessageVisibility", dlq_url, Duration::ZERO, request).await;
            if let Err(e) = result {
                tracing::warn!(
                    "could not make a dead letter visible again ({}); it will be in {RESERVE:?}",
                    sdk("ChangeMessageVisibility", e)
                );
            }
        }
    }

    async fn delete(&self, url: &str, d: &Delivery) -> Result<(), TransportError> {
        let request = self.client.delete_message().queue_url(url).receipt_handle(handle(&d.receipt)?).send();
        self.call("DeleteMessage", url, Duration::ZERO, request).await.map_err(|e| sdk("DeleteMessage", e))?;
        Ok(())
    }

    /// Reserves dead letters into `held` until it has `max` of them or a
    /// receive brings none it did not hold already. On a FIFO DLQ that is the
    /// first letters of each group: the rest cannot be received while those are
    /// reserved.
    async fn reserve_up_to(&self, dlq_url: &str, max: usize, held: &mut Held) -> Result<(), TransportError> {
        while held.len() < max {
            let mut fresh = false;
            for d in self.reserve(dlq_url, max - held.len()).await? {
                fresh |= held.hold(d);
            }
            if !fresh {
                break;
            }
        }
        Ok(())
    }

    /// Republishes a dead letter to its source queue, then deletes it from the
    /// DLQ: it is never in neither queue.
    async fn move_back(&self, q: &SqsQueue, dlq_url: &str, d: &Delivery) -> Result<(), TransportError> {
        let mut attributes = (*d.attributes).clone();
        attributes.remove(REASON);
        let group_id =
            d.group_id.clone().or_else(|| q.spec.fifo.then(|| q.spec.default_group.map(str::to_owned)).flatten());
        let outgoing = Outgoing {
            body: d.body.clone(),
            group_id,
            dedup_id: Some(format!("redrive-{}", MessageId::random())),
            attributes,
            ..Outgoing::default()
        };
        Self::check(q, &outgoing)?;
        let entry = Self::entry(0, &q.spec, &outgoing)?;
        for (_, sent) in self.send_chunk(&q.url, vec![(0, entry)]).await {
            sent?;
        }
        // Sent: from here on the letter counts as moved. A delete that fails
        // twice leaves a copy in the DLQ (said, and deleted if this run sees
        // it again) rather than a letter reported as left while it is back
        // in its queue.
        if self.delete(dlq_url, d).await.is_err() {
            if let Err(e) = self.delete(dlq_url, d).await {
                tracing::warn!(
                    queue = q.spec.name,
                    message_id = %d.message_id,
                    "a redriven dead letter is back in its queue, but its copy in the dead-letter queue could not be deleted: {e}"
                );
            }
        }
        Ok(())
    }

    /// The rounds of a redrive: receive, move back what may go (deleting it,
    /// which on a FIFO DLQ unlocks its group), hold the rest, and receive again
    /// until a receive brings no letter the run has not seen.
    async fn redrive_rounds(
        &self,
        q: &SqsQueue,
        dlq_url: &str,
        options: &RedriveOptions,
        run: &mut Run,
    ) -> Result<(), TransportError> {
        let max = options.max.unwrap_or(usize::MAX);
        // Letters moved back may fail again and return to the DLQ while the
        // run goes on, each time as a letter it has not seen: with a worker
        // running, a poison message would go round forever. The budget ends the
        // run; it is generous because the depth SQS reports is approximate, and
        // stopping short would leave letters behind.
        self.count();
        let budget = super::declare::depth(&self.client, dlq_url).await?.saturating_mul(2).saturating_add(100);
        while run.outcome.moved < max {
            if run.seen >= budget {
                tracing::warn!(
                    queue = q.spec.name,
                    "redrive stopped after {} dead letters, twice as many as the dead-letter queue held when it \
                     began: letters moved back are failing and returning to it",
                    run.seen
                );
                break;
            }
            let mut fresh = false;
            for d in self.reserve(dlq_url, max - run.outcome.moved).await? {
                if run.held.contains(&d.message_id) {
                    run.held.hold(d);
                    continue;
                }
                if run.moved.contains(&d.message_id) {
                    // A copy of a letter already moved back: delete it, or
                    // the letter would be in both queues.
                    if let Err(e) = self.delete(dlq_url, &d).await {
                        tracing::warn!(
                            queue = q.spec.name,
                            message_id = %d.message_id,
                            "a copy of a redriven dead letter stays in the dead-letter queue: {e}"
                        );
                    }
                    continue;
                }
                fresh = true;
                run.seen += 1;
                if run.outcome.moved >= max {
                    // Beyond the limit: left as it is, and not counted as skipped.
                    run.held.hold(d);
                    continue;
                }
                let group = d.group_id.clone().filter(|_| q.spec.fifo);
                let behind = group.as_ref().is_some_and(|g| run.blocked.contains(g));
                if !behind && options.filter.as_ref().is_none_or(|f| f(&letter_of(&d))) {
                    match self.move_back(q, dlq_url, &d).await {
                        Ok(()) => {
                            run.outcome.moved += 1;
                            run.moved.insert(d.message_id.clone());
                            continue;
                        }
                        Err(e) => {
                            tracing::warn!(
                                queue = q.spec.name,
                                message_id = %d.message_id,
                                "cannot redrive a dead letter: {e}"
                            );
                        }
                    }
                }
                // Left: not chosen by the filter, behind a held letter of its
                // FIFO group, or not moved.
                run.outcome.skipped += 1;
                if let Some(g) = group {
                    run.blocked.insert(g);
                }
                run.held.hold(d);
            }
            if !fresh {
                break;
            }
        }
        Ok(())
    }
}

fn letter_of(d: &Delivery) -> DeadLetter {
    DeadLetter {
        message_id: d.message_id.clone(),
        body: d.body.clone(),
        group_id: d.group_id.clone(),
        attributes: Arc::clone(&d.attributes),
        receive_count: d.receive_count,
        reason: d.attributes.get(REASON).cloned(),
        history: Vec::new(),
    }
}

impl DeadLetters for SqsTransport {
    fn dead_letter<'a>(
        &'a self,
        queue: &'a str,
        delivery: &'a Delivery,
        failure: FailedAttempt,
    ) -> BoxFuture<'a, Result<(), TransportError>> {
        Box::pin(async move {
            let reason = failure.reason();
            let (q, dlq_url) = self.dlq(queue)?;
            let mut attributes = (*delivery.attributes).clone();
            attributes.remove(REASON);
            // The reason travels as an attribute when it fits: SQS takes 10
            // attributes (a message may have them all: 8 of ours and the trace
            // context, or another producer's) and the DLQ's size limit counts
            // attributes too. Otherwise the reason is logged instead.
            let base = Self::size_of(&delivery.body, &attributes);
            let room = q.dlq_max_message_bytes.saturating_sub(base + REASON.len() + "String".len());
            let reason = super::text::attribute_value(if reason.is_empty() { "unknown" } else { &reason }).into_owned();
            let fitted = fit(&reason, room);
            if attributes.len() < super::text::MAX_ATTRIBUTES && !fitted.is_empty() {
                attributes.insert(REASON.into(), fitted.to_owned());
            } else {
                tracing::warn!(queue, message_id = %delivery.message_id, %reason, "dead-lettered without its reason attribute: no room for it in the message");
            }
            // The letter keeps its id (SQS gives the copy in the DLQ a new
            // one), so that `show`, the console and a redrive name it as the
            // logs did: where an attribute is left and the size allows.
            let id_attribute = crate::transport::MESSAGE_ID_ATTRIBUTE;
            let carries_id = attributes.len() < super::text::MAX_ATTRIBUTES && !attributes.contains_key(id_attribute);
            if carries_id {
                attributes.insert(id_attribute.into(), delivery.message_id.to_string());
            }
            let mut outgoing = Outgoing {
                body: delivery.body.clone(),
                group_id: delivery.group_id.clone(),
                dedup_id: Some(delivery.message_id.to_string()),
                attributes,
                ..Outgoing::default()
            };
            if carries_id && Self::size(&outgoing) > q.dlq_max_message_bytes {
                outgoing.attributes.remove(id_attribute);
            }
            let size = Self::size(&outgoing);
            if size > q.dlq_max_message_bytes {
                return Err(TransportError::Rejected(format!(
                    "the message is {size} bytes; the dead-letter queue of `{queue}` accepts at most {} (its MaximumMessageSize)",
                    q.dlq_max_message_bytes
                )));
            }
            let entry = Self::entry(0, &q.spec, &outgoing)?;
            // Republish to the DLQ first, then delete: the message is never in neither queue.
            let sent = self.send_chunk(&dlq_url, vec![(0, entry)]).await;
            for (_, result) in sent {
                result?;
            }
            self.delete(&q.url, delivery).await
        })
    }

    /// Up to `max` letters, in receive order, left in the DLQ. On a FIFO DLQ
    /// these are the first letters of each group only: the others cannot be
    /// received without deleting the ones before them.
    fn peek<'a>(&'a self, queue: &'a str, max: usize) -> BoxFuture<'a, Result<Vec<DeadLetter>, TransportError>> {
        Box::pin(async move {
            let (_, dlq_url) = self.dlq(queue)?;
            let mut held = Held::default();
            let looked = self.reserve_up_to(&dlq_url, max, &mut held).await;
            // Whatever happened, nothing stays reserved.
            self.unreserve(&dlq_url, &held.letters).await;
            looked?;
            Ok(held.letters.iter().take(max).map(letter_of).collect())
        })
    }

    /// Moves letters back in rounds until a receive brings none the run has
    /// not seen. `skipped` counts the letters seen and left (other than those
    /// beyond `max`): those the filter refused, those that could not be moved,
    /// and, on a FIFO DLQ, those behind either in their group, which stay so
    /// that the group's order holds. Letters further behind in such a group are
    /// not seen at all; the DLQ's depth afterwards tells how many were left.
    fn redrive<'a>(
        &'a self,
        queue: &'a str,
        options: RedriveOptions,
    ) -> BoxFuture<'a, Result<RedriveOutcome, TransportError>> {
        Box::pin(async move {
            if options.dry_run {
                // Counting would receive every letter (and hide them while
                // it does); `depth` gives the total without a filter.
                return Err(TransportError::Unsupported(format!(
                    "a dry run of a redrive of `{queue}` is not supported on SQS; `dlq peek` shows the letters"
                )));
            }
            let (q, dlq_url) = self.dlq(queue)?;
            let mut run = Run::default();
            let result = self.redrive_rounds(&q, &dlq_url, &options, &mut run).await;
            // Whatever happened, the letters left are visible again.
            self.unreserve(&dlq_url, &run.held.letters).await;
            result.map(|()| run.outcome)
        })
    }

    fn depth<'a>(&'a self, queue: &'a str) -> BoxFuture<'a, Result<u64, TransportError>> {
        Box::pin(async move {
            let (_, dlq_url) = self.dlq(queue)?;
            self.count();
            super::declare::depth(&self.client, &dlq_url).await
        })
    }
}

/// The longest prefix of `text` of at most `bytes` bytes and 1,000
/// characters, cut at a character boundary.
fn fit(text: &str, bytes: usize) -> &str {
    let mut end = 0;
    for (count, (at, c)) in text.char_indices().enumerate() {
        if count == 1_000 || at + c.len_utf8() > bytes {
            break;
        }
        end = at + c.len_utf8();
    }
    &text[..end]
}

#[cfg(test)]
mod tests {
    use super::fit;

    #[test]
    fn a_reason_is_cut_to_fit_at_a_character_boundary() {
        assert_eq!(fit("héllo", 3), "hé");
        assert_eq!(fit("héllo", 2), "h");
        assert_eq!(fit("héllo", 0), "");
        assert_eq!(fit(&"x".repeat(5_000), 10_000).len(), 1_000);
    }
}
