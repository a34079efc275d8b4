//! The schedules' ledger in a database (table `messaging_schedules`), one
//! store for PostgreSQL and SQLite: every process of a deployment reads the
//! same rows, so a tick publishes once across them.
//!
//! Each change loads the schedule's row under a lock (`FOR UPDATE` on
//! PostgreSQL, the write lock on SQLite), applies the same [`LedgerRow`]
//! method the in-process ledger uses, and stores the row, in one
//! transaction. Finishing a tick writes its message on that transaction:
//! the message exists exactly when the last tick moves.

use std::any::Any;

use super::dialect::{fail, Dialect, SqlStore, Write};
use super::driver::Value;
use crate::boxed::BoxFuture;
use crate::error::{PublishError, TransportError};
use crate::transport::schedules::{no_row, Begin, Finish, LedgerRow, ScheduleLedger, TickClaim, TickWriter};

const ENSURE: &str = "INSERT INTO messaging_schedules (name, last_tick, updated_at) VALUES ($1, $2, $3) \
    ON CONFLICT (name) DO NOTHING";
const READ: &str = "SELECT last_tick, last_published, paused, claim_tick, claim_token, claim_expires \
    FROM messaging_schedules WHERE name = $1";
const STORE: &str =
    "UPDATE messaging_schedules SET last_tick = $2, last_published = $3, paused = $4, claim_tick = $5, \
    claim_token = $6, claim_expires = $7, updated_at = $8 WHERE name = $1";
const ALL: &str = "SELECT name, last_tick, last_published, paused, claim_tick, claim_token, claim_expires \
    FROM messaging_schedules ORDER BY name";

/// The ledger's rows in `store`'s database.
pub(crate) struct SqlLedger<D: Dialect> {
    store: SqlStore<D>,
}

impl<D: Dialect> SqlLedger<D> {
    /// The ledger beside `store`'s messages (same pool, same clock, same
    /// write turn on SQLite).
    pub(crate) fn on(store: &SqlStore<D>) -> Self {
        SqlLedger { store: store.clone() }
    }

    /// Names a failure, and the fix when the table is missing.
    fn failed(what: &str) -> impl Fn(TransportError) -> TransportError + '_ {
        move |e| {
            if e.to_string().contains(D::MISSING_TABLE) {
                TransportError::Backend(format!(
                    "{}: the schedules' table `messaging_schedules` is missing ({what}): run the `migrate` command \
                     (or add `?migrate=true` to the database's URL)",
                    D::SYSTEM
                ))
            } else {
                e
            }
        }
    }

    /// The row of `name` on `w`, locked until `w` ends.
    async fn load(&self, w: &mut Write<'_, D>, name: &str) -> Result<Option<LedgerRow>, TransportError> {
        let found = self.store.query_in(w, "reading a schedule", &[READ, D::LOCK], &[name.into()]).await?;
        found.first().map(|r| decode::<D>(r, 0)).transpose()
    }

    async fn store_row(&self, w: &mut Write<'_, D>, name: &str, row: &LedgerRow) -> Result<(), TransportError> {
        let claim = row.claim;
        let args: [Value<'_>; 8] = [
            name.into(),
            row.last_tick_ms.into(),
            row.last_published_ms.into(),
            row.paused.into(),
            claim.map(|c| c.tick_ms).into(),
            claim.map(|c| c.token).into(),
            claim.map(|c| c.expires_ms).into(),
            self.store.now().into(),
        ];
        self.store.exec_in(w, "storing a schedule", &[STORE], &args).await?;
        Ok(())
    }

    /// [`ScheduleLedger::begin`] at the time `now` (the model test's clock).
    pub(crate) async fn begin_at(
        &self,
        name: &str,
        tick_ms: i64,
        token: i64,
        now: i64,
        lease_ms: i64,
    ) -> Result<Begin, TransportError> {
        self.transition("a claim", name, move |row| row.begin(tick_ms, token, now, lease_ms)).await
    }

    /// Applies `change` to the row of `name` in one transaction, storing it
    /// when it changed.
    async fn transition<T>(
        &self,
        what: &'static str,
        name: &str,
        change: impl FnOnce(&mut LedgerRow) -> T + Send,
    ) -> Result<T, TransportError> {
        let mut w = Write::begin(&self.store).await?;
        let done = async {
            let mut row = self.load(&mut w, name).await?.ok_or_else(|| no_row(name))?;
            let before = row;
            let out = change(&mut row);
            if row != before {
                self.store_row(&mut w, name, &row).await?;
            }
            Ok(out)
        }
        .await;
        w.finish(done).await.map_err(Self::failed(what))
    }
}

