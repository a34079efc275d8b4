//! WAL checkpoints off the commit path.
//!
//! By default SQLite checkpoints inside the commit that grows the WAL past
//! 1,000 pages, and that commit waits for the checkpoint's fsync: a publish
//! or an acknowledgement that happens to be the one pays a few milliseconds
//! (it set the in-process latency's p99 at ~4 ms against ~1.3 ms without).
//! A task checkpoints every [`EVERY`] instead, with `PASSIVE`, which neither
//! blocks writers nor waits for readers; commits still checkpoint themselves
//! past [`AUTOCHECKPOINT_PAGES`], a safety net should the task fall behind.

use std::time::Duration;

use sqlx::SqlitePool;

use super::super::dialect::StopOnDrop;

/// How often the task checkpoints.
pub(super) const EVERY: Duration = Duration::from_millis(250);

/// WAL pages after which a commit checkpoints itself (SQLite's default is
/// 1,000; 20,000 pages are 80 MB at the default page size).
pub(super) const AUTOCHECKPOINT_PAGES: &str = "20000";

/// The most bytes of WAL file left on disk once a checkpoint has moved all
/// of it into the database (`journal_size_limit`). SQLite otherwise keeps
/// the file at its largest size for as long as the database is open, for
/// reuse: while an application sharing the file holds a read transaction,
/// nothing can be checkpointed and the WAL grows with every write, and it
/// then stayed that large after the reader ended (a single box's disk).
/// Larger than what the writes between two checkpoints usually add, so that
/// the file is not cut and grown again every round.
pub(super) const WAL_KEPT_BYTES: &str = "67108864";

/// Starts checkpointing `pool` every [`EVERY`] until the returned handle
/// (shared by the store's clones) is dropped; `None` outside a tokio runtime
/// (commits then checkpoint themselves).
pub(super) fn start(pool: SqlitePool) -> Option<StopOnDrop> {
    let runtime = tokio::runtime::Handle::try_current().ok()?;
    let (stop, mut stopped) = StopOnDrop::new();
    runtime.spawn(async move {
        let mut tick = tokio::time::interval(EVERY);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
        loop {
            tokio::select! {
                _ = &mut stopped => break,
                _ = tick.tick() => {
                    if pool.is_closed() {
                        break;
                    }
                    if let Err(e) = sqlx::query("PRAGMA wal_checkpoint(PASSIVE)").execute(&pool).await {
                        tracing::debug!("sqlite: background checkpoint failed: {e}");
                    }
                }
            }
        }
    });
    Some(stop)
}
