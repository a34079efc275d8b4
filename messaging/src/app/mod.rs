//! Assembly: validate what is registered, connect the transport, declare the
//! queues, let the setup hook configure, then run one worker per queue.

mod setup;
mod watch;

use std::sync::Arc;
use std::time::Duration;

use tokio::task::JoinSet;

pub use setup::{RunMode, Setup};

use crate::error::{Error, TransportError};
use crate::extract::{RequirementKind, Resources};
use crate::pipeline::Pipeline;
use crate::registry::{Registry, ValidationErrors};
use crate::shutdown::Shutdown;
use crate::transport::{Outbox, PauseScope, Transport};
use crate::worker::{Hooks, Stopped as WorkerStopped, Worker, WorkerHandle, WorkerSettings};

/// An assembled application: registry, transport and setup.
#[derive(Debug)]
pub struct App {
    registry: Registry,
    setup: Setup,
}

impl App {
    /// Validates everything registered in this binary, then declares every
    /// queue on `transport`. All problems are reported together.
    pub async fn new(transport: Arc<dyn Transport>) -> Result<App, Error> {
        let registry = Registry::from_inventory()?;
        Self::with_registry(registry, transport).await
    }

    /// Like [`App::new`] with a given registry.
    pub async fn with_registry(registry: Registry, transport: Arc<dyn Transport>) -> Result<App, Error> {
        let mut problems = Vec::new();
        // The same problem for several queues (the schema not ready, the
        // database unreachable) is said once, naming them all.
        let mut shared: Vec<(String, Vec<&str>)> = Vec::new();
        for spec in registry.queues() {
            match transport.declare(spec).await {
                Ok(()) => {}
                Err(TransportError::QueueNotFound(_)) => {
                    problems.push(format!("queue `{}` does not exist on {}", spec.name, transport.system()));
                }
                Err(other) => {
                    let problem = other.to_string();
                    match shared.iter_mut().find(|(p, _)| *p == problem) {
                        Some((_, queues)) => queues.push(spec.name),
                        None => shared.push((problem, vec![spec.name])),
                    }
                }
            }
        }
        for (problem, queues) in shared {
            let names: Vec<String> = queues.iter().map(|q| format!("`{q}`")).collect();
            let label = if names.len() == 1 { "queue" } else { "queues" };
            problems.push(format!("{label} {}: {problem}", names.join(", ")));
        }
        if !problems.is_empty() {
            return Err(ValidationErrors::new(problems).into());
        }
        let mut setup = Setup::new(transport.clone());
        if let Some(store) = transport.idempotency_store() {
            setup.idempotency = store;
        }
        Ok(App { registry, setup })
    }

    /// The setup to configure before starting.
    pub fn setup(&mut self) -> &mut Setup {
        &mut self.setup
    }

    pub(crate) fn setup_transport(&self) -> &Arc<dyn Transport> {
        &self.setup.transport
    }

    /// Where this app keeps its schedules' ledger.
    pub(crate) fn setup_schedule_ledger(&self) -> Arc<dyn crate::transport::schedules::ScheduleLedger> {
        self.setup.schedule_ledger()
    }

    /// What an operator's console reads and changes of this app.
    #[cfg_attr(not(feature = "console"), allow(dead_code))]
    pub(crate) fn operations(&self) -> Operations {
        Operations {
            transport: self.setup.transport.clone(),
            specs: self.registry.queues().to_vec(),
            pauses: self.setup.pauses.clone(),
            counters: self.setup.counters.clone(),
        }
    }

    /// The validated registry.
    pub fn registry(&self) -> &Registry {
        &self.registry
    }

    /// Keeps only the handlers of the named queues.
    pub fn only_queues(&mut self, names: &[&str]) {
        self.registry.retain_queues(|q| names.contains(&q));
    }

