//! A settlement of one leased row that another transaction holds (an
//! application's that updated or locked it and has not ended): waited for
//! as long as it is held, in the caller's lane alone.

use std::time::Instant;

use super::{Dialect, RowOp, SqlTransport};
use crate::error::{TransportError, HELD_PAUSE, HELD_WARNING};
use crate::transport::Receipt;

impl<D: Dialect> SqlTransport<D> {
    /// Applies `op` (`what` it does, for the log) to the row of `receipt`:
    /// while another transaction holds the row ([`TransportError::Held`]),
    /// tried again, every half second. The heartbeat cannot extend a held
    /// row, but nothing else can take it back either, and a lease holds
    /// until it is taken back (`Row::holds`), so the retry goes through
    /// once the row is let go. Ends then, or when the caller gives up (a
    /// worker's stop, at its grace period). Bounded at the database's 30 s
    /// answer limit instead, a failed message's retry on a held row was
    /// taken for a lost connection (the pool's connections closed), its
    /// attempt left uncounted and its history without the failure, tried
    /// from outside.
    pub(super) async fn settle(
        &self,
        queue: &str,
        receipt: &Receipt,
        op: RowOp,
        what: &str,
    ) -> Result<(), TransportError> {
        let mut waiting: Option<Instant> = None;
        loop {
            let tried = Instant::now();
            match self.store.apply(queue, self.store.now(), receipt.key, receipt.token, op.clone()).await {
                Err(TransportError::Held(why)) => {
                    if waiting.is_none() && self.held_warned.due(HELD_WARNING, false) {
                        tracing::warn!(queue, row = receipt.key, "{what} waits for the message's row: {why}");
                    }
                    waiting.get_or_insert(tried);
                    tokio::time::sleep(HELD_PAUSE.saturating_sub(tried.elapsed())).await;
                }
                result => {
                    if let (Some(since), Ok(())) = (waiting, &result) {
                        tracing::info!(
                            queue,
                            row = receipt.key,
                            "{what}: done once another transaction let the message's row go, after {:.1} s",
                            since.elapsed().as_secs_f32()
                        );
                    }
                    return result;
                }
            }
        }
    }
}
