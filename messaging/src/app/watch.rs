//! The app's observers: tasks that read what its queues and outbox hold,
//! every so often, for the gauges, until the app stops (aborted).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::boxed::BoxFuture;
use crate::error::TransportError;
use crate::telemetry::{DlqGauge, OutboxGauge, QueueGauges};
use crate::transport::{Outbox, Transport};

/// Runs its function when dropped. An observer is aborted when its app
/// stops, and what it observed must go with it: the SDK calls a gauge's
/// callback for as long as the meter provider lives (dropping the
/// instrument does not unregister it), so a stopped app's queues went on
/// being reported at their last numbers, and an age kept growing.
struct Forget<F: FnMut()>(F);

impl<F: FnMut()> Drop for Forget<F> {
    fn drop(&mut self) {
        (self.0)();
    }
}

/// Observes the outbox every `every`, for its gauges, until aborted.
pub(super) async fn watch_outbox(outbox: Outbox, gauge: OutboxGauge, every: Duration) {
    let _forget = Forget(|| gauge.rows.lock().unwrap_or_else(|p| p.into_inner()).clear());
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        match outbox.stats().await {
            Ok(rows) => *gauge.rows.lock().unwrap_or_else(|p| p.into_inner()) = rows,
            Err(e) => tracing::debug!("outbox gauges unavailable: {e}"),
        }
    }
}

/// Observes the dead-letter depth of every queue every `every`, for the
/// `messaging.dlq.depth` gauge, until aborted. Queues without dead letters
/// (or whose depth cannot be read) are left out.
pub(super) async fn watch_dead_letters(
    transport: Arc<dyn Transport>,
    queues: Vec<&'static str>,
    gauge: DlqGauge,
    every: Duration,
) {
    let Some(dead_letters) = transport.dead_letters() else { return };
    let read = |queue| dead_letters.depth(queue);
    watch_each(transport.system(), &queues, every, &gauge.depths, "dead-letter depth", read).await;
}

/// Observes what every queue of `queues` holds every `every`, for the queue
/// gauges ([`Setup::queue_gauges`](crate::Setup::queue_gauges)), until
/// aborted.
pub(super) async fn watch_queues(
    transport: Arc<dyn Transport>,
    queues: Vec<&'static str>,
    gauges: QueueGauges,
    every: Duration,
) {
    let read = |queue| transport.counts(queue);
    watch_each(transport.system(), &queues, every, &gauges.observed, "queue counts", read).await;
}

/// Reads `what` of every queue of `queues` every `every` into `observed`,
/// until aborted, and then removes them. A queue whose read fails is left
/// out until one succeeds: its gauge goes quiet rather than showing the
/// last numbers as if they were still true.
async fn watch_each<'t, T>(
    system: &'static str,
    queues: &[&'static str],
    every: Duration,
    observed: &Mutex<BTreeMap<(&'static str, &'static str), T>>,
    what: &str,
    read: impl Fn(&'static str) -> BoxFuture<'t, Result<T, TransportError>>,
) {
    let _forget = Forget(|| {
        let mut observed = observed.lock().unwrap_or_else(|p| p.into_inner());
        for &queue in queues {
            observed.remove(&(system, queue));
        }
    });
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        for &queue in queues {
            let result = read(queue).await;
            let mut observed = observed.lock().unwrap_or_else(|p| p.into_inner());
            match result {
                Ok(value) => {
                    observed.insert((system, queue), value);
                }
                Err(e) => {
                    tracing::debug!(queue, "{what} unavailable: {e}");
                    observed.remove(&(system, queue));
                }
            }
        }
    }
}
