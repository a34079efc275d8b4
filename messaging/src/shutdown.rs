//! A shutdown signal shared by the app's tasks: graceful first, then, on
//! request, immediate.

use tokio::sync::watch;

/// Nothing asked yet.
const RUNNING: u8 = 0;
/// Stop receiving, let handlers finish within the grace period.
const GRACEFUL: u8 = 1;
/// Stop now: running handlers are stopped, their messages released.
const IMMEDIATE: u8 = 2;

/// Triggers a graceful shutdown: workers stop receiving, finish in-flight
/// messages within the grace period, release the rest and flush acks.
/// [`Shutdown::force`] cuts the grace period short (a second Ctrl-C).
#[derive(Debug, Clone)]
pub struct Shutdown {
    tx: std::sync::Arc<watch::Sender<u8>>,
}

impl Default for Shutdown {
    fn default() -> Self {
        Self::new()
    }
}

impl Shutdown {
    /// A signal not yet triggered.
    pub fn new() -> Self {
        Shutdown { tx: std::sync::Arc::new(watch::channel(RUNNING).0) }
    }

    /// Triggers the graceful shutdown (idempotent).
    pub fn trigger(&self) {
        self.tx.send_if_modified(|level| {
            let before = *level;
            *level = before.max(GRACEFUL);
            *level != before
        });
    }

    /// Stops at once (and triggers the shutdown if it was not yet): handlers
    /// still running are stopped and their messages released, without
    /// waiting for the rest of the grace period.
    pub fn force(&self) {
        self.tx.send_replace(IMMEDIATE);
    }

    /// Whether it was triggered.
    pub fn is_triggered(&self) -> bool {
        *self.tx.borrow() >= GRACEFUL
    }

    /// Whether [`Shutdown::force`] was called.
    pub fn is_forced(&self) -> bool {
        *self.tx.borrow() >= IMMEDIATE
    }

    /// Completes once triggered.
    pub async fn wait(&self) {
        self.reached(GRACEFUL).await;
    }

    /// Completes once forced.
    pub async fn forced(&self) {
        self.reached(IMMEDIATE).await;
    }

    async fn reached(&self, level: u8) {
        let mut rx = self.tx.subscribe();
        // `wait_for` only fails when the sender is gone, and we hold it.
        let _ = rx.wait_for(|v| *v >= level).await;
    }
}

#[cfg(test)]
mod tests {
    use super::Shutdown;

    #[tokio::test]
    async fn forcing_implies_triggering_and_triggering_does_not_undo_it() {
        let s = Shutdown::new();
        assert!(!s.is_triggered() && !s.is_forced());
        s.trigger();
        assert!(s.is_triggered() && !s.is_forced());
        s.wait().await;
        s.force();
        s.trigger();
        assert!(s.is_triggered() && s.is_forced());
        s.forced().await;
        let fresh = Shutdown::new();
        fresh.force();
        assert!(fresh.is_triggered());
        fresh.wait().await;
    }
}
