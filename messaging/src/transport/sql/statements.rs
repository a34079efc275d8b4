//! The statements PostgreSQL and SQLite share, written once. Both drivers
//! take `$N` placeholders; `TRUE`/`FALSE` are booleans on PostgreSQL and 1/0
//! on SQLite. Tables are named here by their bare names and qualified by
//! [`Tables`] when a schema is set.

use std::borrow::Cow;
use std::sync::Arc;

/// Every column of `messaging_messages` that `record::Record` reads (a
/// macro, so that the statements that list them stay `&'static str`).
macro_rules! columns {
    () => {
        "id, identity, group_id, message_id, payload, attributes, priority, process_at, status, attempts, seq, \
         lease_token, lease_expires, deferred_message_id, deferred_payload, deferred_attributes, deferred_priority, \
         deferred_process_at, deferred_status, deferred_seq, deferred_sent_at, sent_at, processed_at, error, errors"
    };
}
pub(crate) use columns;

/// The columns a lease returns (`record::LeasedRow`), with priority and seq
/// for ordering.
pub(crate) const LEASED: &str =
    "id, lease_token, message_id, payload, attempts, group_id, attributes, sent_at, priority, seq";

/// Where the framework's tables are: the connection's schema, or a named one.
#[derive(Debug, Clone, Default)]
pub(crate) struct Tables {
    /// `Some("app")` names `app.messaging_messages` and so on.
    schema: Option<Arc<str>>,
}

impl Tables {
    /// Tables in `schema` (none: the connection's default schema).
    pub(crate) fn in_schema(schema: Option<&str>) -> Tables {
        Tables { schema: schema.map(Arc::from) }
    }

    /// The schema, if one is named.
    pub(crate) fn schema(&self) -> Option<Arc<str>> {
        self.schema.clone()
    }

    /// The statement made of `parts`, with every table qualified.
    pub(crate) fn sql<'a>(&self, parts: &[&'a str]) -> Cow<'a, str> {
        let text = match parts {
            [one] => Cow::Borrowed(*one),
            _ => Cow::Owned(parts.concat()),
        };
        match &self.schema {
            None => text,
            Some(schema) => Cow::Owned(text.replace("messaging_", &format!("{schema}.messaging_"))),
        }
    }
}

pub(crate) const DECLARE: &str =
    "INSERT INTO messaging_queues (name, fifo, created_at) VALUES ($1, $2, $3) ON CONFLICT (name) DO NOTHING";
pub(crate) const QUEUE_KIND: &str = "SELECT fifo FROM messaging_queues WHERE name = $1";

/// The row of an identity (`$1` queue, `$2` identity).
pub(crate) const BY_IDENTITY: &str =
    concat!("SELECT ", columns!(), " FROM messaging_messages WHERE queue = $1 AND identity = $2");
/// A row by id (`$1` id, `$2` queue).
pub(crate) const BY_ID: &str = concat!("SELECT ", columns!(), " FROM messaging_messages WHERE id = $1 AND queue = $2");

/// A new row with an identity; no row when the identity exists already.
pub(crate) const INSERT_IDENTITY: &str = "INSERT INTO messaging_messages (queue, identity, group_id, message_id, \
    payload, attributes, priority, process_at, status, attempts, seq, sent_at) \
    VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, 0, $10, $11) \
    ON CONFLICT (queue, identity) WHERE identity IS NOT NULL DO NOTHING RETURNING id";

/// Writes every column of a row back after its transition.
pub(crate) const STORE_ROW: &str = "UPDATE messaging_messages SET identity = $2, group_id = $3, message_id = $4, \
    payload = $5, attributes = $6, priority = $7, process_at = $8, status = $9, attempts = $10, seq = $11, \
    lease_token = $12, lease_expires = $13, deferred_message_id = $14, deferred_payload = $15, \
    deferred_attributes = $16, deferred_priority = $17, deferred_process_at = $18, deferred_status = $19, \
    deferred_seq = $20, deferred_sent_at = $21, sent_at = $22, processed_at = $23, error = $24, errors = $25 WHERE id = $1";

pub(crate) const DELETE_ROW: &str = "DELETE FROM messaging_messages WHERE id = $1";

/// The processed version becomes the identity's previous message.
pub(crate) const RECORD_PREVIOUS: &str = "INSERT INTO messaging_previous (queue, identity, message_id, payload, \
    processed_at) VALUES ($1, $2, $3, $4, $5) ON CONFLICT (queue, identity) DO UPDATE SET \
    message_id = excluded.message_id, payload = excluded.payload, processed_at = excluded.processed_at";
pub(crate) const PREVIOUS: &str =
    "SELECT message_id, payload FROM messaging_previous WHERE queue = $1 AND identity = $2";

