//! A long command (a redrive or purge of many dead letters) stopped by a
//! shutdown signal: it stops taking letters at once, finishes what it is
//! writing, and says where it stands.

use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

/// How long a command may go on after a shutdown signal to end by itself
/// (the page it is writing, and looking at the rest without taking any).
pub(super) const AFTER_SIGNAL: Duration = Duration::from_secs(2);

/// How a command run by [`until_signal`] ended.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Ended<T> {
    /// On its own, with no signal.
    Done(T),
    /// After a signal: with what it ended with, or `None` when it was cut
    /// off (it did not end within the grace period, or a second signal came).
    Interrupted(Option<T>),
}

/// Runs `work` until it ends or `signal()` comes. A letter taken after the
/// signal would be taken against the operator's wish, so `gate` is set
/// then (the command's filter refuses every letter from then on) and `work`
/// has `grace` to end by itself; a second signal cuts it off at once.
/// Cutting off is safe on the database queues (each page is a transaction,
/// rolled back when dropped) and `memory://`; on SQS a move in flight could
/// leave a letter in both queues, which is why the gate comes first.
pub(super) async fn until_signal<T, S: Future<Output = ()>>(
    work: impl Future<Output = T>,
    mut signal: impl FnMut() -> S,
    gate: &AtomicBool,
    grace: Duration,
) -> Ended<T> {
    let mut work = std::pin::pin!(work);
    tokio::select! {
        done = &mut work => return Ended::Done(done),
        () = signal() => {}
    }
    gate.store(true, Ordering::SeqCst);
    tokio::select! {
        done = &mut work => Ended::Interrupted(Some(done)),
        () = tokio::time::sleep(grace) => Ended::Interrupted(None),
        () = signal() => Ended::Interrupted(None),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;

    /// A command of `steps` steps 10 ms apart, each taken only while `gate`
    /// is open (a closed one ends it, as a redrive ends once it has looked
    /// at the rest); returns how many it took.
    async fn steps(steps: usize, gate: &AtomicBool, taken: &AtomicUsize) -> usize {
        for _ in 0..steps {
            tokio::time::sleep(Duration::from_millis(10)).await;
            if gate.load(Ordering::SeqCst) {
                break;
            }
            taken.fetch_add(1, Ordering::SeqCst);
        }
        taken.load(Ordering::SeqCst)
    }

    #[tokio::test(start_paused = true)]
    async fn without_a_signal_the_command_ends_on_its_own() {
        let (gate, taken) = (AtomicBool::new(false), AtomicUsize::new(0));
        let ended = until_signal(steps(5, &gate, &taken), std::future::pending, &gate, AFTER_SIGNAL).await;
        assert_eq!(ended, Ended::Done(5));
        assert!(!gate.load(Ordering::SeqCst));
    }

    #[tokio::test(start_paused = true)]
    async fn after_a_signal_nothing_more_is_taken_and_the_command_ends_with_what_it_took() {
        let (gate, taken) = (AtomicBool::new(false), AtomicUsize::new(0));
        let signal = || tokio::time::sleep(Duration::from_millis(35));
        let ended = until_signal(steps(100, &gate, &taken), signal, &gate, AFTER_SIGNAL).await;
        assert_eq!(ended, Ended::Interrupted(Some(3)), "three steps before the signal, none after");
    }

    #[tokio::test(start_paused = true)]
    async fn a_command_that_does_not_end_is_cut_off_after_the_grace_period() {
        let gate = AtomicBool::new(false);
        let signal = || tokio::time::sleep(Duration::from_millis(10));
        let started = tokio::time::Instant::now();
        let ended = until_signal(std::future::pending::<()>(), signal, &gate, Duration::from_secs(2)).await;
        assert_eq!(ended, Ended::Interrupted(None));
        // The second "signal" (10 ms later) cuts it off before the grace ends.
        assert!(started.elapsed() < Duration::from_millis(100), "{:?}", started.elapsed());
        assert!(gate.load(Ordering::SeqCst));
        let gate = AtomicBool::new(false);
        let once = {
            let mut first = true;
            move || {
                let wait = if std::mem::take(&mut first) { 10 } else { 1_000_000 };
                tokio::time::sleep(Duration::from_millis(wait))
            }
        };
        let started = tokio::time::Instant::now();
        let ended = until_signal(std::future::pending::<()>(), once, &gate, Duration::from_secs(2)).await;
        assert_eq!(ended, Ended::Interrupted(None));
        let waited = started.elapsed();
        assert!(waited >= Duration::from_secs(2) && waited < Duration::from_secs(3), "{waited:?}");
    }
}
