//! The server's `idle_session_timeout`.
//!
//! A database shared with an application may have one (PostgreSQL 14 and
//! later; a DBA sets it for the database or the role, so that forgotten
//! sessions end). The server then closes each of the pool's connections
//! that waited that long for a statement, without a word to the client,
//! and the pool, which does not ping before handing one out (see
//! `connect`), handed out the dead ones: after every quiet spell longer
//! than the timeout, the next statements failed one after another ("terminating
//! connection due to idle-session timeout", SQLSTATE 57P05), each a warning
//! and a receive backed off (tried from outside with the timeout at 1 s: ten
//! such spells in 45 s, each 3 to 7 warnings; no message lost).
//!
//! So the pool closes a connection itself once it has been idle for
//! [`MARGIN`] of the timeout ([`fresh`], in its `before_acquire`), and the
//! LISTEN connection, which only waits, runs a statement at half the
//! timeout ([`keepalive`]).

use std::time::Duration;

use sqlx::Postgres;

/// Of the server's timeout, how long a pooled connection may have waited to
/// be handed out: the rest leaves time for its first statement to arrive.
const MARGIN: (u32, u32) = (3, 4);

/// The session's `idle_session_timeout`, if it has one (0 means none; a
/// server before 14 has no such setting), as `conn` reads it.
pub(super) async fn timeout<'c>(conn: impl sqlx::Executor<'c, Database = Postgres>) -> Option<Duration> {
    let read = "SELECT setting::bigint FROM pg_settings WHERE name = 'idle_session_timeout'";
    let ms: Option<i64> = sqlx::query_scalar(read).fetch_optional(conn).await.ok().flatten();
    ms.filter(|ms| *ms > 0).map(|ms| Duration::from_millis(ms.unsigned_abs()))
}

/// Whether a pooled connection idle for `idle_for` may be handed out under
/// the server's `timeout`.
pub(super) fn fresh(idle_for: Duration, timeout: Option<Duration>) -> bool {
    timeout.is_none_or(|timeout| idle_for < timeout * MARGIN.0 / MARGIN.1)
}

/// How often the LISTEN connection runs a statement under the server's
/// `timeout`: at half of it (none without one).
pub(super) fn keepalive(timeout: Option<Duration>) -> Option<Duration> {
    timeout.map(|timeout| (timeout / 2).max(Duration::from_millis(100)))
}

/// The keepalive of a LISTEN connection, `listener`, as its session's
/// timeout asks: first due after one period.
pub(super) async fn keepalive_of(listener: &mut sqlx::postgres::PgListener) -> Option<tokio::time::Interval> {
    let every = keepalive(timeout(listener).await)?;
    let mut keep = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
    keep.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    Some(keep)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_connection_idle_for_most_of_the_timeout_is_not_handed_out() {
        let timeout = Some(Duration::from_secs(60));
        assert!(fresh(Duration::from_millis(44_999), timeout));
        assert!(!fresh(Duration::from_millis(45_000), timeout));
        assert!(fresh(Duration::from_secs(3_600), None), "no timeout: any idle time");
        assert_eq!(keepalive(timeout), Some(Duration::from_secs(30)));
        assert_eq!(keepalive(None), None);
    }
}
