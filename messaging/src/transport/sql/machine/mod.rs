//! The row state machine of database queues (message identity, leases,
//! deferred versions, dead letters), pure and synchronous: no I/O, time
//! passed in.
//!
//! One [`Row`] per message; at most one row per (queue, identity). The SQL
//! backends store rows and run the same transitions (their model-based tests
//! compare them step by step with this module, the oracle).
//!
//! Statuses: `Pending`, `Sleeping` (process-at in the future), `Processing`
//! (leased), `AwaitingRelease` (leased, and a newer version waits), `Error`
//! (dead letters), `Processed` (kept for the retention period).

mod row;

#[cfg(test)]
pub(crate) use row::IdentityQueue;
pub(crate) use row::{Deferred, Enqueue, EnqueueOutcome, LeaseLost, QueueRules, Row, RowId, Suspect, Written};

/// The status of a row.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Status {
    /// Ready to be leased.
    Pending,
    /// Waiting for its process-at time.
    Sleeping,
    /// Leased by a processor.
    Processing,
    /// Leased, and a newer version was enqueued meanwhile; it applies on release.
    AwaitingRelease,
    /// Failed for good: the database queue's dead letters.
    Error,
    /// Completed, kept for the retention period.
    Processed,
}

impl Status {
    /// The name stored in the database.
    pub fn as_str(self) -> &'static str {
        match self {
            Status::Pending => "pending",
            Status::Sleeping => "sleeping",
            Status::Processing => "processing",
            Status::AwaitingRelease => "awaiting_release",
            Status::Error => "error",
            Status::Processed => "processed",
        }
    }

    /// Parses a stored name.
    pub fn parse(text: &str) -> Option<Status> {
        Some(match text {
            "pending" => Status::Pending,
            "sleeping" => Status::Sleeping,
            "processing" => Status::Processing,
            "awaiting_release" => Status::AwaitingRelease,
            "error" => Status::Error,
            "processed" => Status::Processed,
            _ => return None,
        })
    }

    /// Whether a processor holds the row.
    pub fn is_leased(self) -> bool {
        matches!(self, Status::Processing | Status::AwaitingRelease)
    }
}

#[cfg(test)]
mod tests;
