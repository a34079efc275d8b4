//! The command line of every `#[messaging::main]` binary: `run` (default),
//! `validate`, `queues`, `dlq peek|redrive`, `health`, `migrate`.

/// `println!` for the commands' output, which a closed pipe does not stop:
/// `app show QUEUE ID | head -3` panicked ("failed printing to stdout:
/// Broken pipe") once `head` had its lines, a backtrace on the terminal.
/// What a command prints is a report of what it did or found; once the
/// reader is gone the rest is dropped and the command finishes its work
/// (a redrive is not cut short by a pager closing). Restoring `SIGPIPE`'s
/// default instead would also kill a process whose database connection
/// dropped mid-write.
macro_rules! out {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stdout(), $($arg)*);
    }};
}

mod dlq;
mod interrupt;
mod outbox;
mod publish;
mod schedules;
mod show;

use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, Subcommand};

use crate::app::{App, RunMode, Setup};
use crate::boxed::BoxFuture;
use crate::error::Error;
use crate::transport;

/// What a setup hook returns: `()` or `Result<(), E>`.
pub type SetupResult = Result<(), Box<dyn std::error::Error + Send + Sync>>;

/// The hook `#[messaging::main]` makes of the body of the user's `main`.
pub type SetupHook = for<'a> fn(&'a mut Setup) -> BoxFuture<'a, SetupResult>;

/// Checks that `queue` is a declared queue; a dead-letter queue's name is
/// answered with the queue it belongs to, since commands take the source queue.
fn declared(app: &App, queue: &str) -> Result<(), Error> {
    let queues = app.registry().queues();
    if queues.iter().any(|q| q.name == queue) {
        return Ok(());
    }
    if let Some(source) = queues.iter().find(|q| q.dlq == Some(queue)) {
        return Err(Error::Command(format!(
            "`{queue}` is the dead-letter queue of `{}`: name the queue itself (its dead letters are read through it)",
            source.name
        )));
    }
    let known: Vec<&str> = queues.iter().map(|q| q.name).collect();
    Err(Error::Command(format!("`{queue}` is not a declared queue; declared: {}", known.join(", "))))
}

#[derive(Debug, Parser)]
#[command(about = "A message-driven service built with `messaging`", version)]
struct Cli {
    /// Transport URL: sqlite://FILE, postgres://USER@HOST/DB or memory://
    /// (default: $MESSAGING_URL, else sqlite://messaging.db).
    #[arg(long, env = "MESSAGING_URL", global = true)]
    transport: Option<String>,
    /// The outbox's database, postgres://USER@HOST/DB or sqlite://FILE: the
    /// database of the transactions the app publishes in, for queues on
    /// another transport (default: $MESSAGING_OUTBOX_URL, else none).
    #[arg(long, env = "MESSAGING_OUTBOX_URL", global = true)]
    outbox: Option<String>,
    /// The console's token: every request needs it (required when the
    /// console listens beyond loopback).
    #[arg(long, env = "MESSAGING_ADMIN_TOKEN", global = true, hide_env_values = true)]
    admin_token: Option<String>,
    /// The console refuses every action (it only shows).
    #[arg(long, env = "MESSAGING_ADMIN_READ_ONLY", global = true)]
    read_only: bool,
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Consume messages until SIGINT/SIGTERM (the default command).
    Run(RunArgs),
    /// Check registrations, transport, queues and setup, then exit (0 when all is well).
    Validate(JsonArg),
    /// List the declared queues with their kinds, options and depths; pause or resume one.
    Queues(QueuesArgs),
    /// Create or upgrade the database tables (sqlite://, postgres://), then exit.
    Migrate,
    /// Dead letters: peek at them, or redrive them to their queue.
    #[command(subcommand)]
    Dlq(dlq::DlqCommand),
    /// Check that every declared queue is reachable; exit 0 when healthy, 1 otherwise.
    Health(JsonArg),
    /// Publish one message: its JSON data is read as the registered type and
    /// sent in the versioned envelope.
    Publish(publish::PublishArgs),
    /// Show one message: its status, attempts with their errors, and its body.
    Show(show::ShowArgs),
    /// Show what waits in the outbox per queue and what the transport refused.
    Outbox(outbox::OutboxArgs),
    /// List the schedules with their queues, the last tick published and the
    /// next three; pause or resume one.
    Schedules(schedules::SchedulesArgs),
    /// Serve the console (a JSON API under /api/v1 and pages at /) without
    /// consuming, until SIGINT/SIGTERM (feature `console`).
    Console(ConsoleArgs),
}

