//! Three processes of one app, on PostgreSQL and on SQLite, run the same
//! schedule (every 250 ms) for a few seconds, started one after the other:
//! each tick is published once, and none is missing between the first and
//! the last. The test binary runs itself as the processes.
#![cfg(all(feature = "postgres", feature = "sqlite"))]

use std::process::Stdio;
use std::time::Duration;

use messaging::schedule::Tick;

use super::Beat;
use crate::fixtures;

/// The period of the shared schedule, in milliseconds.
const PERIOD_MS: i64 = 250;

#[messaging::queue("sched-shared-beats")]
struct SharedBeats;

#[messaging::schedule(every = "250ms", queue = SharedBeats, name = "shared-beat", catch_up = "all")]
fn shared_beat(tick: Tick) -> Beat {
    Beat { local: tick.local_time().to_owned(), catch_up: tick.is_catch_up() }
}

#[messaging::queue("sched-killed-beats")]
struct KilledBeats;

/// Holds its claim for 100 ms of every 250: a kill often lands while it does.
#[messaging::schedule(every = "250ms", queue = KilledBeats, name = "killed-beat", catch_up = "all")]
async fn killed_beat(tick: Tick) -> Beat {
    tokio::time::sleep(Duration::from_millis(100)).await;
    Beat { local: tick.local_time().to_owned(), catch_up: tick.is_catch_up() }
}

/// One process of the app: runs the schedule of `MESSAGING_TEST_QUEUE` for
/// `MESSAGING_TEST_RUN_MS`.
#[test]
#[ignore = "entry point of the processes started by the tests of this module"]
fn schedule_process() {
    let Ok(url) = std::env::var("MESSAGING_TEST_URL") else { return };
    let queue = std::env::var("MESSAGING_TEST_QUEUE").unwrap_or_else(|_| "sched-shared-beats".into());
    let run: u64 = std::env::var("MESSAGING_TEST_RUN_MS").ok().and_then(|v| v.parse().ok()).unwrap_or(3_000);
    fixtures::runtime().block_on(async move {
        let transport = messaging::transport::connect(&url).await.expect("connect");
        let mut app = messaging::App::new(transport).await.expect("app");
        app.only_queues(&[queue.as_str()]);
        let running = app.start().expect("start");
        tokio::time::sleep(Duration::from_millis(run)).await;
        running.stop().await;
    });
}

fn spawn(url: &str, run_ms: u64) -> std::process::Child {
    spawn_on(url, "sched-shared-beats", run_ms)
}

fn spawn_on(url: &str, queue: &str, run_ms: u64) -> std::process::Child {
    fixtures::entry_process(module_path!(), "schedule_process")
        .env("MESSAGING_TEST_URL", url)
        .env("MESSAGING_TEST_QUEUE", queue)
        .env("MESSAGING_TEST_RUN_MS", run_ms.to_string())
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .spawn()
        .expect("spawn an app process")
}

/// Starts three processes 400 ms apart, each running 3 s, and waits for them.
fn run_three(url: &str) {
    let mut processes = Vec::new();
    for _ in 0..3 {
        processes.push(spawn(url, 3_000));
        std::thread::sleep(Duration::from_millis(400));
    }
    for process in &mut processes {
        let status = fixtures::wait_for(process, Duration::from_secs(60), "an app process");
        assert!(status.success(), "an app process failed: {status:?}");
    }
}

/// Checks that `ticks` (one per published message) hold each tick once,
/// with none missing between the first and the last.
pub(crate) fn once_each_without_gaps(mut ticks: Vec<i64>, period: i64) {
    assert!(ticks.len() >= 10, "a few seconds of ticks: {ticks:?}");
    ticks.sort_unstable();
    let mut distinct = ticks.clone();
    distinct.dedup();
    assert_eq!(distinct.len(), ticks.len(), "a tick was published twice: {ticks:?}");
    for pair in ticks.windows(2) {
        assert_eq!(pair[1] - pair[0], period, "a tick is missing between {} and {}: {ticks:?}", pair[0], pair[1]);
    }
}

/// The tick of each message of `sched-shared-beats`, from its attributes.
fn ticks_of(rows: Vec<(String,)>) -> Vec<i64> {
    // (The queue's own rows: the statement names it.)
    rows.into_iter()
        .map(|(attributes,)| {
            let attributes: serde_json::Value = serde_json::from_str(&attributes).expect("attributes are JSON");
            attributes[messaging::schedule::TICK_ATTRIBUTE].as_str().and_then(|t| t.parse().ok()).expect("a tick")
        })
        .collect()
}

