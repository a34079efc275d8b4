//! What an operator changes and reads of a running process, per queue: the
//! pause switch of this process's workers ([`Pauses`]) and the counts of
//! messages they handled and failed ([`Counters`]). The console reads and sets
//! them; the workers honour and fill them.

// Without the console nothing sets a pause or reads a rate.
#![cfg_attr(not(feature = "console"), allow(dead_code))]

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::watch;

/// The pause switches of this process's workers, one per queue (off until
/// set). Cheap to clone; clones share the switches.
///
/// A paused worker finishes the receive it is in and what that returned,
/// then receives nothing until it is resumed. On database queues the console
/// pauses the queue in the database instead, for every process (see the
/// README's console section); this switch is what pauses a queue on
/// transports that keep no such flag (SQS, `memory://`).
#[derive(Debug, Clone, Default)]
pub(crate) struct Pauses {
    switches: Arc<Mutex<HashMap<String, watch::Sender<bool>>>>,
}

impl Pauses {
    fn switch(&self, queue: &str) -> watch::Sender<bool> {
        let mut switches = self.switches.lock().unwrap_or_else(|p| p.into_inner());
        switches.entry(queue.to_owned()).or_insert_with(|| watch::channel(false).0).clone()
    }

    /// Pauses (`true`) or resumes (`false`) this process's workers of `queue`.
    pub(crate) fn set(&self, queue: &str, paused: bool) {
        self.switch(queue).send_replace(paused);
    }

    /// Whether this process's workers of `queue` are paused.
    pub(crate) fn is_paused(&self, queue: &str) -> bool {
        *self.switch(queue).borrow()
    }

    /// The switch of `queue`, to watch: what a worker holds, so that its
    /// check before each receive takes no lock of the map.
    pub(crate) fn watch(&self, queue: &str) -> PauseWatch {
        PauseWatch(self.switch(queue).subscribe())
    }
}

/// One queue's pause switch, as its worker sees it.
#[derive(Debug, Clone)]
pub(crate) struct PauseWatch(watch::Receiver<bool>);

impl PauseWatch {
    /// Whether the queue is paused now.
    pub(crate) fn is_paused(&self) -> bool {
        *self.0.borrow()
    }

    /// Returns once the queue is not paused (at once when it is not).
    pub(crate) async fn resumed(&self) {
        let mut watching = self.0.clone();
        // An error means the sender is gone, which cannot happen while the
        // map holds it; either way there is nothing left to wait for.
        let _ = watching.wait_for(|paused| !paused).await;
    }
}

/// What this process's workers did with the messages of one queue.
#[derive(Debug, Default)]
pub(crate) struct QueueCounters {
    handled: AtomicU64,
    failed: AtomicU64,
}

impl QueueCounters {
    /// One message handled (acknowledged).
    pub(crate) fn handled(&self) {
        self.handled.fetch_add(1, Ordering::Relaxed);
    }

    /// One attempt failed (retried or dead-lettered).
    pub(crate) fn failed(&self) {
        self.failed.fetch_add(1, Ordering::Relaxed);
    }

    fn totals(&self) -> (u64, u64) {
        (self.handled.load(Ordering::Relaxed), self.failed.load(Ordering::Relaxed))
    }
}

/// The totals at one time: (when, handled, failed).
type Sample = (Instant, u64, u64);

/// How far back the rates look.
const RATE_WINDOW: Duration = Duration::from_secs(60);
/// How often a sample is kept (a read at most this often adds one).
const SAMPLE_EVERY: Duration = Duration::from_secs(5);

/// The counters of every queue of this process, and the rates read from them.
#[derive(Debug, Clone, Default)]
pub(crate) struct Counters {
    queues: Arc<Mutex<HashMap<String, Arc<QueueCounters>>>>,
    /// Samples of the totals, per queue, oldest first.
    samples: Arc<Mutex<HashMap<String, Vec<Sample>>>>,
}

/// A queue's counts since the process started, and the rates of the last
/// minute (per minute; `None` until the process has watched for a while).
#[derive(Debug, Clone, Copy, Default, PartialEq, serde::Serialize)]
pub(crate) struct Rates {
    pub(crate) handled_total: u64,
    pub(crate) failed_total: u64,
    pub(crate) handled_per_min: Option<f64>,
    pub(crate) failed_per_min: Option<f64>,
}

impl Counters {
    /// The counters of `queue` (made on first use).
    pub(crate) fn of(&self, queue: &str) -> Arc<QueueCounters> {
        let mut queues = self.queues.lock().unwrap_or_else(|p| p.into_inner());
        queues.entry(queue.to_owned()).or_default().clone()
    }

    /// The totals of `queue` and its rates over the last minute, measured
    /// from samples that reads like this one keep (one per five seconds).
    pub(crate) fn rates(&self, queue: &str) -> Rates {
        self.rates_at(queue, Instant::now())
    }

    fn rates_at(&self, queue: &str, now: Instant) -> Rates {
        let (handled, failed) = self.of(queue).totals();
        let mut samples = self.samples.lock().unwrap_or_else(|p| p.into_inner());
        let kept = samples.entry(queue.to_owned()).or_default();
        if kept.last().is_none_or(|&(at, _, _)| now.duration_since(at) >= SAMPLE_EVERY) {
            kept.push((now, handled, failed));
        }
        // Keep one sample older than the window, to measure the whole of it.
        while kept.len() > 2 && now.duration_since(kept[1].0) >= RATE_WINDOW {
            kept.remove(0);
        }
        let (at, h0, f0) = kept[0];
        let span = now.duration_since(at).as_secs_f64();
        let per_min = |delta: u64| (span >= 1.0).then(|| delta as f64 * 60.0 / span);
        Rates {
            handled_total: handled,
            failed_total: failed,
            handled_per_min: per_min(handled.saturating_sub(h0)),
            failed_per_min: per_min(failed.saturating_sub(f0)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_paused_queue_is_waited_for_until_resumed() {
        let pauses = Pauses::default();
        assert!(!pauses.is_paused("q"));
        let watch = pauses.watch("q");
        watch.resumed().await; // not paused: at once
        pauses.set("q", true);
        assert!(pauses.is_paused("q") && !pauses.is_paused("other") && watch.is_paused());
        let waiting = tokio::spawn(async move { watch.resumed().await });
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(!waiting.is_finished(), "a paused queue must hold its waiter");
        pauses.set("q", false);
        tokio::time::timeout(Duration::from_secs(1), waiting).await.expect("resumed").expect("task");
    }

    #[test]
    fn rates_are_measured_over_the_samples_of_the_last_minute() {
        let counters = Counters::default();
        let start = Instant::now();
        let first = counters.rates_at("q", start);
        assert_eq!((first.handled_total, first.handled_per_min), (0, None));
        for _ in 0..30 {
            counters.of("q").handled();
        }
        counters.of("q").failed();
        let later = counters.rates_at("q", start + Duration::from_secs(30));
        assert_eq!((later.handled_total, later.failed_total), (30, 1));
        assert_eq!(later.handled_per_min, Some(60.0));
        assert_eq!(later.failed_per_min, Some(2.0));
        // Two minutes on with nothing new: the old samples leave the window.
        counters.rates_at("q", start + Duration::from_secs(100));
        let idle = counters.rates_at("q", start + Duration::from_secs(170));
        assert_eq!(idle.handled_total, 30);
        assert_eq!(idle.handled_per_min, Some(0.0));
    }
}
