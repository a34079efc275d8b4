//! Startup validation of everything registered: one error listing every problem.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use super::codec::{Chain, Route, Routes};
use super::{HandlerEntry, MessageEntry, QueueEntry, Registry, ScheduleEntry};
use crate::queue::{check_queue_name, QueueSpec};

pub use crate::error::ValidationErrors;

pub(super) fn build(
    queues: &[&'static QueueEntry],
    messages: &[&'static MessageEntry],
    handlers: &[&'static HandlerEntry],
    schedules: &[&'static ScheduleEntry],
) -> Result<Registry, ValidationErrors> {
    let mut problems = Vec::new();
    let specs = check_queues(queues, &mut problems);
    let chains = Arc::new(check_messages(messages, &mut problems));
    let routes = check_handlers(handlers, &specs, &chains, &mut problems);
    let schedules = super::schedules::check(schedules, &specs, &mut problems);
    if problems.is_empty() {
        Ok(Registry { queues: specs.into_values().collect(), routes, schedules })
    } else {
        Err(ValidationErrors::new(problems))
    }
}

fn check_queues(queues: &[&'static QueueEntry], problems: &mut Vec<String>) -> BTreeMap<&'static str, QueueSpec> {
    let mut specs: BTreeMap<&'static str, (QueueSpec, &'static str)> = BTreeMap::new();
    for entry in queues {
        let spec = (entry.spec)();
        if let Err(e) = check_queue_name(spec.name, spec.fifo) {
            problems.push(format!("queue `{}`: {e}", entry.type_name));
        }
        if let Some(dlq) = spec.dlq {
            if let Err(e) = check_queue_name(dlq, spec.fifo) {
                problems.push(format!("dead-letter queue of `{}`: {e}", entry.type_name));
            }
        }
        if spec.concurrency == 0 {
            problems.push(format!("queue `{}`: concurrency must be at least 1", entry.type_name));
        }
        match specs.get(spec.name) {
            Some((_, other)) => problems.push(format!(
                "queue name `{}` is declared twice, by `{other}` and `{}`; each queue must be declared once",
                spec.name, entry.type_name
            )),
            None => {
                specs.insert(spec.name, (spec, entry.type_name));
            }
        }
    }
    specs.into_iter().map(|(k, (spec, _))| (k, spec)).collect()
}

fn check_messages(messages: &[&'static MessageEntry], problems: &mut Vec<String>) -> HashMap<&'static str, Chain> {
    let mut by_name: BTreeMap<&'static str, Vec<&'static MessageEntry>> = BTreeMap::new();
    let mut by_type: HashMap<std::any::TypeId, &'static MessageEntry> = HashMap::new();
    for entry in messages {
        if by_type.insert((entry.type_id)(), entry).is_some() {
            problems.push(format!("message type `{}` is registered twice", entry.type_name));
        }
        if let Some(name) = entry.name {
            by_name.entry(name).or_default().push(entry);
        }
    }
    let mut chains = HashMap::new();
    for (name, mut entries) in by_name {
        entries.sort_by_key(|e| e.version);
        let mut versions = HashMap::new();
        for e in &entries {
            if e.version == 0 {
                problems.push(format!("`{}`: version 0 is not allowed; versions start at 1", e.type_name));
            }
            if let Some(prev) = versions.insert(e.version, *e) {
                problems.push(format!(
                    "`{name}` v{} is declared twice, by `{}` and `{}`",
                    e.version, prev.type_name, e.type_name
                ));
            }
        }
        let mut currents: Vec<_> = versions.values().filter(|e| e.upcast.is_none()).collect();
        currents.sort_by_key(|e| e.version);
        let current = match currents.as_slice() {
            [only] => only.version,
            [] => {
                problems.push(format!("`{name}` has no current version: every version has `upcast`"));
                continue;
            }
            many => {
                let list: Vec<String> = many.iter().map(|e| format!("v{} `{}`", e.version, e.type_name)).collect();
                let newest = many.iter().map(|e| e.version).max().unwrap_or(0);
                problems.push(format!(
                    "`{name}` has {} current versions ({}); only v{newest} may be current: give each older one `upcast = <its v+1 type>`",
                    many.len(),
                    list.join(", ")
                ));
                newest
            }
        };
        for e in &entries {
            if let Some(up) = &e.upcast {
                let target = versions.get(&(e.version + 1));
                if target.is_none_or(|t| (t.type_id)() != (up.target)()) {
                    problems.push(format!(
                        "`{name}` v{} (`{}`) upcasts to `{}`, which is not `{name}` v{}",
                        e.version,
                        e.type_name,
                        up.target_name,
                        e.version + 1
                    ));
                }
            }
        }
        let min = entries.first().map_or(current, |e| e.version);
        for v in min..current {
            if !versions.contains_key(&v) {
                problems.push(format!(
                    "`{name}` has a gap in its upcast chain: v{v} is missing between v{min} and v{current}"
                ));
            }
        }
        chains.insert(name, Chain { current, versions });
    }
    chains
}

fn check_handlers(
    handlers: &[&'static HandlerEntry],
    specs: &BTreeMap<&'static str, QueueSpec>,
    chains: &Arc<HashMap<&'static str, Chain>>,
    problems: &mut Vec<String>,
) -> Vec<Arc<Routes>> {
    let mut by_queue: BTreeMap<&'static str, Vec<&'static HandlerEntry>> = BTreeMap::new();
    let mut names = HashMap::new();
    for h in handlers {
        if names.insert(h.name, ()).is_some() {
            problems.push(format!("handler `{}` is registered twice", h.name));
        }
        let spec = (h.queue)();
        // (An idempotency `lease` longer than the queue's visibility is fine:
        // a claim never outlives its message's invisibility, see pipeline.rs.)
        if !specs.contains_key(spec.name) {
            problems.push(format!(
                "handler `{}` consumes `{}` (queue `{}`), which is not declared; declare it with #[messaging::queue]",
                h.name, h.queue_type, spec.name
            ));
        }
        if let Some(name) = h.message_name {
            if let Some(chain) = chains.get(name) {
                if chain.current != h.message_version {
                    problems.push(format!(
                        "handler `{}` takes `{}` (`{name}` v{}), but the current version is v{}; handlers take the current version",
                        h.name, h.message_type_name, h.message_version, chain.current
                    ));
                }
            }
        }
        by_queue.entry(spec.name).or_default().push(h);
    }
    let mut routes = Vec::new();
    for (queue, hs) in by_queue {
        let Some(spec) = specs.get(queue) else { continue };
        let mut seen: HashMap<std::any::TypeId, &'static str> = HashMap::new();
        for h in &hs {
            if let Some(other) = seen.insert((h.message_type)(), h.name) {
                problems.push(format!(
                    "queue `{queue}` has two handlers for `{}`: `{other}` and `{}`; keep one",
                    h.message_type_name, h.name
                ));
            }
            if hs.len() > 1 && h.message_name.is_none() {
                problems.push(format!(
                    "queue `{queue}` has several handlers, so messages are routed by type name, but `{}` (taken by `{}`) has none; \
                     give it `#[messaging::message(name = \"...\", v = 1)]`",
                    h.message_type_name, h.name
                ));
            }
        }
        routes.push(Arc::new(Routes {
            spec: spec.clone(),
            routes: hs.iter().map(|h| Route { entry: h, handler: (h.handler)() }).collect(),
            chains: chains.clone(),
        }));
    }
    routes
}
