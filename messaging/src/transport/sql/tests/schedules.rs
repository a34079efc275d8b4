//! Model-based test of the schedules' ledger: random sequences of row
//! creation, claims (`begin`) at a moving clock, finishes that write a
//! message (or nothing, or fail half-way), skips, releases and pauses, run
//! against the pure [`LedgerRow`] (the oracle) and against the SQL ledger on
//! PostgreSQL and SQLite, comparing every answer, every row and the messages
//! written after every step. A finish whose write fails must leave neither
//! its message nor a change of the row.

use std::any::Any;
use std::collections::BTreeMap;

use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};

use crate::boxed::BoxFuture;
use crate::error::{PublishError, TransportError};
use crate::transport::schedules::{Finish, LedgerRow, ScheduleLedger, TickWriter};
use crate::transport::sql::machine::Enqueue;
use crate::transport::sql::schedules::SqlLedger;
use crate::transport::sql::{Dialect, SqlStore};
use crate::transport::MessageId;

const START: i64 = 1_800_000_000_000;
const NAMES: [&str; 2] = ["nightly", "hourly"];

#[derive(Debug, Clone, Copy)]
enum Write {
    Nothing,
    Message,
    /// Writes the message, then fails: the transaction rolls back.
    FailsAfterWriting,
}

#[derive(Debug, Clone)]
enum Cmd {
    Row {
        name: usize,
        baseline: i64,
    },
    Begin {
        name: usize,
        tick: i64,
        token: i64,
        lease: i64,
    },
    /// `own`: the tick and token of the row's claim, when it has one (a
    /// random pair would rarely hold it).
    Finish {
        name: usize,
        own: bool,
        tick: i64,
        token: i64,
        write: Write,
    },
    Skip {
        name: usize,
        through: i64,
    },
    Release {
        name: usize,
        token: i64,
    },
    Pause {
        name: usize,
        paused: bool,
    },
    Advance {
        ms: i64,
    },
}

fn cmd() -> impl Strategy<Value = Cmd> {
    let name = 0..NAMES.len();
    let tick = (0..8i64).prop_map(|t| START + t * 1_000);
    let token = 1..4i64;
    let write = prop_oneof![Just(Write::Nothing), Just(Write::Message), Just(Write::FailsAfterWriting)];
    prop_oneof![
        1 => (name.clone(), tick.clone()).prop_map(|(name, baseline)| Cmd::Row { name, baseline }),
        3 => (name.clone(), tick.clone(), token.clone(), 1..3_000i64)
            .prop_map(|(name, tick, token, lease)| Cmd::Begin { name, tick, token, lease }),
        3 => (name.clone(), prop::bool::weighted(0.75), tick.clone(), token.clone(), write)
            .prop_map(|(name, own, tick, token, write)| Cmd::Finish { name, own, tick, token, write }),
        1 => (name.clone(), tick).prop_map(|(name, through)| Cmd::Skip { name, through }),
        1 => (name.clone(), token).prop_map(|(name, token)| Cmd::Release { name, token }),
        1 => (name, any::<bool>()).prop_map(|(name, paused)| Cmd::Pause { name, paused }),
        1 => (0..2_000i64).prop_map(|ms| Cmd::Advance { ms }),
    ]
}

/// Enqueues one message on the ledger's transaction, and maybe fails after.
struct TestWriter<D: Dialect> {
    store: SqlStore<D>,
    queue: String,
    fail: bool,
}

impl<D: Dialect> TickWriter for TestWriter<D> {
    fn write<'c>(
        &'c self,
        conn: Option<&'c mut (dyn Any + Send)>,
    ) -> BoxFuture<'c, Result<Vec<MessageId>, PublishError>> {
        Box::pin(async move {
            let conn = conn.and_then(|c| c.downcast_mut::<D::Connection>()).ok_or_else(|| {
                PublishError::Transport(TransportError::Backend("the ledger gave no transaction".into()))
            })?;
            let message = Enqueue {
                identity: None,
                message_id: MessageId::random().to_string(),
                payload: b"{}".to_vec(),
                priority: 0,
                process_at: None,
                status: None,
                group: None,
                attributes: String::new(),
            };
            let stored = self.store.enqueue_on(conn, &self.queue, START, vec![message], false).await?;
            if self.fail {
                return Err(PublishError::Transport(TransportError::Backend("the broker said no".into())));
            }
            Ok(stored.into_iter().map(|e| e.message_id).collect())
        })
    }
}

