//! Dead letters on SQS: moving a message to its DLQ, peeking without losing
//! anything, redriving (republish first, then delete), depth.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use aws_sdk_sqs::types::MessageSystemAttributeName;

use super::{delivery_of, handle, sdk, SqsTransport, MAX_BATCH};
use crate::error::TransportError;
use crate::transport::{
    BoxFuture, DeadLetter, DeadLetters, Delivery, MessageId, Outgoing, RedriveOptions, RedriveOutcome,
};

/// How long messages stay reserved while a peek or redrive looks at them.
const RESERVE: Duration = Duration::from_secs(30);
/// The attribute carrying why a message was dead-lettered.
const REASON: &str = "messaging.dead_letter_reason";

impl SqsTransport {
    fn dlq(&self, queue: &str) -> Result<(super::SqsQueue, String), TransportError> {
        let q = self.queue(queue)?;
        let dlq = q.dlq_url.clone().ok_or_else(|| {
            TransportError::Rejected(format!("queue `{queue}` has no dead-letter queue (declare `dlq = \"...\"`)"))
        })?;
        Ok((q, dlq))
    }

    /// Receives up to 10 messages of the DLQ, reserving them.
    async fn reserve(&self, dlq_url: &str, max: usize) -> Result<Vec<Delivery>, TransportError> {
        self.count();
        let out = self
            .client
            .receive_message()
            .queue_url(dlq_url)
            .max_number_of_messages(max.clamp(1, MAX_BATCH) as i32)
            .wait_time_seconds(0)
            .visibility_timeout(RESERVE.as_secs() as i32)
            .message_system_attribute_names(MessageSystemAttributeName::ApproximateReceiveCount)
            .message_system_attribute_names(MessageSystemAttributeName::MessageGroupId)
            .message_system_attribute_names(MessageSystemAttributeName::SentTimestamp)
            .message_attribute_names("All")
            .send()
            .await
            .map_err(|e| sdk("ReceiveMessage (dead letters)", e))?;
        Ok(out.messages().iter().filter_map(delivery_of).collect())
    }

    /// Makes reserved messages visible again at once.
    async fn unreserve(&self, dlq_url: &str, deliveries: &[Delivery]) {
        for d in deliveries {
            let Ok(h) = handle(&d.receipt) else { continue };
            self.count();
            let result = self
                .client
                .change_message_visibility()
                .queue_url(dlq_url)
                .receipt_handle(h)
                .visibility_timeout(0)
                .send()
                .await;
            if let Err(e) = result {
                tracing::warn!(
                    "could not make a dead letter visible again ({}); it will be in {RESERVE:?}",
                    sdk("ChangeMessageVisibility", e)
                );
            }
        }
    }

    async fn delete(&self, url: &str, d: &Delivery) -> Result<(), TransportError> {
        self.count();
        self.client
            .delete_message()
            .queue_url(url)
            .receipt_handle(handle(&d.receipt)?)
            .send()
            .await
            .map_err(|e| sdk("DeleteMessage", e))?;
        Ok(())
    }

    /// Reserves every dead letter (up to `max`), in receive order, each once.
    async fn reserve_all(&self, dlq_url: &str, max: usize) -> Result<Vec<Delivery>, TransportError> {
        let mut seen = HashSet::new();
        let mut all = Vec::new();
        while all.len() < max {
            let batch = self.reserve(dlq_url, max - all.len()).await?;
            if batch.is_empty() {
                break;
            }
            for d in batch {
                if seen.insert(d.message_id.clone()) {
                    all.push(d);
                }
            }
        }
        Ok(all)
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
    }
}

impl DeadLetters for SqsTransport {
    fn dead_letter<'a>(
        &'a self,
        queue: &'a str,
        delivery: &'a Delivery,
        reason: String,
    ) -> BoxFuture<'a, Result<(), TransportError>> {
        Box::pin(async move {
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
            let outgoing = Outgoing {
                body: delivery.body.clone(),
                group_id: delivery.group_id.clone(),
                dedup_id: Some(delivery.message_id.to_string()),
                attributes,
                ..Outgoing::default()
            };
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

    fn peek<'a>(&'a self, queue: &'a str, max: usize) -> BoxFuture<'a, Result<Vec<DeadLetter>, TransportError>> {
        Box::pin(async move {
            let (_, dlq_url) = self.dlq(queue)?;
            let reserved = self.reserve_all(&dlq_url, max).await?;
            let letters = reserved.iter().map(letter_of).collect();
            self.unreserve(&dlq_url, &reserved).await;
            Ok(letters)
        })
    }

    fn redrive<'a>(
        &'a self,
        queue: &'a str,
        options: RedriveOptions,
    ) -> BoxFuture<'a, Result<RedriveOutcome, TransportError>> {
        Box::pin(async move {
            let (q, dlq_url) = self.dlq(queue)?;
            let max = options.max.unwrap_or(usize::MAX);
            let reserved = self.reserve_all(&dlq_url, usize::MAX).await?;
            let mut outcome = RedriveOutcome::default();
            let mut left = Vec::new();
            for d in reserved {
                let letter = letter_of(&d);
                if outcome.moved >= max || !options.filter.as_ref().is_none_or(|f| f(&letter)) {
                    if outcome.moved < max {
                        outcome.skipped += 1;
                    }
                    left.push(d);
                    continue;
                }
                let mut attributes = (*d.attributes).clone();
                attributes.remove(REASON);
                let group_id = d
                    .group_id
                    .clone()
                    .or_else(|| q.spec.fifo.then(|| q.spec.default_group.map(str::to_owned)).flatten());
                let outgoing = Outgoing {
                    body: d.body.clone(),
                    group_id,
                    dedup_id: Some(format!("redrive-{}", MessageId::random())),
                    attributes,
                    ..Outgoing::default()
                };
                // Republish first, then delete from the DLQ.
                let entry = Self::check(&q, &outgoing).and_then(|_| Self::entry(0, &q.spec, &outgoing));
                let sent = match entry {
                    Ok(entry) => self.send_chunk(&q.url, vec![(0, entry)]).await.into_iter().all(|(_, r)| r.is_ok()),
                    Err(e) => {
                        tracing::warn!(queue, "cannot redrive a dead letter: {e}");
                        false
                    }
                };
                if sent && self.delete(&dlq_url, &d).await.is_ok() {
                    outcome.moved += 1;
                } else {
                    left.push(d);
                }
            }
            self.unreserve(&dlq_url, &left).await;
            Ok(outcome)
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
