//! What the console reads and changes of a queue's rows: counts by status,
//! pages of rows, retry now, delete, redrive by id, and the queue's pause flag.

use super::*;

/// The statuses whose rows are waiting or in progress (not dead letters,
/// not processed): the oldest of them is the queue's oldest message.
const LIVE: [&str; 4] = ["pending", "sleeping", "processing", "awaiting_release"];

/// One status's count, its oldest row's send time, how many of its rows
/// are held past their lease, and (pending rows) when the longest waiting
/// became receivable.
pub(crate) struct StatusCount {
    pub(crate) status: String,
    pub(crate) count: u64,
    pub(crate) oldest_sent_at: Option<i64>,
    pub(crate) expired: u64,
    pub(crate) due_since: Option<i64>,
}

impl<D: Dialect> SqlStore<D> {
    /// The number of rows of `queue` per status at `now`, each with its
    /// oldest send time and its rows held past their lease.
    pub(crate) async fn counts(&self, queue: &str, now: i64) -> Result<Vec<StatusCount>, TransportError> {
        let what = "counting messages";
        let found = self.query(what, &[sql::COUNTS], &[queue.into(), now.into()]).await?;
        found
            .iter()
            .map(|r| {
                Ok(StatusCount {
                    status: D::text(r, 0)?.unwrap_or_default(),
                    count: D::int(r, 1)?.unwrap_or(0).max(0) as u64,
                    oldest_sent_at: D::int(r, 2)?,
                    expired: D::int(r, 3)?.unwrap_or(0).max(0) as u64,
                    due_since: D::int(r, 4)?,
                })
            })
            .collect::<Result<_, sqlx::Error>>()
            .map_err(fail::<D>(what))
    }

    /// The oldest send time of the rows waiting or in progress.
    pub(crate) fn oldest_live(counts: &[StatusCount]) -> Option<i64> {
        counts.iter().filter(|c| LIVE.contains(&c.status.as_str())).filter_map(|c| c.oldest_sent_at).min()
    }

    /// Up to `limit` rows of `queue` in `status` after the row at
    /// (`priority`, `seq`) in lease order, of `identity` and `group` when given.
    #[allow(clippy::too_many_arguments)]
    pub(crate) async fn page(
        &self,
        queue: &str,
        status: &str,
        after: (i64, i64),
        limit: usize,
        identity: Option<&str>,
        group: Option<&str>,
    ) -> Result<Vec<Row>, TransportError> {
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        let args =
            [queue.into(), status.into(), after.0.into(), after.1.into(), limit.into(), identity.into(), group.into()];
        rows::<D>(&self.query("listing messages", &[sql::LIST], &args).await?)
    }

    /// Runs `template` once per message id of `queue` (in one transaction);
    /// how many rows it changed.
    async fn each_message(
        &self,
        what: &str,
        template: &str,
        queue: &str,
        ids: &[&str],
    ) -> Result<usize, TransportError> {
        if ids.is_empty() {
            return Ok(0);
        }
        let mut w = Write::begin(self).await?;
        let done = async {
            let mut changed = 0;
            for &id in ids {
                changed += self.exec_in(&mut w, what, &[template], &[queue.into(), id.into()]).await?;
            }
            Ok(changed as usize)
        }
        .await;
        w.finish(done).await
    }

    /// Sleeping messages with these ids become due now; how many were
    /// sleeping or pending.
    pub(crate) async fn retry_now(&self, queue: &str, ids: &[&str]) -> Result<usize, TransportError> {
        let changed = self.each_message("retrying a message now", sql::RETRY_NOW, queue, ids).await?;
        D::notify(&self.pool, queue).await;
        Ok(changed)
    }

    /// Deletes the messages with these ids that no consumer holds.
    pub(crate) async fn delete_waiting(&self, queue: &str, ids: &[&str]) -> Result<usize, TransportError> {
        self.each_message("deleting a message", sql::DELETE_WAITING, queue, ids).await
    }

    /// The rows of the dead letters with these message ids, in the order given.
    pub(crate) async fn dead_rows(&self, queue: &str, ids: &[&str]) -> Result<Vec<RowId>, TransportError> {
        let what = "finding dead letters";
        let mut found = Vec::new();
        for &id in ids {
            let rows = self.query(what, &[sql::DEAD_BY_MESSAGE_ID], &[queue.into(), id.into()]).await?;
            if let Some(row) = int::<D>(&rows, 0, what)? {
                found.push(row as RowId);
            }
        }
        Ok(found)
    }

    /// Whether `queue` is paused for every process.
    pub(crate) async fn paused(&self, queue: &str) -> Result<bool, TransportError> {
        let what = "reading the queue's pause flag";
        let rows = self.query(what, &[sql::PAUSED], &[queue.into()]).await?;
        Ok(flag::<D>(&rows, 0, what)?.unwrap_or(false))
    }

    /// Pauses or resumes `queue` for every process.
    pub(crate) async fn set_paused(&self, queue: &str, paused: bool) -> Result<(), TransportError> {
        let changed = self.exec("pausing a queue", &[sql::SET_PAUSED], &[queue.into(), paused.into()]).await?;
        if changed == 0 {
            return Err(TransportError::QueueNotFound(queue.to_owned()));
        }
        D::notify(&self.pool, queue).await;
        Ok(())
    }
}
