//! Model-based tests of the database queues: random sequences of enqueue
//! (with and without identity, identical payloads, future process-at,
//! priority), lease, complete, fail, release, postpone, dead-letter, extend, a
//! suspect's mark of running alone and its taking back, lease expiry (counted or given back),
//! redrive and the console's retry now, delete and redrive by id
//! run against the pure state machine
//! (`machine::IdentityQueue`, the oracle) and against the real
//! PostgreSQL and SQLite stores, with the same clock, comparing every row
//! after every step.

use std::collections::HashMap;

use crate::transport::sql::machine::{Enqueue, EnqueueOutcome, IdentityQueue, QueueRules, Row, RowId, Status, Take};
use crate::transport::sql::record::Tuple;
use crate::transport::sql::statements::FifoSearch;
use crate::transport::sql::{Dialect, RowOp, SqlStore};
use crate::transport::FailedAttempt;
use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};

const LEASE_MS: i64 = 1_000;
const START: i64 = 1_800_000_000_000;

#[derive(Debug, Clone)]
enum Cmd {
    Enqueue {
        identity: Option<u8>,
        payload: u8,
        priority: i32,
        delay: Option<i64>,
        group: u8,
        via: Via,
    },
    EnqueueBatch {
        /// Identity, payload, priority, delay, group and attributes of each
        /// message: a batch's rows agree on some columns and not others.
        items: Vec<BatchItem>,
        via: Via,
    },
    Lease {
        n: usize,
        /// How far a FIFO lease looks (rows walked, groups enumerated):
        /// small bounds make it take each of its three ways.
        search: (i64, i64),
        /// The bodies' bound and the rows taken whatever it ([`Take`]):
        /// bodies of one to three bytes meet a bound of a few.
        bytes: i64,
        at_least: usize,
    },
    Complete {
        pick: usize,
    },
    Fail {
        pick: usize,
        backoff: i64,
    },
    Release {
        pick: usize,
    },
    /// Given back uncharged until a later time (a consumer that cannot read
    /// the message's version leaves it for a newer one).
    Postpone {
        pick: usize,
        delay: i64,
    },
    /// Several leases given back in one call (what a worker does when it
    /// stops), maybe naming one twice.
    ReleaseAll {
        picks: Vec<usize>,
    },
    DeadLetter {
        pick: usize,
    },
    Extend {
        pick: usize,
    },
    /// A failed attempt that the holder tries again under its lease.
    Note {
        pick: usize,
    },
    /// A suspect's handler about to run alone (then a lease expiry counts).
    Isolate {
        pick: usize,
    },
    /// That suspect's handler did not run after all (its claim held elsewhere).
    Rejoin {
        pick: usize,
    },
    Advance {
        ms: i64,
    },
    Redrive {
        pick: usize,
    },
    /// The console's operations, on a row picked among all: retry now,
    /// delete, redrive by message id.
    Console {
        pick: usize,
        op: ConsoleOp,
    },
}

#[derive(Debug, Clone, Copy)]
enum ConsoleOp {
    RetryNow,
    Delete,
    RedriveById,
}

/// How an enqueue reaches the store: by itself, or inside a transaction of
/// the caller's (`enqueue_on`, as `in_transaction` does) that commits or
/// rolls back. A rolled-back enqueue leaves the model as it was.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Via {
    Plain,
    Commit,
    Rollback,
}

fn via() -> impl Strategy<Value = Via> {
    prop_oneof![2 => Just(Via::Plain), 1 => Just(Via::Commit), 1 => Just(Via::Rollback)]
}

/// Enqueues `items` the way `via` says; one result per item.
async fn enqueue_via<D: Dialect>(
    store: &SqlStore<D>,
    queue: &str,
    now: i64,
    items: Vec<Enqueue>,
    idempotent: bool,
    via: Via,
) -> Vec<Result<crate::transport::sql::store::Enqueued, crate::error::TransportError>> {
    if via == Via::Plain {
        return store.enqueue(queue, now, items, idempotent).await;
    }
    let n = items.len();
    let mut tx = store.pool.begin_with(D::BEGIN).await.expect("begin the caller's transaction");
    let got = store.enqueue_on(&mut tx, queue, now, items, idempotent).await;
    if via == Via::Commit {
        tx.commit().await.expect("commit");
    } else {
        tx.rollback().await.expect("rollback");
    }
    match got {
        Ok(stored) => stored.into_iter().map(Ok).collect(),
        Err(e) => vec![Err(e); n],
    }
}

