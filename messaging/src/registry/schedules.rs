//! What `#[messaging::schedule]` registers, and its startup checks.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use crate::extract::Requirement;
use crate::queue::QueueSpec;
use crate::schedule::plan::Timing;
use crate::schedule::{Build, Cadence, CatchUp};

/// A schedule declared with `#[messaging::schedule]`.
pub struct ScheduleEntry {
    /// The schedule's name: the function's path, or `name = ".."`.
    pub name: &'static str,
    /// The function's path.
    pub function: &'static str,
    /// The queue's type path.
    pub queue_type: &'static str,
    /// The queue's description.
    pub queue: fn() -> QueueSpec,
    /// The cron expression, when it has one.
    pub cron: Option<&'static str>,
    /// The cron expression's time zone (UTC when `None`).
    pub zone: Option<&'static str>,
    /// The interval in milliseconds (`every = ".."`), when it has one.
    pub every_ms: Option<u64>,
    /// What happens to ticks missed while no process ran.
    pub catch_up: CatchUp,
    /// The FIFO message group (`group = ".."`).
    pub group: Option<&'static str>,
    /// Up to how long after its time each tick is published.
    pub jitter_ms: u64,
    /// The states its arguments need.
    pub requirements: fn() -> Vec<Requirement>,
    /// Calls the function and encodes what it returns.
    pub build: Build,
}

impl std::fmt::Debug for ScheduleEntry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ScheduleEntry")
            .field("name", &self.name)
            .field("queue", &self.queue_type)
            .field("cron", &self.cron)
            .field("every_ms", &self.every_ms)
            .finish_non_exhaustive()
    }
}

impl ScheduleEntry {
    /// The cadence as written: `0 30 2 * * (Europe/Oslo)` or `every 5m`.
    pub fn describe(&self) -> String {
        match (self.cron, self.every_ms) {
            (Some(cron), _) => match self.zone {
                Some(zone) => format!("{cron} ({zone})"),
                None => format!("{cron} (UTC)"),
            },
            (None, Some(ms)) => format!("every {}", crate::duration::format_duration(ms)),
            (None, None) => "never".to_owned(),
        }
    }
}

/// A validated schedule: its entry, its queue, its timing.
#[derive(Debug)]
pub(crate) struct Scheduled {
    pub(crate) entry: &'static ScheduleEntry,
    pub(crate) spec: QueueSpec,
    pub(crate) timing: Timing,
}

/// Checks each schedule: a declared queue, a unique name, a cadence that
/// reads (the macro checked it; an entry made by hand may not be).
pub(super) fn check(
    entries: &[&'static ScheduleEntry],
    specs: &BTreeMap<&'static str, QueueSpec>,
    problems: &mut Vec<String>,
) -> Vec<Arc<Scheduled>> {
    let mut by_name: HashMap<&'static str, &'static str> = HashMap::new();
    let mut checked = Vec::new();
    for entry in entries {
        if entry.name.trim().is_empty() {
            problems.push(format!("schedule `{}` has an empty name; give it `name = \"..\"`", entry.function));
            continue;
        }
        if let Some(other) = by_name.insert(entry.name, entry.function) {
            problems.push(format!(
                "two schedules are named `{}`: `{other}` and `{}`; give one of them `name = \"..\"`",
                entry.name, entry.function
            ));
            continue;
        }
        let queue = (entry.queue)();
        let Some(spec) = specs.get(queue.name) else {
            problems.push(format!(
                "schedule `{}` publishes to `{}` (queue `{}`), which is not declared; declare it with \
                 #[messaging::queue]",
                entry.name, entry.queue_type, queue.name
            ));
            continue;
        };
        let cadence = match (entry.cron, entry.every_ms) {
            (Some(cron), None) => Cadence::cron(cron, entry.zone),
            (None, Some(ms)) => Cadence::every(ms),
            _ => Err("it needs a cron expression or `every`, not both".to_owned()),
        };
        match cadence {
            Ok(cadence) => checked.push(Arc::new(Scheduled {
                entry,
                spec: spec.clone(),
                timing: Timing { name: entry.name, cadence, catch_up: entry.catch_up, jitter_ms: entry.jitter_ms },
            })),
            Err(e) => problems.push(format!("schedule `{}`: {e}", entry.name)),
        }
    }
    checked.sort_by(|a, b| a.entry.name.cmp(b.entry.name));
    checked
}