/// Whether housekeeping has work (`$3`: retention is on, `$4`: its cutoff):
/// looked at without a write lock, since usually there is none.
pub(crate) const HOUSEKEEPING_DUE: &str = "SELECT \
    EXISTS (SELECT 1 FROM messaging_messages WHERE queue = $1 AND status = 'sleeping' \
            AND (process_at IS NULL OR process_at <= $2)), \
    EXISTS (SELECT 1 FROM messaging_messages WHERE queue = $1 \
            AND status IN ('processing', 'awaiting_release') AND lease_expires <= $2), \
    $3 AND EXISTS (SELECT 1 FROM messaging_messages WHERE queue = $1 AND status = 'processed' \
            AND processed_at <= $4)";
/// Sleepers whose time came (one without a time is due, as in `Row::is_eligible`).
pub(crate) const WAKE: &str = "UPDATE messaging_messages SET status = 'pending' WHERE queue = $1 \
    AND status = 'sleeping' AND (process_at IS NULL OR process_at <= $2)";
pub(crate) const EXPIRED: &str = concat!(
    "SELECT ",
    columns!(),
    " FROM messaging_messages WHERE queue = $1 AND status IN ('processing', 'awaiting_release') \
     AND lease_expires <= $2"
);
pub(crate) const PURGE_PROCESSED: &str =
    "DELETE FROM messaging_messages WHERE queue = $1 AND status = 'processed' AND processed_at <= $2";

/// The earliest sleeper and lease expiry.
pub(crate) const NEXT_DUE: &str = "SELECT \
    (SELECT min(process_at) FROM messaging_messages WHERE queue = $1 AND status = 'sleeping'), \
    (SELECT min(lease_expires) FROM messaging_messages WHERE queue = $1 \
        AND status IN ('processing', 'awaiting_release'))";
pub(crate) const DEPTH: &str = "SELECT count(*) FROM messaging_messages WHERE queue = $1 \
    AND status IN ('pending', 'sleeping', 'processing', 'awaiting_release')";
pub(crate) const ERROR_DEPTH: &str = "SELECT count(*) FROM messaging_messages WHERE queue = $1 AND status = 'error'";
pub(crate) const ERRORS: &str = concat!(
    "SELECT ",
    columns!(),
    " FROM messaging_messages WHERE queue = $1 AND status = 'error' ORDER BY seq LIMIT $2"
);
/// Dead letters after enqueue position `$3`, in enqueue order: the pages of a
/// redrive or a purge (the index on (queue, seq) of rows in error serves it).
pub(crate) const ERRORS_AFTER: &str = concat!(
    "SELECT ",
    columns!(),
    " FROM messaging_messages WHERE queue = $1 AND status = 'error' AND seq > $3 ORDER BY seq LIMIT $2"
);
/// A message by its id (`$2`) in queue `$1`, its current or its waiting
/// version (no index: an operator's lookup reads the queue's rows).
pub(crate) const BY_MESSAGE_ID: &str = concat!(
    "SELECT ",
    columns!(),
    " FROM messaging_messages WHERE queue = $1 AND (message_id = $2 OR deferred_message_id = $2)"
);
/// Deletes one dead letter by row id (`$1`) of queue `$2`.
pub(crate) const DELETE_DEAD: &str = "DELETE FROM messaging_messages WHERE id = $1 AND queue = $2 AND status = 'error'";
/// Deletes one dead letter by message id (`$1`) of queue `$2`.
pub(crate) const DELETE_DEAD_BY_MESSAGE_ID: &str =
    "DELETE FROM messaging_messages WHERE message_id = $1 AND queue = $2 AND status = 'error'";
/// How many rows `queue` holds per status, and the oldest's send time.
pub(crate) const COUNTS: &str =
    "SELECT status, count(*), min(sent_at) FROM messaging_messages WHERE queue = $1 GROUP BY status";
/// A page of the rows of `queue` in status `$2`, in lease order (priority,
/// then enqueue order) after the row at (`$3` priority, `$4` seq), of identity
/// `$6` and group `$7` when given: the console's listing (the ready index
/// serves the pending rows, the dead letters' index the rows in error).
pub(crate) const LIST: &str = concat!(
    "SELECT ",
    columns!(),
    " FROM messaging_messages WHERE queue = $1 AND status = $2 \
     AND (priority < $3 OR (priority = $3 AND seq > $4)) \
     AND (CAST($6 AS TEXT) IS NULL OR identity = $6) AND (CAST($7 AS TEXT) IS NULL OR group_id = $7) \
     ORDER BY priority DESC, seq LIMIT $5"
);
/// A sleeping message (`$2`) of `$1` becomes due now; a pending one is already.
pub(crate) const RETRY_NOW: &str = "UPDATE messaging_messages SET status = 'pending', process_at = NULL \
    WHERE queue = $1 AND message_id = $2 AND status IN ('sleeping', 'pending')";