/// A message of a batch: identity, payload, priority, delay, group and
/// attributes (numbered).
type BatchItem = (Option<u8>, u8, i32, Option<i64>, u8, u8);

/// A message of a batch: mostly alike, so that batches both agree and
/// differ on their columns.
fn batch_item() -> impl Strategy<Value = BatchItem> {
    (
        proptest::option::of(0u8..4),
        0u8..3,
        prop_oneof![3 => Just(0i32), 1 => 1i32..3],
        proptest::option::weighted(0.25, 0i64..600),
        prop_oneof![3 => Just(0u8), 1 => 1u8..3],
        prop_oneof![3 => Just(0u8), 1 => 1u8..3],
    )
}

fn cmd() -> impl Strategy<Value = Cmd> {
    prop_oneof![
        4 => (proptest::option::weighted(0.7, 0u8..4), 0u8..3, 0i32..3, proptest::option::of(0i64..600), 0u8..3, via())
            .prop_map(|(identity, payload, priority, delay, group, via)| Cmd::Enqueue { identity, payload, priority, delay, group, via }),
        1 => (prop::collection::vec(batch_item(), 1..5), via())
            .prop_map(|(items, via)| Cmd::EnqueueBatch { items, via }),
        3 => (1usize..4, search(), prop_oneof![Just(1i64), Just(2), Just(3), Just(5), Just(i64::MAX)], 0usize..3)
            .prop_map(|(n, search, bytes, at_least)| Cmd::Lease { n, search, bytes, at_least }),
        2 => any::<usize>().prop_map(|pick| Cmd::Complete { pick }),
        1 => (any::<usize>(), 0i64..800).prop_map(|(pick, backoff)| Cmd::Fail { pick, backoff }),
        1 => any::<usize>().prop_map(|pick| Cmd::Release { pick }),
        1 => (any::<usize>(), 0i64..800).prop_map(|(pick, delay)| Cmd::Postpone { pick, delay }),
        1 => proptest::collection::vec(any::<usize>(), 1..6).prop_map(|picks| Cmd::ReleaseAll { picks }),
        1 => any::<usize>().prop_map(|pick| Cmd::DeadLetter { pick }),
        1 => any::<usize>().prop_map(|pick| Cmd::Extend { pick }),
        1 => any::<usize>().prop_map(|pick| Cmd::Note { pick }),
        1 => any::<usize>().prop_map(|pick| Cmd::Isolate { pick }),
        1 => any::<usize>().prop_map(|pick| Cmd::Rejoin { pick }),
        2 => (1i64..1_500).prop_map(|ms| Cmd::Advance { ms }),
        1 => any::<usize>().prop_map(|pick| Cmd::Redrive { pick }),
        1 => (any::<usize>(), prop_oneof![Just(ConsoleOp::RetryNow), Just(ConsoleOp::Delete), Just(ConsoleOp::RedriveById)])
            .prop_map(|(pick, op)| Cmd::Console { pick, op }),
    ]
}

/// Bounds of a FIFO lease's search ([`FifoSearch`]): none, tight, and wide.
fn search() -> impl Strategy<Value = (i64, i64)> {
    let bound = || prop_oneof![Just(0i64), Just(1), Just(2), Just(1_000)];
    (bound(), bound())
}

fn rules() -> impl Strategy<Value = QueueRules> {
    (any::<bool>(), 1u32..4, any::<bool>(), prop_oneof![Just(0i64), Just(700i64)], any::<bool>()).prop_map(
        |(idempotent, max_attempts, retry_abandoned, retention_ms, fifo)| QueueRules {
            idempotent,
            max_attempts,
            retry_abandoned,
            retention_ms,
            fifo,
        },
    )
}

