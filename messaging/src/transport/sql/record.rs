//! A message row as stored, decoded the same way on every database.

use crate::error::TransportError;
use crate::transport::sql::machine::{Deferred, Row, RowId, Status};

/// One row of `messaging_messages` (the columns of `statements::columns!`).
#[derive(Debug, sqlx::FromRow)]
pub(crate) struct Record {
    id: i64,
    identity: Option<String>,
    group_id: Option<String>,
    message_id: String,
    payload: Vec<u8>,
    attributes: String,
    priority: i32,
    process_at: Option<i64>,
    status: String,
    attempts: i32,
    seq: i64,
    lease_token: Option<i64>,
    lease_expires: Option<i64>,
    deferred_message_id: Option<String>,
    deferred_payload: Option<Vec<u8>>,
    deferred_attributes: Option<String>,
    deferred_priority: Option<i32>,
    deferred_process_at: Option<i64>,
    deferred_status: Option<String>,
    deferred_seq: Option<i64>,
    deferred_sent_at: Option<i64>,
    sent_at: i64,
    processed_at: Option<i64>,
    error: Option<String>,
    errors: String,
}

/// A leased row (the columns of `statements::LEASED`), with what orders it.
#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow)]
pub(crate) struct LeasedRow {
    /// The row.
    #[sqlx(try_from = "i64")]
    pub id: RowId,
    /// The lease token every later call must present.
    #[sqlx(rename = "lease_token", try_from = "i64")]
    pub token: u64,
    /// The version's id.
    pub message_id: String,
    /// The payload.
    pub payload: Vec<u8>,
    /// Attempts including this one.
    #[sqlx(try_from = "i32")]
    pub attempts: u32,
    /// FIFO group.
    #[sqlx(rename = "group_id")]
    pub group: Option<String>,
    /// Attributes as JSON text ('' for none).
    pub attributes: String,
    /// When this version was enqueued (ms).
    pub sent_at: i64,
    priority: i32,
    seq: i64,
}

/// Leased rows in the order they go out (a RETURNING clause comes in no
/// particular order): by priority then enqueue order (on a FIFO queue, one
/// head per group).
pub(crate) fn in_order(mut leased: Vec<LeasedRow>) -> Vec<LeasedRow> {
    leased.sort_by_key(|r| (std::cmp::Reverse(r.priority), r.seq));
    leased
}

fn status(text: &str) -> Result<Status, TransportError> {
    Status::parse(text)
        .ok_or_else(|| TransportError::Backend(format!("unknown status `{text}` in table `messaging_messages`")))
}

impl TryFrom<Record> for Row {
    type Error = TransportError;

    fn try_from(r: Record) -> Result<Row, TransportError> {
        let deferred = match r.deferred_payload {
            None => None,
            Some(payload) => Some(Deferred {
                message_id: r.deferred_message_id.unwrap_or_default(),
                payload,
                priority: r.deferred_priority.unwrap_or_default(),
                process_at: r.deferred_process_at,
                status_after_release: r.deferred_status.as_deref().map(status).transpose()?,
                seq: r.deferred_seq.unwrap_or_default() as u64,
                attributes: r.deferred_attributes.unwrap_or_default(),
                sent_at: r.deferred_sent_at.unwrap_or_default(),
            }),
        };
        Ok(Row {
            id: r.id as RowId,
            identity: r.identity,
            group: r.group_id,
            message_id: r.message_id,
            payload: r.payload,
            priority: r.priority,
            process_at: r.process_at,
            status: status(&r.status)?,
            attempts: r.attempts.max(0) as u32,
            seq: r.seq as u64,
            lease_token: r.lease_token.map(|t| t as u64),
            lease_expires: r.lease_expires,
            deferred,
            processed_at: r.processed_at,
            error: r.error,
            // A history that does not parse is shown empty rather than
            // stopping the message.
            history: serde_json::from_str(&r.errors).unwrap_or_default(),
            attributes: r.attributes,
            sent_at: r.sent_at,
        })
    }
}
