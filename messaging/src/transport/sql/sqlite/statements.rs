//! Statements shared by the transactions: counters, leases by id, identity
//! rows, transitions and inserts.

use super::*;

/// Commits `tx` when `result` is a success, rolls it back otherwise.
pub(super) async fn finish<R>(tx: Tx, result: Result<R, TransportError>) -> Result<R, TransportError> {
    match result {
        Ok(value) => {
            tx.commit().await.map_err(|e| backend("commit", e))?;
            Ok(value)
        }
        Err(e) => {
            if let Err(rollback) = tx.rollback().await {
                tracing::debug!("sqlite: rollback failed: {rollback}");
            }
            Err(e)
        }
    }
}

/// Reserves `n` consecutive values of the counter; returns the first.
pub(super) async fn reserve(conn: &mut SqliteConnection, n: usize) -> Result<u64, TransportError> {
    if n == 0 {
        return Ok(0);
    }
    let last: Option<i64> =
        sqlx::query_scalar("UPDATE messaging_counters SET value = value + ?1 WHERE name = 'seq' RETURNING value")
            .bind(int(n))
            .fetch_optional(&mut *conn)
            .await
            .map_err(|e| backend("advancing the counter", e))?;
    match last {
        Some(last) => Ok((last - int(n) + 1) as u64),
        None => Err(TransportError::Backend(
            "sqlite: the counter `seq` is missing from table `messaging_counters`; run the `migrate` command".into(),
        )),
    }
}

/// Leases the rows `ids` in one statement, with one new token for the lease
/// (fencing compares the pair (row, token), and a later lease of any of these
/// rows draws a newer token); returns them in the order of `ids`.
pub(super) async fn lease_ids(
    conn: &mut SqliteConnection,
    ids: &[i64],
    now: i64,
    lease_ms: i64,
) -> Result<Vec<LeasedRow>, TransportError> {
    if ids.is_empty() {
        return Ok(Vec::new());
    }
    let token = reserve(conn, 1).await?;
    let update = format!(
        "UPDATE messaging_messages SET status = 'processing', lease_token = ?1, lease_expires = ?2, \
         attempts = attempts + 1 WHERE id IN (SELECT value FROM json_each(?3)) RETURNING {LEASED_COLUMNS}"
    );
    let rows = sqlx::query(&update)
        .bind(token as i64)
        .bind(now + lease_ms)
        .bind(json_ids(ids.iter().copied()))
        .fetch_all(&mut *conn)
        .await
        .map_err(|e| backend("lease", e))?;
    let position: std::collections::HashMap<i64, usize> = ids.iter().enumerate().map(|(i, &id)| (id, i)).collect();
    let mut leased = rows.iter().map(leased_of).collect::<Result<Vec<_>, _>>()?;
    leased.sort_by_key(|l| position.get(&(l.id as i64)).copied().unwrap_or(usize::MAX));
    Ok(leased)
}

/// Row ids as a JSON array, for `IN (SELECT value FROM json_each(?))`: one
/// statement for a whole batch.
pub(super) fn json_ids(ids: impl Iterator<Item = i64>) -> String {
    let mut json = String::from("[");
    for (i, id) in ids.enumerate() {
        if i > 0 {
            json.push(',');
        }
        json.push_str(&id.to_string());
    }
    json.push(']');
    json
}

/// The row of an identity.
pub(super) async fn load_identity(
    conn: &mut SqliteConnection,
    queue: &str,
    identity: &str,
) -> Result<Option<Row>, TransportError> {
    let select = format!("SELECT {COLUMNS} FROM messaging_messages WHERE queue = ?1 AND identity = ?2");
    let found = sqlx::query(&select)
        .bind(queue)
        .bind(identity)
        .fetch_optional(&mut *conn)
        .await
        .map_err(|e| backend("enqueue", e))?;
    found.as_ref().map(row_of).transpose()
}

/// Loads a row of `queue`, applies `f`, stores the row (or deletes it).
/// A row that is not there is a lost lease.
pub(super) async fn transition<R>(
    conn: &mut SqliteConnection,
    queue: &str,
    id: RowId,
    f: impl FnOnce(&mut Row) -> Result<(R, bool), TransportError>,
) -> Result<R, TransportError> {
    let select = format!("SELECT {COLUMNS} FROM messaging_messages WHERE id = ?1 AND queue = ?2");
    let found = sqlx::query(&select)
        .bind(id as i64)
        .bind(queue)
        .fetch_optional(&mut *conn)
        .await
        .map_err(|e| backend("loading a message", e))?
        .ok_or(TransportError::StaleReceipt)?;
    let mut row = row_of(&found)?;
    let (result, delete) = f(&mut row)?;
    if delete {
        sqlx::query("DELETE FROM messaging_messages WHERE id = ?1")
            .bind(id as i64)
            .execute(&mut *conn)
            .await
            .map_err(|e| backend("deleting a message", e))?;
    } else {
        store_row(conn, &row).await?;
    }
    Ok(result)
}

