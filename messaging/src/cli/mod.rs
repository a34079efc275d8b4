//! The command line of every `#[messaging::main]` binary: `run` (default),
//! `validate`, `queues`, `dlq peek|redrive`, `health`, `migrate`.

mod dlq;
mod publish;
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
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Consume messages until SIGINT/SIGTERM (the default command).
    Run(RunArgs),
    /// Check registrations, transport, queues and setup, then exit (0 when all is well).
    Validate,
    /// List the declared queues with their kinds, options and depths.
    Queues,
    /// Create or upgrade the database tables (sqlite://, postgres://), then exit.
    Migrate,
    /// Dead letters: peek at them, or redrive them to their queue.
    #[command(subcommand)]
    Dlq(dlq::DlqCommand),
    /// Check that every declared queue is reachable; exit 0 when healthy, 1 otherwise.
    Health,
    /// Publish one message: its JSON data is read as the registered type and
    /// sent in the versioned envelope.
    Publish(publish::PublishArgs),
    /// Show one message: its status, attempts with their errors, and its body.
    Show(show::ShowArgs),
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
    /// Serve /health, /ready and /metrics on this address (a bare port binds
    /// to loopback: `--http 9090` is 127.0.0.1:9090).
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
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

async fn execute(cli: Cli, hook: SetupHook) -> Result<(), Error> {
    let url = cli.transport.unwrap_or_else(|| transport::DEFAULT_URL.to_owned());
    let transport = transport::connect(&url).await?;
    let command = cli.command.unwrap_or(Command::Run(RunArgs::default()));
    if matches!(command, Command::Migrate | Command::Run(RunArgs { migrate: true, .. })) {
        transport.migrate().await?;
        if matches!(command, Command::Migrate) {
            println!("migrated: {} ({url}) is ready", transport.system());
            return Ok(());
        }
    }
    let mut app = App::new(transport.clone()).await?;
    match command {
        Command::Migrate => Ok(()),
        Command::Dlq(dlq) => dlq::run(&app, dlq).await,
        Command::Health => health(&app).await,
        Command::Publish(args) => publish::run(&mut app, args).await,
        Command::Show(args) => show::run(&app, args).await,
        Command::Queues => {
            print_queues(&app).await;
            Ok(())
        }
        Command::Validate => {
            hook(app.setup()).await.map_err(Error::Setup)?;
            app.validate()?;
            let handlers: usize = app.registry().routes().iter().map(|r| r.handler_names().count()).sum();
            println!(
                "ok: {} queue(s), {} handler(s) on {} ({url})",
                app.registry().queues().len(),
                handlers,
                transport.system()
            );
            Ok(())
        }
        Command::Run(args) => {
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
            let mut running = app.start()?;
            if let Some(addr) = args.http {
                running.serve_http(addr).await?;
            }
            let shutdown = running.shutdown_handle();
            tokio::spawn(async move {
                wait_for_signal().await;
                tracing::info!("shutdown signal received; finishing in-flight messages");
                shutdown.trigger();
            });
            running.wait().await;
            Ok(())
        }
    }
}

/// Probes every declared queue; an error lists the unreachable ones.
async fn health(app: &App) -> Result<(), Error> {
    let transport = app.setup_transport();
    let queues: Vec<&'static str> = app.registry().queues().iter().map(|q| q.name).collect();
    let failing: Vec<String> = crate::health::probe(transport, &queues)
        .await
        .into_iter()
        .map(|f| format!("`{}`: {}", f.queue, f.error))
        .collect();
    if failing.is_empty() {
        println!("healthy: {} queue(s) reachable on {}", app.registry().queues().len(), transport.system());
        Ok(())
    } else {
        Err(crate::registry::ValidationErrors::new(
            failing.into_iter().map(|f| format!("unreachable queue {f}")).collect(),
        )
        .into())
    }
}

async fn print_queues(app: &App) {
    let transport = app.setup_transport();
    println!("{:<40} {:<9} {:>6} {:>8} {:>5}  dead letters", "queue", "kind", "depth", "visible", "conc");
    for spec in app.registry().queues() {
        let depth = transport.depth(spec.name).await.map_or_else(|e| format!("? ({e})"), |d| d.to_string());
        let dead = match transport.dead_letters() {
            Some(dl) => match dl.depth(spec.name).await {
                Ok(n) => format!("{n} in {}", spec.dlq.unwrap_or("status error")),
                Err(_) => spec.dlq.map_or_else(|| "-".to_owned(), str::to_owned),
            },
            None => "-".to_owned(),
        };
        println!(
            "{:<40} {:<9} {:>6} {:>7}s {:>5}  {}",
            spec.name,
            if spec.fifo { "fifo" } else { "standard" },
            depth,
            spec.visibility.as_secs(),
            spec.concurrency,
            dead
        );
    }
}

async fn wait_for_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = tokio::signal::ctrl_c() => {}
                    _ = term.recv() => {}
                }
            }
            Err(_) => {
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}