/// A lease held on both sides: (model id, model token, store id, store
/// token, where the store's row was leased).
type Held = (RowId, u64, RowId, u64, Tuple);

/// The id of the row of `queue` holding message `message_id`: appended rows
/// (without identity) come back without theirs.
async fn stored_id<D: Dialect>(store: &SqlStore<D>, queue: &str, message_id: &str) -> Result<RowId, String> {
    let rows = store.rows(queue).await.map_err(|e| e.to_string())?;
    let mut found = rows.iter().filter(|r| r.message_id == message_id).map(|r| r.id);
    match (found.next(), found.next()) {
        (Some(id), None) => Ok(id),
        (None, _) => Err(format!("no row holds the appended message {message_id}")),
        (Some(_), Some(_)) => Err(format!("two rows hold the appended message {message_id}")),
    }
}

/// Runs one sequence; `Err` describes the first divergence.
async fn run_case<D: Dialect>(store: &SqlStore<D>, queue: &str, rules: QueueRules, cmds: &[Cmd]) -> Result<(), String> {
    let mut model = IdentityQueue::new(rules);
    let mut ids: HashMap<RowId, RowId> = HashMap::new();
    let mut held: Vec<Held> = Vec::new();
    let mut now = START;
    store.declare(queue, rules.fifo, now).await.map_err(|e| e.to_string())?;
    for (step, cmd) in cmds.iter().enumerate() {
        let at = |what: String| format!("step {step} {cmd:?}: {what}");
        match cmd {
            Cmd::Enqueue { identity, payload, priority, delay, group, via } => {
                let e = Enqueue {
                    identity: identity.map(|k| format!("k{k}")),
                    message_id: format!("m{step}"),
                    payload: vec![b'p'; 1 + usize::from(*payload)],
                    priority: *priority,
                    process_at: delay.map(|d| now + d),
                    status: None,
                    // Every message of a FIFO queue has a group (the transport
                    // refuses one without).
                    group: rules.fifo.then(|| format!("g{group}")),
                    attributes: String::new(),
                };
                let got = enqueue_via(store, queue, now, vec![e.clone()], rules.idempotent, *via)
                    .await
                    .remove(0)
                    .map_err(|e| at(e.to_string()))?;
                if *via == Via::Rollback {
                    continue;
                }
                let (plain, message_id) = (e.identity.is_none(), e.message_id.clone());
                let expected = model.enqueue(now, e);
                match (expected, got.outcome) {
                    (EnqueueOutcome::Inserted(m), EnqueueOutcome::Inserted(s)) => {
                        ids.insert(m, s);
                    }
                    (EnqueueOutcome::Inserted(m), EnqueueOutcome::Appended) if plain => {
                        ids.insert(m, stored_id(store, queue, &message_id).await.map_err(at)?);
                    }
                    (EnqueueOutcome::Updated(m), EnqueueOutcome::Updated(s))
                    | (EnqueueOutcome::Deferred(m), EnqueueOutcome::Deferred(s))
                    | (EnqueueOutcome::Discarded(m), EnqueueOutcome::Discarded(s)) => {
                        if ids.get(&m) != Some(&s) {
                            return Err(at(format!("row {m} is {:?} in the store, got {s}", ids.get(&m))));
                        }
                    }
                    (EnqueueOutcome::Unchanged, EnqueueOutcome::Unchanged) => {}
                    (e, g) => return Err(at(format!("model {e:?}, store {g:?}"))),
                }
            }
            Cmd::EnqueueBatch { items, via } => {
                let batch: Vec<Enqueue> = items
                    .iter()
                    .enumerate()
                    .map(|(i, (identity, payload, priority, delay, group, attributes))| Enqueue {
                        identity: identity.map(|k| format!("k{k}")),
                        // Every other batch with ids of a UUID's length,
                        // which SQLite binds packed.
                        message_id: if step % 2 == 0 {
                            format!("{:->36}", format!("m{step}.{i}"))
                        } else {
                            format!("m{step}.{i}")
                        },
                        payload: vec![b'b', *payload],
                        priority: *priority,
                        process_at: delay.map(|d| now + d),
                        status: None,
                        group: rules.fifo.then(|| format!("g{group}")),
                        attributes: if *attributes == 0 {
                            String::new()
                        } else {
                            format!("{{\"a\":\"{attributes}\"}}")
                        },
                    })
                    .collect();
                let got = enqueue_via(store, queue, now, batch.clone(), rules.idempotent, *via).await;
                if *via == Via::Rollback {
                    for g in got {
                        g.map_err(|err| at(err.to_string()))?;
                    }
                    continue;
                }
                let expected: Vec<EnqueueOutcome> = batch.iter().map(|e| model.enqueue(now, e.clone())).collect();
                for ((e, g), item) in expected.into_iter().zip(got).zip(&batch) {
                    let g = g.map_err(|err| at(err.to_string()))?;
                    // A new row or version is named by the message's own id
                    // (read before the append takes its text).
                    let new_version = matches!(
                        g.outcome,
                        EnqueueOutcome::Inserted(_)
                            | EnqueueOutcome::Appended
                            | EnqueueOutcome::Updated(_)
                            | EnqueueOutcome::Deferred(_)
                    );
                    if new_version && g.message_id.as_str() != item.message_id {
                        return Err(at(format!("batch: stored as {}, sent as {}", g.message_id, item.message_id)));
                    }
                    match (e, g.outcome) {
                        (EnqueueOutcome::Inserted(m), EnqueueOutcome::Inserted(s)) => {
                            ids.insert(m, s);
                        }
                        (EnqueueOutcome::Inserted(m), EnqueueOutcome::Appended) if item.identity.is_none() => {
                            ids.insert(m, stored_id(store, queue, &item.message_id).await.map_err(at)?);
                        }
                        (EnqueueOutcome::Updated(m), EnqueueOutcome::Updated(s))
                        | (EnqueueOutcome::Deferred(m), EnqueueOutcome::Deferred(s))
                        | (EnqueueOutcome::Discarded(m), EnqueueOutcome::Discarded(s))
                            if ids.get(&m) == Some(&s) => {}
                        (EnqueueOutcome::Unchanged, EnqueueOutcome::Unchanged) => {}
                        (e, g) => return Err(at(format!("batch: model {e:?}, store {g:?}"))),
                    }
                }
            }
            Cmd::Lease { n, search, bytes, at_least } => {
                model.purge(now);
                store.maintain(queue, now, rules).await.map_err(|e| at(e.to_string()))?;
                let take = Take { rows: *n, bytes: *bytes, at_least: *at_least };
                let expected = model.lease_taking(now, take, LEASE_MS);
                let search = rules.fifo.then_some(FifoSearch { walk: search.0, groups: search.1 });
                let got =
                    store.lease_searching(queue, now, take, LEASE_MS, search).await.map_err(|e| at(e.to_string()))?;
                let expected_ids: Vec<RowId> = expected.iter().map(|l| ids.get(&l.id).copied().unwrap_or(0)).collect();
                let got_ids: Vec<RowId> = got.iter().map(|l| l.id).collect();
                if expected_ids != got_ids {
                    return Err(at(format!("leased {got_ids:?}, expected {expected_ids:?}")));
                }
                for (m, s) in expected.iter().zip(&got) {
                    if (m.payload.as_slice(), m.attempts, m.suspect) != (s.payload.as_slice(), s.attempts, s.suspect) {
                        return Err(at(format!("lease of {} differs: {m:?} vs {s:?}", s.id)));
                    }
                    held.push((m.id, m.token, s.id, s.token, s.tuple));
                }
            }
            Cmd::Complete { pick }
            | Cmd::Fail { pick, .. }
            | Cmd::Release { pick }
            | Cmd::Postpone { pick, .. }
            | Cmd::DeadLetter { pick }
            | Cmd::Extend { pick }
            | Cmd::Note { pick }
            | Cmd::Isolate { pick }
            | Cmd::Rejoin { pick } => {
                if held.is_empty() {
                    continue;
                }
                // Settled leases stay in `held`, so stale tokens get exercised too.
                let (mid, mtok, sid, stok, tuple) = held[pick % held.len()];
                let (expected, got) = match cmd {
                    Cmd::Complete { .. } => {
                        let e = model.complete(now, mid, mtok).is_ok();
                        let g =
                            store.complete(queue, now, vec![(sid, stok, tuple)], rules.retention_ms).await.remove(0);
                        (e, g)
                    }
                    Cmd::Isolate { .. } => (model.isolate(mid, mtok).is_ok(), store.isolate(queue, sid, stok).await),
                    Cmd::Rejoin { .. } => (model.rejoin(mid, mtok).is_ok(), store.rejoin(queue, sid, stok).await),
                    _ => {
                        let op = match cmd {
                            Cmd::Fail { backoff, .. } => RowOp::Fail {
                                retry_at: now + backoff,
                                failure: FailedAttempt::new(0, "Error", "failed"),
                                max_attempts: rules.max_attempts,
                            },
                            Cmd::Release { .. } => RowOp::Release,
                            Cmd::Postpone { delay, .. } => {
                                RowOp::Postpone { retry_at: now + delay, reason: "newer".into() }
                            }
                            Cmd::DeadLetter { .. } => {
                                RowOp::DeadLetter { failure: FailedAttempt::new(0, "Error", "permanent") }
                            }
                            Cmd::Note { .. } => RowOp::Note { failure: FailedAttempt::new(0, "Error", "again") },
                            _ => RowOp::Extend { lease_ms: LEASE_MS },
                        };
                        let e = match &op {
                            RowOp::Fail { retry_at, .. } => model.fail(now, mid, mtok, *retry_at, "failed").is_ok(),
                            RowOp::Release => model.release(now, mid, mtok).is_ok(),
                            RowOp::Postpone { retry_at, .. } => {
                                model.postpone(now, mid, mtok, *retry_at, "newer").is_ok()
                            }
                            RowOp::DeadLetter { .. } => model.dead_letter(now, mid, mtok, "permanent").is_ok(),
                            RowOp::Extend { lease_ms } => model.extend(now, mid, mtok, *lease_ms).is_ok(),
                            RowOp::Note { .. } => model.note(now, mid, mtok, "again").is_ok(),
                        };
                        (e, store.apply(queue, now, sid, stok, op).await)
                    }
                };
                match (expected, got) {
                    (true, Ok(())) => {}
                    (false, Err(crate::error::TransportError::StaleReceipt)) => {}
                    (e, g) => return Err(at(format!("model ok={e}, store {g:?}"))),
                }
            }
            Cmd::ReleaseAll { picks } => {
                if held.is_empty() {
                    continue;
                }
                let picked: Vec<_> = picks.iter().map(|p| held[p % held.len()]).collect();
                let expected: Vec<bool> =
                    picked.iter().map(|&(mid, mtok, _, _, _)| model.release(now, mid, mtok).is_ok()).collect();
                let items: Vec<(RowId, u64)> = picked.iter().map(|&(_, _, sid, stok, _)| (sid, stok)).collect();
                let got = store.apply_all(queue, now, &items, &RowOp::Release).await.map_err(|e| at(e.to_string()))?;
                let got: Vec<Option<bool>> = got
                    .iter()
                    .map(|r| match r {
                        Ok(()) => Some(true),
                        Err(crate::error::TransportError::StaleReceipt) => Some(false),
                        Err(_) => None,
                    })
                    .collect();
                if got != expected.iter().map(|&e| Some(e)).collect::<Vec<_>>() {
                    return Err(at(format!("release of {items:?}: model {expected:?}, store {got:?}")));
                }
            }
            Cmd::Advance { ms } => now += ms,
            Cmd::Redrive { pick } => {
                let errors: Vec<RowId> = model.rows().filter(|r| r.status == Status::Error).map(|r| r.id).collect();
                if errors.is_empty() {
                    continue;
                }
                let mid = errors[pick % errors.len()];
                model.redrive(mid);
                let sid = ids.get(&mid).copied().unwrap_or(0);
                let moved = store.redrive(queue, vec![sid]).await.map_err(|e| at(e.to_string()))?;
                if moved != 1 {
                    return Err(at(format!("redrive moved {moved}")));
                }
            }
            Cmd::Console { pick, op } => {
                let all: Vec<(RowId, String)> = model.rows().map(|r| (r.id, r.message_id.clone())).collect();
                if all.is_empty() {
                    continue;
                }
                let (mid, message_id) = all[pick % all.len()].clone();
                let (expected, got) = match op {
                    ConsoleOp::RetryNow => (model.retry_now(mid), store.retry_now(queue, &[&message_id]).await),
                    ConsoleOp::Delete => (model.delete(mid), store.delete_waiting(queue, &[&message_id]).await),
                    ConsoleOp::RedriveById => {
                        let rows = store.dead_rows(queue, &[&message_id]).await.map_err(|e| at(e.to_string()))?;
                        (model.redrive(mid), store.redrive(queue, rows).await)
                    }
                };
                let got = got.map_err(|e| at(e.to_string()))?;
                if usize::from(expected) != got {
                    return Err(at(format!("model changed {expected}, the store {got} row(s)")));
                }
            }
        }
        compare(store, queue, &model, &ids, now).await.map_err(at)?;
    }
    Ok(())
}

