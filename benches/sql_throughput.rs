//! Throughput and latency of the database transports, on PostgreSQL and on
//! SQLite, beside raw-SQL baselines measured in the same run on the same
//! database:
//!
//! * **drain**: 20,000 small messages are enqueued (`send_batch`, 1,000 per
//!   call), then a no-op handler drains them (concurrency 1 and 8) until the
//!   queue is empty; three rounds of the baseline's and the two drains in
//!   turn, medians. Baseline: the same payloads in a plain table
//!   `(id, payload)`, inserted 1,000 per statement and drained with
//!   `DELETE … WHERE id IN (SELECT id … LIMIT 100 [FOR UPDATE SKIP LOCKED])
//!   RETURNING payload` (8 tasks on PostgreSQL, 1 on SQLite), each payload
//!   deserialized with serde_json.
//! * **publish**: the same payloads 1,000 at a time, in turn: a multi-row
//!   `INSERT` into the plain table, the same into a table with the columns,
//!   constraints and indexes of the framework's (`LIKE … INCLUDING ALL` on
//!   PostgreSQL, the same DDL on SQLite) with every column an enqueue writes
//!   (what any enqueue into such a table must pay), the same again into a
//!   table of its own after encoding the chunk's messages and making their
//!   ids (what an enqueue of typed messages written by hand also does; the
//!   two before bind payloads and ids made before their clock starts), and
//!   `send_batch` of the 1,000 messages; three passes over the messages, each table emptied
//!   between them. Taking turns statement by statement gives the three the
//!   same server and machine: run one after the other, their ratio moved
//!   by a factor of two with what the server was doing meanwhile (WAL
//!   stalls, checkpoints, vacuum).
//! * **identities**: `send_batch` of messages with an identity each, first
//!   all new (one insert per call), then a new version of each (rows
//!   locked and updated); against the plain baseline insert.
//! * **latency**: one `send` every 5 ms for 10 s with the worker idle between
//!   messages; each message carries its send time and the handler records
//!   `now - sent`. On PostgreSQL the publisher has its own transport, so the
//!   worker is woken by LISTEN/NOTIFY (default `poll`); on SQLite publisher
//!   and worker share the transport (in-process wake-up). Baseline: the same
//!   rate through the plain table (PostgreSQL: `INSERT` + `pg_notify` in one
//!   statement, a LISTEN connection, `DELETE … RETURNING`; SQLite: `INSERT`,
//!   a tokio `Notify`, `DELETE … RETURNING`).
//!
//! Before each timed drain the table is `VACUUM ANALYZE`d on PostgreSQL, so
//! every drain starts from the same state. The PostgreSQL schema and the
//! SQLite file are created for the run and removed at the end, also on error.
//!
//! ```text
//! cargo bench -p messaging-suite --bench sql_throughput                       # 20,000 messages, 10 s of latency
//! MESSAGES=5000 LATENCY_SECS=3 cargo bench -p messaging-suite --bench sql_throughput
//! BENCH_DB=postgres cargo bench -p messaging-suite --bench sql_throughput   # or sqlite: one database only
//! TEST_POSTGRES_URL=postgres://user@host/db cargo bench -p messaging-suite --bench sql_throughput
//! BENCH_ONLY=publish cargo bench -p messaging-suite --bench sql_throughput  # the publish comparison alone (or drain: the drains alone), to profile it
//! BENCH_ONLY=framework-drain MESSAGES=100000 cargo bench -p messaging-suite --bench sql_throughput  # one drain of the framework's, no baseline
//! ```

use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::path::PathBuf;
use std::str::FromStr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{anyhow, bail, Context as _};
use messaging::prelude::*;
use messaging::sqlx::postgres::{PgConnection, PgListener, PgPool, PgPoolOptions};
use messaging::sqlx::sqlite::{
    SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions, SqliteSynchronous,
};
use messaging::sqlx::{self, Connection as _};
use messaging::transport::Transport;
use tokio::sync::Notify;

/// The drain queue handled one message at a time.
#[messaging::queue("bench-sql-sequential")]
struct Sequential;

/// The drain queue handled eight messages at a time.
#[messaging::queue("bench-sql-parallel", concurrency = 8)]
struct Parallel;

/// The queue the publish comparison fills (no handler: emptied by hand).
#[messaging::queue("bench-sql-publish")]
struct Publishing;

/// The latency queue.
#[messaging::queue("bench-sql-latency")]
struct Latency;

/// The drain payload (the same as `memory_throughput`'s).
#[messaging::message(name = "bench.tick", v = 1)]
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Tick {
    /// Sequence number.
    n: u64,
    /// A short string.
    label: String,
}

/// The queue of messages with an identity (published, not drained).
#[messaging::queue("bench-sql-accounts")]
struct Accounts;

/// A message with an identity: one row per account.
#[messaging::message(name = "bench.account", v = 1, id = key)]
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Account {
    /// The identity.
    key: String,
    /// A version number.
    n: u64,
}

#[messaging::handler(queue = Accounts)]
async fn on_account(_account: Account) {}

/// The latency probe: carries its send time.
#[messaging::message(name = "bench.ping", v = 1)]
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Ping {
    /// Sequence number.
    n: u64,
    /// When it was sent: nanoseconds since the Unix epoch.
    sent_ns: u64,
}

/// The envelope as the baselines read it (the bytes `messaging` stores).
#[derive(Debug, Deserialize)]
struct RawEnvelope<T> {
    /// The message name.
    #[serde(rename = "type")]
    kind: String,
    /// The message version.
    v: u32,
    /// The message.
    data: T,
}