/// A row's columns from `first` on: last tick, last published, paused,
/// claim tick, token, expiry.
fn decode<D: Dialect>(r: &D::Row, first: usize) -> Result<LedgerRow, TransportError> {
    let read = fail::<D>("reading a schedule");
    let last_tick_ms = D::int(r, first).map_err(&read)?.unwrap_or_default();
    let last_published_ms = D::int(r, first + 1).map_err(&read)?;
    let paused = D::flag(r, first + 2).map_err(&read)?;
    let tick = D::int(r, first + 3).map_err(&read)?;
    let token = D::int(r, first + 4).map_err(&read)?;
    let expires = D::int(r, first + 5).map_err(&read)?;
    let claim = match (tick, token, expires) {
        (Some(tick_ms), Some(token), Some(expires_ms)) => Some(TickClaim { tick_ms, token, expires_ms }),
        _ => None,
    };
    Ok(LedgerRow { last_tick_ms, last_published_ms, paused, claim })
}

impl<D: Dialect> ScheduleLedger for SqlLedger<D> {
    fn describe(&self) -> &'static str {
        D::SYSTEM
    }

    fn shared(&self) -> bool {
        true
    }

    fn row<'a>(&'a self, name: &'a str, baseline_ms: i64) -> BoxFuture<'a, Result<LedgerRow, TransportError>> {
        Box::pin(async move {
            let args = [name.into(), baseline_ms.into(), self.store.now().into()];
            self.store.exec("making a schedule's row", &[ENSURE], &args).await.map_err(Self::failed("its row"))?;
            let found = self
                .store
                .query("reading a schedule", &[READ], &[name.into()])
                .await
                .map_err(Self::failed("its row"))?;
            found.first().map(|r| decode::<D>(r, 0)).transpose()?.ok_or_else(|| no_row(name))
        })
    }

    fn begin<'a>(
        &'a self,
        name: &'a str,
        tick_ms: i64,
        token: i64,
        lease_ms: i64,
    ) -> BoxFuture<'a, Result<Begin, TransportError>> {
        Box::pin(self.begin_at(name, tick_ms, token, self.store.now(), lease_ms))
    }

    fn finish<'a>(
        &'a self,
        name: &'a str,
        tick_ms: i64,
        token: i64,
        writer: Option<&'a dyn TickWriter>,
    ) -> BoxFuture<'a, Result<Finish, PublishError>> {
        Box::pin(async move {
            let mut w = Write::begin(&self.store).await?;
            // A failed write rolls the transaction back: nothing of the tick
            // was written, and it stays claimed.
            let mut refused = None;
            let done = async {
                let mut row = self.load(&mut w, name).await?.ok_or_else(|| no_row(name))?;
                if !row.holds(tick_ms, token) {
                    return Ok(Finish::Lost);
                }
                let ids = match writer {
                    Some(writer) => match writer.write(Some(w.conn() as &mut (dyn Any + Send))).await {
                        Ok(ids) => ids,
                        Err(e) => {
                            let rollback = TransportError::Rejected(e.to_string());
                            refused = Some(e);
                            return Err(rollback);
                        }
                    },
                    None => Vec::new(),
                };
                row.finish(tick_ms, token, !ids.is_empty());
                self.store_row(&mut w, name, &row).await?;
                Ok(Finish::Done(ids))
            }
            .await;
            match (w.finish(done).await.map_err(Self::failed("a tick")), refused) {
                (Err(_), Some(refused)) => Err(refused),
                (finished, _) => Ok(finished?),
            }
        })
    }

    fn skip<'a>(&'a self, name: &'a str, through_ms: i64) -> BoxFuture<'a, Result<bool, TransportError>> {
        Box::pin(self.transition("a skip", name, move |row| row.skip(through_ms)))
    }

    fn release<'a>(&'a self, name: &'a str, token: i64) -> BoxFuture<'a, Result<bool, TransportError>> {
        Box::pin(self.transition("a release", name, move |row| row.release(token)))
    }

    fn set_paused<'a>(&'a self, name: &'a str, paused: bool) -> BoxFuture<'a, Result<bool, TransportError>> {
        Box::pin(async move {
            match self.transition("a pause", name, move |row| row.paused = paused).await {
                Ok(()) => Ok(true),
                Err(e) if e.to_string() == no_row(name).to_string() => Ok(false),
                Err(e) => Err(e),
            }
        })
    }

    fn rows(&self) -> BoxFuture<'_, Result<Vec<(String, LedgerRow)>, TransportError>> {
        Box::pin(async move {
            let found = self.store.query("reading the schedules", &[ALL], &[]).await.map_err(Self::failed("rows"))?;
            let read = fail::<D>("reading the schedules");
            found.iter().map(|r| Ok((D::text(r, 0).map_err(&read)?.unwrap_or_default(), decode::<D>(r, 1)?))).collect()
        })
    }
}