/// A status as seen from outside: a due sleeper is as good as pending (the
/// store wakes sleepers eagerly, the model when it leases).
fn seen(row: &Row, now: i64) -> Status {
    match row.status {
        Status::Sleeping if row.process_at.is_none_or(|at| at <= now) => Status::Pending,
        s => s,
    }
}

async fn compare<D: Dialect>(
    store: &SqlStore<D>,
    queue: &str,
    model: &IdentityQueue,
    ids: &HashMap<RowId, RowId>,
    now: i64,
) -> Result<(), String> {
    let rows: HashMap<RowId, Row> =
        store.rows(queue).await.map_err(|e| e.to_string())?.into_iter().map(|r| (r.id, r)).collect();
    // Every enqueue draws its rows' sequence values from the counter: an
    // enqueue that forgot to move it would repeat values (ties that the row
    // id breaks, so the leases alone would not tell).
    let mut seqs = std::collections::HashSet::new();
    if let Some(twice) = rows.values().find(|r| !seqs.insert(r.seq)) {
        return Err(format!("two rows hold sequence value {}", twice.seq));
    }
    let expected: Vec<&Row> = model.rows().collect();
    if rows.len() != expected.len() {
        return Err(format!("{} rows in the store, {} in the model", rows.len(), expected.len()));
    }
    for m in expected {
        let sid = ids.get(&m.id).copied().unwrap_or(0);
        let Some(s) = rows.get(&sid) else { return Err(format!("row {} ({sid}) missing in the store", m.id)) };
        let view = |r: &Row| {
            (
                r.identity.clone(),
                seen(r, now),
                (r.message_id.clone(), r.group.clone(), r.attributes.clone()),
                r.payload.clone(),
                r.priority,
                r.attempts,
                r.lease_expires,
                r.deferred.as_ref().map(|d| (d.payload.clone(), d.priority, d.process_at)),
                r.error.clone(),
                r.history.iter().map(|a| (a.attempt, a.at_ms, a.message.clone())).collect::<Vec<_>>(),
                r.lease_token.is_some(),
                r.suspect,
            )
        };
        if view(m) != view(s) {
            return Err(format!("row {} differs:\n  model {:?}\n  store {:?}", m.id, view(m), view(s)));
        }
        if m.status == Status::Sleeping && seen(m, now) == Status::Sleeping && m.process_at != s.process_at {
            return Err(format!("row {}: process_at {:?} vs {:?}", m.id, m.process_at, s.process_at));
        }
        if let Some(k) = &m.identity {
            let previous = store.previous(queue, k).await.map_err(|e| e.to_string())?;
            if previous.as_deref() != model.previous(k) {
                return Err(format!("previous of {k}: model {:?}, store {previous:?}", model.previous(k)));
            }
        }
    }
    Ok(())
}