async fn run_case<D: Dialect>(store: &SqlStore<D>, case: usize, cmds: &[Cmd]) -> Result<(), String> {
    let ledger = SqlLedger::on(store);
    // Names of this case, so that cases share the tables without meeting.
    let names: Vec<String> = NAMES.iter().map(|n| format!("{n}-{case}")).collect();
    let queue = format!("ledger-model-{case}");
    store.declare(&queue, false, START).await.map_err(|e| e.to_string())?;
    let mut model: BTreeMap<String, LedgerRow> = BTreeMap::new();
    let mut messages = 0usize;
    let mut now = START;
    for (step, cmd) in cmds.iter().enumerate() {
        let at = |what: String| format!("step {step} {cmd:?}: {what}");
        match *cmd {
            Cmd::Row { name, baseline } => {
                let expected = *model.entry(names[name].clone()).or_insert_with(|| LedgerRow::new(baseline));
                let got = ledger.row(&names[name], baseline).await.map_err(|e| at(e.to_string()))?;
                if got != expected {
                    return Err(at(format!("row: model {expected:?}, ledger {got:?}")));
                }
            }
            Cmd::Begin { name, tick, token, lease } => {
                let expected = model.get_mut(&names[name]).map(|r| r.begin(tick, token, now, lease));
                let got = ledger.begin_at(&names[name], tick, token, now, lease).await;
                match (expected, got) {
                    (Some(e), Ok(g)) if e == g => {}
                    (None, Err(_)) => {}
                    (e, g) => return Err(at(format!("begin: model {e:?}, ledger {g:?}"))),
                }
            }
            Cmd::Finish { name, own, tick, token, write } => {
                let claim = model.get(&names[name]).and_then(|r| r.claim).filter(|_| own);
                let (tick, token) = claim.map_or((tick, token), |c| (c.tick_ms, c.token));
                let writer = TestWriter {
                    store: store.clone(),
                    queue: queue.clone(),
                    fail: matches!(write, Write::FailsAfterWriting),
                };
                let writer = (!matches!(write, Write::Nothing)).then_some(&writer as &dyn TickWriter);
                let holds = model.get(&names[name]).map(|r| r.holds(tick, token));
                let got = ledger.finish(&names[name], tick, token, writer).await;
                match (holds, write, got) {
                    (None, _, Err(_)) => {}
                    (Some(false), _, Ok(Finish::Lost)) => {}
                    (Some(true), Write::FailsAfterWriting, Err(_)) => {}
                    (Some(true), Write::Nothing, Ok(Finish::Done(ids))) if ids.is_empty() => {
                        model.get_mut(&names[name]).map(|r| r.finish(tick, token, false));
                    }
                    (Some(true), Write::Message, Ok(Finish::Done(ids))) if ids.len() == 1 => {
                        model.get_mut(&names[name]).map(|r| r.finish(tick, token, true));
                        messages += 1;
                    }
                    (holds, _, got) => return Err(at(format!("finish: model holds {holds:?}, ledger {got:?}"))),
                }
            }
            Cmd::Skip { name, through } => {
                let expected = model.get_mut(&names[name]).map(|r| r.skip(through));
                let got = ledger.skip(&names[name], through).await;
                match (expected, got) {
                    (Some(e), Ok(g)) if e == g => {}
                    (None, Err(_)) => {}
                    (e, g) => return Err(at(format!("skip: model {e:?}, ledger {g:?}"))),
                }
            }
            Cmd::Release { name, token } => {
                let expected = model.get_mut(&names[name]).map(|r| r.release(token));
                let got = ledger.release(&names[name], token).await;
                match (expected, got) {
                    (Some(e), Ok(g)) if e == g => {}
                    (None, Err(_)) => {}
                    (e, g) => return Err(at(format!("release: model {e:?}, ledger {g:?}"))),
                }
            }
            Cmd::Pause { name, paused } => {
                let expected = model.get_mut(&names[name]).map(|r| r.paused = paused).is_some();
                let got = ledger.set_paused(&names[name], paused).await.map_err(|e| at(e.to_string()))?;
                if got != expected {
                    return Err(at(format!("pause: model found {expected}, ledger {got}")));
                }
            }
            Cmd::Advance { ms } => now += ms,
        }
        let rows: BTreeMap<String, LedgerRow> = ledger
            .rows()
            .await
            .map_err(|e| at(e.to_string()))?
            .into_iter()
            .filter(|(n, _)| names.contains(n))
            .collect();
        if rows != model {
            return Err(at(format!("rows: model {model:?}, ledger {rows:?}")));
        }
        let written = store.rows(&queue).await.map_err(|e| at(e.to_string()))?.len();
        if written != messages {
            return Err(at(format!("messages: {messages} finished with one, {written} in the queue")));
        }
    }
    Ok(())
}

fn check<D: Dialect>(store: SqlStore<D>, runtime: &tokio::runtime::Runtime, label: &str) {
    runtime.block_on(store.migrate()).expect("migrate");
    let mut runner = TestRunner::new(Config { cases: 64, failure_persistence: None, ..Config::default() });
    let case = std::sync::atomic::AtomicUsize::new(0);
    let result = runner.run(&prop::collection::vec(cmd(), 1..40), |cmds| {
        let n = case.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        runtime.block_on(run_case(&store, n, &cmds)).map_err(TestCaseError::fail)
    });
    if let Err(e) = result {
        panic!("{label}: the ledger diverged from the model: {e}");
    }
}

#[cfg(feature = "postgres")]
#[test]
fn postgres_ledger_follows_the_model() {
    let runtime = super::runtime();
    let db = super::Postgres::new();
    let store = runtime.block_on(crate::transport::sql::postgres::PostgresStore::connect(&db.url)).expect("connect");
    check(store, &runtime, "postgres");
    drop(db);
}

#[cfg(feature = "sqlite")]
#[test]
fn sqlite_ledger_follows_the_model() {
    let runtime = super::runtime();
    let file = super::SqliteFile::new();
    let store = runtime.block_on(crate::transport::sql::sqlite::SqliteStore::connect(&file.url)).expect("connect");
    check(store, &runtime, "sqlite");
}