    /// Checks what depends on the setup: every `State<T>` a handler takes was provided.
    pub fn validate(&self) -> Result<(), Error> {
        let mut problems = Vec::new();
        for routes in self.registry.routes() {
            for route in routes.routes() {
                for req in (route.entry.requirements)() {
                    if req.kind == RequirementKind::IdempotentHandler {
                        if route.entry.idempotency.is_none() {
                            problems.push(format!(
                                "handler `{}` takes `{}`, which needs `idempotent = \"scope\"` on the handler",
                                route.entry.name, req.type_name
                            ));
                        }
                    } else if !self.setup.states.contains_key(&req.type_id) {
                        problems.push(format!(
                            "handler `{}` takes `State<{}>`, which was not provided; call `setup.provide(..)` with one in `#[messaging::main]`",
                            route.entry.name, req.type_name
                        ));
                    }
                }
            }
        }
        for schedule in self.registry.schedules() {
            for req in (schedule.requirements)() {
                if !self.setup.states.contains_key(&req.type_id) {
                    problems.push(format!(
                        "schedule `{}` takes `State<{}>`, which was not provided; call `setup.provide(..)` with one in `#[messaging::main]`",
                        schedule.name, req.type_name
                    ));
                }
            }
        }
        if problems.is_empty() {
            Ok(())
        } else {
            Err(ValidationErrors::new(problems).into())
        }
    }

    /// Validates, then starts the workers and the setup's tasks.
    pub fn start(self) -> Result<Running, Error> {
        self.validate()?;
        let operations = self.operations();
        let App { registry, mut setup } = self;
        let publisher = setup.publisher();
        let states = std::mem::take(&mut setup.states).into_iter().collect();
        let resources = Arc::new(Resources::new(states, publisher.clone()));
        let pipeline = Arc::new(Pipeline {
            behaviours: std::mem::take(&mut setup.behaviours),
            resources: resources.clone(),
            idempotency: setup.idempotency.clone(),
        });
        let settings = WorkerSettings { receive_wait: setup.receive_wait, grace: setup.grace };
        let shutdown = setup.shutdown.clone();
        let mut workers = JoinSet::new();
        let mut handles = Vec::new();
        let hooks = Hooks {
            observer: setup.observer.clone(),
            telemetry: setup.telemetry.clone(),
            enrich: setup.enrich.clone(),
            pauses: setup.pauses.clone(),
            counters: setup.counters.clone(),
        };
        for routes in registry.routes() {
            let handle = Worker::start(
                routes.clone(),
                setup.transport.clone(),
                pipeline.clone(),
                hooks.clone(),
                setup.newer_wait,
            );
            handles.push(handle.clone());
            workers.spawn(handle.run(settings, shutdown.clone()));
        }
        let mut tasks = JoinSet::new();
        for task in std::mem::take(&mut setup.tasks) {
            tasks.spawn(task);
        }
        let schedules = start_schedules(&registry, &setup, publisher, resources);
        let schedule_ledger = setup.schedule_ledger();
        let scheduled = registry.scheduled().to_vec();
        let queues: Vec<&'static str> = registry.queues().iter().map(|q| q.name).collect();
        // The dead letters of the queues this app consumes.
        let consumed: Vec<&'static str> = handles.iter().map(WorkerHandle::queue).collect();
        let queue_monitor = setup.queue_gauges.and_then(|every| {
            let gauges = setup.telemetry.queue_gauges()?;
            Some(tokio::spawn(watch::watch_queues(setup.transport.clone(), queues.clone(), gauges, every)))
        });
        let monitor = setup.telemetry.dlq_gauge().map(|gauge| {
            tokio::spawn(watch::watch_dead_letters(setup.transport.clone(), consumed, gauge, setup.dlq_depth_interval))
        });
        let outbox = setup.outbox.read().unwrap_or_else(|p| p.into_inner()).clone();
        let relay = outbox.clone().map(|outbox| {
            let stop = Shutdown::new();
            let relay = crate::relay::Relay {
                outbox,
                transport: setup.transport.clone(),
                queues: queues.clone(),
                lease: crate::relay::LEASE,
            };
            (stop.clone(), tokio::spawn(relay.run(stop)))
        });
        let outbox_monitor = outbox.as_ref().and_then(|outbox| {
            let gauge = setup.telemetry.outbox_gauge()?;
            Some(tokio::spawn(watch::watch_outbox(outbox.clone(), gauge, setup.dlq_depth_interval)))
        });
        tracing::info!(
            transport = setup.transport.system(),
            workers = handles.len(),
            outbox = outbox.as_ref().map(Outbox::system),
            "consuming"
        );
        Ok(Running {
            shutdown,
            workers,
            tasks,
            handles,
            transport: setup.transport.clone(),
            mode: setup.run_mode,
            queues,
            monitor,
            queue_monitor,
            http: None,
            relay,
            outbox,
            outbox_monitor,
            schedules,
            schedule_ledger,
            scheduled,
            operations,
        })
    }