fn check<D: Dialect>(store: SqlStore<D>, runtime: &tokio::runtime::Runtime, label: &str) {
    runtime.block_on(store.migrate()).expect("migrate");
    let mut runner = TestRunner::new(Config { cases: 96, failure_persistence: None, ..Config::default() });
    let case = std::sync::atomic::AtomicUsize::new(0);
    let result = runner.run(&(rules(), prop::collection::vec(cmd(), 1..40)), |(rules, cmds)| {
        let n = case.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        let queue = format!("model-{n}");
        runtime
            .block_on(run_case(&store, &queue, rules, &cmds))
            .map_err(|e| TestCaseError::fail(format!("{rules:?}\n{e}")))
    });
    if let Err(e) = result {
        panic!("{label}: the store diverged from the model: {e}");
    }
}

#[cfg(feature = "postgres")]
#[test]
fn postgres_follows_the_model() {
    let runtime = super::runtime();
    let db = super::Postgres::new();
    let store = runtime.block_on(crate::transport::sql::postgres::PostgresStore::connect(&db.url)).expect("connect");
    check(store, &runtime, "postgres");
    drop(db);
}

#[cfg(feature = "sqlite")]
#[test]
fn sqlite_follows_the_model() {
    let runtime = super::runtime();
    let file = super::SqliteFile::new();
    let store = runtime.block_on(crate::transport::sql::sqlite::SqliteStore::connect(&file.url)).expect("connect");
    check(store, &runtime, "sqlite");
}

