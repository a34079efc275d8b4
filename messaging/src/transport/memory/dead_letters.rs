//! Dead-letter operations of the in-memory transport.

use std::time::Duration;

use super::state::{Clock, QueueState, Stored};
use super::MemoryTransport;
use crate::boxed::BoxFuture;
use crate::error::TransportError;
use crate::transport::{
    DeadLetter, DeadLetters, Delivery, FailedAttempt, MessageId, Outgoing, PurgeOutcome, RedriveOptions, RedriveOutcome,
};

impl MemoryTransport {
    fn dlq_name(&self, queue: &str) -> Result<&'static str, TransportError> {
        let q = self.queue(queue)?;
        let dlq = q.lock().spec.dlq;
        dlq.ok_or_else(|| {
            TransportError::Rejected(format!("queue `{queue}` has no dead-letter queue (declare `dlq = \"...\"`)"))
        })
    }
}

impl DeadLetters for MemoryTransport {
    fn dead_letter<'a>(
        &'a self,
        queue: &'a str,
        delivery: &'a Delivery,
        failure: FailedAttempt,
    ) -> BoxFuture<'a, Result<(), TransportError>> {
        Box::pin(async move {
            let dlq = self.queue(self.dlq_name(queue)?)?;
            let source = self.queue(queue)?;
            let mut stored = source.lock().take_in_flight(&delivery.receipt)?;
            stored.failures_mut().reason = Some(failure.reason());
            failure.push_onto(&mut stored.failures_mut().history);
            dlq.lock().insert(stored, QueueState::visible());
            source.notify.notify_waiters();
            source.room.notify_waiters();
            Ok(())
        })
    }

    fn peek<'a>(&'a self, queue: &'a str, max: usize) -> BoxFuture<'a, Result<Vec<DeadLetter>, TransportError>> {
        Box::pin(async move {
            let dlq = self.queue(self.dlq_name(queue)?)?;
            let state = dlq.lock();
            Ok(state.iter_ordered().into_iter().take(max).map(|(_, m)| letter_of(m)).collect())
        })
    }

    fn redrive<'a>(
        &'a self,
        queue: &'a str,
        options: RedriveOptions,
    ) -> BoxFuture<'a, Result<RedriveOutcome, TransportError>> {
        Box::pin(async move {
            let dlq = self.queue(self.dlq_name(queue)?)?;
            let source = self.queue(queue)?;
            let mut dlq_state = dlq.lock();
            let (chosen, skipped) = choose(&dlq_state, &options);
            let outcome = RedriveOutcome { moved: chosen.len(), skipped };
            if options.dry_run {
                return Ok(outcome);
            }
            let mut source_state = source.lock();
            let default_group = source_state.spec.default_group;
            let fifo = source_state.spec.fifo;
            for key in chosen {
                // Republish first, then delete: a message is never in neither queue.
                let Some(letter) = dlq_state.remove(key) else { continue };
                let group_id =
                    letter.group.clone().or_else(|| fifo.then(|| default_group.map(str::to_owned)).flatten());
                let outgoing = Outgoing {
                    body: letter.body.clone(),
                    group_id,
                    dedup_id: None,
                    delay: None::<Duration>,
                    attributes: (*letter.attributes).clone(),
                    ..Outgoing::default()
                };
                if let Err(e) = source_state.send(outgoing, &mut Clock::default()) {
                    dlq_state.insert(letter, QueueState::visible());
                    return Err(e);
                }
            }
            drop(source_state);
            source.notify.notify_waiters();
            Ok(outcome)
        })
    }

    fn depth<'a>(&'a self, queue: &'a str) -> BoxFuture<'a, Result<u64, TransportError>> {
        Box::pin(async move { Ok(self.queue(self.dlq_name(queue)?)?.lock().len() as u64) })
    }

    fn delete<'a>(&'a self, queue: &'a str, ids: &'a [MessageId]) -> BoxFuture<'a, Result<usize, TransportError>> {
        Box::pin(async move {
            let dlq = self.queue(self.dlq_name(queue)?)?;
            let mut state = dlq.lock();
            let keys: Vec<u64> =
                state.iter_ordered().into_iter().filter(|(_, m)| ids.contains(&m.id)).map(|(key, _)| key).collect();
            Ok(keys.into_iter().filter(|&key| state.remove(key).is_some()).count())
        })
    }

    fn purge<'a>(
        &'a self,
        queue: &'a str,
        options: RedriveOptions,
    ) -> BoxFuture<'a, Result<PurgeOutcome, TransportError>> {
        Box::pin(async move {
            let dlq = self.queue(self.dlq_name(queue)?)?;
            let mut state = dlq.lock();
            let (chosen, skipped) = choose(&state, &options);
            if options.dry_run {
                return Ok(PurgeOutcome { deleted: chosen.len(), skipped });
            }
            let deleted = chosen.into_iter().filter(|&key| state.remove(key).is_some()).count();
            Ok(PurgeOutcome { deleted, skipped })
        })
    }
}

/// A stored message as a dead letter.
fn letter_of(m: &Stored) -> DeadLetter {
    DeadLetter {
        message_id: m.id.clone(),
        body: m.body.clone(),
        group_id: m.group.clone(),
        attributes: m.attributes.clone(),
        receive_count: m.receive_count,
        reason: m.reason().map(str::to_owned),
        history: m.history().to_vec(),
    }
}

/// The keys of the dead letters `options` choose, oldest first, and how many
/// the filter skipped.
fn choose(state: &QueueState, options: &RedriveOptions) -> (Vec<u64>, usize) {
    let max = options.max.unwrap_or(usize::MAX);
    let (mut chosen, mut skipped) = (Vec::new(), 0);
    for (key, m) in state.iter_ordered() {
        if chosen.len() >= max {
            break;
        }
        if options.filter.as_ref().is_none_or(|f| f(&letter_of(m))) {
            chosen.push(key);
        } else {
            skipped += 1;
        }
    }
    (chosen, skipped)
}