/// `queues [--json]`, `queues pause NAME`, `queues resume NAME`.
#[derive(Debug, Default, clap::Args)]
#[command(args_conflicts_with_subcommands = true)]
struct QueuesArgs {
    #[command(subcommand)]
    action: Option<QueuesAction>,
    #[command(flatten)]
    json: JsonArg,
}

#[derive(Debug, Subcommand)]
enum QueuesAction {
    /// Pause a database queue for every process: none leases its messages
    /// (within one poll interval) until it is resumed.
    Pause {
        /// The queue.
        queue: String,
    },
    /// Resume a paused database queue.
    Resume {
        /// The queue.
        queue: String,
    },
}

/// Arguments of `console`.
#[derive(Debug, clap::Args)]
struct ConsoleArgs {
    /// Where to listen (a bare port binds to loopback). Beyond loopback the
    /// console needs a token (--admin-token or MESSAGING_ADMIN_TOKEN).
    #[arg(long, value_name = "ADDR", value_parser = parse_http_addr, default_value = "127.0.0.1:9090")]
    http: std::net::SocketAddr,
}

/// `--json`, for the commands that print data.
#[derive(Debug, Default, Clone, Copy, clap::Args)]
struct JsonArg {
    /// Print JSON on standard output instead of text (one object; `queues`:
    /// one object per line).
    #[arg(long)]
    json: bool,
}

#[derive(Debug, Default, clap::Args)]
struct RunArgs {
    /// Stop once every queue is empty and nothing is in flight.
    #[arg(long, conflicts_with = "serve")]
    drain: bool,
    /// Keep serving until a signal, even if the app defaults to draining.
    #[arg(long)]
    serve: bool,
    /// How long in-flight handlers may finish after a shutdown signal, e.g. 30s.
    #[arg(long, value_parser = crate::duration::parse_duration)]
    grace: Option<Duration>,
    /// Create or upgrade the database tables before starting.
    #[arg(long)]
    migrate: bool,
    /// Serve /health, /ready and /metrics on this address, and the console
    /// at / with the `console` feature (a bare port binds to loopback:
    /// `--http 9090` is 127.0.0.1:9090).
    #[arg(long, value_name = "ADDR", value_parser = parse_http_addr)]
    http: Option<std::net::SocketAddr>,
}

/// `9090` → 127.0.0.1:9090; `0.0.0.0:9090` and `[::1]:9090` as written.
fn parse_http_addr(text: &str) -> Result<std::net::SocketAddr, String> {
    let text = text.trim();
    if let Ok(port) = text.parse::<u16>() {
        return Ok(std::net::SocketAddr::from(([127, 0, 0, 1], port)));
    }
    text.parse().map_err(|_| format!("`{text}` is not an address; write a port (9090) or IP:PORT (0.0.0.0:9090)"))
}

/// The body of the `main` that `#[messaging::main]` generates.
pub fn run_main(hook: SetupHook) -> ExitCode {
    run_parsed(Cli::parse(), hook)
}

/// [`run_main`] under the application's own name and version, for
/// `--version` and the help: what `#[messaging::main]` calls, with the
/// binary's name and its crate's version.
pub fn run_app(hook: SetupHook, name: &'static str, version: &'static str) -> ExitCode {
    use clap::{CommandFactory, FromArgMatches};
    let matches = Cli::command().name(name).version(version).get_matches();
    match Cli::from_arg_matches(&matches) {
        Ok(cli) => run_parsed(cli, hook),
        Err(e) => e.exit(),
    }
}