/// On an idempotent queue, re-sending the version that was processed (its row
/// deleted at once, retention 0) is discarded; a changed version runs.
async fn an_unchanged_version_is_not_handled_again<D: Dialect>(store: &SqlStore<D>) {
    store.migrate().await.expect("migrate");
    store.declare("nightly", false, START).await.expect("declare");
    let version = |payload: &str| Enqueue::test(&format!("m-{payload}-{START}"), Some("customer-7"), payload);
    let send = |payload: &str| store.enqueue("nightly", START, vec![version(payload)], true);
    assert!(matches!(send("v1").await.remove(0).expect("enqueue").outcome, EnqueueOutcome::Inserted(_)));
    let leased = store.lease("nightly", START, 1, 30_000, false).await.expect("lease").remove(0);
    store.complete("nightly", START + 1, vec![leased.held()], 0).await.remove(0).expect("complete");
    assert!(store.rows("nightly").await.expect("rows").is_empty(), "processed rows are deleted");
    let again = send("v1").await.remove(0).expect("enqueue");
    assert_eq!(again.outcome, EnqueueOutcome::Unchanged, "the processed version again");
    assert_eq!(again.message_id.as_str(), leased.message_id, "named by the processed version's id");
    assert!(store.lease("nightly", START + 2, 1, 30_000, false).await.expect("lease").is_empty(), "nothing to handle");
    assert!(matches!(send("v2").await.remove(0).expect("enqueue").outcome, EnqueueOutcome::Inserted(_)));
}