/// Counts handled messages and wakes the benchmark at the target.
struct Counter {
    /// Messages handled so far.
    handled: AtomicU64,
    /// How many to wait for.
    target: u64,
    /// Notified when `handled` reaches `target`.
    done: Notify,
}

impl Counter {
    /// A counter waiting for `target` messages.
    fn new(target: u64) -> Arc<Counter> {
        Arc::new(Counter { handled: AtomicU64::new(0), target, done: Notify::new() })
    }

    /// Counts one message.
    fn hit(&self) {
        if self.handled.fetch_add(1, Ordering::Relaxed) + 1 == self.target {
            self.done.notify_one();
        }
    }
}

/// Latencies recorded by a consumer, in nanoseconds.
#[derive(Default)]
struct Samples {
    /// The recorded latencies.
    nanos: Mutex<Vec<u64>>,
    /// Notified on each record.
    recorded: Notify,
}

impl Samples {
    /// Records the latency of a message sent at `sent_ns`.
    fn record(&self, sent_ns: u64) {
        let latency = now_ns().saturating_sub(sent_ns);
        self.nanos.lock().unwrap_or_else(|p| p.into_inner()).push(latency);
        self.recorded.notify_waiters();
    }

    /// How many were recorded.
    fn len(&self) -> usize {
        self.nanos.lock().unwrap_or_else(|p| p.into_inner()).len()
    }

    /// Waits until `n` latencies are recorded.
    async fn wait_for(&self, n: usize) {
        loop {
            let recorded = self.recorded.notified();
            if self.len() >= n {
                return;
            }
            // The timeout covers a record between `len` and `notified`.
            let _ = tokio::time::timeout(Duration::from_millis(10), recorded).await;
        }
    }

    /// The recorded latencies, sorted.
    fn sorted(&self) -> Vec<u64> {
        let mut v = self.nanos.lock().unwrap_or_else(|p| p.into_inner()).clone();
        v.sort_unstable();
        v
    }
}

#[messaging::handler(queue = Sequential)]
async fn on_sequential(tick: Tick, counter: State<Arc<Counter>>) {
    std::hint::black_box(tick);
    counter.hit();
}

#[messaging::handler(queue = Parallel)]
async fn on_parallel(tick: Tick, counter: State<Arc<Counter>>) {
    std::hint::black_box(tick);
    counter.hit();
}

#[messaging::handler(queue = Latency)]
async fn on_ping(ping: Ping, samples: State<Arc<Samples>>) {
    samples.record(ping.sent_ns);
}

/// Messages per `send_batch` call and per baseline INSERT.
const PUBLISH_CHUNK: usize = 1_000;
/// Rows per baseline DELETE (the transport's batch size).
const CLAIM: i64 = 100;
/// Baseline drain tasks on PostgreSQL (the framework's concurrency 8).
const PG_TASKS: usize = 8;
/// Rounds of the drains (each of the three once a round); medians reported.
const DRAIN_ROUNDS: usize = 3;
/// The longest a publish or a drain may take.
const PHASE_TIMEOUT: Duration = Duration::from_secs(300);
/// The longest the latency consumer may lag behind the last send, and the
/// longest a graceful stop may take.
const SETTLE_TIMEOUT: Duration = Duration::from_secs(60);
/// One send every this often in the latency runs (200 msgs/s).
const SEND_EVERY: Duration = Duration::from_millis(5);

/// Nanoseconds since the Unix epoch.
fn now_ns() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64)
}

/// A name unique to this run.
fn unique(prefix: &str) -> String {
    let nanos = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.subsec_nanos());
    format!("{prefix}_{}_{nanos}", std::process::id())
}

/// Awaits `future`, failing with a message naming `what` after `limit`.
async fn within<T>(limit: Duration, what: &str, future: impl Future<Output = T>) -> anyhow::Result<T> {
    tokio::time::timeout(limit, future).await.map_err(|_| anyhow!("{what} took longer than {limit:?}; giving up"))
}

/// What the run is configured with (environment).
struct Config {
    /// Messages per drain (`MESSAGES`).
    messages: u64,
    /// Length of each latency run (`LATENCY_SECS`).
    latency: Duration,
    /// The PostgreSQL server and database (`TEST_POSTGRES_URL`).
    postgres: String,
    /// Only the publish comparison, only the drains, or only one drain of
    /// the framework's (`BENCH_ONLY=publish`, `drain` or `framework-drain`),
    /// for a profile of one path.
    only: Option<String>,
}

impl Config {
    /// Reads the environment.
    fn from_env() -> Config {
        let number = |name: &str| std::env::var(name).ok().and_then(|v| v.trim().parse::<u64>().ok());
        Config {
            messages: number("MESSAGES").filter(|n| *n > 0).unwrap_or(20_000),
            latency: Duration::from_secs(number("LATENCY_SECS").filter(|n| *n > 0).unwrap_or(10)),
            postgres: std::env::var("TEST_POSTGRES_URL")
                .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".to_owned()),
            only: std::env::var("BENCH_ONLY").ok().map(|v| v.trim().to_owned()),
        }
    }
}

/// The database a run uses for its baselines.
#[derive(Clone)]
enum Raw {
    /// PostgreSQL, through a pool on the run's schema.
    Postgres(PgPool),
    /// SQLite, through a pool on the run's file.
    Sqlite(SqlitePool),
}

/// The payloads of the drain: the framework's envelope of each `Tick`.
fn payloads(messages: u64) -> anyhow::Result<Vec<Vec<u8>>> {
    (0..messages).map(|n| messaging::envelope::encode(&tick(n)).context("encoding a payload")).collect()
}

