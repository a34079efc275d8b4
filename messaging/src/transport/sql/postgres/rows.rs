//! Reading and inserting rows: the column list, decoding and the plain insert.

use super::*;

/// Every column of `messaging_messages`, in the order [`row_of`] reads them.
pub(super) const COLUMNS: &str = "id, queue, identity, group_id, message_id, payload, attributes, priority, process_at, status, \
    attempts, seq, lease_token, lease_expires, deferred_message_id, deferred_payload, deferred_attributes, \
    deferred_priority, deferred_process_at, deferred_status, deferred_seq, deferred_sent_at, sent_at, processed_at, error";

/// Inserts a new row; `None` when the identity exists already (ON CONFLICT).
pub(super) async fn insert(
    tx: &mut Transaction<'static, Postgres>,
    queue: &str,
    e: &Enqueue,
    seq: u64,
    now: i64,
    guard_identity: bool,
) -> Result<Option<RowId>, TransportError> {
    let row = Row::new(0, seq, now, e.clone());
    let sql = if guard_identity {
        "INSERT INTO messaging_messages (queue, identity, group_id, message_id, payload, attributes, priority, process_at, \
         status, attempts, seq, sent_at) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, 0, $10, $11) \
         ON CONFLICT (queue, identity) WHERE identity IS NOT NULL DO NOTHING RETURNING id"
    } else {
        "INSERT INTO messaging_messages (queue, identity, group_id, message_id, payload, attributes, priority, process_at, \
         status, attempts, seq, sent_at) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, 0, $10, $11) RETURNING id"
    };
    let id: Option<i64> = sqlx::query_scalar(sql)
        .bind(queue)
        .bind(&row.identity)
        .bind(&row.group)
        .bind(&row.message_id)
        .bind(&row.payload)
        .bind(&row.attributes)
        .bind(row.priority)
        .bind(row.process_at)
        .bind(row.status.as_str())
        .bind(seq as i64)
        .bind(now)
        .fetch_optional(&mut **tx)
        .await
        .map_err(|e| backend("enqueue", e))?;
    Ok(id.map(|id| id as RowId))
}

/// A leased row, with its priority and seq for ordering.
pub(super) fn leased_of(r: &PgRow) -> Result<(LeasedRow, i32, i64), TransportError> {
    let get = |e: sqlx::Error| backend("reading a leased row", e);
    Ok((
        LeasedRow {
            id: r.try_get::<i64, _>("id").map_err(get)? as RowId,
            token: r.try_get::<i64, _>("lease_token").map_err(get)? as u64,
            message_id: r.try_get("message_id").map_err(get)?,
            payload: r.try_get("payload").map_err(get)?,
            attempts: r.try_get::<i32, _>("attempts").map_err(get)? as u32,
            group: r.try_get("group_id").map_err(get)?,
            attributes: r.try_get("attributes").map_err(get)?,
            sent_at: r.try_get("sent_at").map_err(get)?,
        },
        r.try_get("priority").map_err(get)?,
        r.try_get("seq").map_err(get)?,
    ))
}

/// Reads a whole row (columns as in [`COLUMNS`]).
pub(super) fn row_of(r: &PgRow) -> Result<Row, TransportError> {
    let get = |e: sqlx::Error| backend("reading a message", e);
    let status = |text: Option<String>| -> Result<Option<Status>, TransportError> {
        match text {
            None => Ok(None),
            Some(t) => Status::parse(&t).map(Some).ok_or_else(|| {
                TransportError::Backend(format!("postgresql: unknown status `{t}` in messaging_messages"))
            }),
        }
    };
    let deferred_payload: Option<Vec<u8>> = r.try_get("deferred_payload").map_err(get)?;
    let deferred = match deferred_payload {
        None => None,
        Some(payload) => Some(Deferred {
            message_id: r.try_get::<Option<String>, _>("deferred_message_id").map_err(get)?.unwrap_or_default(),
            payload,
            priority: r.try_get::<Option<i32>, _>("deferred_priority").map_err(get)?.unwrap_or_default(),
            process_at: r.try_get("deferred_process_at").map_err(get)?,
            status_after_release: status(r.try_get("deferred_status").map_err(get)?)?,
            seq: r.try_get::<Option<i64>, _>("deferred_seq").map_err(get)?.unwrap_or_default() as u64,
            attributes: r.try_get::<Option<String>, _>("deferred_attributes").map_err(get)?.unwrap_or_default(),
            sent_at: r.try_get::<Option<i64>, _>("deferred_sent_at").map_err(get)?.unwrap_or_default(),
        }),
    };
    Ok(Row {
        id: r.try_get::<i64, _>("id").map_err(get)? as RowId,
        identity: r.try_get("identity").map_err(get)?,
        group: r.try_get("group_id").map_err(get)?,
        message_id: r.try_get("message_id").map_err(get)?,
        payload: r.try_get("payload").map_err(get)?,
        priority: r.try_get("priority").map_err(get)?,
        process_at: r.try_get("process_at").map_err(get)?,
        status: status(Some(r.try_get("status").map_err(get)?))?.unwrap_or(Status::Pending),
        attempts: r.try_get::<i32, _>("attempts").map_err(get)? as u32,
        seq: r.try_get::<i64, _>("seq").map_err(get)? as u64,
        lease_token: r.try_get::<Option<i64>, _>("lease_token").map_err(get)?.map(|t| t as u64),
        lease_expires: r.try_get("lease_expires").map_err(get)?,
        deferred,
        processed_at: r.try_get("processed_at").map_err(get)?,
        error: r.try_get("error").map_err(get)?,
        attributes: r.try_get("attributes").map_err(get)?,
        sent_at: r.try_get("sent_at").map_err(get)?,
    })
}
