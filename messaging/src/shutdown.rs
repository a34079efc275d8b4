//! A shutdown signal shared by the app's tasks.

use tokio::sync::watch;

/// Triggers a graceful shutdown: workers stop receiving, finish in-flight
/// messages within the grace period, release the rest and flush acks.
#[derive(Debug, Clone)]
pub struct Shutdown {
    tx: std::sync::Arc<watch::Sender<bool>>,
}

impl Default for Shutdown {
    fn default() -> Self {
        Self::new()
    }
}

impl Shutdown {
    /// A signal not yet triggered.
    pub fn new() -> Self {
        Shutdown { tx: std::sync::Arc::new(watch::channel(false).0) }
    }

    /// Triggers the shutdown (idempotent).
    pub fn trigger(&self) {
        self.tx.send_replace(true);
    }

    /// Whether it was triggered.
    pub fn is_triggered(&self) -> bool {
        *self.tx.borrow()
    }

    /// Completes once triggered.
    pub async fn wait(&self) {
        let mut rx = self.tx.subscribe();
        // `wait_for` only fails when the sender is gone, and we hold it.
        let _ = rx.wait_for(|v| *v).await;
    }
}