/// The `n`th drain message.
fn tick(n: u64) -> Tick {
    Tick { n, label: "bench".to_owned() }
}

/// Decodes a baseline payload as the framework would (envelope, then data).
fn decode<T: serde::de::DeserializeOwned>(payload: &[u8]) -> anyhow::Result<T> {
    let envelope: RawEnvelope<T> = serde_json::from_slice(payload).context("deserializing a payload")?;
    std::hint::black_box((&envelope.kind, envelope.v));
    Ok(envelope.data)
}

impl Raw {
    /// Creates the baseline table.
    async fn create(&self) -> anyhow::Result<()> {
        match self {
            Raw::Postgres(pool) => {
                sqlx::query("CREATE TABLE bench_raw (id BIGSERIAL PRIMARY KEY, payload BYTEA NOT NULL)")
                    .execute(pool)
                    .await?;
            }
            Raw::Sqlite(pool) => {
                sqlx::query("CREATE TABLE bench_raw (id INTEGER PRIMARY KEY AUTOINCREMENT, payload BLOB NOT NULL)")
                    .execute(pool)
                    .await?;
            }
        }
        Ok(())
    }

    /// Creates `table`: a table with the columns, constraints and
    /// indexes of the framework's `messaging_messages` (which must exist),
    /// for a baseline insert that does what an enqueue must do to the table.
    async fn create_shaped(&self, table: &str) -> anyhow::Result<()> {
        match self {
            Raw::Postgres(pool) => {
                sqlx::query(&format!("CREATE TABLE {table} (LIKE messaging_messages INCLUDING ALL)"))
                    .execute(pool)
                    .await?;
            }
            Raw::Sqlite(pool) => {
                let ddl: Vec<String> = sqlx::query_scalar(
                    "SELECT sql FROM sqlite_master WHERE tbl_name = 'messaging_messages' AND sql IS NOT NULL \
                     ORDER BY type = 'index'",
                )
                .fetch_all(pool)
                .await?;
                for statement in ddl {
                    sqlx::query(&statement.replace("messaging_messages", table)).execute(pool).await?;
                }
            }
        }
        Ok(())
    }

    /// Inserts `chunk` into `table` (of [`Raw::create_shaped`]) as pending messages with every
    /// column an enqueue writes, in one statement; `first` numbers them.
    async fn insert_shaped(
        &self,
        table: &str,
        chunk: &[Vec<u8>],
        ids: &[String],
        first: i64,
        now: i64,
    ) -> anyhow::Result<()> {
        match self {
            Raw::Postgres(pool) => {
                sqlx::query(&format!(
                    "INSERT INTO {table} (queue, group_id, message_id, payload, attributes, priority, \
                     process_at, status, attempts, seq, sent_at) \
                     SELECT 'bench-shape', NULL, m, p, '', 0, NULL, 'pending', 0, $3 + o, $4 \
                     FROM UNNEST($1::text[], $2::bytea[]) WITH ORDINALITY AS t(m, p, o)"
                ))
                .bind(ids)
                .bind(chunk)
                .bind(first)
                .bind(now)
                .execute(pool)
                .await?;
            }
            Raw::Sqlite(pool) => {
                let row = "('bench-shape', NULL, ?, ?, '', 0, NULL, 'pending', 0, ?, ?)";
                let sql = format!(
                    "INSERT INTO {table} (queue, group_id, message_id, payload, attributes, priority, \
                     process_at, status, attempts, seq, sent_at) VALUES {}",
                    vec![row; chunk.len()].join(",")
                );
                let mut query = sqlx::query(&sql);
                for (i, (payload, id)) in chunk.iter().zip(ids).enumerate() {
                    query = query.bind(id).bind(payload).bind(first + i as i64).bind(now);
                }
                query.execute(pool).await?;
            }
        }
        Ok(())
    }

    /// Brings `table` to a settled state before a timed drain (PostgreSQL:
    /// `VACUUM ANALYZE`; SQLite: nothing).
    async fn settle(&self, table: &str) -> anyhow::Result<()> {
        if let Raw::Postgres(pool) = self {
            sqlx::query(&format!("VACUUM ANALYZE {table}")).execute(pool).await?;
        }
        Ok(())
    }

    /// Deletes the framework's rows of `queue`, then settles the table as
    /// [`Raw::empty`] does.
    async fn empty_queue(&self, queue: &str) -> anyhow::Result<()> {
        match self {
            Raw::Postgres(pool) => {
                sqlx::query("DELETE FROM messaging_messages WHERE queue = $1").bind(queue).execute(pool).await?;
            }
            Raw::Sqlite(pool) => {
                sqlx::query("DELETE FROM messaging_messages WHERE queue = ?1").bind(queue).execute(pool).await?;
            }
        }
        self.settle("messaging_messages").await
    }

    /// Deletes every row of `table`, then settles it ([`Raw::settle`]). The
    /// publish comparison empties each of its tables this way after a pass,
    /// so that every pass inserts into tables in the same state: when the
    /// baselines' tables were truncated and the framework's rows deleted
    /// (the server runs without autovacuum), the framework inserted into a
    /// table and indexes that grew dead rows and entries pass after pass.
    async fn empty(&self, table: &str) -> anyhow::Result<()> {
        let delete = format!("DELETE FROM {table}");
        match self {
            Raw::Postgres(pool) => {
                sqlx::query(&delete).execute(pool).await?;
            }
            Raw::Sqlite(pool) => {
                sqlx::query(&delete).execute(pool).await?;
            }
        }
        self.settle(table).await
    }

