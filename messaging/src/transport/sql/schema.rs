//! Startup checks of the SQL schema: the tables exist with the expected
//! columns, and a queue keeps its declared kind.

use crate::error::TransportError;

/// The tables and columns the transport and the idempotency store use (the
/// message columns as the statements list them).
const EXPECTED: &[(&str, &str)] = &[
    ("messaging_queues", "name, fifo, created_at, paused"),
    ("messaging_messages", concat!("queue, ", super::statements::columns!())),
    ("messaging_previous", "queue, identity, message_id, payload, processed_at"),
    ("messaging_idempotency", "message_id, scope, processor_id, lease_expires_at, completed, completed_at"),
    (
        "messaging_schedules",
        "name, last_tick, last_published, paused, claim_tick, claim_token, claim_expires, updated_at",
    ),
];

/// Compares the columns found per table with [`EXPECTED`], and the step of
/// `messaging_seq` (`None`: no sequence found) with the least this version
/// needs, where the database has the sequence.
pub(crate) fn compare(
    system: &str,
    found: &[(String, String)],
    step: Option<(Option<i64>, i64)>,
) -> Result<(), TransportError> {
    if EXPECTED.iter().all(|(table, _)| found.iter().all(|(t, _)| t != table)) {
        let tables: Vec<String> = EXPECTED.iter().map(|(table, _)| format!("`{table}`")).collect();
        return Err(TransportError::Backend(format!(
            "the {system} database has none of the framework's tables ({}; a new database?): run the `migrate` \
             command (or connect with `?migrate=true`), or create the tables as documented in the README",
            tables.join(", ")
        )));
    }
    let mut problems = Vec::new();
    for (table, columns) in EXPECTED {
        let present: Vec<&str> = found.iter().filter(|(t, _)| t == table).map(|(_, c)| c.as_str()).collect();
        if present.is_empty() {
            problems.push(format!("table `{table}` is missing"));
            continue;
        }
        let missing: Vec<&str> = columns.split(", ").filter(|c| !present.contains(c)).collect();
        if !missing.is_empty() {
            problems.push(format!("table `{table}` lacks column(s) {}", missing.join(", ")));
        }
    }
    match step {
        Some((None, _)) => problems.push("sequence `messaging_seq` is missing".to_owned()),
        Some((Some(step), least)) if step < least => problems.push(format!(
            "sequence `messaging_seq` draws blocks of {step} value(s), where this version numbers up to {least} \
             rows from one draw (migration 20261210000001_seq_blocks.sql: `ALTER SEQUENCE messaging_seq \
             INCREMENT BY {least}`)"
        )),
        _ => {}
    }
    if problems.is_empty() {
        Ok(())
    } else {
        Err(TransportError::Backend(format!(
            "the {system} schema is not ready: {}; run the `migrate` command (or connect with `?migrate=true`), \
             or create the tables as documented in the README",
            problems.join("; ")
        )))
    }
}

/// A queue exists with the other kind.
pub(crate) fn check_kind(queue: &str, declared_fifo: bool, stored_fifo: bool) -> Result<(), TransportError> {
    if declared_fifo == stored_fifo {
        return Ok(());
    }
    let kind = |fifo: bool| if fifo { "FIFO" } else { "standard" };
    Err(TransportError::Rejected(format!(
        "queue `{queue}` exists as a {} queue but is declared {}; rename one of them",
        kind(stored_fifo),
        kind(declared_fifo)
    )))
}
