//! The in-process idempotency store.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

use super::{Claim, IdempotencyStore};
use crate::boxed::BoxFuture;
use crate::error::TransportError;

#[derive(Debug)]
struct Entry {
    processor: Option<String>,
    expires: Option<Instant>,
    completed: bool,
}

/// Claims kept in memory: enough for one process (and for tests).
#[derive(Debug, Default)]
pub struct MemoryIdempotencyStore {
    entries: Mutex<HashMap<(String, String), Entry>>,
}

impl MemoryIdempotencyStore {
    /// An empty store.
    pub fn new() -> Self {
        Self::default()
    }

    fn with<R>(&self, f: impl FnOnce(&mut HashMap<(String, String), Entry>) -> R) -> R {
        let mut guard = self.entries.lock().unwrap_or_else(|p| p.into_inner());
        f(&mut guard)
    }
}

impl IdempotencyStore for MemoryIdempotencyStore {
    fn claim<'a>(
        &'a self,
        message_id: &'a str,
        scope: &'a str,
        processor: &'a str,
        lease: Duration,
    ) -> BoxFuture<'a, Result<Claim, TransportError>> {
        Box::pin(async move {
            let now = Instant::now();
            Ok(self.with(|entries| {
                let entry = entries.entry((message_id.to_owned(), scope.to_owned())).or_insert(Entry {
                    processor: None,
                    expires: None,
                    completed: false,
                });
                if entry.completed {
                    return Claim::Completed;
                }
                let free = entry.processor.is_none() || entry.expires.is_none_or(|e| e <= now);
                if free || entry.processor.as_deref() == Some(processor) {
                    entry.processor = Some(processor.to_owned());
                    entry.expires = Some(now + lease);
                    Claim::Claimed
                } else {
                    Claim::InProgress { remaining: entry.expires.map_or(Duration::ZERO, |e| e - now) }
                }
            }))
        })
    }

    fn complete<'a>(
        &'a self,
        message_id: &'a str,
        scope: &'a str,
        processor: &'a str,
    ) -> BoxFuture<'a, Result<(), TransportError>> {
        Box::pin(async move {
            self.with(|entries| match entries.get_mut(&(message_id.to_owned(), scope.to_owned())) {
                Some(e) if e.processor.as_deref() == Some(processor) => {
                    e.completed = true;
                    e.expires = None;
                    Ok(())
                }
                _ => Err(TransportError::StaleReceipt),
            })
        })
    }

    fn release<'a>(
        &'a self,
        message_id: &'a str,
        scope: &'a str,
        processor: &'a str,
    ) -> BoxFuture<'a, Result<(), TransportError>> {
        Box::pin(async move {
            self.with(|entries| {
                let key = (message_id.to_owned(), scope.to_owned());
                if entries.get(&key).is_some_and(|e| !e.completed && e.processor.as_deref() == Some(processor)) {
                    entries.remove(&key);
                }
                Ok(())
            })
        })
    }

    fn extend<'a>(
        &'a self,
        message_id: &'a str,
        scope: &'a str,
        processor: &'a str,
        lease: Duration,
    ) -> BoxFuture<'a, Result<(), TransportError>> {
        Box::pin(async move {
            let now = Instant::now();
            self.with(|entries| match entries.get_mut(&(message_id.to_owned(), scope.to_owned())) {
                Some(e) if !e.completed && e.processor.as_deref() == Some(processor) => {
                    e.expires = Some(now + lease);
                    Ok(())
                }
                _ => Err(TransportError::StaleReceipt),
            })
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn claim_lease_complete_release() {
        let store = MemoryIdempotencyStore::new();
        let lease = Duration::from_secs(10);
        assert_eq!(store.claim("m", "s", "p1", lease).await.unwrap(), Claim::Claimed);
        assert_eq!(store.claim("m", "s", "p2", lease).await.unwrap(), Claim::InProgress { remaining: lease });
        assert_eq!(store.claim("m", "other", "p2", lease).await.unwrap(), Claim::Claimed);
        tokio::time::advance(Duration::from_secs(4)).await;
        store.extend("m", "s", "p1", lease).await.unwrap();
        assert_eq!(
            store.claim("m", "s", "p2", lease).await.unwrap(),
            Claim::InProgress { remaining: lease },
            "the heartbeat pushed the lease out"
        );
        assert!(store.extend("m", "s", "p2", lease).await.is_err(), "only the holder extends");
        tokio::time::advance(Duration::from_secs(11)).await;
        assert_eq!(store.claim("m", "s", "p2", lease).await.unwrap(), Claim::Claimed, "expired lease is taken over");
        assert!(store.complete("m", "s", "p1").await.is_err(), "a fenced-out holder cannot complete");
        store.release("m", "s", "p2").await.unwrap();
        assert_eq!(store.claim("m", "s", "p3", lease).await.unwrap(), Claim::Claimed);
        store.complete("m", "s", "p3").await.unwrap();
        assert!(store.extend("m", "s", "p3", lease).await.is_err(), "a completed claim is not extended");
        assert_eq!(store.claim("m", "s", "p4", lease).await.unwrap(), Claim::Completed);
    }
}
