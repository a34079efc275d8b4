//! A transaction that holds back the cleanup of processed messages.
//!
//! Every lease walks the queue's ready index from its start, and passes the
//! entries that rows leased and completed before it left behind. A scan
//! marks such an entry dead once no transaction can see its row any more,
//! and later walks skip it. A transaction that stays open (an application's
//! session left `idle in transaction` on the shared database, a long report)
//! keeps every row completed since it began visible to it: no entry can be
//! marked and vacuum removes nothing, so each lease walks past all of them.
//! Measured (`BENCH_ONLY=framework-drain`, one snapshot held open in another
//! session while the drain ran): 100,000 messages 78,800 → 68,400 msgs/s,
//! 400,000 messages 73,900 → 41,000 msgs/s, slower the longer it stays open.
//!
//! The framework cannot end another session's transaction, but it can say
//! which one it is: the store's background task looks every
//! [`super::super::clock::EVERY`] for the oldest transaction of this
//! database open longer than [`HELD_TOO_LONG`] and holding a snapshot, and
//! warns with its pid, age, state, application and client, and what to do.
//! Not its statement: that is the application's, and may carry its data.

use std::time::Duration;

use sqlx::PgPool;

/// How long a transaction may hold a snapshot before it is reported. A queue
/// that completes a thousand messages a second leaves 300,000 dead rows in
/// five minutes, enough to slow its leases by about a third (above); an
/// application's ordinary transactions are far shorter.
pub(super) const HELD_TOO_LONG: Duration = Duration::from_secs(300);

/// How often a transaction still open is reported again.
const AGAIN_EVERY: Duration = Duration::from_secs(600);

/// The oldest session of this database, other than the asking one, whose
/// transaction has been open longer than `$1` seconds and holds back the
/// horizon: with a snapshot (`backend_xmin`: a repeatable-read transaction,
/// or a statement running) or a transaction id of its own (`backend_xid`:
/// it wrote). A read-committed session idle after reading holds neither.
/// Without `pg_read_all_stats` PostgreSQL shows these columns only for the
/// sessions of the asking role.
const OLDEST: &str = "SELECT pid, \
        (extract(epoch FROM clock_timestamp() - xact_start) * 1000)::bigint, \
        (extract(epoch FROM xact_start) * 1000)::bigint, \
        coalesce(state, ''), coalesce(application_name, ''), coalesce(host(client_addr), 'local') \
    FROM pg_stat_activity \
    WHERE datname = current_database() AND pid <> pg_backend_pid() \
        AND (backend_xmin IS NOT NULL OR backend_xid IS NOT NULL) \
        AND xact_start < clock_timestamp() - make_interval(secs => $1) \
    ORDER BY xact_start LIMIT 1";

/// A session whose transaction holds back cleanup.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Holder {
    pub(crate) pid: i32,
    /// How long its transaction has been open.
    pub(crate) open_ms: i64,
    /// When its transaction began (with `pid`, which transaction it is).
    pub(crate) began_ms: i64,
    pub(crate) state: String,
    pub(crate) application: String,
    pub(crate) client: String,
}

impl Holder {
    /// The warning: who, for how long, what it costs and what to do.
    pub(crate) fn warning(&self) -> String {
        let minutes = self.open_ms / 60_000;
        let application = if self.application.is_empty() { String::new() } else { format!(" `{}`", self.application) };
        // A session waiting between statements, or one statement running.
        let bound = if self.state.starts_with("idle in transaction") {
            "idle_in_transaction_session_timeout"
        } else {
            "statement_timeout"
        };
        format!(
            "postgresql: the transaction of session {pid}{application} ({client}, {state}) has been open for \
             {minutes} min; while it is, rows completed since it began cannot be cleaned up and every lease walks \
             past them, so consumers slow down the longer it stays open. End it (`SELECT \
             pg_terminate_backend({pid})`), or bound such sessions with `{bound}`",
            pid = self.pid,
            client = self.client,
            state = self.state,
        )
    }
}

/// The oldest session holding a snapshot for longer than `held`, if any.
pub(crate) async fn oldest(pool: &PgPool, held: Duration) -> Result<Option<Holder>, sqlx::Error> {
    let row: Option<(i32, i64, i64, String, String, String)> =
        sqlx::query_as(OLDEST).bind(held.as_secs_f64()).fetch_optional(pool).await?;
    Ok(row.map(|(pid, open_ms, began_ms, state, application, client)| Holder {
        pid,
        open_ms,
        began_ms,
        state,
        application,
        client,
    }))
}

/// What the background task last reported: the transaction, and when.
#[derive(Debug, Default)]
pub(super) struct Reported(Option<((i32, i64), std::time::Instant)>);

impl Reported {
    /// Looks for a holder and warns about a new one, or one still open
    /// [`AGAIN_EVERY`] after the last warning; says when it is gone.
    pub(super) async fn check(&mut self, pool: &PgPool) {
        match oldest(pool, HELD_TOO_LONG).await {
            Ok(Some(holder)) => {
                let which = (holder.pid, holder.began_ms);
                let due = match &self.0 {
                    Some((last, at)) => *last != which || at.elapsed() >= AGAIN_EVERY,
                    None => true,
                };
                if due {
                    tracing::warn!(pid = holder.pid, open_ms = holder.open_ms, "{}", holder.warning());
                    self.0 = Some((which, std::time::Instant::now()));
                }
            }
            Ok(None) => {
                if let Some(((pid, _), _)) = self.0.take() {
                    tracing::info!("postgresql: the long transaction of session {pid} ended; cleanup can go on");
                }
            }
            Err(e) => tracing::debug!("postgresql: looking for long transactions failed ({e})"),
        }
    }
}
