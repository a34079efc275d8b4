//! Catch-up after a simulated outage, pauses, and schedule functions that
//! fail: on a SQLite file, whose ledger outlives the app, with the
//! schedules' clock set where the test says (and running in real time).
#![cfg(feature = "sqlite")]

use std::time::Duration;

use messaging::prelude::*;
use messaging::schedule::Tick;
use messaging::sqlx;
use messaging::testing::TestApp;
use messaging::transport::Transport;

use super::{at, Beat, Sink};
use crate::fixtures;

#[messaging::queue("sched-skip")]
struct SkipQueue;
#[messaging::queue("sched-last")]
struct LastQueue;
#[messaging::queue("sched-all")]
struct AllQueue;
#[messaging::queue("sched-all-capped")]
struct CappedQueue;
#[messaging::queue("sched-pausable")]
struct PausableQueue;
#[messaging::queue("sched-flaky")]
struct FlakyQueue;

fn beat(tick: &Tick) -> Beat {
    Beat { local: tick.local_time().to_owned(), catch_up: tick.is_catch_up() }
}

#[messaging::schedule("0 * * * *", queue = SkipQueue, name = "hourly-skip")]
fn hourly_skip(tick: Tick) -> Beat {
    beat(&tick)
}

#[messaging::schedule("0 * * * *", queue = LastQueue, name = "hourly-last", catch_up = "last")]
fn hourly_last(tick: Tick) -> Beat {
    beat(&tick)
}

#[messaging::schedule("0 * * * *", queue = AllQueue, name = "hourly-all", catch_up = "all")]
fn hourly_all(tick: Tick) -> Beat {
    beat(&tick)
}

#[messaging::schedule(every = "1m", queue = CappedQueue, name = "minutely-all", catch_up = "all")]
fn minutely_all(tick: Tick) -> Beat {
    beat(&tick)
}

#[messaging::schedule(every = "200ms", queue = PausableQueue, name = "pausable", catch_up = "all")]
fn pausable(tick: Tick) -> Beat {
    beat(&tick)
}

/// Fails one tick in four, panics in one, has nothing in one, publishes one.
#[messaging::schedule(every = "250ms", queue = FlakyQueue, name = "flaky")]
fn flaky(tick: Tick) -> Result<Option<Beat>, String> {
    match (tick.unix_ms() / 250) % 4 {
        0 => Err("the report service is down".into()),
        1 => Ok(None),
        2 => panic!("a bug in the schedule function"),
        _ => Ok(Some(beat(&tick))),
    }
}

#[messaging::handler(queue = SkipQueue)]
async fn seen_skip(beat: Beat, ctx: MessageContext, seen: State<Sink>) {
    seen.record(&beat, &ctx);
}
#[messaging::handler(queue = LastQueue)]
async fn seen_last(beat: Beat, ctx: MessageContext, seen: State<Sink>) {
    seen.record(&beat, &ctx);
}
#[messaging::handler(queue = AllQueue)]
async fn seen_all(beat: Beat, ctx: MessageContext, seen: State<Sink>) {
    seen.record(&beat, &ctx);
}
#[messaging::handler(queue = CappedQueue)]
async fn seen_capped(beat: Beat, ctx: MessageContext, seen: State<Sink>) {
    seen.record(&beat, &ctx);
}
#[messaging::handler(queue = PausableQueue)]
async fn seen_pausable(beat: Beat, ctx: MessageContext, seen: State<Sink>) {
    seen.record(&beat, &ctx);
}
#[messaging::handler(queue = FlakyQueue)]
async fn seen_flaky(beat: Beat, ctx: MessageContext, seen: State<Sink>) {
    seen.record(&beat, &ctx);
}

/// A SQLite file with the framework's tables, its transport and a pool on it.
async fn database() -> (fixtures::SqliteFile, std::sync::Arc<dyn Transport>, sqlx::SqlitePool) {
    let file = fixtures::SqliteFile::new();
    let transport =
        messaging::transport::connect(&format!("{}&migrate=true&poll=50ms", file.url)).await.expect("sqlite");
    let pool = sqlx::SqlitePool::connect(&file.url).await.expect("pool");
    (file, transport, pool)
}

/// The schedule's row: (last tick, last published, paused).
async fn row(pool: &sqlx::SqlitePool, name: &str) -> Option<(i64, Option<i64>, bool)> {
    sqlx::query_as("SELECT last_tick, last_published, paused FROM messaging_schedules WHERE name = ?1")
        .bind(name)
        .fetch_optional(pool)
        .await
        .expect("read the ledger")
}

/// Starts the schedules of `Q` on `transport` with the clock at `start`.
async fn start<Q: Queue>(transport: &std::sync::Arc<dyn Transport>, start: &str, seen: &Sink) -> TestApp {
    let sink = seen.clone();
    TestApp::builder()
        .only::<Q>()
        .transport(transport.clone())
        .clock_at(at(start))
        .setup(move |s| {
            s.provide(sink);
        })
        .start()
        .await
        .expect("start")
}

/// Waits until `seen` holds `n` messages (and a little longer, for any extra).
async fn expect_count(seen: &Sink, n: usize) {
    fixtures::eventually(
        Duration::from_secs(10),
        || seen.all().len() >= n,
        || format!("{n} ticks: {:?}", seen.locals()),
    )
    .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
}