fn run_parsed(cli: Cli, hook: SetupHook) -> ExitCode {
    let serves_metrics = matches!(&cli.command, Some(Command::Run(RunArgs { http: Some(_), .. })));
    let _telemetry = crate::telemetry::init(crate::telemetry::TelemetryConfig::from_env().prometheus(serves_metrics));
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: could not start the tokio runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(execute(cli, hook)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(Error::Interrupted) => ExitCode::from(FORCED_EXIT as u8),
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Whether `command` works on what is there (it reads, or changes messages
/// that must exist): it opens an existing database and never creates (or
/// migrates) one. Only `run`, `migrate` and `publish` may create it.
fn uses_existing(command: &Command) -> bool {
    match command {
        Command::Validate(_)
        | Command::Queues(_)
        | Command::Health(_)
        | Command::Show(_)
        | Command::Dlq(_)
        | Command::Outbox(_)
        | Command::Schedules(_)
        | Command::Console(_) => true,
        Command::Run(_) | Command::Migrate | Command::Publish(_) => false,
    }
}

/// Runs `main` (`hook`) for `command`, a command other than `run`: the
/// publishers it takes send nothing ([`crate::publish::Withheld`]), and what
/// they would have sent is said on standard error.
async fn set_up_without_sending(app: &mut App, hook: SetupHook, command: &str) -> Result<(), Error> {
    let withheld = app.setup().withhold_sends();
    let done = hook(app.setup()).await.map_err(Error::Setup);
    if let Some(note) = withheld.summary(command) {
        eprintln!("note: {note}");
    }
    done
}

async fn execute(cli: Cli, hook: SetupHook) -> Result<(), Error> {
    let url = cli.transport.unwrap_or_else(|| transport::DEFAULT_URL.to_owned());
    let access = ConsoleAccess { token: cli.admin_token.filter(|t| !t.is_empty()), read_only: cli.read_only };
    let command = cli.command.unwrap_or(Command::Run(RunArgs::default()));
    // The outbox alone, without the transport: what an operator looks at
    // when the broker is down.
    let command = match (command, &cli.outbox) {
        (Command::Outbox(args), Some(outbox_url)) => {
            let outbox = crate::transport::Outbox::connect(outbox_url)
                .await
                .map_err(|e| Error::Command(format!("the outbox ({outbox_url}): {e}")))?;
            return outbox::run(Some(&outbox), args).await;
        }
        (command, _) => command,
    };
    let validate_json = matches!(command, Command::Validate(JsonArg { json: true }));
    let migrating = matches!(command, Command::Migrate | Command::Run(RunArgs { migrate: true, .. }));
    if !uses_existing(&command) && !migrating {
        transport::refuse_new_file_without_tables(&url)?;
    }
    let transport =
        if uses_existing(&command) { transport::connect_existing(&url).await } else { transport::connect(&url).await };
    let transport = transport.inspect_err(|e| {
        if validate_json {
            print_validation(&problems_of(e));
        }
    })?;
    if migrating {
        transport.migrate().await?;
    }
    let outbox = match &cli.outbox {
        Some(outbox_url) => {
            let opened = if migrating {
                crate::transport::Outbox::connect(&transport::with_migrate(outbox_url)).await
            } else {
                crate::transport::Outbox::connect(outbox_url).await
            };
            Some(opened.map_err(|e| Error::Command(format!("the outbox ({outbox_url}): {e}")))?)
        }
        None => None,
    };
    if matches!(command, Command::Migrate) {
        out!("migrated: {} ({url}) is ready", transport.system());
        if let (Some(outbox), Some(outbox_url)) = (&outbox, &cli.outbox) {
            out!("migrated: the outbox on {} ({outbox_url}) is ready", outbox.system());
        }
        return Ok(());
    }
    let app = App::new(transport.clone()).await.inspect_err(|e| {
        if validate_json {
            print_validation(&problems_of(e));
        }
    });
    let mut app = app?;
    if let Some(outbox) = &outbox {
        app.setup().outbox(outbox.clone());
    }
    match command {
        Command::Migrate => Ok(()),
        Command::Dlq(dlq) => dlq::run(&app, dlq).await,
        Command::Health(JsonArg { json }) => health(&app, outbox.as_ref(), json).await,
        Command::Outbox(args) => {
            // An outbox the app gives itself in `main` (`setup.outbox(..)`).
            let outbox = match outbox {
                Some(outbox) => Some(outbox),
                None => {
                    set_up_without_sending(&mut app, hook, "outbox").await?;
                    app.setup().publisher().outbox()
                }
            };
            outbox::run(outbox.as_ref(), args).await
        }
        Command::Publish(args) => publish::run(&mut app, args).await,
        Command::Schedules(args) => {
            // An outbox the app gives itself in `main` keeps the ledger of
            // a transport without a database.
            if app.setup_transport().schedule_ledger().is_none() && outbox.is_none() {
                set_up_without_sending(&mut app, hook, "schedules").await?;
            }
            schedules::run(&app, args).await
        }
        Command::Show(args) => show::run(&app, args).await,
        Command::Queues(QueuesArgs { action: Some(action), .. }) => pause(&app, action).await,
        Command::Queues(QueuesArgs { action: None, json: JsonArg { json } }) => {
            print_queues(&app, json).await;
            Ok(())
        }
        Command::Console(args) => {
            set_up_without_sending(&mut app, hook, "console").await?;
            console(&app, args.http, access).await
        }
        Command::Validate(JsonArg { json }) => {
            let checked = set_up_without_sending(&mut app, hook, "validate").await.and_then(|()| app.validate());
            if let Err(e) = checked {
                if json {
                    print_validation(&problems_of(&e));
                }
                return Err(e);
            }
            let handlers: usize = app.registry().routes().iter().map(|r| r.handler_names().count()).sum();
            let queues = app.registry().queues().len();
            if json {
                let value = serde_json::json!({
                    "status": "ok",
                    "queues": queues,
                    "handlers": handlers,
                    "transport": transport.system(),
                });
                out!("{value}");
            } else {
                out!("ok: {queues} queue(s), {handlers} handler(s) on {} ({url})", transport.system());
            }
            Ok(())
        }
        Command::Run(args) => {
            // The port first: a busy one fails the start before anything is consumed.
            let listener = match args.http {
                Some(addr) => Some(crate::health::bind(addr).await?),
                None => None,
            };
            hook(app.setup()).await.map_err(Error::Setup)?;
            if args.drain {
                app.set_run_mode(RunMode::Drain);
            }
            if args.serve {
                app.set_run_mode(RunMode::Serve);
            }
            if let Some(grace) = args.grace {
                app.setup().grace_period(grace);
            }
            // Listened for before the workers start: a signal that came
            // before the task below first waited was left to its default
            // action, which ended the process at once, its handlers'
            // messages held (seen under load: SIGINT just after two
            // handlers started).
            let mut signals = Signals::listen();
            let mut running = app.start()?;
            if let Some(listener) = listener {
                let extra = console_routes(&running, &listener, &access);
                running.serve_http_with(listener, extra)?;
            }
            let shutdown = running.shutdown_handle();
            tokio::spawn(async move {
                signals.next().await;
                tracing::info!(
                    "shutdown signal received; finishing in-flight messages (a second signal stops at once)"
                );
                shutdown.trigger();
                signals.next().await;
                tracing::warn!("second shutdown signal: stopping running handlers and releasing their messages");
                shutdown.force();
                // The promise to an operator who pressed Ctrl-C twice: out
                // within two seconds, whatever is still waiting.
                tokio::time::sleep(Duration::from_secs(2)).await;
                eprintln!("error: the shutdown did not finish within 2 s of the second signal; exiting");
                std::process::exit(FORCED_EXIT);
            });
            let stopped = running.wait().await;
            if let Some(summary) = stop_summary(&stopped) {
                eprintln!("{summary}");
            }
            if stopped.forced {
                return Err(Error::Interrupted);
            }
            Ok(())
        }
    }
}

/// What a stop left for later, for the operator: always after a forced stop
/// (second signal), after a graceful one only when something was left.
fn stop_summary(stopped: &crate::Stopped) -> Option<String> {
    let mut left = Vec::new();
    if stopped.not_acknowledged > 0 {
        left.push(format!(
            "{} handled message(s) whose acknowledgement the transport could not store: they come back and are \
             handled again",
            stopped.not_acknowledged
        ));
    }
    if stopped.receives_cut_off > 0 {
        left.push(format!(
            "{} receive(s) cut off mid-call: what they took, if anything, also comes back after its visibility \
             timeout",
            stopped.receives_cut_off
        ));
    }
    let left = left.iter().map(|l| format!("; {l}")).collect::<String>();
    let (how, when) = if stopped.forced {
        ("stopped at once (second signal)", "")
    } else if stopped.handlers_stopped == 0 && stopped.not_released == 0 && left.is_empty() {
        return None;
    } else {
        ("stopped", " at the end of the grace period")
    };
    Some(format!(
        "{how}: {} handler(s) stopped{when}, {} message(s) released, {} left to come back after their visibility \
         timeout{left}",
        stopped.handlers_stopped, stopped.released, stopped.not_released
    ))
}

/// The console's access settings from the command line.
#[derive(Debug, Clone)]
#[cfg_attr(not(feature = "console"), allow(dead_code))]
struct ConsoleAccess {
    token: Option<String>,
    read_only: bool,
}

/// The console's routes beside `/health` for `run --http`: with the
/// `console` feature, the console of the running app (locked, and said so,
/// when it listens beyond loopback without a token); without it, none.
#[cfg(feature = "console")]
fn console_routes(
    running: &crate::Running,
    listener: &tokio::net::TcpListener,
    access: &ConsoleAccess,
) -> axum::Router {
    let mut console =
        crate::console::Console::of_running(running).token(access.token.clone()).read_only(access.read_only);
    let addr = listener.local_addr().ok();
    if let Some(addr) = addr {
        console = console.listening_on(addr);
    }
    match addr {
        _ if console.locked() => tracing::warn!(
            "the console listens beyond loopback without a token and refuses every request: set MESSAGING_ADMIN_TOKEN"
        ),
        Some(addr) => tracing::info!("the console: http://{addr}/ (its JSON API under /api/v1)"),
        None => {}
    }
    console.router()
}

#[cfg(not(feature = "console"))]
fn console_routes(_: &crate::Running, _: &tokio::net::TcpListener, _: &ConsoleAccess) -> axum::Router {
    axum::Router::new()
}

/// `console`: serves the console of `app` (not consuming) on `addr` until a signal.
#[cfg(feature = "console")]
async fn console(app: &App, addr: std::net::SocketAddr, access: ConsoleAccess) -> Result<(), Error> {
    let console =
        crate::console::Console::of_app(app).token(access.token).read_only(access.read_only).listening_on(addr);
    if console.locked() {
        return Err(Error::Command(format!(
            "the console would listen on {addr}, beyond loopback, without a token: set MESSAGING_ADMIN_TOKEN \
             (or --admin-token), or listen on 127.0.0.1"
        )));
    }
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|e| Error::Command(format!("cannot listen on {addr} for the console: {e}")))?;
    let bound = listener.local_addr().map_err(|e| Error::Command(e.to_string()))?;
    out!("console: http://{bound}/ (JSON API under /api/v1); Ctrl-C stops it");
    axum::serve(listener, console.router())
        .with_graceful_shutdown(wait_for_signal())
        .await
        .map_err(|e| Error::Command(format!("the console stopped: {e}")))
}

#[cfg(not(feature = "console"))]
async fn console(_: &App, _: std::net::SocketAddr, _: ConsoleAccess) -> Result<(), Error> {
    Err(Error::Command(
        "this binary was built without the console: enable the `console` feature of messaging \
         (features = [\"console\"])"
            .to_owned(),
    ))
}

/// `queues pause|resume NAME`: the queue's flag in the database, for every process.
async fn pause(app: &App, action: QueuesAction) -> Result<(), Error> {
    let (queue, paused) = match &action {
        QueuesAction::Pause { queue } => (queue.as_str(), true),
        QueuesAction::Resume { queue } => (queue.as_str(), false),
    };
    declared(app, queue)?;
    let transport = app.setup_transport();
    let shared = match transport.browse() {
        Some(browse) => browse.set_paused(queue, paused).await?,
        None => false,
    };
    if !shared {
        return Err(Error::Command(format!(
            "the {} transport keeps no pause flag that every process reads: pause the workers of one process \
             through its console (POST /api/v1/queues/{queue}/pause, with `run --http` and the `console` feature)",
            transport.system()
        )));
    }
    if paused {
        out!("paused `{queue}`: no process leases its messages (each sees it within one poll interval)");
    } else {
        out!("resumed `{queue}`");
    }
    Ok(())
}

/// The exit status after a forced shutdown: 128 + SIGINT, as shells report
/// a process ended by Ctrl-C.
const FORCED_EXIT: i32 = 130;

/// The problems an error stands for: each of a validation's, else its text.
fn problems_of(e: &Error) -> Vec<String> {
    match e {
        Error::Validation(v) => v.problems().to_vec(),
        other => vec![other.to_string()],
    }
}

/// `validate --json` when validation fails: every problem, a sentence each.
fn print_validation(problems: &[String]) {
    out!("{}", serde_json::json!({ "status": "invalid", "problems": problems }));
}

/// Probes every declared queue; an error lists the unreachable ones.
async fn health(app: &App, outbox: Option<&crate::transport::Outbox>, json: bool) -> Result<(), Error> {
    let transport = app.setup_transport();
    let queues: Vec<&'static str> = app.registry().queues().iter().map(|q| q.name).collect();
    let failing = crate::health::probe(transport, &queues).await;
    let outbox_problem = match outbox {
        Some(outbox) => crate::health::probe_outbox(outbox).await,
        None => None,
    };
    let healthy = failing.is_empty() && outbox_problem.is_none();
    if json {
        let failing: Vec<_> =
            failing.iter().map(|f| serde_json::json!({ "queue": f.queue, "error": f.error })).collect();
        let value = serde_json::json!({
            "status": if healthy { "healthy" } else { "unhealthy" },
            "transport": transport.system(),
            "queues": queues.len(),
            "failing": failing,
            "outbox": outbox_problem,
        });
        out!("{value}");
    } else if healthy {
        out!("healthy: {} queue(s) reachable on {}", queues.len(), transport.system());
    }
    if healthy {
        return Ok(());
    }
    let mut problems: Vec<String> =
        failing.into_iter().map(|f| format!("unreachable queue `{}`: {}", f.queue, f.error)).collect();
    problems.extend(outbox_problem);
    Err(crate::registry::ValidationErrors::new(problems).into())
}

/// One declared queue as `queues` shows it.
struct QueueLine<'a> {
    spec: &'a crate::queue::QueueSpec,
    depth: Result<u64, String>,
    /// The dead letters' count, where the transport keeps them.
    dead: Option<Result<u64, String>>,
    /// Whether the queue is paused for every process (database queues).
    paused: Option<bool>,
    /// Messages in flight past their lease (`QueueCounts::expired`), where
    /// the transport can tell.
    expired: Option<u64>,
}

async fn print_queues(app: &App, json: bool) {
    let transport = app.setup_transport();
    // Every queue asked at once, as the console and `health` do: one after
    // another, a service of many SQS queues waited two requests' round
    // trip per queue.
    let lines = app.registry().queues().iter().map(|spec| queue_line(transport.as_ref(), spec));
    let lines = futures_util::future::join_all(lines).await;
    if json {
        for QueueLine { spec, depth, dead, paused, expired } in &lines {
            let value = serde_json::json!({
                "name": spec.name,
                "kind": if spec.fifo { "fifo" } else { "standard" },
                "depth": depth.as_ref().ok(),
                "depth_error": depth.as_ref().err(),
                "visibility_secs": spec.visibility.as_secs(),
                "concurrency": spec.concurrency,
                "max_receives": spec.max_receives,
                "dead_letter_queue": spec.dlq,
                "dead_letters": dead.as_ref().and_then(|d| d.as_ref().ok()),
                "paused": paused,
                "held_past_lease": expired,
            });
            out!("{value}");
        }
        return;
    }
    out!("{:<40} {:<9} {:>6} {:>8} {:>5}  dead letters", "queue", "kind", "depth", "visible", "conc");
    for QueueLine { spec, depth, dead, paused, expired } in &lines {
        let depth = depth.as_ref().map_or_else(|e| format!("? ({e})"), |d| d.to_string());
        let dead = match dead {
            Some(Ok(n)) => format!("{n} in {}", spec.dlq.unwrap_or("status error")),
            Some(Err(_)) | None => spec.dlq.map_or_else(|| "-".to_owned(), str::to_owned),
        };
        let name = if *paused == Some(true) { format!("{} (paused)", spec.name) } else { spec.name.to_owned() };
        out!(
            "{:<40} {:<9} {:>6} {:>7}s {:>5}  {}",
            name,
            if spec.fifo { "fifo" } else { "standard" },
            depth,
            spec.visibility.as_secs(),
            spec.concurrency,
            dead
        );
        if let Some(note) = expired.and_then(transport::held_past_lease) {
            out!("  {note}");
        }
    }
}

/// What `queues` shows of `spec`.
async fn queue_line<'a>(
    transport: &dyn crate::transport::Transport,
    spec: &'a crate::queue::QueueSpec,
) -> QueueLine<'a> {
    let counts = match transport.browse() {
        Some(browse) => browse.counts(spec.name).await.ok(),
        None => None,
    };
    // Depth and dead letters from one count where the transport makes
    // one (the database queues: one statement, one snapshot). Asked
    // apart while 20,000 letters were being dead-lettered, the two
    // summed to 20,034: letters moved between the two questions.
    // (A queue without a dead-letter queue keeps the transport's own
    // answer: `memory://` has none to count, the databases count the
    // queue's `error` rows.)
    let (depth, dead) = match counts.as_ref().and_then(depth_and_dead).filter(|_| spec.dlq.is_some()) {
        Some((depth, dead)) => (Ok(depth), transport.dead_letters().map(|_| Ok(dead))),
        None => {
            let depth = transport.depth(spec.name).await.map_err(|e| e.to_string());
            let dead = match transport.dead_letters() {
                Some(dl) => Some(dl.depth(spec.name).await.map_err(|e| e.to_string())),
                None => None,
            };
            (depth, dead)
        }
    };
    let paused = match transport.browse() {
        Some(browse) => browse.paused(spec.name).await.ok().flatten(),
        None => None,
    };
    // After a crash, what the dead consumer held stays in flight until a
    // receive takes it back: said here, as on the console.
    let expired = counts.and_then(|c| c.expired);
    QueueLine { spec, depth, dead, paused, expired }
}

