//! `schedules [--json]`: each schedule, its queue, its cadence, the last
//! tick published and the next three; `schedules pause|resume NAME`.

use std::sync::Arc;

use clap::Subcommand;

use super::JsonArg;
use crate::app::App;
use crate::error::Error;
use crate::registry::Scheduled;
use crate::transport::schedules::{LedgerRow, ScheduleLedger};

/// `schedules [--json]`, `schedules pause NAME`, `schedules resume NAME`.
#[derive(Debug, Default, clap::Args)]
#[command(args_conflicts_with_subcommands = true)]
pub(super) struct SchedulesArgs {
    #[command(subcommand)]
    action: Option<SchedulesAction>,
    #[command(flatten)]
    json: JsonArg,
}

#[derive(Debug, Subcommand)]
enum SchedulesAction {
    /// Pause a schedule for every process (its ledger in a database): its
    /// ticks are skipped, not published, until it is resumed.
    Pause {
        /// The schedule's name (`app schedules` lists them).
        name: String,
    },
    /// Resume a paused schedule: it publishes from its next tick on (the
    /// ticks while it was paused are not caught up).
    Resume {
        /// The schedule's name.
        name: String,
    },
}

pub(super) async fn run(app: &App, args: SchedulesArgs) -> Result<(), Error> {
    let ledger = app.setup_schedule_ledger();
    match args.action {
        Some(SchedulesAction::Pause { name }) => pause(app, &ledger, &name, true).await,
        Some(SchedulesAction::Resume { name }) => pause(app, &ledger, &name, false).await,
        None => list(app, &ledger, args.json.json).await,
    }
}

/// The schedule of that name, or an error naming the declared ones.
fn find<'a>(app: &'a App, name: &str) -> Result<&'a Arc<Scheduled>, Error> {
    let schedules = app.registry().scheduled();
    schedules.iter().find(|s| s.entry.name == name).ok_or_else(|| {
        let known: Vec<&str> = schedules.iter().map(|s| s.entry.name).collect();
        Error::Command(if known.is_empty() {
            format!("`{name}` is not a schedule: this app declares none (#[messaging::schedule])")
        } else {
            format!("`{name}` is not a schedule; declared: {}", known.join(", "))
        })
    })
}

async fn pause(app: &App, ledger: &Arc<dyn ScheduleLedger>, name: &str, paused: bool) -> Result<(), Error> {
    let scheduled = find(app, name)?;
    if !ledger.shared() {
        return Err(Error::Command(format!(
            "this app keeps its schedules' ledger in each process ({}): a pause from here reaches no running \
             process; give the app a database the processes share (a database transport, or an outbox: \
             --outbox URL)",
            app.setup_transport().system()
        )));
    }
    crate::scheduler::set_paused(ledger.as_ref(), scheduled, paused).await?;
    if paused {
        out!("paused schedule `{name}`: every process skips its ticks until it is resumed");
    } else {
        out!("resumed schedule `{name}`: it publishes from its next tick on");
    }
    Ok(())
}

async fn list(app: &App, ledger: &Arc<dyn ScheduleLedger>, json: bool) -> Result<(), Error> {
    let rows = ledger.rows().await?;
    let now = crate::scheduler::Clock::System.now_ms();
    let schedules = app.registry().scheduled();
    for scheduled in schedules {
        let (entry, cadence) = (scheduled.entry, &scheduled.timing.cadence);
        let row: Option<LedgerRow> = rows.iter().find(|(n, _)| n == entry.name).map(|(_, r)| *r);
        let after = row.map_or(now, |r| r.last_tick_ms.max(now));
        let next = cadence.upcoming(after, 3);
        let last_published = row.and_then(|r| r.last_published_ms);
        let paused = row.is_some_and(|r| r.paused);
        if json {
            let value = serde_json::json!({
                "name": entry.name,
                "function": entry.function,
                "queue": scheduled.spec.name,
                "cron": entry.cron,
                "tz": entry.cron.map(|_| entry.zone.unwrap_or("UTC")),
                "every_ms": entry.every_ms,
                "catch_up": entry.catch_up.as_str(),
                "jitter_ms": entry.jitter_ms,
                "group": entry.group,
                "paused": paused,
                "last_published_ms": last_published,
                "last_published": last_published.map(|t| cadence.local(t)),
                "last_tick_ms": row.map(|r| r.last_tick_ms),
                "next_ms": next,
                "next": next.iter().map(|&t| cadence.local(t)).collect::<Vec<_>>(),
                "ledger": ledger.describe(),
                "shared": ledger.shared(),
            });
            out!("{value}");
            continue;
        }
        out!("{}{}", entry.name, if paused { " (paused)" } else { "" });
        out!("  queue           {}", scheduled.spec.name);
        let mut when = format!("{}, catch_up = {}", entry.describe(), entry.catch_up.as_str());
        if entry.jitter_ms > 0 {
            when.push_str(&format!(", jitter {}", crate::duration::format_duration(entry.jitter_ms)));
        }
        out!("  when            {when}");
        let last = match (last_published, row) {
            (Some(t), _) => cadence.local(t),
            (None, Some(_)) => "never".to_owned(),
            (None, None) => "never (it has not run yet)".to_owned(),
        };
        out!("  last published  {last}");
        let next: Vec<String> = next.iter().map(|&t| cadence.local(t)).collect();
        out!("  next            {}", if next.is_empty() { "never".to_owned() } else { next.join(", ") });
    }
    if !json {
        if schedules.is_empty() {
            out!("no schedules (declare one with #[messaging::schedule])");
        } else if ledger.shared() {
            out!("ledger: {} (every process reads it: each tick is published once)", ledger.describe());
        } else {
            out!(
                "ledger: each process keeps its own ({}), so this command sees none of a running process's ticks",
                app.setup_transport().system()
            );
        }
    }
    Ok(())
}