/// Waits until the schedule `name` has a row in the ledger.
async fn has_row(pool: &sqlx::SqlitePool, name: &str) {
    for _ in 0..400 {
        if row(pool, name).await.is_some() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    panic!("schedule `{name}` made no row in 10 s");
}

/// The app runs at 00:00:30 (its row starts at 00:00), stops, and comes back
/// at 05:10:30: 01:00 to 05:00 were missed, 05:00 by ten minutes.
async fn outage<Q: Queue>(name: &str, expected: usize) -> (Sink, Option<(i64, Option<i64>, bool)>) {
    let (_file, transport, pool) = database().await;
    let seen = Sink::default();
    let before = start::<Q>(&transport, "2026-01-01T00:00:30Z", &seen).await;
    has_row(&pool, name).await;
    before.stop().await;
    assert_eq!(row(&pool, name).await, Some((super::ms("2026-01-01T00:00:00Z"), None, false)), "the row starts now");
    let after = start::<Q>(&transport, "2026-01-01T05:10:30Z", &seen).await;
    if expected == 0 {
        tokio::time::sleep(Duration::from_millis(1_000)).await;
    } else {
        expect_count(&seen, expected).await;
    }
    after.stop().await;
    (seen, row(&pool, name).await)
}

#[tokio::test]
async fn skip_publishes_nothing_that_was_missed() {
    let (seen, row) = outage::<SkipQueue>("hourly-skip", 0).await;
    assert_eq!(seen.locals(), Vec::<String>::new());
    assert_eq!(row, Some((super::ms("2026-01-01T05:00:00Z"), None, false)), "five ticks skipped, none published");
}

#[tokio::test]
async fn last_publishes_the_newest_missed_tick_once() {
    let (seen, row) = outage::<LastQueue>("hourly-last", 1).await;
    assert_eq!(seen.locals(), ["2026-01-01T05:00:00Z"]);
    assert!(seen.all()[0].3, "published as a catch-up");
    let five = super::ms("2026-01-01T05:00:00Z");
    assert_eq!(row, Some((five, Some(five), false)));
}

#[tokio::test]
async fn all_publishes_every_missed_tick_in_order() {
    let (seen, row) = outage::<AllQueue>("hourly-all", 5).await;
    let expected: Vec<String> = (1..=5).map(|h| format!("2026-01-01T{h:02}:00:00Z")).collect();
    assert_eq!(seen.locals(), expected);
    assert!(seen.all().iter().all(|t| t.3), "all published as catch-ups");
    let five = super::ms("2026-01-01T05:00:00Z");
    assert_eq!(row, Some((five, Some(five), false)));
}

#[tokio::test]
async fn all_stops_at_the_newest_hundred_missed_ticks() {
    let (_file, transport, pool) = database().await;
    let seen = Sink::default();
    let before = start::<CappedQueue>(&transport, "2026-01-01T00:00:30Z", &seen).await;
    has_row(&pool, "minutely-all").await;
    before.stop().await;
    // 150 minutes later: 00:01 to 02:30 missed; 02:30 itself is on time.
    let after = start::<CappedQueue>(&transport, "2026-01-01T02:30:20Z", &seen).await;
    expect_count(&seen, 100).await;
    after.stop().await;
    let locals = seen.locals();
    assert_eq!(locals.len(), 100, "{locals:?}");
    assert_eq!(locals.first().map(String::as_str), Some("2026-01-01T00:51:00Z"));
    assert_eq!(locals.last().map(String::as_str), Some("2026-01-01T02:30:00Z"));
    let mut sorted = locals.clone();
    sorted.sort();
    assert_eq!(sorted, locals, "oldest first");
}

#[tokio::test]
async fn a_paused_schedule_skips_its_ticks_and_does_not_catch_them_up() {
    let (_file, transport, pool) = database().await;
    let seen = Sink::default();
    let app = start::<PausableQueue>(&transport, "2026-01-01T00:00:00.050Z", &seen).await;
    expect_count(&seen, 3).await;
    // What `app schedules pause` does; every process reads it.
    sqlx::query("UPDATE messaging_schedules SET paused = 1 WHERE name = 'pausable'").execute(&pool).await.unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let before = seen.all().len();
    tokio::time::sleep(Duration::from_millis(1_000)).await;
    assert_eq!(seen.all().len(), before, "nothing published while paused");
    let (last_tick, _, paused) = row(&pool, "pausable").await.unwrap();
    assert!(paused);
    sqlx::query("UPDATE messaging_schedules SET paused = 0 WHERE name = 'pausable'").execute(&pool).await.unwrap();
    expect_count(&seen, before + 3).await;
    app.stop().await;
    let ticks: Vec<i64> = seen.all().iter().map(|t| t.1).collect();
    let resumed: Vec<i64> = ticks[before..].to_vec();
    assert!(
        resumed.iter().all(|&t| t > last_tick),
        "paused ticks were not caught up: {ticks:?} (paused through {last_tick})"
    );
    assert!(seen.all()[before..].iter().all(|t| !t.3), "the ticks after a pause are on time");
}

#[tokio::test]
async fn a_failing_or_panicking_schedule_function_costs_its_tick_only() {
    let (_file, transport, pool) = database().await;
    let seen = Sink::default();
    let app = start::<FlakyQueue>(&transport, "2026-01-01T00:00:00.100Z", &seen).await;
    expect_count(&seen, 3).await;
    app.stop().await;
    let ticks: Vec<i64> = seen.all().iter().map(|t| t.1).collect();
    assert!(ticks.iter().all(|t| (t / 250) % 4 == 3), "only the good ticks publish: {ticks:?}");
    assert!(ticks.windows(2).all(|w| w[1] - w[0] == 1_000), "one in four, none missing: {ticks:?}");
    let (last_tick, last_published, _) = row(&pool, "flaky").await.unwrap();
    assert!(last_tick >= *ticks.last().unwrap() && last_published == ticks.last().copied());
}