/// A queue's depth (every message not a dead letter: waiting, sleeping, in
/// flight or awaiting release) and its dead letters, when `counts` has every
/// one of them.
fn depth_and_dead(counts: &crate::transport::QueueCounts) -> Option<(u64, u64)> {
    let depth = counts.pending? + counts.sleeping? + counts.in_flight? + counts.awaiting_release?;
    Some((depth, counts.dead?))
}

async fn wait_for_signal() {
    Signals::listen().next().await;
}

/// SIGINT and SIGTERM (Ctrl-C elsewhere), caught from the moment this is
/// made, not from the first wait.
struct Signals {
    #[cfg(unix)]
    interrupt: Option<tokio::signal::unix::Signal>,
    #[cfg(unix)]
    terminate: Option<tokio::signal::unix::Signal>,
}

impl Signals {
    fn listen() -> Signals {
        #[cfg(unix)]
        {
            use tokio::signal::unix::{signal, SignalKind};
            Signals { interrupt: signal(SignalKind::interrupt()).ok(), terminate: signal(SignalKind::terminate()).ok() }
        }
        #[cfg(not(unix))]
        {
            Signals {}
        }
    }

    /// Waits for the next signal (forever, when none could be listened for).
    async fn next(&mut self) {
        #[cfg(unix)]
        {
            async fn on(signal: &mut Option<tokio::signal::unix::Signal>) {
                match signal {
                    Some(signal) => {
                        signal.recv().await;
                    }
                    None => std::future::pending().await,
                }
            }
            tokio::select! {
                () = on(&mut self.interrupt) => {}
                () = on(&mut self.terminate) => {}
            }
        }
        #[cfg(not(unix))]
        {
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::stop_summary;
    use crate::Stopped;

    #[test]
    fn a_stop_says_what_it_left_and_a_clean_one_says_nothing() {
        assert_eq!(stop_summary(&Stopped::default()), None);
        let unacknowledged = Stopped { not_acknowledged: 3, released: 2, ..Stopped::default() };
        assert_eq!(
            stop_summary(&unacknowledged).as_deref(),
            Some(
                "stopped: 0 handler(s) stopped at the end of the grace period, 2 message(s) released, 0 left to come \
                 back after their visibility timeout; 3 handled message(s) whose acknowledgement the transport could \
                 not store: they come back and are handled again"
            )
        );
        let forced = Stopped { forced: true, handlers_stopped: 1, receives_cut_off: 1, ..Stopped::default() };
        assert_eq!(
            stop_summary(&forced).as_deref(),
            Some(
                "stopped at once (second signal): 1 handler(s) stopped, 0 message(s) released, 0 left to come back \
                 after their visibility timeout; 1 receive(s) cut off mid-call: what they took, if anything, also \
                 comes back after its visibility timeout"
            )
        );
    }
}
