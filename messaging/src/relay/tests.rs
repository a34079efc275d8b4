//! The relay against real outboxes (PostgreSQL and SQLite) and a recording
//! broker: two relays send every row once and keep each FIFO group's order
//! through transient failures; a refused row is set aside and its group goes
//! on; a relay that dies after the broker accepted a batch leaves rows that
//! the next relay sends again with the same deduplication id and message id.

#![allow(clippy::unwrap_used)] // tests: a failed step is a failed test

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use sqlx::Pool;

use super::Relay;
use crate::boxed::BoxFuture;
use crate::error::TransportError;
use crate::queue::QueueSpec;
use crate::shutdown::Shutdown;
use crate::transport::schedules::ScheduleLedger;
use crate::transport::sql::Dialect;
use crate::transport::{
    Claimed, Delivery, FailedOutboxRow, MessageId, Outbox, OutboxQueue, OutboxStore, OutboxWrite, Outgoing, Receipt,
    Settle, Transport,
};

/// One message a broker accepted.
#[derive(Debug, Clone)]
struct Accepted {
    relay: &'static str,
    queue: String,
    message_id: String,
    group: Option<String>,
    dedup: Option<String>,
    n: u32,
}

/// What a broker does with a batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// Accepts it (refusing bodies that hold `poison`), failing every k-th batch
    /// with a transient error (0: never).
    Accept { fail_every: usize },
    /// Accepts it, then never answers (the relay's process dies meanwhile).
    AcceptThenHang,
}

/// A transport that records what it accepts into a log shared by brokers.
struct Broker {
    relay: &'static str,
    log: Arc<Mutex<Vec<Accepted>>>,
    batches: AtomicUsize,
    mode: Mode,
}

impl Broker {
    fn new(relay: &'static str, log: &Arc<Mutex<Vec<Accepted>>>, mode: Mode) -> Arc<Broker> {
        Arc::new(Broker { relay, log: log.clone(), batches: AtomicUsize::new(0), mode })
    }
}

fn number(body: &[u8]) -> u32 {
    std::str::from_utf8(body).ok().and_then(|s| s.trim_start_matches("poison").parse().ok()).unwrap_or(u32::MAX)
}

impl Transport for Broker {
    fn system(&self) -> &'static str {
        "broker"
    }

    fn declare<'a>(&'a self, _: &'a QueueSpec) -> BoxFuture<'a, Result<(), TransportError>> {
        Box::pin(async { Ok(()) })
    }

    fn send<'a>(&'a self, queue: &'a str, message: Outgoing) -> BoxFuture<'a, Result<MessageId, TransportError>> {
        Box::pin(async move { self.send_batch(queue, vec![message]).await.pop().unwrap() })
    }

    fn send_batch<'a>(
        &'a self,
        queue: &'a str,
        messages: Vec<Outgoing>,
    ) -> BoxFuture<'a, Vec<Result<MessageId, TransportError>>> {
        Box::pin(async move {
            tokio::time::sleep(Duration::from_millis(2)).await;
            let k = self.batches.fetch_add(1, Ordering::SeqCst) + 1;
            if let Mode::Accept { fail_every } = self.mode {
                if fail_every > 0 && k % fail_every == 0 {
                    return messages
                        .iter()
                        .map(|_| Err(TransportError::Backend("the broker is away".into())))
                        .collect();
                }
            }
            let mut results = Vec::new();
            for m in &messages {
                if m.body.starts_with(b"poison") {
                    results.push(Err(TransportError::Rejected("poison is refused".into())));
                    continue;
                }
                self.log.lock().unwrap().push(Accepted {
                    relay: self.relay,
                    queue: queue.to_owned(),
                    message_id: m.attributes.get(crate::transport::MESSAGE_ID_ATTRIBUTE).cloned().unwrap_or_default(),
                    group: m.group_id.clone(),
                    dedup: m.dedup_id.clone(),
                    n: number(&m.body),
                });
                results.push(Ok(MessageId::random()));
            }
            if self.mode == Mode::AcceptThenHang {
                std::future::pending::<()>().await;
            }
            results
        })
    }

    fn receive<'a>(
        &'a self,
        _: &'a str,
        _: usize,
        _: Duration,
    ) -> BoxFuture<'a, Result<Vec<Delivery>, TransportError>> {
        Box::pin(async { Ok(Vec::new()) })
    }

    fn ack<'a>(&'a self, _: &'a str, receipts: Vec<Receipt>) -> BoxFuture<'a, Vec<Result<(), TransportError>>> {
        Box::pin(async move { receipts.iter().map(|_| Ok(())).collect() })
    }

    fn nack<'a>(&'a self, _: &'a str, _: Receipt, _: Duration) -> BoxFuture<'a, Result<(), TransportError>> {
        Box::pin(async { Ok(()) })
    }

    fn extend<'a>(&'a self, _: &'a str, _: &'a Receipt, _: Duration) -> BoxFuture<'a, Result<(), TransportError>> {
        Box::pin(async { Ok(()) })
    }

    fn depth<'a>(&'a self, _: &'a str) -> BoxFuture<'a, Result<u64, TransportError>> {
        Box::pin(async { Ok(0) })
    }
}

