//! Connections to a server that is no longer the one they were opened on.
//!
//! *A failover.* After a failover (an Aurora writer made a reader, a standby
//! promoted behind the same name) the pool's open connections still reach
//! the old primary, and every write on them fails with SQLSTATE 25006 for as
//! long as they live (sqlx keeps a connection up to 30 minutes).
//!
//! *A restart, or connections killed.* A server restarted, or an operator's
//! `pg_terminate_backend`, ends the sessions of every pooled connection; the
//! pool does not know until it hands one out, and the first statement on
//! each failed (57P01): tried from outside, three kills of every connection
//! during a drain cost a handful of warnings each, and a claim that failed so
//! counted as a failed attempt of its message.
//!
//! Either error marks every connection opened before it stale ([`noticed`]),
//! and the pool closes a stale one instead of handing it out ([`usable`],
//! its `before_acquire`): the next attempt connects anew, through the name.
//! A connection that waited in the pool for [`CHECK_AFTER`] or more is
//! pinged before it is handed out ([`alive`]), so that after a restart
//! during a quiet spell the first statement, which may be a publish, does
//! not find it dead; a busy pool, whose connections come back within
//! milliseconds, pays no round trip. The statements that may safely run
//! twice run once more when their connection was lost
//! (`SqlStore::again_if_lost`).
//!
//! *A server gone from the network* (a failover that moved the name to
//! another address, a partition) answers nothing and closes nothing. The
//! framework's statements wait for an answer at most
//! `Dialect::ANSWER_WITHIN` (`dialect::within`), and then count as a lost
//! connection, marking the others stale. sqlx pings every connection given
//! back to the pool, without a limit, and that ping would hold one of the
//! pool's places for good: so a stale connection given back is closed, and
//! any other is pinged first within the same limit ([`answers`], the pool's
//! `after_release`).
//!
//! The mark is the process's, for every PostgreSQL pool in it: a pool on
//! another server reconnects once for nothing, which is cheap beside
//! writes failing for half an hour.
//!
//! The LISTEN connection writes nothing, so no error of its own tells it
//! apart: on the old primary it hears none of the new primary's NOTIFYs,
//! and idle receivers would wait for their poll. [`marked`] wakes its task,
//! which replaces it when it is [`stale`].

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;
use std::time::Instant;

use sqlx::pool::PoolConnectionMetadata;

use crate::transport::sql::dialect::within;

/// SQLSTATE `read_only_sql_transaction`.
pub(super) const READ_ONLY: &str = "25006";

/// When the process started counting (the mark is nanoseconds after it).
fn origin() -> Instant {
    static ORIGIN: OnceLock<Instant> = OnceLock::new();
    *ORIGIN.get_or_init(Instant::now)
}

/// Connections opened before this many nanoseconds after [`origin`] are
/// stale (0: none).
static STALE_BEFORE: AtomicU64 = AtomicU64::new(0);

fn nanos_since_origin(at: Instant) -> u64 {
    u64::try_from(at.saturating_duration_since(origin()).as_nanos()).unwrap_or(u64::MAX)
}

/// SQLSTATEs of a session the server ended: `admin_shutdown` (an
/// operator's `pg_terminate_backend`, a server stopped or restarted),
/// `crash_shutdown` (another backend crashed, and the server resets), and
/// `idle_session_timeout`.
const ENDED: [&str; 3] = ["57P01", "57P02", "57P05"];

/// Whether `e` says that the statement's connection is gone: the server
/// ended its session, or its socket failed.
pub(super) fn lost(e: &sqlx::Error) -> bool {
    match e {
        sqlx::Error::Database(db) => db.code().is_some_and(|c| ENDED.contains(&&*c)),
        sqlx::Error::Io(_) => true,
        _ => false,
    }
}

/// Why connections were marked stale: each is said on its own.
#[derive(Clone, Copy)]
enum Why {
    ReadOnly,
    Lost,
}