/// Deletes message `$2` of `$1` unless a consumer holds it.
pub(crate) const DELETE_WAITING: &str = "DELETE FROM messaging_messages WHERE queue = $1 AND message_id = $2 \
    AND status IN ('pending', 'sleeping', 'error')";
/// The row of dead letter `$2` of `$1`.
pub(crate) const DEAD_BY_MESSAGE_ID: &str =
    "SELECT id FROM messaging_messages WHERE queue = $1 AND message_id = $2 AND status = 'error'";
/// Whether queue `$1` is paused (for every process).
pub(crate) const PAUSED: &str = "SELECT paused FROM messaging_queues WHERE name = $1";
/// Pauses (`$2` true) or resumes queue `$1` for every process.
pub(crate) const SET_PAUSED: &str = "UPDATE messaging_queues SET paused = $2 WHERE name = $1";
#[cfg(test)]
pub(crate) const ROWS: &str = concat!("SELECT ", columns!(), " FROM messaging_messages WHERE queue = $1 ORDER BY id");

/// Standard queues: the first pending rows by priority, then enqueue order.
pub(crate) const PICK_STANDARD: &str = "SELECT id FROM messaging_messages WHERE queue = $1 AND status = 'pending' \
    ORDER BY priority DESC, seq LIMIT $2";

/// FIFO: the head of each group with nothing leased, one per group, in
/// enqueue order. The head of a group is its earliest pending or sleeping
/// row; a sleeping head holds the group back. Rows without a group form one
/// group (as in the state machine; the transport refuses such messages on a
/// FIFO queue, so only rows written by other means have none).
pub(crate) const PICK_FIFO: &str = "SELECT id FROM ( \
        SELECT id, group_id, status, seq, \
            row_number() OVER (PARTITION BY group_id ORDER BY seq) AS place \
        FROM messaging_messages WHERE queue = $1 AND status IN ('pending', 'sleeping')) heads \
    WHERE place = 1 AND status = 'pending' AND NOT EXISTS ( \
        SELECT 1 FROM messaging_messages l WHERE l.queue = $1 \
        AND l.group_id IS NOT DISTINCT FROM heads.group_id \
        AND l.status IN ('processing', 'awaiting_release')) \
    ORDER BY seq LIMIT $2";

// Idempotency claims.

/// Inserts an unclaimed row or takes the existing one over when it is not
/// completed and free (no holder, expired lease) or held by the same
/// processor. Returns a row only when this caller got the claim.
pub(crate) const CLAIM: &str = "INSERT INTO messaging_idempotency \
    (message_id, scope, processor_id, lease_expires_at, completed) VALUES ($1, $2, $3, $4, FALSE) \
    ON CONFLICT (message_id, scope) DO UPDATE \
    SET processor_id = excluded.processor_id, lease_expires_at = excluded.lease_expires_at \
    WHERE messaging_idempotency.completed = FALSE \
      AND (messaging_idempotency.processor_id IS NULL \
           OR messaging_idempotency.lease_expires_at IS NULL \
           OR messaging_idempotency.lease_expires_at <= $5 \
           OR messaging_idempotency.processor_id = excluded.processor_id) \
    RETURNING processor_id";
pub(crate) const CLAIM_READ: &str = "SELECT completed, processor_id, lease_expires_at FROM messaging_idempotency \
    WHERE message_id = $1 AND scope = $2";
pub(crate) const CLAIM_COMPLETE: &str = "UPDATE messaging_idempotency \
    SET completed = TRUE, completed_at = $4, lease_expires_at = NULL \
    WHERE message_id = $1 AND scope = $2 AND processor_id = $3 AND completed = FALSE";
pub(crate) const CLAIM_RELEASE: &str = "UPDATE messaging_idempotency SET processor_id = NULL, lease_expires_at = NULL \
    WHERE message_id = $1 AND scope = $2 AND processor_id = $3 AND completed = FALSE";
pub(crate) const CLAIM_EXTEND: &str = "UPDATE messaging_idempotency SET lease_expires_at = $4 \
    WHERE message_id = $1 AND scope = $2 AND processor_id = $3 AND completed = FALSE";
pub(crate) const CLAIMS_PURGE: &str = "DELETE FROM messaging_idempotency WHERE completed = TRUE AND completed_at < $1";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tables_are_qualified_only_with_a_schema() {
        let plain = Tables::default();
        assert!(matches!(plain.sql(&[DEPTH]), Cow::Borrowed(_)));
        let app = Tables::in_schema(Some("app"));
        let sql = app.sql(&[BY_IDENTITY, " FOR UPDATE"]);
        assert!(sql.contains("FROM app.messaging_messages WHERE"), "{sql}");
        assert!(sql.ends_with(" FOR UPDATE"));
        assert!(app.sql(&[CLAIM]).contains("WHERE app.messaging_idempotency.completed"));
    }
}