const FIFO: &str = "relay-test.fifo";
const STANDARD: &str = "relay-test";

/// A row of `queue` (FIFO rows in `group`) whose body is `body`.
fn row(queue: &'static str, group: Option<&str>, body: String) -> OutboxWrite {
    OutboxWrite {
        queue,
        fifo: queue == FIFO,
        outgoing: Outgoing { body: body.into(), group_id: group.map(str::to_owned), ..Outgoing::default() },
    }
}

/// Writes `rows` in one committed transaction of `pool`.
async fn write<D: Dialect>(outbox: &Outbox, pool: &Pool<D>, rows: Vec<OutboxWrite>) -> Vec<MessageId> {
    let mut tx = pool.begin().await.unwrap();
    let ids = outbox.store.write(&mut *tx, rows).await.unwrap();
    tx.commit().await.unwrap();
    ids
}

fn relay(outbox: &Outbox, broker: &Arc<Broker>, lease: Duration) -> Relay {
    Relay { outbox: outbox.clone(), transport: broker.clone(), queues: vec![FIFO, STANDARD], lease }
}

async fn pending(outbox: &Outbox) -> u64 {
    outbox.stats().await.unwrap().iter().map(|q| q.pending).sum()
}

async fn until_empty(outbox: &Outbox, within: Duration) {
    let deadline = tokio::time::Instant::now() + within;
    while pending(outbox).await > 0 {
        assert!(tokio::time::Instant::now() < deadline, "rows left in the outbox: {:?}", outbox.stats().await);
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Each FIFO group's accepted numbers, in acceptance order, rise.
fn assert_group_order(log: &[Accepted]) {
    let mut last: HashMap<&str, u32> = HashMap::new();
    for a in log.iter().filter(|a| a.queue == FIFO) {
        let group = a.group.as_deref().unwrap();
        if let Some(&before) = last.get(group) {
            assert!(a.n > before, "group {group}: {} after {before}", a.n);
        }
        last.insert(group, a.n);
    }
}

async fn two_relays_send_every_row_once_in_order<D: Dialect>(outbox: Outbox, pool: Pool<D>) {
    let mut written = Vec::new();
    for t in 0..4u32 {
        let rows = (0..100u32)
            .map(|i| {
                let n = t * 100 + i;
                if i % 4 == 3 {
                    row(STANDARD, None, n.to_string())
                } else {
                    row(FIFO, Some(&format!("g{}", i % 3)), n.to_string())
                }
            })
            .collect();
        written.extend(write(&outbox, &pool, rows).await);
    }
    let log = Arc::new(Mutex::new(Vec::new()));
    let stop = Shutdown::new();
    let a = tokio::spawn(
        relay(&outbox, &Broker::new("a", &log, Mode::Accept { fail_every: 7 }), Duration::from_secs(5))
            .run(stop.clone()),
    );
    let b = tokio::spawn(
        relay(&outbox, &Broker::new("b", &log, Mode::Accept { fail_every: 5 }), Duration::from_secs(5))
            .run(stop.clone()),
    );
    until_empty(&outbox, Duration::from_secs(60)).await;
    stop.trigger();
    a.await.unwrap();
    b.await.unwrap();
    let log = log.lock().unwrap().clone();
    assert_eq!(log.len(), 400, "every row accepted once");
    let ids: HashSet<&str> = log.iter().map(|a| a.message_id.as_str()).collect();
    let expected: HashSet<&str> = written.iter().map(MessageId::as_str).collect();
    assert_eq!(ids, expected, "each accepted under the id its publish returned");
    assert!(log.iter().any(|a| a.relay == "a") && log.iter().any(|a| a.relay == "b"), "both relays sent");
    assert_group_order(&log);
    for a in log.iter().filter(|a| a.queue == FIFO) {
        assert_eq!(a.dedup.as_deref(), Some(a.message_id.as_str()), "a FIFO message is deduplicated by its id");
    }
    assert!(log.iter().filter(|a| a.queue == STANDARD).all(|a| a.dedup.is_none()));
}

async fn a_refused_row_is_set_aside_and_its_group_goes_on<D: Dialect>(outbox: Outbox, pool: Pool<D>) {
    let rows = vec![
        row(FIFO, Some("g"), "1".into()),
        row(FIFO, Some("g"), "poison2".into()),
        row(FIFO, Some("g"), "3".into()),
    ];
    let ids = write(&outbox, &pool, rows).await;
    let log = Arc::new(Mutex::new(Vec::new()));
    let relay = relay(&outbox, &Broker::new("a", &log, Mode::Accept { fail_every: 0 }), Duration::from_secs(5));
    relay.round(FIFO).await.unwrap();
    let sent: Vec<u32> = log.lock().unwrap().iter().map(|a| a.n).collect();
    assert_eq!(sent, [1, 3], "the group goes on past the refused row");
    let stats = outbox.stats().await.unwrap();
    assert_eq!((stats[0].pending, stats[0].failed), (0, 1), "{stats:?}");
    let failed = outbox.failed(10).await.unwrap();
    assert_eq!(failed.len(), 1);
    assert_eq!(failed[0].message_id, ids[1].as_str());
    assert!(failed[0].error.as_deref().unwrap_or("").contains("poison is refused"), "{failed:?}");
    assert_eq!(outbox.retry_failed(Some("another-queue")).await.unwrap(), 0);
    assert_eq!(outbox.retry_failed(None).await.unwrap(), 1);
    assert_eq!(pending(&outbox).await, 1, "pending again");
}

async fn a_relay_that_dies_after_the_broker_accepted_leaves_the_rows_to_the_next<D: Dialect>(
    outbox: Outbox,
    pool: Pool<D>,
) {
    let rows = (0..5u32).map(|n| row(FIFO, Some("g"), n.to_string())).collect();
    write(&outbox, &pool, rows).await;
    let log = Arc::new(Mutex::new(Vec::new()));
    let lease = Duration::from_millis(600);
    let dying =
        tokio::spawn(relay(&outbox, &Broker::new("dying", &log, Mode::AcceptThenHang), lease).run(Shutdown::new()));
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while log.lock().unwrap().is_empty() {
        assert!(tokio::time::Instant::now() < deadline, "the first relay sent nothing");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    dying.abort(); // killed between the broker's acceptance and the delete
    let _ = dying.await;
    assert_eq!(pending(&outbox).await, 5, "nothing deleted: the broker's answer never came");
    let stop = Shutdown::new();
    let next = tokio::spawn(
        relay(&outbox, &Broker::new("next", &log, Mode::Accept { fail_every: 0 }), lease).run(stop.clone()),
    );
    until_empty(&outbox, Duration::from_secs(10)).await;
    stop.trigger();
    next.await.unwrap();
    let log = log.lock().unwrap().clone();
    let first: Vec<&Accepted> = log.iter().filter(|a| a.relay == "dying").collect();
    let again: Vec<&Accepted> = log.iter().filter(|a| a.relay == "next").collect();
    assert_eq!((first.len(), again.len()), (5, 5), "{log:?}");
    for (a, b) in first.iter().zip(&again) {
        assert_eq!((&a.message_id, &a.dedup, a.n), (&b.message_id, &b.dedup, b.n), "resent as the same message");
    }
    assert_group_order(&again.into_iter().cloned().collect::<Vec<_>>());
}

/// An outbox store that refuses the first `refusals` settles (its database
/// restarting), and is otherwise `inner`.
struct RefusesSettles {
    inner: Arc<dyn OutboxStore>,
    refusals: AtomicUsize,
}

impl OutboxStore for RefusesSettles {
    fn system(&self) -> &'static str {
        self.inner.system()
    }
    fn write<'a>(
        &'a self,
        conn: &'a mut (dyn std::any::Any + Send),
        rows: Vec<OutboxWrite>,
    ) -> BoxFuture<'a, Result<Vec<MessageId>, TransportError>> {
        self.inner.write(conn, rows)
    }
    fn claim<'a>(
        &'a self,
        queue: &'a str,
        max: usize,
        lease: Duration,
    ) -> BoxFuture<'a, Result<(i64, Vec<Claimed>), TransportError>> {
        self.inner.claim(queue, max, lease)
    }
    fn settle(&self, token: i64, outcomes: Vec<(i64, Settle)>) -> BoxFuture<'_, Result<(), TransportError>> {
        if self.refusals.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1)).is_ok() {
            let away = TransportError::Backend("postgresql: connect failed: refused".into());
            return Box::pin(async move { Err(away) });
        }
        self.inner.settle(token, outcomes)
    }
    fn stats(&self) -> BoxFuture<'_, Result<Vec<OutboxQueue>, TransportError>> {
        self.inner.stats()
    }
    fn failed(&self, max: usize) -> BoxFuture<'_, Result<Vec<FailedOutboxRow>, TransportError>> {
        self.inner.failed(max)
    }
    fn retry_failed<'a>(&'a self, queue: Option<&'a str>) -> BoxFuture<'a, Result<u64, TransportError>> {
        self.inner.retry_failed(queue)
    }
    fn now(&self) -> i64 {
        self.inner.now()
    }
    fn changes(&self) -> Option<tokio::sync::broadcast::Receiver<String>> {
        self.inner.changes()
    }
    fn migrate(&self) -> BoxFuture<'_, Result<(), TransportError>> {
        self.inner.migrate()
    }
    fn schedule_ledger(&self) -> Arc<dyn ScheduleLedger> {
        self.inner.schedule_ledger()
    }
}