    /// Inserts the payloads, `PUBLISH_CHUNK` per statement.
    async fn insert(&self, payloads: &[Vec<u8>]) -> anyhow::Result<()> {
        for chunk in payloads.chunks(PUBLISH_CHUNK) {
            self.insert_chunk(chunk).await?;
        }
        Ok(())
    }

    /// Inserts `chunk` into the plain table in one statement.
    async fn insert_chunk(&self, chunk: &[Vec<u8>]) -> anyhow::Result<()> {
        match self {
            Raw::Postgres(pool) => {
                sqlx::query("INSERT INTO bench_raw (payload) SELECT * FROM UNNEST($1::bytea[])")
                    .bind(chunk)
                    .execute(pool)
                    .await?;
            }
            Raw::Sqlite(pool) => {
                let sql = format!("INSERT INTO bench_raw (payload) VALUES {}", vec!["(?)"; chunk.len()].join(","));
                let mut query = sqlx::query(&sql);
                for payload in chunk {
                    query = query.bind(payload);
                }
                query.execute(pool).await?;
            }
        }
        Ok(())
    }

    /// Claims and deletes up to `CLAIM` rows; returns their payloads.
    async fn claim(&self) -> anyhow::Result<Vec<Vec<u8>>> {
        Ok(match self {
            Raw::Postgres(pool) => {
                sqlx::query_scalar(
                    "DELETE FROM bench_raw WHERE id IN \
                     (SELECT id FROM bench_raw ORDER BY id LIMIT $1 FOR UPDATE SKIP LOCKED) RETURNING payload",
                )
                .bind(CLAIM)
                .fetch_all(pool)
                .await?
            }
            Raw::Sqlite(pool) => sqlx::query_scalar(
                "DELETE FROM bench_raw WHERE id IN (SELECT id FROM bench_raw ORDER BY id LIMIT ?1) RETURNING payload",
            )
            .bind(CLAIM)
            .fetch_all(pool)
            .await?,
        })
    }

    /// Drains the table from `tasks` concurrent tasks; returns how many rows
    /// were handled.
    async fn drain(&self, tasks: usize) -> anyhow::Result<u64> {
        let mut set = tokio::task::JoinSet::new();
        for _ in 0..tasks {
            let raw = self.clone();
            set.spawn(async move {
                let mut handled = 0u64;
                loop {
                    let rows = raw.claim().await?;
                    if rows.is_empty() {
                        return anyhow::Ok(handled);
                    }
                    for payload in &rows {
                        std::hint::black_box(decode::<Tick>(payload)?);
                        handled += 1;
                    }
                }
            });
        }
        let mut total = 0;
        while let Some(joined) = set.join_next().await {
            total += joined.context("a baseline drain task panicked")??;
        }
        Ok(total)
    }
}

/// The middle of `times`.
fn median(mut times: Vec<Duration>) -> Duration {
    times.sort();
    times.get(times.len() / 2).copied().unwrap_or_default()
}

/// Messages per second.
fn rate(messages: u64, elapsed: Duration) -> f64 {
    messages as f64 / elapsed.as_secs_f64()
}

/// Prints a throughput figure and its ratio to `base`.
fn print_rate(what: &str, value: f64, base: f64) {
    println!("  {what:<52} {value:>10.0} msgs/s   {:.2} x baseline", value / base);
}

/// Prints a latency figure (ns) and its ratio to `base`.
fn print_latency(what: &str, value: u64, base: u64) {
    let ms = value as f64 / 1e6;
    println!("  {what:<52} {ms:>10.2} ms       {:.2} x baseline", value as f64 / base.max(1) as f64);
}

/// The value at `percentile` (nearest rank) of sorted `values`.
fn percentile(values: &[u64], percentile: f64) -> u64 {
    if values.is_empty() {
        return 0;
    }
    let rank = (percentile / 100.0 * values.len() as f64).ceil() as usize;
    values[rank.clamp(1, values.len()) - 1]
}

/// Publishes `messages` ticks to `Q` and drains them with the framework.
/// Returns the drain time.
async fn framework_drain<Q: Queue<Kind = messaging::Standard>>(
    transport: &Arc<dyn Transport>,
    raw: &Raw,
    messages: u64,
) -> anyhow::Result<Duration> {
    let mut app = messaging::App::new(transport.clone()).await.context("assembling the app")?;
    app.only_queues(&[Q::SPEC.name]);
    let counter = Counter::new(messages);
    app.setup().provide(counter.clone());
    let publisher = app.setup().publisher();

    let ticks: Vec<Tick> = (0..messages).map(tick).collect();
    publish_all::<Q, _>(&publisher, &ticks, "publishing").await?;
    let depth = transport.depth(Q::SPEC.name).await?;
    if depth != messages {
        bail!("queue `{}` holds {depth} messages after publishing {messages}", Q::SPEC.name);
    }
    raw.settle("messaging_messages").await?;

    let started = Instant::now();
    let running = app.start().context("starting the worker")?;
    let drained = within(PHASE_TIMEOUT, "draining", async {
        counter.done.notified().await;
        // Then the acknowledgements: poll the depth, often enough that the
        // error stays within 0.5% and seldom enough not to load the database.
        while transport.depth(Q::SPEC.name).await? > 0 {
            let every = (started.elapsed() / 200).clamp(Duration::from_millis(1), Duration::from_millis(20));
            tokio::time::sleep(every).await;
        }
        anyhow::Ok(started.elapsed())
    })
    .await;
    within(SETTLE_TIMEOUT, "stopping the worker", running.stop()).await?;
    let handled = counter.handled.load(Ordering::Relaxed);
    let drained = drained.with_context(|| format!("{handled} of {messages} messages handled"))??;
    if handled != messages {
        eprintln!("warning: {handled} deliveries for {messages} messages (redeliveries)");
    }
    Ok(drained)
}

