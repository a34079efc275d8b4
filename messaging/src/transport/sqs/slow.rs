//! Calls to SQS that take long to answer, said while they wait.
//!
//! The SDK gives an attempt 25 s (a receive's long poll lasts up to 20 s)
//! and then tries again on its own, so a hung endpoint held a publish or an
//! acknowledgement for a minute or more without a word: tried from outside
//! by stopping the SQS server (`SIGSTOP`) for 30 s under a publisher and a
//! consumer, nothing was lost, and nothing was logged either.

use std::collections::HashMap;
use std::future::Future;
use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

use crate::throttle::Throttle;

/// How long a call other than a receive may go unanswered before it is
/// said to be slow: SQS answers in tens of milliseconds.
pub(super) const SLOW_CALL: Duration = Duration::from_secs(5);

/// How long after a slow call of an action on a queue is said at WARN the
/// next ones of that action on that queue are only counted (and said at
/// DEBUG): a publisher sending a hundred messages a second into a hung
/// endpoint said each of them twice, and the first line is what matters.
const SAY_EVERY: Duration = Duration::from_secs(30);

/// An action and the queue it was called on.
type Call = (String, String);

/// When each call says it is slow at WARN, and how many slow calls it has
/// held back since it last did.
static SAID: Mutex<Option<HashMap<Call, (Throttle, u32)>>> = Mutex::new(None);

/// Whether a slow call of `what` on `queue` is said at WARN now: `Some`
/// with the slow calls held back since the last one said, or `None` (it is
/// held back and counted).
fn say(what: &str, queue: &str) -> Option<u32> {
    let mut said = SAID.lock().unwrap_or_else(|p| p.into_inner());
    let (throttle, held) =
        said.get_or_insert_with(HashMap::new).entry((what.to_owned(), queue.to_owned())).or_default();
    if throttle.due(SAY_EVERY, false) {
        Some(std::mem::take(held))
    } else {
        *held += 1;
        None
    }
}

/// Awaits `call`, the SQS action `what` on `queue` (its URL, or its name
/// while it is looked up); once it has waited `slow_after` without an
/// answer, says so at WARN, and at INFO when the answer comes, at most once
/// every [`SAY_EVERY`] for an action on a queue (the others at DEBUG, and
/// counted in the next WARN). The call itself is neither cut short nor
/// retried here.
pub(super) async fn answered<T>(what: &str, queue: &str, slow_after: Duration, call: impl Future<Output = T>) -> T {
    let started = Instant::now();
    tokio::pin!(call);
    tokio::select! {
        answer = &mut call => return answer,
        () = tokio::time::sleep(slow_after) => {}
    }
    let waited = slow_after.as_secs_f32();
    let said = say(what, queue);
    match said {
        Some(0) => tracing::warn!(
            queue,
            "sqs: {what} has had no answer for {waited:.0} s; SQS is unreachable or slow (the SDK gives each \
             attempt 25 s and tries again)"
        ),
        Some(held) => tracing::warn!(
            queue,
            "sqs: {what} has had no answer for {waited:.0} s, and {held} more such call(s) since the last warning; \
             SQS is unreachable or slow (the SDK gives each attempt 25 s and tries again)"
        ),
        None => tracing::debug!(queue, "sqs: {what} has had no answer for {waited:.0} s"),
    }
    let answer = call.await;
    let took = started.elapsed().as_secs_f32();
    if said.is_some() {
        tracing::info!(queue, "sqs: {what} answered after {took:.1} s");
    } else {
        tracing::debug!(queue, "sqs: {what} answered after {took:.1} s");
    }
    answer
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::printed::Printed;

    fn logged(printed: &Printed) -> tracing::subscriber::DefaultGuard {
        tracing::subscriber::set_default(printed.subscriber().finish())
    }

    #[tokio::test(start_paused = true)]
    async fn a_call_answered_in_time_says_nothing() {
        let lines = Printed::default();
        let _guard = logged(&lines);
        let answer = answered("SendMessage", "http://sqs/q", SLOW_CALL, async {
            tokio::time::sleep(Duration::from_millis(4_900)).await;
            7
        });
        assert_eq!(answer.await, 7);
        assert_eq!(lines.text(), "");
    }

    #[tokio::test(start_paused = true)]
    async fn a_call_that_hangs_is_said_once_and_again_when_it_answers() {
        let lines = Printed::default();
        let _guard = logged(&lines);
        let started = Instant::now();
        let answer = answered("DeleteMessageBatch", "http://sqs/q", SLOW_CALL, async {
            tokio::time::sleep(Duration::from_secs(32)).await;
            "done"
        });
        assert_eq!(answer.await, "done");
        assert_eq!(started.elapsed(), Duration::from_secs(32), "the call is not cut short");
        let text = lines.text();
        assert_eq!(text.lines().count(), 2, "{text}");
        assert!(text.contains("WARN") && text.contains("sqs: DeleteMessageBatch has had no answer for 5 s"), "{text}");
        assert!(text.contains("queue=\"http://sqs/q\""), "{text}");
        assert!(text.contains("INFO") && text.contains("sqs: DeleteMessageBatch answered after 32.0 s"), "{text}");
    }

    #[tokio::test(start_paused = true)]
    async fn many_slow_calls_are_said_once_every_half_minute_with_a_count() {
        let lines = Printed::default();
        let _guard = logged(&lines);
        let slow = || async {
            tokio::time::sleep(Duration::from_secs(6)).await;
        };
        // Ten slow sends at once, then ten more 40 s later.
        let sends = (0..10).map(|_| answered("SendMessage", "http://sqs/many", SLOW_CALL, slow()));
        futures_util::future::join_all(sends).await;
        tokio::time::sleep(Duration::from_secs(40)).await;
        let sends = (0..10).map(|_| answered("SendMessage", "http://sqs/many", SLOW_CALL, slow()));
        futures_util::future::join_all(sends).await;
        let text = lines.text();
        let warnings: Vec<&str> = text.lines().filter(|l| l.contains("WARN")).collect();
        assert_eq!(warnings.len(), 2, "{text}");
        assert!(warnings[0].contains("no answer for 5 s; SQS"), "{text}");
        assert!(warnings[1].contains("and 9 more such call(s) since the last warning"), "{text}");
        assert_eq!(text.lines().filter(|l| l.contains("INFO")).count(), 2, "{text}");
    }
}
