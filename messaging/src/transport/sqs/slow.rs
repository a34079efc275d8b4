//! Calls to SQS that take long to answer, said while they wait.
//!
//! The SDK gives an attempt 25 s (a receive's long poll lasts up to 20 s)
//! and then tries again on its own, so a hung endpoint held a publish or an
//! acknowledgement for a minute or more without a word: tried from outside
//! by stopping the SQS server (`SIGSTOP`) for 30 s under a publisher and a
//! consumer, nothing was lost, and nothing was logged either.

use std::future::Future;
use std::time::Duration;

use tokio::time::Instant;

/// How long a call other than a receive may go unanswered before it is
/// said to be slow: SQS answers in tens of milliseconds.
pub(super) const SLOW_CALL: Duration = Duration::from_secs(5);

/// Awaits `call`, the SQS action `what` on `queue` (its URL, or its name
/// while it is looked up); once it has
/// waited `slow_after` without an answer, says so at WARN, and at INFO when
/// the answer comes. The call itself is neither cut short nor retried here.
pub(super) async fn answered<T>(what: &str, queue: &str, slow_after: Duration, call: impl Future<Output = T>) -> T {
    let started = Instant::now();
    tokio::pin!(call);
    tokio::select! {
        answer = &mut call => return answer,
        () = tokio::time::sleep(slow_after) => {}
    }
    tracing::warn!(
        queue,
        "sqs: {what} has had no answer for {:.0} s; SQS is unreachable or slow (the SDK gives each attempt 25 s \
         and tries again)",
        slow_after.as_secs_f32()
    );
    let answer = call.await;
    tracing::info!(queue, "sqs: {what} answered after {:.1} s", started.elapsed().as_secs_f32());
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
}