/// Publishes `items` to `Q`, `PUBLISH_CHUNK` per `send_batch`; returns the time it took.
async fn publish_all<Q: Queue<Kind = messaging::Standard>, M: messaging::Message>(
    publisher: &Publisher,
    items: &[M],
    what: &str,
) -> anyhow::Result<Duration> {
    let started = Instant::now();
    within(PHASE_TIMEOUT, what, async {
        for chunk in items.chunks(PUBLISH_CHUNK) {
            for result in publisher.send_batch::<Q, _>(chunk).await {
                result.context("publishing")?;
            }
        }
        anyhow::Ok(())
    })
    .await??;
    Ok(started.elapsed())
}

/// Publishes `messages` accounts with an identity each (new rows), then
/// each again with a new version (updates of pending rows), 1,000 per
/// `send_batch`. Returns the two publish times.
async fn identity_publish(transport: &Arc<dyn Transport>, messages: u64) -> anyhow::Result<(Duration, Duration)> {
    let mut app = messaging::App::new(transport.clone()).await.context("assembling the app")?;
    app.only_queues(&[Accounts::SPEC.name]);
    let publisher = app.setup().publisher();
    let mut times = Vec::new();
    for version in 0..2 {
        let accounts: Vec<Account> = (0..messages).map(|n| Account { key: format!("acct-{n}"), n: version }).collect();
        times.push(publish_all::<Accounts, _>(&publisher, &accounts, "publishing with identities").await?);
    }
    let depth = transport.depth(Accounts::SPEC.name).await?;
    if depth != messages {
        bail!("queue `{}` holds {depth} rows after two versions of {messages} identities", Accounts::SPEC.name);
    }
    Ok((times[0], times[1]))
}

/// Publishes `payloads` to the baseline table and drains it with `tasks`
/// tasks. Returns the drain time.
async fn baseline_drain(raw: &Raw, payloads: &[Vec<u8>], tasks: usize) -> anyhow::Result<Duration> {
    within(PHASE_TIMEOUT, "the baseline insert", raw.insert(payloads)).await??;
    raw.settle("bench_raw").await?;
    let started = Instant::now();
    let handled = within(PHASE_TIMEOUT, "the baseline drain", raw.drain(tasks)).await??;
    let drained = started.elapsed();
    if handled != payloads.len() as u64 {
        bail!("the baseline drained {handled} rows of {}", payloads.len());
    }
    Ok(drained)
}

/// The time each way of publishing took for each chunk, in the order they
/// ran (the three ways of a chunk one after the other).
#[derive(Default)]
struct PublishTimes {
    /// The multi-row insert into the plain table.
    plain: Vec<Duration>,
    /// The same into the table of the framework's shape.
    shaped: Vec<Duration>,
    /// The same, encoding the chunk's messages and making their ids first,
    /// inside the timed section: what an enqueue of typed messages written
    /// by hand does (the two baselines above bind payloads and ids prepared
    /// before the clock starts; `send_batch` is given the messages).
    encoding: Vec<Duration>,
    /// `send_batch` of the same messages.
    framework: Vec<Duration>,
}

impl PublishTimes {
    /// The median over the chunks of `base`'s time over the framework's for
    /// the same chunk: the framework's speed as a fraction of `base`'s. A
    /// stall of the machine or the database (a checkpoint, another
    /// process) lands on one chunk of one way, and in the ratio of the sums
    /// it counted against whichever way it hit. Three runs of one build's
    /// PostgreSQL publish alone: the ratio of the sums to the shaped insert
    /// 0.845-0.887, the median of the chunks' ratios 0.866-0.867 (on
    /// SQLite the sums gave 0.81-0.90 where the chunks gave 0.79-0.82).
    fn chunk_ratio(&self, base: &[Duration]) -> f64 {
        let mut ratios: Vec<f64> =
            base.iter().zip(&self.framework).map(|(b, f)| b.as_secs_f64() / f.as_secs_f64().max(1e-9)).collect();
        ratios.sort_by(f64::total_cmp);
        ratios.get(ratios.len() / 2).copied().unwrap_or_default()
    }
}