#[cfg(feature = "postgres")]
#[test]
fn postgres_discards_an_unchanged_version_after_processing() {
    let runtime = super::runtime();
    let db = super::Postgres::new();
    runtime.block_on(async {
        let store = crate::transport::sql::postgres::PostgresStore::connect(&db.url).await.expect("connect");
        an_unchanged_version_is_not_handled_again(&store).await;
    });
    drop(db);
}

#[cfg(feature = "sqlite")]
#[test]
fn sqlite_discards_an_unchanged_version_after_processing() {
    let runtime = super::runtime();
    let file = super::SqliteFile::new();
    runtime.block_on(async {
        let store = crate::transport::sql::sqlite::SqliteStore::connect(&file.url).await.expect("connect");
        an_unchanged_version_is_not_handled_again(&store).await;
    });
}

/// PostgreSQL leases a standard queue in two partitions at once: each lease
/// takes only its partition's rows, in priority then enqueue order, and two
/// concurrent partition leases never return the same row.
#[cfg(feature = "postgres")]
#[test]
fn postgres_partition_leases_split_the_queue_in_order() {
    let runtime = super::runtime();
    let db = super::Postgres::new();
    runtime.block_on(async {
        let store = crate::transport::sql::postgres::PostgresStore::connect(&db.url).await.expect("connect");
        store.migrate().await.expect("migrate");
        assert_eq!(<sqlx::Postgres as Dialect>::CONCURRENT_LEASES, 2);
        store.declare("parts", false, START).await.expect("declare");
        let items: Vec<Enqueue> = (0..40)
            .map(|n| Enqueue {
                payload: vec![n as u8],
                priority: if n % 5 == 0 { 1 } else { 0 },
                ..Enqueue::test(&format!("m{n}"), None, "")
            })
            .collect();
        for result in store.enqueue("parts", START, items, false).await {
            result.expect("enqueued");
        }
        let (even, odd) = tokio::join!(
            sqlx::Postgres::lease(&store, "parts", START, Take::rows(100), 30_000, None, Some((0, 2))),
            sqlx::Postgres::lease(&store, "parts", START, Take::rows(100), 30_000, None, Some((1, 2))),
        );
        let (even, odd) = (even.expect("lease"), odd.expect("lease"));
        assert_eq!(even.len() + odd.len(), 40, "together the partitions are the whole queue");
        assert!(even.iter().all(|r| r.id % 2 == 0) && odd.iter().all(|r| r.id % 2 == 1));
        for part in [&even, &odd] {
            // Priority first, then enqueue order (message ids m0, m1, ... follow it).
            let order: Vec<(bool, u32)> = part
                .iter()
                .map(|r| {
                    let n: u32 = r.message_id[1..].parse().expect("m<n>");
                    (n % 5 != 0, n)
                })
                .collect();
            let mut sorted = order.clone();
            sorted.sort();
            assert_eq!(order, sorted, "priority then enqueue order within a partition");
        }
        assert!(store.lease("parts", START, 100, 30_000, false).await.expect("lease").is_empty());
    });
    drop(db);
}