const MESSAGES: &str = "SELECT attributes FROM messaging_messages WHERE queue = 'sched-shared-beats'";
const KILLED: &str = "SELECT attributes FROM messaging_messages WHERE queue = 'sched-killed-beats'";
const LAST: &str = "SELECT last_tick, last_published FROM messaging_schedules WHERE name = 'shared-beat'";

#[test]
fn three_processes_on_postgres_publish_each_tick_once() {
    let runtime = fixtures::runtime();
    let db = runtime.block_on(fixtures::Postgres::new());
    runtime.block_on(async {
        messaging::transport::connect(&format!("{}&migrate=true", db.url)).await.expect("migrate");
    });
    run_three(&db.url);
    runtime.block_on(async {
        let pool = messaging::sqlx::PgPool::connect(&db.url).await.expect("pool");
        let rows: Vec<(String,)> = messaging::sqlx::query_as(MESSAGES).fetch_all(&pool).await.expect("messages");
        let ticks = ticks_of(rows);
        let (last, published): (i64, Option<i64>) =
            messaging::sqlx::query_as(LAST).fetch_one(&pool).await.expect("ledger");
        assert_eq!(published, ticks.iter().max().copied());
        assert!(last >= published.unwrap_or_default());
        once_each_without_gaps(ticks, PERIOD_MS);
        pool.close().await;
    });
    runtime.block_on(db.drop());
}

#[test]
fn three_processes_on_sqlite_publish_each_tick_once() {
    let runtime = fixtures::runtime();
    let file = fixtures::SqliteFile::new();
    runtime.block_on(async {
        messaging::transport::connect(&format!("{}&migrate=true", file.url)).await.expect("migrate");
    });
    run_three(&file.url);
    runtime.block_on(async {
        let pool = messaging::sqlx::SqlitePool::connect(&file.url).await.expect("pool");
        let rows: Vec<(String,)> = messaging::sqlx::query_as(MESSAGES).fetch_all(&pool).await.expect("messages");
        let ticks = ticks_of(rows);
        let (_, published): (i64, Option<i64>) =
            messaging::sqlx::query_as(LAST).fetch_one(&pool).await.expect("ledger");
        assert_eq!(published, ticks.iter().max().copied());
        once_each_without_gaps(ticks, PERIOD_MS);
        pool.close().await;
    });
}

/// Two faults at once: processes killed (SIGKILL) while they build a tick,
/// holding its claim, and started again, three times, while two others
/// run. The claim of a dead process ends with its lease (10 s); then another
/// process takes the tick over, and `catch_up = "all"` publishes what was
/// held up. Each tick once, none missing.
#[test]
fn processes_killed_while_holding_a_claim_lose_and_repeat_no_tick() {
    let runtime = fixtures::runtime();
    let db = runtime.block_on(fixtures::Postgres::new());
    runtime.block_on(async {
        messaging::transport::connect(&format!("{}&migrate=true", db.url)).await.expect("migrate");
    });
    let start = || spawn_on(&db.url, "sched-killed-beats", 60_000);
    let mut processes = vec![start(), start(), start()];
    for round in 0..3 {
        std::thread::sleep(Duration::from_millis(1_500 + 230 * round));
        let victim = &mut processes[round as usize % 3];
        let _ = victim.kill();
        let _ = victim.wait();
        *victim = start();
    }
    // A dead claimant's lease ends within 10 s; then the ticks it held up
    // are caught up.
    std::thread::sleep(Duration::from_secs(13));
    for process in &mut processes {
        let _ = process.kill();
        let _ = process.wait();
    }
    runtime.block_on(async {
        let pool = messaging::sqlx::PgPool::connect(&db.url).await.expect("pool");
        let rows: Vec<(String,)> = messaging::sqlx::query_as(KILLED).fetch_all(&pool).await.expect("messages");
        let ticks = ticks_of(rows);
        assert!(ticks.len() >= 20, "many seconds of ticks every 250 ms: {}", ticks.len());
        once_each_without_gaps(ticks, PERIOD_MS);
        pool.close().await;
    });
    runtime.block_on(db.drop());
}