/// Publishes the messages three times over, `PUBLISH_CHUNK` at a time and
/// each chunk three ways in turn: into the plain table, into the table of the
/// framework's shape, and by `send_batch` to queue `Q` (which has no
/// handler); every table is emptied after each pass.
async fn publish_side_by_side<Q: Queue<Kind = messaging::Standard>>(
    transport: &Arc<dyn Transport>,
    raw: &Raw,
    payloads: &[Vec<u8>],
) -> anyhow::Result<PublishTimes> {
    const PASSES: usize = 3;
    transport.declare(&Q::SPEC).await?;
    let publisher = Publisher::new(transport.clone());
    let ticks: Vec<Tick> = (0..payloads.len() as u64).map(tick).collect();
    let ids: Vec<String> = (0..payloads.len()).map(|n| format!("00000000-0000-4000-8000-{n:012}")).collect();
    let now = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as i64);
    let mut times = PublishTimes::default();
    for _ in 0..PASSES {
        for (n, ((chunk, ids), ticks)) in
            payloads.chunks(PUBLISH_CHUNK).zip(ids.chunks(PUBLISH_CHUNK)).zip(ticks.chunks(PUBLISH_CHUNK)).enumerate()
        {
            let started = Instant::now();
            within(PHASE_TIMEOUT, "the plain insert", raw.insert_chunk(chunk)).await??;
            times.plain.push(started.elapsed());
            let started = Instant::now();
            let first = (n * PUBLISH_CHUNK) as i64;
            within(PHASE_TIMEOUT, "the shaped insert", raw.insert_shaped("bench_shape", chunk, ids, first, now))
                .await??;
            times.shaped.push(started.elapsed());
            let started = Instant::now();
            let encoded = ticks.iter().map(messaging::envelope::encode).collect::<Result<Vec<_>, _>>()?;
            let made: Vec<String> = ticks.iter().map(|_| MessageId::random().as_str().to_owned()).collect();
            within(
                PHASE_TIMEOUT,
                "the encoding insert",
                raw.insert_shaped("bench_encode", &encoded, &made, first, now),
            )
            .await??;
            times.encoding.push(started.elapsed());
            let started = Instant::now();
            for result in within(PHASE_TIMEOUT, "send_batch", publisher.send_batch::<Q, _>(ticks)).await? {
                result.context("publishing")?;
            }
            times.framework.push(started.elapsed());
        }
        let depth = transport.depth(Q::SPEC.name).await?;
        if depth != payloads.len() as u64 {
            bail!("queue `{}` holds {depth} messages after publishing {}", Q::SPEC.name, payloads.len());
        }
        raw.empty("bench_raw").await?;
        raw.empty("bench_shape").await?;
        raw.empty("bench_encode").await?;
        raw.empty_queue(Q::SPEC.name).await?;
    }
    Ok(times)
}

/// Sends a ping every `SEND_EVERY` for `length` through `send`; returns how
/// many were sent.
async fn pace<F, Fut>(length: Duration, mut send: F) -> anyhow::Result<u64>
where
    F: FnMut(Ping) -> Fut,
    Fut: Future<Output = anyhow::Result<()>>,
{
    let mut interval = tokio::time::interval(SEND_EVERY);
    interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let started = Instant::now();
    let mut n = 0;
    while started.elapsed() < length {
        interval.tick().await;
        within(SETTLE_TIMEOUT, "a send", send(Ping { n, sent_ns: now_ns() })).await??;
        n += 1;
    }
    Ok(n)
}

/// The framework's latency: pings published through `publisher_transport`,
/// handled by a worker on `worker_transport`. Returns sorted latencies (ns).
async fn framework_latency(
    worker_transport: &Arc<dyn Transport>,
    publisher_transport: &Arc<dyn Transport>,
    length: Duration,
) -> anyhow::Result<Vec<u64>> {
    let mut app = messaging::App::new(worker_transport.clone()).await.context("assembling the app")?;
    app.only_queues(&[Latency::SPEC.name]);
    let samples = Arc::new(Samples::default());
    app.setup().provide(samples.clone());
    publisher_transport.declare(&Latency::SPEC).await?;
    let publisher = Publisher::new(publisher_transport.clone());
    let running = app.start().context("starting the worker")?;
    // Let the worker go idle, so that each message has to wake it.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let result = async {
        let sent = pace(length, |ping| {
            let publisher = publisher.clone();
            async move {
                publisher.send::<Latency, _>(&ping).await?;
                Ok(())
            }
        })
        .await?;
        within(SETTLE_TIMEOUT, "handling the last pings", samples.wait_for(sent as usize)).await
    }
    .await;
    within(SETTLE_TIMEOUT, "stopping the worker", running.stop()).await?;
    result?;
    Ok(samples.sorted())
}

/// The baseline latency: a row per ping in the plain table, a wake-up
/// (PostgreSQL: NOTIFY to a LISTEN connection; SQLite: a tokio `Notify`),
/// then `DELETE … RETURNING` until empty. Returns sorted latencies (ns).
async fn baseline_latency(raw: &Raw, url: &str, length: Duration) -> anyhow::Result<Vec<u64>> {
    let samples = Arc::new(Samples::default());
    let local = Arc::new(Notify::new());
    let listener = match raw {
        Raw::Postgres(_) => {
            let mut listener = PgListener::connect(url).await.context("the baseline LISTEN connection")?;
            listener.listen("bench_raw").await?;
            Some(listener)
        }
        Raw::Sqlite(_) => None,
    };
    let consumer = tokio::spawn(consume(raw.clone(), listener, local.clone(), samples.clone()));
    let result = async {
        let sent = pace(length, |ping| {
            let (raw, local) = (raw.clone(), local.clone());
            async move {
                let payload = messaging::envelope::encode(&ping)?;
                match &raw {
                    Raw::Postgres(pool) => {
                        sqlx::query(
                            "WITH i AS (INSERT INTO bench_raw (payload) VALUES ($1)) SELECT pg_notify('bench_raw', '')",
                        )
                        .bind(payload)
                        .execute(pool)
                        .await?;
                    }
                    Raw::Sqlite(pool) => {
                        sqlx::query("INSERT INTO bench_raw (payload) VALUES (?1)").bind(payload).execute(pool).await?;
                        local.notify_one();
                    }
                }
                Ok(())
            }
        })
        .await?;
        within(SETTLE_TIMEOUT, "handling the last baseline pings", samples.wait_for(sent as usize)).await
    }
    .await;
    consumer.abort();
    // Aborted, it ends as cancelled, unless it had failed before.
    if let Ok(Err(e)) = consumer.await {
        return Err(e.context("the baseline consumer failed"));
    }
    result?;
    Ok(samples.sorted())
}

