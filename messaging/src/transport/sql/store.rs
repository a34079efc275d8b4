//! What the store's operations take and give: enqueue results and the
//! transitions of one leased row.

use crate::transport::sql::machine::{EnqueueOutcome, Row};
use crate::transport::{FailedAttempt, MessageId};

/// What an enqueue stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Enqueued {
    /// What happened.
    pub outcome: EnqueueOutcome,
    /// The id of the newest stored version (the existing one when discarded).
    pub message_id: MessageId,
}

/// A transition of one leased row, checked against its token.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum RowOp {
    /// A failed attempt: Sleeping until `retry_at` while attempts remain, else Error.
    Fail {
        /// When to try again (ms).
        retry_at: i64,
        /// Why it failed.
        failure: FailedAttempt,
        /// The queue's attempt limit.
        max_attempts: u32,
    },
    /// A failed attempt tried again under the same lease: recorded only.
    Note {
        /// Why it failed.
        failure: FailedAttempt,
    },
    /// Give the lease back without charging the attempt.
    Release,
    /// Give the lease back without charging the attempt, Sleeping until
    /// `retry_at`: left for a consumer that can read it.
    Postpone {
        /// When it may be leased again (ms).
        retry_at: i64,
        /// Why, as its last error meanwhile.
        reason: String,
    },
    /// A permanent failure: Error at once.
    DeadLetter {
        /// Why.
        failure: FailedAttempt,
    },
    /// Push the lease's expiry out.
    Extend {
        /// New lease length (ms from now).
        lease_ms: i64,
    },
}

impl RowOp {
    /// Whether the transition leaves both bodies as they are, so that they
    /// need be neither read nor written back: an extension only moves the
    /// lease's expiry (every other transition may apply a waiting version,
    /// whose body becomes the row's).
    pub(crate) fn keeps_bodies(&self) -> bool {
        matches!(self, RowOp::Extend { .. })
    }

    /// Applies the transition to a loaded row.
    pub(crate) fn apply(
        &self,
        row: &mut Row,
        now: i64,
        token: u64,
    ) -> Result<(), crate::transport::sql::machine::LeaseLost> {
        match self {
            RowOp::Fail { retry_at, failure, max_attempts } => row.fail(now, token, *retry_at, failure, *max_attempts),
            RowOp::Note { failure } => row.note(now, token, failure),
            RowOp::Release => row.release(now, token),
            RowOp::Postpone { retry_at, reason } => row.postpone(now, token, *retry_at, reason),
            RowOp::DeadLetter { failure } => row.dead_letter(now, token, failure),
            RowOp::Extend { lease_ms } => row.extend(now, token, *lease_ms),
        }
    }
}
