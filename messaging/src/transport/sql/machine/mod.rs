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

/// How much one lease of a standard queue takes, in its order (priority,
/// then enqueue order): at most `rows` rows, and of those each row while
/// the bodies of the rows before it come to less than `bytes`, or while it
/// is among the first `at_least`. So a lease brings at least one row (when
/// `bytes` is above zero), and its bodies pass `bytes` by one body at most
/// beyond what `at_least` takes. A FIFO queue's heads are counted in rows
/// only.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Take {
    /// The most rows.
    pub(crate) rows: usize,
    /// The bodies before the last row taken, at most (bytes).
    pub(crate) bytes: i64,
    /// Rows taken whatever their bodies.
    pub(crate) at_least: usize,
}

impl Take {
    /// Up to `rows` rows, whatever their bodies.
    pub(crate) fn rows(rows: usize) -> Take {
        Take { rows, bytes: i64::MAX, at_least: 0 }
    }

    /// Whether the row at `place` (1 for the first) is taken after rows
    /// whose bodies come to `before` bytes: what the statements compute
    /// with a running sum over the rows they locked (the model test's
    /// oracle takes rows by it).
    #[cfg_attr(not(test), allow(dead_code))]
    pub(crate) fn takes(&self, place: usize, before: i64) -> bool {
        place <= self.rows && (before < self.bytes || place <= self.at_least)
    }
}

#[cfg(test)]
mod tests;
