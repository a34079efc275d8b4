//! The deliveries a worker holds (received, not yet settled), and the
//! heartbeat that keeps them invisible while they wait or run.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;

use crate::transport::{Receipt, Transport};

/// Received-but-unsettled deliveries, with when their visibility was last set.
#[derive(Debug, Default)]
pub(crate) struct InFlight {
    held: Mutex<HashMap<Receipt, Instant>>,
}

impl InFlight {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<Receipt, Instant>> {
        self.held.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(crate) fn hold_all<'a>(&self, receipts: impl Iterator<Item = &'a Receipt>) {
        let now = Instant::now();
        let mut held = self.lock();
        for r in receipts {
            held.insert(r.clone(), now);
        }
    }

    /// Forgets a delivery; returns whether it was still held.
    pub(crate) fn settle(&self, receipt: &Receipt) -> bool {
        self.lock().remove(receipt).is_some()
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.lock().is_empty()
    }

    /// Takes every delivery still held (at shutdown, to release them).
    pub(crate) fn take_all(&self) -> Vec<Receipt> {
        self.lock().drain().map(|(r, _)| r).collect()
    }

    /// Extends the visibility of deliveries held for a third of the visibility
    /// timeout or longer, until the task is aborted.
    pub(crate) async fn heartbeat(self: Arc<Self>, transport: Arc<dyn Transport>, queue: &'static str, visibility: Duration) {
        let period = (visibility / 3).max(Duration::from_millis(50));
        let mut tick = tokio::time::interval(period);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            let now = Instant::now();
            let due: Vec<Receipt> = self
                .lock()
                .iter()
                .filter(|(_, at)| now.duration_since(**at) >= period)
                .map(|(r, _)| r.clone())
                .collect();
            for receipt in due {
                match transport.extend(queue, &receipt, visibility).await {
                    Ok(()) => {
                        if let Some(at) = self.lock().get_mut(&receipt) {
                            *at = Instant::now();
                        }
                    }
                    Err(crate::error::TransportError::StaleReceipt) => {
                        // Settled meanwhile, or its visibility ran out before we got to it.
                        self.settle(&receipt);
                    }
                    Err(e) => tracing::warn!(queue, "could not extend a message's visibility: {e}"),
                }
            }
        }
    }
}