/// A settle the outbox's database refuses for a moment (a restart) is tried
/// again while the claim holds: the rows the broker took are deleted, and
/// no relay sends them again once the claim runs out.
async fn a_refused_settle_is_tried_again_while_the_claim_holds<D: Dialect>(outbox: Outbox, pool: Pool<D>) {
    let rows = (0..5u32).map(|n| row(STANDARD, None, n.to_string())).collect();
    write(&outbox, &pool, rows).await;
    let refusing = Outbox::of(Arc::new(RefusesSettles { inner: outbox.store.clone(), refusals: AtomicUsize::new(3) }));
    let log = Arc::new(Mutex::new(Vec::new()));
    let lease = Duration::from_secs(5);
    let relay = relay(&refusing, &Broker::new("a", &log, Mode::Accept { fail_every: 0 }), lease);
    assert_eq!(relay.round(STANDARD).await.unwrap(), 5, "claimed, sent and settled");
    assert_eq!(pending(&outbox).await, 0, "the sent rows are deleted");
    assert_eq!(log.lock().unwrap().len(), 5, "each sent once");
}

fn postgres_base() -> String {
    std::env::var("TEST_POSTGRES_URL").unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".to_owned())
}

/// Runs `scenario` on a fresh outbox in PostgreSQL (a schema of its own)
/// and in a SQLite file.
macro_rules! on_both {
    ($($name:ident),*) => {$(
        mod $name {
            #[test]
            fn postgres() {
                super::runtime().block_on(async {
                    let schema = super::unique();
                    let url = format!("{}?options=-c%20search_path%3D{schema}", super::postgres_base());
                    let admin = sqlx::PgPool::connect(&super::postgres_base()).await.unwrap();
                    sqlx::query(&format!("CREATE SCHEMA {schema}")).execute(&admin).await.unwrap();
                    let outbox = super::Outbox::connect(&format!("{url}&migrate=true")).await.unwrap();
                    let pool = sqlx::PgPool::connect(&url).await.unwrap();
                    super::$name(outbox, pool).await;
                    sqlx::query(&format!("DROP SCHEMA {schema} CASCADE")).execute(&admin).await.unwrap();
                });
            }

            #[test]
            fn sqlite() {
                super::runtime().block_on(async {
                    let path = std::env::temp_dir().join(format!("{}.db", super::unique()));
                    let url = format!("sqlite://{}?mode=rwc", path.display());
                    let outbox = super::Outbox::connect(&format!("{url}&migrate=true")).await.unwrap();
                    let pool = sqlx::SqlitePool::connect(&url).await.unwrap();
                    super::$name(outbox, pool).await;
                    for suffix in ["", "-wal", "-shm"] {
                        let _ = std::fs::remove_file(format!("{}{suffix}", path.display()));
                    }
                });
            }
        }
    )*};
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap()
}

fn unique() -> String {
    static COUNTER: AtomicUsize = AtomicUsize::new(0);
    format!("relaytest_{}_{}", std::process::id(), COUNTER.fetch_add(1, Ordering::Relaxed))
}

on_both!(
    two_relays_send_every_row_once_in_order,
    a_refused_row_is_set_aside_and_its_group_goes_on,
    a_relay_that_dies_after_the_broker_accepted_leaves_the_rows_to_the_next,
    a_refused_settle_is_tried_again_while_the_claim_holds
);