/// Marks every open connection stale when `e` says the server is read-only
/// or closed the connection.
pub(super) fn noticed(e: &sqlx::Error) {
    let read_only = match e {
        sqlx::Error::Database(db) => db.code().is_some_and(|c| c == READ_ONLY),
        _ => false,
    };
    let why = match () {
        () if read_only => Why::ReadOnly,
        () if lost(e) => Why::Lost,
        () => return,
    };
    // At least 1: 0 means none.
    let now = nanos_since_origin(Instant::now()).max(1);
    STALE_BEFORE.fetch_max(now, Ordering::SeqCst);
    MARKED.notify_waiters();
    // Once per ten seconds at most: while a server stays read-only every
    // write fails so (15 warnings in 10 s in a trial), and each failure
    // is logged by its caller anyway.
    let warned = &WARNED[why as usize];
    let last = warned.load(Ordering::SeqCst);
    let due = last == 0 || now.saturating_sub(last) >= WARN_EVERY.as_nanos() as u64;
    if !due || warned.compare_exchange(last, now, Ordering::SeqCst, Ordering::SeqCst).is_err() {
        return;
    }
    match why {
        Why::ReadOnly => tracing::warn!(
            "postgresql: the server is read-only; the connections opened before now are closed as they come back \
             (after a failover they reach the old primary)"
        ),
        Why::Lost => tracing::warn!(
            "postgresql: a connection to the server is gone ({e}); the connections opened before now are closed as \
             they come back, and new ones are opened (a restart, a failover or an operator's kill ends them all)"
        ),
    }
}

/// Told when [`noticed`] marks connections stale.
static MARKED: tokio::sync::Notify = tokio::sync::Notify::const_new();

/// Completes at the next read-only error's mark (one after this is
/// called and polled).
pub(super) fn marked() -> tokio::sync::futures::Notified<'static> {
    MARKED.notified()
}

/// Whether a connection opened at `opened` is older than the last
/// read-only or lost connection.
pub(super) fn stale(opened: Instant) -> bool {
    let stale_before = STALE_BEFORE.load(Ordering::SeqCst);
    stale_before != 0 && nanos_since_origin(opened) < stale_before
}

/// When [`noticed`] last warned, for each [`Why`] (nanoseconds after
/// [`origin`]; 0: never).
static WARNED: [AtomicU64; 2] = [AtomicU64::new(0), AtomicU64::new(0)];

/// How often [`noticed`] says that it closes the connections.
const WARN_EVERY: std::time::Duration = std::time::Duration::from_secs(10);

/// Whether a pooled connection of age `meta.age` may be handed out: it was
/// opened after the last read-only or lost connection.
pub(super) fn usable(meta: &PoolConnectionMetadata) -> bool {
    let opened = Instant::now().checked_sub(meta.age).unwrap_or_else(origin);
    !stale(opened)
}

/// How long a connection may wait in the pool before it is pinged on its
/// way out ([`alive`]).
pub(super) const CHECK_AFTER: std::time::Duration = std::time::Duration::from_secs(1);

/// Whether a pooled connection that waited `meta.idle_for` still answers:
/// pinged, within `wait`, when it waited [`CHECK_AFTER`] or more.
pub(super) async fn alive(
    conn: &mut sqlx::PgConnection,
    meta: &PoolConnectionMetadata,
    wait: Option<std::time::Duration>,
) -> bool {
    meta.idle_for < CHECK_AFTER || pings(conn, wait).await
}

/// Whether a connection given back to the pool answers a ping within
/// `wait` (without one, sqlx's own ping is left to tell).
pub(super) async fn answers(conn: &mut sqlx::PgConnection, wait: Option<std::time::Duration>) -> bool {
    wait.is_none() || pings(conn, wait).await
}

/// Whether `conn` answers a ping within `wait`. One that does not marks the
/// others of its age stale ([`noticed`]; `within` has already marked them
/// when the answer did not come in time).
async fn pings(conn: &mut sqlx::PgConnection, wait: Option<std::time::Duration>) -> bool {
    match within::<sqlx::Postgres, _, _>(wait, sqlx::Connection::ping(conn), |e| e).await {
        Ok(()) => true,
        Err(e) => {
            noticed(&e);
            false
        }
    }
}