/// A batch that finds no row for an identity which another transaction is
/// inserting at the same moment: its insert waits for that commit, skips the
/// identity, and replays the batch's versions onto the other's row, as one
/// enqueue at a time would (the path no single-process test reaches).
#[cfg(feature = "postgres")]
#[test]
fn postgres_a_batch_meets_an_identity_inserted_meanwhile() {
    let runtime = super::runtime();
    let db = super::Postgres::new();
    runtime.block_on(async {
        let store = crate::transport::sql::postgres::PostgresStore::connect(&db.url).await.expect("connect");
        store.migrate().await.expect("migrate");
        store.declare("accounts", false, START).await.expect("declare");
        let version = |id: &str, identity: &str| Enqueue::test(id, Some(identity), id);
        // The other process: `acct-1` inserted, not yet committed.
        let mut theirs = store.pool.begin().await.expect("begin");
        let first = store.enqueue_on(&mut theirs, "accounts", START, vec![version("a", "acct-1")], false).await;
        let EnqueueOutcome::Inserted(row) = first.expect("enqueue")[0].outcome else { panic!("a new row") };
        let batch = vec![version("b", "acct-1"), version("c", "acct-2"), version("d", "acct-1")];
        let ours = tokio::spawn({
            let store = store.clone();
            async move { store.enqueue("accounts", START, batch, false).await }
        });
        // Long enough for the batch to read no row and wait in its insert.
        tokio::time::sleep(std::time::Duration::from_millis(300)).await;
        assert!(!ours.is_finished(), "the batch waits for the other transaction");
        theirs.commit().await.expect("commit");
        let got: Vec<_> = ours.await.expect("join").into_iter().map(|r| r.expect("enqueue")).collect();
        assert_eq!(got[0].outcome, EnqueueOutcome::Updated(row), "onto their row");
        assert!(matches!(got[1].outcome, EnqueueOutcome::Inserted(r) if r != row), "{:?}", got[1]);
        assert_eq!(got[2].outcome, EnqueueOutcome::Updated(row));
        assert_eq!((got[0].message_id.as_str(), got[2].message_id.as_str()), ("b", "d"));
        let rows = store.rows("accounts").await.expect("rows");
        let acct1 = rows.iter().find(|r| r.id == row).expect("their row");
        assert_eq!((acct1.message_id.as_str(), acct1.payload.as_slice()), ("d", &b"d"[..]), "the last version");
        assert_eq!(rows.len(), 2);
    });
    drop(db);
}