    /// Sets the run mode (see [`RunMode`]).
    pub fn set_run_mode(&mut self, mode: RunMode) {
        self.setup.run_mode = mode;
    }

    /// How long one receive waits for messages (long polling; default 5 s).
    pub fn set_receive_wait(&mut self, wait: Duration) {
        self.setup.receive_wait = wait;
    }
}

/// What an operator's console works on: the transport, the declared
/// queues, this process's pause switches and counters.
#[cfg_attr(not(feature = "console"), allow(dead_code))]
#[derive(Clone)]
pub(crate) struct Operations {
    pub(crate) transport: Arc<dyn Transport>,
    pub(crate) specs: Vec<crate::queue::QueueSpec>,
    pub(crate) pauses: crate::control::Pauses,
    pub(crate) counters: crate::control::Counters,
}

/// What a shutdown left behind, over every worker of the app: returned by
/// [`Running::wait`] and [`Running::stop`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Stopped {
    /// Whether the shutdown was forced ([`Shutdown::force`], a second Ctrl-C).
    pub forced: bool,
    /// Handlers still running when the grace period ran out or the shutdown
    /// was forced; they were stopped.
    pub handlers_stopped: usize,
    /// Messages received and not handled, given back to their queues at once.
    pub released: usize,
    /// Messages received and not handled that could not be given back in
    /// time, and failed messages whose retry or dead letter the stop cut off
    /// on its way (waiting for a row another transaction held): they are
    /// received again once their visibility timeout runs out.
    pub not_released: usize,
    /// Receives still in flight when the shutdown stopped waiting for them
    /// (a forced shutdown waits a moment): what they leased, if anything, is
    /// in neither count above and comes back once its visibility timeout
    /// runs out.
    pub receives_cut_off: usize,
    /// Messages handled whose acknowledgement could not be stored over the
    /// whole run (the transport refused it for as long as the message
    /// stayed invisible, a minute at most, or until the stop's deadline; or
    /// a forced stop cut the flush short): they stay in their queues and
    /// are received and handled again once their visibility timeout runs
    /// out.
    pub not_acknowledged: usize,
}

impl Stopped {
    fn add(&mut self, worker: WorkerStopped) {
        self.handlers_stopped += worker.handlers_stopped;
        self.released += worker.released;
        self.not_released += worker.not_released;
        self.receives_cut_off += worker.receives_cut_off;
        self.not_acknowledged += worker.not_acknowledged;
    }
}

/// A started app.
pub struct Running {
    shutdown: Shutdown,
    workers: JoinSet<WorkerStopped>,
    tasks: JoinSet<()>,
    handles: Vec<WorkerHandle>,
    transport: Arc<dyn Transport>,
    mode: RunMode,
    /// Every declared queue (for health).
    queues: Vec<&'static str>,
    /// The task observing dead-letter depths for `messaging.dlq.depth`.
    monitor: Option<tokio::task::JoinHandle<()>>,
    /// The task observing the app's queues for the queue gauges, when asked
    /// for.
    queue_monitor: Option<tokio::task::JoinHandle<()>>,
    /// The HTTP endpoint's task, once serving.
    http: Option<tokio::task::JoinHandle<()>>,
    /// The outbox relay (its own stop, triggered once the workers are done),
    /// when the app has an outbox.
    relay: Option<(Shutdown, tokio::task::JoinHandle<()>)>,
    /// The app's outbox.
    outbox: Option<Outbox>,
    /// The task observing the outbox for its gauges.
    outbox_monitor: Option<tokio::task::JoinHandle<()>>,
    /// The schedules' tasks (they stop with the app's shutdown).
    schedules: JoinSet<()>,
    /// Where the schedules' rows are.
    schedule_ledger: Arc<dyn crate::transport::schedules::ScheduleLedger>,
    /// The app's schedules.
    scheduled: Vec<Arc<crate::registry::Scheduled>>,
    /// What the console works on.
    #[cfg_attr(not(feature = "console"), allow(dead_code))]
    operations: Operations,
}

