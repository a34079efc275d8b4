//! Ticks under a paused clock (`start_paused`): the app's schedules run on
//! `memory://` with a wall clock that starts where the test says and
//! advances with tokio's, so an hour or three days of ticks take
//! milliseconds.

use std::time::Duration;

use messaging::prelude::*;
use messaging::schedule::Tick;
use messaging::testing::TestApp;

use super::{at, Beat, Sink};

#[messaging::queue("sched-five-minutes")]
struct FiveMinutes;
#[messaging::queue("sched-ninety-seconds")]
struct NinetySeconds;
#[messaging::queue("sched-oslo-nightly")]
struct OsloNightly;
#[messaging::queue("sched-oslo-half-hourly")]
struct OsloHalfHourly;
#[messaging::queue("sched-with-seconds.fifo", fifo)]
struct WithSeconds;

fn beat(tick: &Tick) -> Beat {
    Beat { local: tick.local_time().to_owned(), catch_up: tick.is_catch_up() }
}

#[messaging::schedule("*/5 * * * *", queue = FiveMinutes)]
fn five_minutes(tick: Tick) -> Beat {
    beat(&tick)
}

#[messaging::schedule(every = "90s", queue = NinetySeconds)]
async fn ninety_seconds(tick: Tick) -> Beat {
    beat(&tick)
}

#[messaging::schedule("30 2 * * *", queue = OsloNightly, tz = "Europe/Oslo")]
fn oslo_nightly(tick: Tick) -> Beat {
    beat(&tick)
}

#[messaging::schedule("*/30 * * * *", queue = OsloHalfHourly, tz = "Europe/Oslo")]
fn oslo_half_hourly(tick: Tick) -> Beat {
    beat(&tick)
}

#[messaging::schedule("*/20 * * * * *", queue = WithSeconds, group = "beats")]
fn with_seconds(tick: Tick) -> Beat {
    beat(&tick)
}

#[messaging::handler(queue = FiveMinutes)]
async fn seen_five(beat: Beat, ctx: MessageContext, seen: State<Sink>) {
    seen.record(&beat, &ctx);
}
#[messaging::handler(queue = NinetySeconds)]
async fn seen_ninety(beat: Beat, ctx: MessageContext, seen: State<Sink>) {
    seen.record(&beat, &ctx);
}
#[messaging::handler(queue = OsloNightly)]
async fn seen_nightly(beat: Beat, ctx: MessageContext, seen: State<Sink>) {
    seen.record(&beat, &ctx);
}
#[messaging::handler(queue = OsloHalfHourly)]
async fn seen_half_hourly(beat: Beat, ctx: MessageContext, seen: State<Sink>) {
    seen.record(&beat, &ctx);
}
#[messaging::handler(queue = WithSeconds)]
async fn seen_seconds(beat: Beat, ctx: MessageContext, seen: State<Sink>) {
    assert_eq!(ctx.group_id(), Some("beats"));
    seen.record(&beat, &ctx);
}

/// Runs the schedules of queue `Q` from `start` for `run`, on a paused
/// clock; what the handler saw.
async fn run_from<Q: Queue>(start: &str, run: Duration) -> Sink {
    let seen = Sink::default();
    let sink = seen.clone();
    let app = TestApp::builder().only::<Q>().clock_at(at(start)).setup(move |s| {
        s.provide(sink);
    });
    let app = app.start().await.expect("start");
    tokio::time::sleep(run).await;
    app.stop().await;
    seen
}

#[tokio::test(start_paused = true)]
async fn a_cron_expression_ticks_on_its_minutes() {
    let seen = run_from::<FiveMinutes>("2026-05-01T10:02:30Z", Duration::from_secs(3600)).await;
    let expected: Vec<String> =
        (5..=60).step_by(5).map(|m| format!("2026-05-01T{}:{:02}:00Z", 10 + m / 60, m % 60)).collect();
    assert_eq!(seen.locals(), expected);
    for (schedule, tick, local, catch_up) in seen.all() {
        assert_eq!(schedule, "schedules::ticks::five_minutes", "the schedule's name is the function's path");
        assert_eq!(tick, super::ms(&local), "the tick attribute is its instant");
        assert!(!catch_up);
    }
}

