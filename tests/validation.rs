//! Startup validation: one error that lists every problem, before anything is
//! consumed. This binary registers deliberately broken declarations, so it
//! holds nothing else.

use std::sync::Arc;

use messaging::prelude::*;
use messaging::registry::Registry;
use messaging::transport::memory::MemoryTransport;

// Two declarations of one queue name.
#[messaging::queue("val-dup")]
struct DupA;
#[messaging::queue("val-dup")]
struct DupB;

// Two current versions of one name (v1 forgot its `upcast`).
#[messaging::message(name = "val.thing", v = 1)]
#[derive(Serialize, Deserialize)]
struct ThingV1 {}
#[messaging::message(name = "val.thing", v = 2)]
#[derive(Serialize, Deserialize)]
struct Thing {}

// One (name, version) declared by two types.
#[messaging::message(name = "val.same", v = 1)]
#[derive(Serialize, Deserialize)]
struct SameA {}
#[messaging::message(name = "val.same", v = 1)]
#[derive(Serialize, Deserialize)]
struct SameB {}

// A chain whose handler takes the old version.
#[messaging::message(name = "val.chain", v = 1, upcast = ChainV2)]
#[derive(Serialize, Deserialize)]
struct ChainV1 {}
#[messaging::message(name = "val.chain", v = 2)]
#[derive(Serialize, Deserialize)]
struct ChainV2 {}
impl From<ChainV1> for ChainV2 {
    fn from(_: ChainV1) -> Self {
        ChainV2 {}
    }
}

#[messaging::message]
#[derive(Serialize, Deserialize)]
struct Unmapped {}

/// A queue implemented by hand and never registered.
struct Ghost;
impl Queue for Ghost {
    type Kind = messaging::Standard;
    type HasDefaultGroup = messaging::__private::No;
    const SPEC: messaging::QueueSpec = messaging::QueueSpec::standard("val-ghost");
}

#[messaging::queue("val-work", visibility = "5s")]
struct Work;

#[messaging::queue("val-mixed")]
struct Mixed;

struct NotProvided;

#[messaging::handler(queue = Ghost)]
async fn on_ghost(_m: Thing) {}

#[messaging::handler(queue = Work)]
async fn first(_m: Thing) {}

#[messaging::handler(queue = Work)]
async fn second(_m: Thing) {}

#[messaging::handler(queue = Work)]
async fn old_version(_m: ChainV1) {}

// A lease longer than the queue's visibility is not a problem: the claim is
// capped by the message's invisibility.
#[messaging::handler(queue = Work, idempotent = "scope", lease = "10s")]
async fn long_lease(_m: SameA) {}

#[messaging::handler(queue = Mixed)]
async fn mixed_a(_m: ChainV2) {}

#[messaging::handler(queue = Mixed)]
async fn mixed_b(_m: Unmapped) {}

#[messaging::queue("val-needs")]
struct Needs;

// A schedule to a queue that is not declared, and two schedules of one name.
#[messaging::schedule(every = "1h", queue = Ghost)]
fn ghost_report() -> ChainV2 {
    ChainV2 {}
}

#[messaging::schedule("0 * * * *", queue = Work, name = "val-nightly")]
fn nightly_a() -> ChainV2 {
    ChainV2 {}
}

#[messaging::schedule("30 * * * *", queue = Work, name = "val-nightly")]
fn nightly_b() -> ChainV2 {
    ChainV2 {}
}

#[messaging::handler(queue = Needs)]
async fn needs_state(_m: ChainV2, _s: State<NotProvided>) {}

#[messaging::schedule(every = "1h", queue = Needs)]
fn scheduled_needs_state(_s: State<NotProvided>) -> ChainV2 {
    ChainV2 {}
}

#[test]
fn every_problem_is_reported_at_once() {
    let errors = Registry::from_inventory().unwrap_err();
    let problems = errors.problems().join("\n");
    let expected = [
        "queue name `val-dup` is declared twice",
        "`val.thing` has 2 current versions",
        "`val.same` v1 is declared twice",
        "handler `validation::on_ghost` consumes `Ghost` (queue `val-ghost`), which is not declared",
        "queue `val-work` has two handlers for `Thing`",
        "handler `validation::old_version` takes `ChainV1` (`val.chain` v1), but the current version is v2",
        "queue `val-mixed` has several handlers, so messages are routed by type name, but `Unmapped`",
        "schedule `validation::ghost_report` publishes to `Ghost` (queue `val-ghost`), which is not declared",
        "two schedules are named `val-nightly`",
    ];
    for fragment in expected {
        assert!(problems.contains(fragment), "missing `{fragment}` in:\n{problems}");
    }
    assert_eq!(errors.problems().len(), expected.len(), "{problems}");
    let shown = errors.to_string();
    assert!(shown.starts_with(&format!("startup validation found {} problem(s):", expected.len())), "{shown}");
}

#[tokio::test]
async fn the_app_refuses_to_start() {
    let err = messaging::App::new(Arc::new(MemoryTransport::new())).await.unwrap_err();
    assert!(matches!(err, messaging::Error::Validation(_)), "{err}");
}

#[tokio::test]
async fn missing_states_are_reported_before_consuming() {
    use messaging::__private::{inventory, HandlerEntry, MessageEntry, QueueEntry, ScheduleEntry};
    // A valid subset of this binary's registrations: queue `val-needs`, its handler
    // and the `val.chain` messages.
    let queues: Vec<&'static QueueEntry> =
        inventory::iter::<QueueEntry>.into_iter().filter(|q| (q.spec)().name == "val-needs").collect();
    let messages: Vec<&'static MessageEntry> =
        inventory::iter::<MessageEntry>.into_iter().filter(|m| m.name == Some("val.chain")).collect();
    let handlers: Vec<&'static HandlerEntry> =
        inventory::iter::<HandlerEntry>.into_iter().filter(|h| h.name.ends_with("needs_state")).collect();
    let schedules: Vec<&'static ScheduleEntry> =
        inventory::iter::<ScheduleEntry>.into_iter().filter(|s| s.name.ends_with("scheduled_needs_state")).collect();
    let registry =
        Registry::build_with_schedules(&queues, &messages, &handlers, &schedules).expect("the subset is valid");
    let mut app = messaging::App::with_registry(registry, Arc::new(MemoryTransport::new())).await.unwrap();
    let err = app.validate().unwrap_err().to_string();
    assert!(err.contains("handler `validation::needs_state` takes `State<validation::NotProvided>`"), "{err}");
    assert!(
        err.contains("schedule `validation::scheduled_needs_state` takes `State<validation::NotProvided>`"),
        "{err}"
    );
    assert!(err.contains("setup.provide"), "{err}");
    app.setup().provide(NotProvided);
    app.validate().expect("valid once provided");
    let running = app.start().unwrap();
    running.stop().await;
}