impl std::fmt::Debug for Running {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Running").field("workers", &self.handles).field("mode", &self.mode).finish_non_exhaustive()
    }
}

impl std::fmt::Debug for WorkerHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Worker").field("queue", &self.queue()).finish()
    }
}

impl Running {
    /// The shutdown handle.
    pub fn shutdown_handle(&self) -> Shutdown {
        self.shutdown.clone()
    }

    /// Triggers a graceful shutdown and waits for it to finish.
    pub async fn stop(mut self) -> Stopped {
        self.shutdown.trigger();
        self.join().await
    }

    /// Runs until shutdown is triggered (or, in drain mode, until everything
    /// is handled), then shuts down and says what was left.
    pub async fn wait(mut self) -> Stopped {
        if self.mode == RunMode::Drain {
            let shutdown = self.shutdown.clone();
            tokio::select! {
                _ = self.drained() => shutdown.trigger(),
                _ = shutdown.wait() => {}
            }
        } else {
            self.shutdown.wait().await;
        }
        self.join().await
    }

    /// Serves `/health` (200 when every declared queue answers, else 503 with
    /// the failing queues), `/ready` (200 while consuming; 503 while a
    /// queue's receives fail, and once shutdown begins) and `/metrics`
    /// (Prometheus text, when a
    /// [`prometheus_reader`](crate::telemetry::prometheus_reader) is installed)
    /// on `addr` until shutdown. Returns the bound address (so `127.0.0.1:0`
    /// picks a free port). To fail before consuming when the port is taken,
    /// bind first and use [`Running::serve_http_on`]; `run --http ADDR` does.
    pub async fn serve_http(&mut self, addr: std::net::SocketAddr) -> Result<std::net::SocketAddr, Error> {
        let listener = crate::health::bind(addr).await?;
        self.serve_http_on(listener)
    }

    /// What an operator's console reads and changes of this app.
    #[cfg_attr(not(feature = "console"), allow(dead_code))]
    pub(crate) fn operations(&self) -> Operations {
        self.operations.clone()
    }

    /// Pauses (`true`) or resumes (`false`) the schedule `name`: while it
    /// is paused its ticks are skipped, not published, and they are not
    /// caught up when it is resumed. The pause holds for every process when
    /// the schedules' ledger is in a database they share (a database
    /// transport, or an outbox: what `app schedules pause` needs), for this
    /// process otherwise; the answer says which.
    pub async fn set_schedule_paused(&self, name: &str, paused: bool) -> Result<PauseScope, Error> {
        let Some(scheduled) = self.scheduled.iter().find(|s| s.entry.name == name) else {
            let known: Vec<&str> = self.scheduled.iter().map(|s| s.entry.name).collect();
            return Err(Error::Command(format!("`{name}` is not a running schedule; running: {}", known.join(", "))));
        };
        crate::scheduler::set_paused(self.schedule_ledger.as_ref(), scheduled, paused).await?;
        Ok(if self.schedule_ledger.shared() { PauseScope::AllProcesses } else { PauseScope::ThisProcess })
    }

    /// Like [`Running::serve_http`] on a listener bound beforehand.
    pub fn serve_http_on(&mut self, listener: tokio::net::TcpListener) -> Result<std::net::SocketAddr, Error> {
        self.serve_http_with(listener, axum::Router::new())
    }

    /// Like [`Running::serve_http_on`], serving `extra`'s routes beside the
    /// endpoints (the console's, say: `Console::of_running(&running).router()`
    /// with the `console` feature).
    pub fn serve_http_with(
        &mut self,
        listener: tokio::net::TcpListener,
        extra: axum::Router,
    ) -> Result<std::net::SocketAddr, Error> {
        let handles = self.handles.clone();
        let readiness: crate::health::Readiness = Arc::new(move || {
            handles
                .iter()
                .filter_map(|h| h.receive_error().map(|error| crate::health::Unreachable { queue: h.queue(), error }))
                .collect()
        });
        let (bound, task) = crate::health::serve(
            listener,
            self.transport.clone(),
            self.queues.clone(),
            self.shutdown.clone(),
            readiness,
            self.outbox.clone(),
            extra,
        )?;
        self.http = Some(task);
        Ok(bound)
    }