/// The baseline consumer: on each wake-up, claims until the table is empty.
async fn consume(
    raw: Raw,
    mut listener: Option<PgListener>,
    local: Arc<Notify>,
    samples: Arc<Samples>,
) -> anyhow::Result<()> {
    loop {
        match listener.as_mut() {
            Some(listener) => {
                let _notification = listener.recv().await?;
            }
            None => local.notified().await,
        }
        loop {
            let rows = raw.claim().await?;
            if rows.is_empty() {
                break;
            }
            for payload in &rows {
                samples.record(decode::<Ping>(payload)?.sent_ns);
            }
        }
    }
}

/// Everything measured on one database: the baselines through `raw`, and
/// through `publishing` in the publish comparison.
async fn measure(
    system: &str,
    config: &Config,
    (raw, publishing): (&Raw, &Raw),
    url: &str,
    transport: Arc<dyn Transport>,
    publisher_transport: Arc<dyn Transport>,
    baseline_tasks: usize,
) -> anyhow::Result<()> {
    let messages = config.messages;
    println!(
        "{system}: {messages} messages, {:?} of latency, {} worker threads",
        config.latency,
        std::thread::available_parallelism().map_or(0, |n| n.get())
    );
    raw.create().await.context("creating the baseline table")?;
    for table in ["bench_shape", "bench_encode"] {
        raw.create_shaped(table).await.context("creating a baseline table of the framework's shape")?;
    }
    let payloads = payloads(messages)?;
    let base_publish = if matches!(config.only.as_deref(), Some("drain" | "framework-drain")) {
        None
    } else {
        let published = publish_side_by_side::<Publishing>(&transport, publishing, &payloads)
            .await
            .context("the publish comparison")?;
        let rounds = 3 * messages;
        let total = |times: &[Duration]| rate(rounds, times.iter().sum());
        let (base_publish, base_shaped) = (total(&published.plain), total(&published.shaped));
        let publish = total(&published.framework);
        print_rate("baseline publish (INSERT, 1,000 rows/statement)", base_publish, base_publish);
        print_rate("messaging publish (send_batch, 1,000/call)", publish, base_publish);
        print_rate("baseline publish, the framework's columns and indexes", base_shaped, base_shaped);
        print_rate("messaging publish × that baseline", publish, base_shaped);
        // The ratios to quote: see `PublishTimes::chunk_ratio`.
        for (what, base) in [
            ("the plain insert", &published.plain),
            ("the shaped insert", &published.shaped),
            ("the shaped insert encoding as it goes", &published.encoding),
        ] {
            let what = format!("messaging publish × {what}, chunk by chunk");
            let chunks = base.len();
            println!("  {what:<52} {:>10.3} x, the median of {chunks} chunks", published.chunk_ratio(base));
        }
        Some(base_publish)
    };
    if config.only.as_deref() == Some("publish") {
        return Ok(());
    }
    if config.only.as_deref() == Some("framework-drain") {
        // No baseline and one drain: the framework's work alone, for `perf`
        // or a statement log (a rate, not a ratio).
        let drained = framework_drain::<Parallel>(&transport, raw, messages).await.context("the drain")?;
        println!("  {:<52} {:>10.0} msgs/s", "messaging drain, concurrency 8 (alone)", rate(messages, drained));
        return Ok(());
    }

    // Three rounds of the three drains in turn, the median of each: a drain
    // of 20,000 rows takes a tenth to a third of a second, and one run of
    // each, one after the other, moved their ratio by half with whatever
    // the machine did meanwhile. The first round is also the cold one: on
    // PostgreSQL the baseline's first drain took twice its later ones (its
    // pool opening the connections of seven of its eight tasks), which the
    // single drain this benchmark used to time counted against it.
    let (mut base_drains, mut seq_drains, mut par_drains) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..DRAIN_ROUNDS {
        base_drains.push(baseline_drain(raw, &payloads, baseline_tasks).await.context("the baseline drain")?);
        seq_drains.push(
            framework_drain::<Sequential>(&transport, raw, messages).await.context("the drain with concurrency 1")?,
        );
        par_drains.push(
            framework_drain::<Parallel>(&transport, raw, messages).await.context("the drain with concurrency 8")?,
        );
    }
    let base_drain = rate(messages, median(base_drains));
    let (seq_drain, par_drain) = (median(seq_drains), median(par_drains));
    let tasks = if baseline_tasks == 1 { "1 task".to_owned() } else { format!("{baseline_tasks} tasks") };
    print_rate(&format!("baseline drain (DELETE 100 … RETURNING, {tasks})"), base_drain, base_drain);
    print_rate("messaging drain, concurrency 1", rate(messages, seq_drain), base_drain);
    print_rate("messaging drain, concurrency 8", rate(messages, par_drain), base_drain);
    let Some(base_publish) = base_publish else { return Ok(()) };

    let base = baseline_latency(raw, url, config.latency).await.context("the baseline latency")?;
    let ours =
        framework_latency(&transport, &publisher_transport, config.latency).await.context("the framework latency")?;
    let wake = if system == "postgresql" { "LISTEN/NOTIFY" } else { "in-process wake-up" };
    let (b50, b99) = (percentile(&base, 50.0), percentile(&base, 99.0));
    print_latency(&format!("baseline latency p50 ({} pings)", base.len()), b50, b50);
    print_latency("baseline latency p99", b99, b99);
    print_latency(&format!("messaging latency p50 ({} pings, {wake})", ours.len()), percentile(&ours, 50.0), b50);
    print_latency("messaging latency p99", percentile(&ours, 99.0), b99);
    print_latency("messaging latency max", ours.last().copied().unwrap_or(0), base.last().copied().unwrap_or(0));

    // Last: its rows stay, and the drains above ran on an emptier table.
    let (new, again) = identity_publish(&transport, messages).await.context("publishing with identities")?;
    print_rate("messaging publish with identities, new rows", rate(messages, new), base_publish);
    print_rate("messaging publish with identities, new versions", rate(messages, again), base_publish);
    Ok(())
}