#[tokio::test(start_paused = true)]
async fn an_interval_ticks_on_multiples_of_its_period_since_the_epoch() {
    let seen = run_from::<NinetySeconds>("2026-05-01T10:00:10Z", Duration::from_secs(6 * 60)).await;
    assert_eq!(
        seen.locals(),
        ["2026-05-01T10:01:30Z", "2026-05-01T10:03:00Z", "2026-05-01T10:04:30Z", "2026-05-01T10:06:00Z"]
    );
}

#[tokio::test(start_paused = true)]
async fn six_fields_tick_on_seconds_with_the_schedules_group() {
    let seen = run_from::<WithSeconds>("2026-05-01T10:00:05Z", Duration::from_secs(61)).await;
    assert_eq!(seen.locals(), ["2026-05-01T10:00:20Z", "2026-05-01T10:00:40Z", "2026-05-01T10:01:00Z"]);
}

#[tokio::test(start_paused = true)]
async fn a_skipped_local_time_fires_once_when_the_clocks_go_forward() {
    // Europe/Oslo skips 02:00-03:00 on 2026-03-29: 02:30 fires at 03:00.
    let seen = run_from::<OsloNightly>("2026-03-28T12:00:00Z", Duration::from_secs(3 * 86_400)).await;
    assert_eq!(seen.locals(), ["2026-03-29T03:00:00+02:00", "2026-03-30T02:30:00+02:00", "2026-03-31T02:30:00+02:00"]);
}

#[tokio::test(start_paused = true)]
async fn a_repeated_local_time_fires_once_when_the_clocks_go_back() {
    // Europe/Oslo repeats 02:00-03:00 on 2026-10-25.
    let seen = run_from::<OsloNightly>("2026-10-24T12:00:00Z", Duration::from_secs(2 * 86_400)).await;
    assert_eq!(seen.locals(), ["2026-10-25T02:30:00+02:00", "2026-10-26T02:30:00+01:00"]);
    // Every half hour: 02:00 and 02:30 once each, in the first pass.
    let seen = run_from::<OsloHalfHourly>("2026-10-24T23:10:00Z", Duration::from_secs(3 * 3600)).await;
    assert_eq!(
        seen.locals(),
        [
            "2026-10-25T01:30:00+02:00",
            "2026-10-25T02:00:00+02:00",
            "2026-10-25T02:30:00+02:00",
            "2026-10-25T03:00:00+01:00"
        ]
    );
}

#[tokio::test(start_paused = true)]
async fn a_pause_in_the_process_skips_ticks_until_resumed() {
    let seen = Sink::default();
    let sink = seen.clone();
    let app = TestApp::builder()
        .only::<FiveMinutes>()
        .clock_at(at("2026-05-01T10:02:30Z"))
        .setup(move |s| {
            s.provide(sink);
        })
        .start()
        .await
        .expect("start");
    tokio::time::sleep(Duration::from_secs(10 * 60)).await; // 10:05, 10:10
    let scope = app.running().set_schedule_paused("schedules::ticks::five_minutes", true).await.expect("pause");
    assert_eq!(scope, messaging::transport::PauseScope::ThisProcess, "memory:// keeps the ledger in the process");
    tokio::time::sleep(Duration::from_secs(15 * 60)).await; // 10:15, 10:20, 10:25 skipped
    app.running().set_schedule_paused("schedules::ticks::five_minutes", false).await.expect("resume");
    tokio::time::sleep(Duration::from_secs(10 * 60)).await; // 10:30, 10:35
    let error = app.running().set_schedule_paused("five_minutes", true).await.unwrap_err().to_string();
    assert!(
        error.contains("`five_minutes` is not a running schedule; running: schedules::ticks::five_minutes"),
        "{error}"
    );
    app.stop().await;
    assert_eq!(
        seen.locals(),
        ["2026-05-01T10:05:00Z", "2026-05-01T10:10:00Z", "2026-05-01T10:30:00Z", "2026-05-01T10:35:00Z"]
    );
}