    async fn join(&mut self) -> Stopped {
        let mut stopped = Stopped::default();
        // Schedules stop at the shutdown signal; a tick being published
        // finishes, unless the shutdown is forced.
        tokio::select! {
            _ = async { while self.schedules.join_next().await.is_some() {} } => {}
            _ = self.shutdown.forced() => self.schedules.abort_all(),
        }
        while let Some(worker) = self.workers.join_next().await {
            if let Ok(worker) = worker {
                stopped.add(worker);
            }
        }
        // The relay stops after the workers, with one more pass: what
        // handlers published while finishing leaves too. A forced stop does
        // not wait for it (its claims end with their lease).
        if let Some((stop, mut relay)) = self.relay.take() {
            stop.trigger();
            tokio::select! {
                _ = &mut relay => {}
                _ = self.shutdown.forced() => relay.abort(),
            }
        }
        if let Some(monitor) = self.outbox_monitor.take() {
            end(monitor).await;
        }
        stopped.forced = self.shutdown.is_forced();
        self.tasks.abort_all();
        while self.tasks.join_next().await.is_some() {}
        for monitor in [self.monitor.take(), self.queue_monitor.take()].into_iter().flatten() {
            end(monitor).await;
        }
        if let Some(http) = self.http.take() {
            let _ = http.await;
        }
        stopped
    }

    /// Completes once the tasks are done and every queue is empty and settled
    /// (seen twice in a row, 20 ms apart).
    async fn drained(&mut self) {
        while self.tasks.join_next().await.is_some() {}
        let mut quiet = 0;
        loop {
            tokio::time::sleep(Duration::from_millis(20)).await;
            let mut idle = self.handles.iter().all(WorkerHandle::is_idle);
            if idle {
                if let Some(outbox) = &self.outbox {
                    idle = outbox_empty(outbox, &self.queues).await;
                }
            }
            if idle {
                for h in &self.handles {
                    if self.transport.depth(h.queue()).await.map_or(true, |d| d > 0) {
                        idle = false;
                        break;
                    }
                }
            }
            quiet = if idle { quiet + 1 } else { 0 };
            if quiet >= 2 {
                return;
            }
        }
    }
}

/// Starts the app's schedules in serve mode: a drained app stops when its
/// queues are empty, which a schedule would keep from happening.
fn start_schedules(
    registry: &Registry,
    setup: &Setup,
    publisher: crate::publish::Publisher,
    resources: Arc<Resources>,
) -> JoinSet<()> {
    let schedules = registry.scheduled();
    if schedules.is_empty() {
        return JoinSet::new();
    }
    if setup.run_mode == RunMode::Drain {
        tracing::info!("drain mode: the app's {} schedule(s) do not run", schedules.len());
        return JoinSet::new();
    }
    let ledger = setup.schedule_ledger();
    if !ledger.shared() && setup.transport.system() != "memory" {
        tracing::warn!(
            "the schedules' ledger is this process's: with several processes, each publishes every tick (on a FIFO \
             queue deduplicated within five minutes); give the app a database they share with an outbox \
             (--outbox URL, MESSAGING_OUTBOX_URL or setup.outbox(..)) to publish each tick once"
        );
    }
    tracing::info!(schedules = schedules.len(), ledger = ledger.describe(), "scheduling");
    let scheduler = crate::scheduler::Scheduler {
        ledger,
        publisher,
        resources,
        clock: setup.clock.clone(),
        telemetry: setup.telemetry.clone(),
    };
    scheduler.start(schedules, setup.shutdown.clone())
}

/// Aborts an observer and waits until it is gone, so that what it observed
/// is forgotten (`watch::Forget`) by the time the stop returns.
async fn end(monitor: tokio::task::JoinHandle<()>) {
    monitor.abort();
    let _ = monitor.await;
}

/// Whether the outbox holds no pending row for `queues` (an unreadable
/// outbox counts as not empty).
async fn outbox_empty(outbox: &Outbox, queues: &[&'static str]) -> bool {
    match outbox.stats().await {
        Ok(rows) => rows.iter().all(|q| q.pending == 0 || !queues.contains(&q.queue.as_str())),
        Err(_) => false,
    }
}