/// A runtime like the one `#[messaging::main]` builds.
fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    Ok(tokio::runtime::Builder::new_multi_thread().enable_all().build()?)
}

/// Runs `body` on a fresh runtime, turning a panic into an error, then shuts
/// the runtime down so that every connection it opened is closed.
fn isolated<F: Future<Output = anyhow::Result<()>>>(body: F) -> anyhow::Result<()> {
    let runtime = runtime()?;
    let result = std::panic::catch_unwind(AssertUnwindSafe(|| runtime.block_on(body)));
    runtime.shutdown_timeout(Duration::from_secs(5));
    match result {
        Ok(result) => result,
        Err(panic) => {
            let message = panic
                .downcast_ref::<&str>()
                .map(|s| (*s).to_owned())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "(no message)".to_owned());
            Err(anyhow!("panicked: {message}"))
        }
    }
}

/// Runs one statement on the server with a connection of its own.
fn admin(base: &str, statement: &str) -> anyhow::Result<()> {
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    runtime.block_on(within(Duration::from_secs(30), statement, async {
        let mut conn = PgConnection::connect(base).await.with_context(|| format!("connecting to {base}"))?;
        sqlx::query(statement).execute(&mut conn).await?;
        conn.close().await?;
        anyhow::Ok(())
    }))?
}

/// The PostgreSQL measurements, in a schema of their own that is dropped at the end.
fn postgres(config: &Config) -> anyhow::Result<()> {
    let schema = unique("msgbench");
    admin(&config.postgres, &format!("CREATE SCHEMA {schema}")).context("creating the benchmark schema")?;
    let sep = if config.postgres.contains('?') { '&' } else { '?' };
    let url = format!("{}{sep}options=-c%20search_path%3D{schema}", config.postgres);
    let result = isolated(async {
        let transport = messaging::transport::connect(&format!("{url}&migrate=true")).await?;
        // The publisher of the latency run has its own transport, so that the
        // worker learns of each message by NOTIFY, as from another process.
        let publisher_transport = messaging::transport::connect(&url).await?;
        let pool = PgPoolOptions::new()
            .max_connections(PG_TASKS as u32)
            .acquire_timeout(Duration::from_secs(5))
            // As the transport's pool: no ping before each statement.
            .test_before_acquire(false)
            .connect(&url)
            .await?;
        let raw = Raw::Postgres(pool);
        measure("postgresql", config, (&raw, &raw), &url, transport, publisher_transport, PG_TASKS).await
    });
    if let Err(e) = admin(&config.postgres, &format!("DROP SCHEMA IF EXISTS {schema} CASCADE")) {
        eprintln!("could not drop the schema `{schema}` ({e:#}); drop it by hand");
    }
    result
}

/// The SQLite measurements, in a file of their own that is removed at the end.
fn sqlite(config: &Config) -> anyhow::Result<()> {
    let path: PathBuf = std::env::temp_dir().join(format!("{}.db", unique("msgbench")));
    let url = format!("sqlite://{}?mode=rwc", path.display());
    let result = isolated(async {
        let transport = messaging::transport::connect(&format!("{url}&migrate=true")).await?;
        // The baseline connects as the transport does: WAL, synchronous=NORMAL.
        let options = SqliteConnectOptions::from_str(&url)?
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            .synchronous(SqliteSynchronous::Normal)
            .busy_timeout(Duration::from_secs(5));
        let pool = SqlitePoolOptions::new().max_connections(2).test_before_acquire(false);
        let raw = Raw::Sqlite(pool.clone().connect_with(options.clone()).await?);
        // In the publish comparison, checkpoints too are left to the
        // transport's background task, as its own commits leave them: with
        // SQLite's default (a commit past 1,000 WAL pages checkpoints), the
        // baselines' commits checkpointed the frames the framework's inserts
        // had written, in their own time (the plain insert measured 0.9-1.2
        // million rows/s taking turns with the others, 1.5-1.8 million
        // without those checkpoints). The drain's baseline keeps the default,
        // under which it drains faster.
        let options = options.pragma("wal_autocheckpoint", "20000");
        let publishing = Raw::Sqlite(pool.connect_with(options).await?);
        measure("sqlite", config, (&raw, &publishing), &url, transport.clone(), transport, 1).await
    });
    for suffix in ["", "-wal", "-shm"] {
        let file = format!("{}{suffix}", path.display());
        if let Err(e) = std::fs::remove_file(&file) {
            if e.kind() != std::io::ErrorKind::NotFound {
                eprintln!("could not remove `{file}` ({e}); remove it by hand");
            }
        }
    }
    result
}

fn main() -> std::process::ExitCode {
    let filter = std::env::var("RUST_LOG").unwrap_or_else(|_| "warn".to_owned());
    tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).init();
    let config = Config::from_env();
    let mut failed = false;
    let only = std::env::var("BENCH_DB").unwrap_or_default();
    if only != "sqlite" {
        if let Err(e) = postgres(&config) {
            eprintln!("postgresql: FAILED: {e:#}");
            failed = true;
        }
        println!();
    }
    if only != "postgres" {
        if let Err(e) = sqlite(&config) {
            eprintln!("sqlite: FAILED: {e:#}");
            failed = true;
        }
    }
    if failed {
        std::process::ExitCode::FAILURE
    } else {
        std::process::ExitCode::SUCCESS
    }
}