/// Records the processed version of an identity.
pub(super) async fn record_previous(
    conn: &mut SqliteConnection,
    queue: &str,
    identity: &str,
    message_id: &str,
    payload: &[u8],
    now: i64,
) -> Result<(), TransportError> {
    sqlx::query(
        "INSERT INTO messaging_previous (queue, identity, message_id, payload, processed_at) VALUES (?1, ?2, ?3, ?4, ?5) \
         ON CONFLICT (queue, identity) DO UPDATE SET message_id = excluded.message_id, payload = excluded.payload, \
         processed_at = excluded.processed_at",
    )
    .bind(queue)
    .bind(identity)
    .bind(message_id)
    .bind(payload)
    .bind(now)
    .execute(&mut *conn)
    .await
    .map_err(|e| backend("recording the previous message", e))?;
    Ok(())
}

/// Stores every column of `row` (which exists).
pub(super) async fn store_row(conn: &mut SqliteConnection, row: &Row) -> Result<(), TransportError> {
    let d = row.deferred.as_ref();
    sqlx::query(
        "UPDATE messaging_messages SET identity = ?2, group_id = ?3, message_id = ?4, payload = ?5, attributes = ?6, \
         priority = ?7, process_at = ?8, status = ?9, attempts = ?10, seq = ?11, lease_token = ?12, lease_expires = ?13, \
         deferred_message_id = ?14, deferred_payload = ?15, deferred_attributes = ?16, deferred_priority = ?17, \
         deferred_process_at = ?18, deferred_status = ?19, deferred_seq = ?20, deferred_sent_at = ?21, sent_at = ?22, \
         processed_at = ?23, error = ?24 WHERE id = ?1",
    )
    .bind(row.id as i64)
    .bind(&row.identity)
    .bind(&row.group)
    .bind(&row.message_id)
    .bind(&row.payload)
    .bind(&row.attributes)
    .bind(row.priority)
    .bind(row.process_at)
    .bind(row.status.as_str())
    .bind(i64::from(row.attempts))
    .bind(row.seq as i64)
    .bind(row.lease_token.map(|t| t as i64))
    .bind(row.lease_expires)
    .bind(d.map(|d| d.message_id.as_str()))
    .bind(d.map(|d| d.payload.as_slice()))
    .bind(d.map(|d| d.attributes.as_str()))
    .bind(d.map(|d| d.priority))
    .bind(d.and_then(|d| d.process_at))
    .bind(d.and_then(|d| d.status_after_release).map(Status::as_str))
    .bind(d.map(|d| d.seq as i64))
    .bind(d.map(|d| d.sent_at))
    .bind(row.sent_at)
    .bind(row.processed_at)
    .bind(&row.error)
    .execute(&mut *conn)
    .await
    .map_err(|e| backend("storing a message", e))?;
    Ok(())
}

/// Inserts a new row for `e` (whose identity, if any, has no row yet).
pub(super) async fn insert(
    conn: &mut SqliteConnection,
    queue: &str,
    e: Enqueue,
    seq: u64,
    now: i64,
) -> Result<RowId, TransportError> {
    // Row::new computes the landing status: Pending, Sleeping when delayed, or the custom one.
    let row = Row::new(0, seq, now, e);
    let ids = insert_many(conn, queue, std::iter::once(&row), now).await?;
    ids.get(&seq)
        .copied()
        .ok_or_else(|| TransportError::Backend(format!("sqlite: the insert returned no row for sequence {seq}")))
}

/// Rows per multi-row insert: 12 values each, well under SQLite's 32,766
/// bound parameters.
pub(super) const INSERT_ROWS: usize = 500;

/// Inserts new rows (whose identity, if any, has no row yet), [`INSERT_ROWS`]
/// per statement; returns each row's id by its sequence number.
pub(super) async fn insert_many<'r>(
    conn: &mut SqliteConnection,
    queue: &str,
    rows: impl Iterator<Item = &'r Row>,
    now: i64,
) -> Result<std::collections::HashMap<u64, RowId>, TransportError> {
    let rows: Vec<&Row> = rows.collect();
    let mut ids = std::collections::HashMap::with_capacity(rows.len());
    for chunk in rows.chunks(INSERT_ROWS) {
        let mut insert = sqlx::QueryBuilder::<Sqlite>::new(
            "INSERT INTO messaging_messages (queue, identity, group_id, message_id, payload, attributes, priority, \
             process_at, status, attempts, seq, sent_at) ",
        );
        insert.push_values(chunk, |mut values, row| {
            values
                .push_bind(queue)
                .push_bind(&row.identity)
                .push_bind(&row.group)
                .push_bind(&row.message_id)
                .push_bind(&row.payload)
                .push_bind(&row.attributes)
                .push_bind(row.priority)
                .push_bind(row.process_at)
                .push_bind(row.status.as_str())
                .push_bind(0_i64)
                .push_bind(row.seq as i64)
                .push_bind(now);
        });
        insert.push(" RETURNING id, seq");
        let inserted: Vec<(i64, i64)> =
            insert.build_query_as().fetch_all(&mut *conn).await.map_err(|e| backend("enqueue", e))?;
        ids.extend(inserted.into_iter().map(|(id, seq)| (seq as u64, id as RowId)));
    }
    Ok(ids)
}
