//! [`Setup`]: what the body of `#[messaging::main]` (or a test) configures
//! before consuming starts.

use std::any::{Any, TypeId};
use std::collections::HashMap;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use crate::boxed::BoxFuture;
use crate::claims::{IdempotencyStore, MemoryIdempotencyStore};
use crate::context::MessageContext;
use crate::enrich::EnrichHook;
use crate::observe::Observer;
use crate::pipeline::Behaviour;
use crate::publish::{OutboxSlot, Publisher};
use crate::shutdown::Shutdown;
use crate::telemetry::Telemetry;
use crate::transport::{Outbox, Transport};

/// Whether `run` keeps serving or stops once the queues are drained.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum RunMode {
    /// Consume until SIGINT/SIGTERM (the default).
    #[default]
    Serve,
    /// Stop once background tasks are done, every queue with handlers is
    /// empty and nothing is in flight.
    Drain,
}

/// Configuration of an app before it starts consuming.
///
/// ```no_run
/// # use messaging::prelude::*;
/// # struct Db;
/// #[messaging::main]
/// async fn main(setup: &mut Setup) -> Result<(), std::io::Error> {
///     setup.provide(Db);                       // handlers take it as `State<Db>`
///     let publisher = setup.publisher();
///     setup.spawn(async move { let _ = publisher; /* publish something */ });
///     Ok(())
/// }
/// ```
pub struct Setup {
    pub(crate) transport: Arc<dyn Transport>,
    pub(crate) states: HashMap<TypeId, Arc<dyn Any + Send + Sync>>,
    pub(crate) state_names: Vec<&'static str>,
    pub(crate) behaviours: Vec<Arc<dyn Behaviour>>,
    pub(crate) idempotency: Arc<dyn IdempotencyStore>,
    pub(crate) tasks: Vec<BoxFuture<'static, ()>>,
    pub(crate) shutdown: Shutdown,
    pub(crate) run_mode: RunMode,
    pub(crate) grace: Duration,
    /// [`Setup::wait_for_newer`].
    pub(crate) newer_wait: Duration,
    pub(crate) receive_wait: Duration,
    pub(crate) observer: Option<Arc<dyn Observer>>,
    pub(crate) telemetry: Arc<Telemetry>,
    pub(crate) enrich: Option<EnrichHook>,
    pub(crate) dlq_depth_interval: Duration,
    /// How often the queue gauges observe the consumed queues; `None`: no
    /// queue gauges ([`Setup::queue_gauges`]).
    pub(crate) queue_gauges: Option<Duration>,
    /// The app's outbox, shared with its publishers.
    pub(crate) outbox: OutboxSlot,
    /// This process's pause switches, shared with its workers and console.
    pub(crate) pauses: crate::control::Pauses,
    /// What this process's workers handled and failed, per queue.
    pub(crate) counters: crate::control::Counters,
    /// The wall clock the schedules tick by.
    pub(crate) clock: crate::scheduler::Clock,
    /// The schedules' ledger when no database keeps it: this process's.
    pub(crate) local_ledger: Arc<crate::transport::schedules::MemoryLedger>,
    /// Where this setup's publishers count their sends instead of making
    /// them: set for the commands other than `run` ([`Setup::withhold_sends`]).
    pub(crate) withheld: Option<Arc<crate::publish::Withheld>>,
}

impl std::fmt::Debug for Setup {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Setup")
            .field("transport", &self.transport.system())
            .field("states", &self.state_names)
            .field("behaviours", &self.behaviours.len())
            .field("run_mode", &self.run_mode)
            .finish_non_exhaustive()
    }
}

impl Setup {
    /// [`Setup::wait_for_newer`]'s default: a quarter of an hour, longer
    /// than most rolling deploys take.
    pub const DEFAULT_WAIT_FOR_NEWER: Duration = Duration::from_secs(15 * 60);

    pub(crate) fn new(transport: Arc<dyn Transport>) -> Self {
        Setup {
            transport,
            states: HashMap::new(),
            state_names: Vec::new(),
            behaviours: Vec::new(),
            idempotency: Arc::new(MemoryIdempotencyStore::new()),
            tasks: Vec::new(),
            shutdown: Shutdown::new(),
            run_mode: RunMode::Serve,
            grace: Duration::from_secs(30),
            newer_wait: Setup::DEFAULT_WAIT_FOR_NEWER,
            receive_wait: Duration::from_secs(5),
            observer: None,
            telemetry: Arc::new(Telemetry::default()),
            enrich: None,
            dlq_depth_interval: Duration::from_secs(30),
            queue_gauges: None,
            outbox: OutboxSlot::default(),
            pauses: Default::default(),
            counters: Default::default(),
            clock: Default::default(),
            local_ledger: Default::default(),
            withheld: None,
        }
    }

    /// Makes the publishers this setup gives from now on count their sends
    /// instead of making them (what a command other than `run` does with
    /// `main`); what they counted.
    pub(crate) fn withhold_sends(&mut self) -> Arc<crate::publish::Withheld> {
        self.withheld.get_or_insert_with(Default::default).clone()
    }

    /// Where the schedules' ledger is: the transport's database (database
    /// queues), else the outbox's database, else this process.
    pub(crate) fn schedule_ledger(&self) -> Arc<dyn crate::transport::schedules::ScheduleLedger> {
        if let Some(ledger) = self.transport.schedule_ledger() {
            return ledger;
        }
        if let Some(outbox) = self.outbox.read().unwrap_or_else(|p| p.into_inner()).as_ref() {
            return outbox.schedule_ledger();
        }
        self.local_ledger.clone()
    }

    /// Provides a value that handlers take as `State<T>`.
    pub fn provide<T: Send + Sync + 'static>(&mut self, value: T) -> &mut Self {
        self.states.insert(TypeId::of::<T>(), Arc::new(value));
        self.state_names.push(std::any::type_name::<T>());
        self
    }

    /// Adds a behaviour (middleware) around every dispatch; the first added is
    /// the outermost.
    pub fn behaviour(&mut self, behaviour: impl Behaviour) -> &mut Self {
        self.behaviours.push(Arc::new(behaviour));
        self
    }

    /// Replaces the idempotency store (by default the transport's own database
    /// for sqlite:// and postgres://, in memory otherwise).
    pub fn idempotency_store(&mut self, store: impl IdempotencyStore) -> &mut Self {
        self.idempotency = Arc::new(store);
        self
    }

    /// A publisher on the app's transport.
    ///
    /// `main` runs for `validate`, `console`, `outbox` and `schedules` too
    /// (they need what it sets up); there the publishers it takes check and
    /// encode each message but send none, and the command says how many it
    /// left unsent. Only `run` (and an [`App`](crate::App) started in code)
    /// sends what `main` publishes.
    pub fn publisher(&self) -> Publisher {
        Publisher::of_app(self.transport.clone(), self.telemetry.clone(), self.outbox.clone(), self.withheld.clone())
    }

    /// Gives the app an outbox (what `--outbox URL` / `MESSAGING_OUTBOX_URL`
    /// does): every publisher of the app (those made before too) writes
    /// there what is published inside a transaction on the outbox's
    /// database for a queue whose transport is not that database, and `run`
    /// starts a relay that sends it. Use
    /// [`Outbox::on_pool`](crate::transport::Outbox::on_pool) with the pool
    /// your transactions come from.
    ///
    /// ```no_run
    /// # async fn f(setup: &mut messaging::Setup, pool: messaging::sqlx::PgPool) {
    /// setup.outbox(messaging::transport::Outbox::on_pool(pool));
    /// # }
    /// ```
    pub fn outbox(&mut self, outbox: Outbox) -> &mut Self {
        *self.outbox.write().unwrap_or_else(|p| p.into_inner()) = Some(outbox);
        self
    }

    /// The app's transport.
    pub fn transport(&self) -> &Arc<dyn Transport> {
        &self.transport
    }

    /// Runs a task beside the workers once `run` starts (not for `validate`
    /// or other commands). In drain mode the app waits for it.
    pub fn spawn(&mut self, task: impl Future<Output = ()> + Send + 'static) -> &mut Self {
        self.tasks.push(Box::pin(task));
        self
    }

    /// A handle that stops the app gracefully when triggered.
    pub fn shutdown_handle(&self) -> Shutdown {
        self.shutdown.clone()
    }

    /// Sets the default run mode (`run --serve` / `run --drain` override it).
    pub fn run_mode(&mut self, mode: RunMode) -> &mut Self {
        self.run_mode = mode;
        self
    }

    /// How long in-flight handlers may finish after shutdown begins (30 s by default).
    pub fn grace_period(&mut self, grace: Duration) -> &mut Self {
        self.grace = grace;
        self
    }

    /// How long after it was sent a message that this build cannot read,
    /// and a newer one may, is left for a newer build (15 minutes by
    /// default; zero turns it off): a version newer than any this build
    /// knows, or an envelope whose type no handler of its queue takes here.
    ///
    /// During a rolling deploy the old build's replicas receive what the new
    /// build's replicas publish. Such a message is given back without
    /// charging an attempt, and comes back after a pause (2 s at first,
    /// longer as it waits; 5 minutes at most), for a newer consumer to
    /// take. Once this long has passed since it was sent, it fails like any
    /// other attempt: retried with backoff, then dead-lettered with the
    /// decode error as its reason. Database queues give it back uncharged;
    /// SQS does on standard queues (every receive counts toward the redrive
    /// policy there, so the last receive it allows fails the message
    /// instead); SQS FIFO queues and `memory://` fail it at once, as
    /// without the wait. `examples/rolling.rs` shows the old build's side.
    pub fn wait_for_newer(&mut self, wait: Duration) -> &mut Self {
        self.newer_wait = wait;
        self
    }

    /// Reports every dispatch outcome to `observer`.
    pub fn observer(&mut self, observer: impl Observer) -> &mut Self {
        self.observer = Some(Arc::new(observer));
        self
    }

    /// Turns the framework's metrics off (`messaging.client.*`,
    /// `messaging.process.duration`, `messaging.dlq.depth`) for this app's
    /// workers and publishers. Spans and logs stay.
    pub fn without_observability(&mut self) -> &mut Self {
        self.telemetry.disable_metrics();
        self
    }

    /// Adds attributes to the consumer span of every message: `hook` gets the
    /// live span and the message's context. A hook that panics is contained
    /// and logged; dispatch goes on.
    ///
    /// ```no_run
    /// use tracing_opentelemetry::OpenTelemetrySpanExt as _;
    /// # fn f(setup: &mut messaging::Setup) {
    /// setup.enrich(|span, ctx| {
    ///     if let Some(tenant) = ctx.attribute("tenant") {
    ///         span.set_attribute("app.tenant", tenant.to_owned());
    ///     }
    /// });
    /// # }
    /// ```
    pub fn enrich(&mut self, hook: impl Fn(&tracing::Span, &MessageContext) + Send + Sync + 'static) -> &mut Self {
        self.enrich = Some(Arc::new(hook));
        self
    }

    /// How often the dead-letter depths of `messaging.dlq.depth`, and the
    /// outbox's gauges, are observed (default 30 s).
    pub fn dlq_depth_interval(&mut self, every: Duration) -> &mut Self {
        self.dlq_depth_interval = every.max(Duration::from_millis(10));
        self
    }

    /// Observes every queue this app declares, consumed here or not, every
    /// `every` (at least 10 ms), for three gauges, each tagged with the
    /// system and the queue: `messaging.queue.depth` (messages by
    /// `messaging.message.status`: `pending`, `sleeping`, `in_flight`,
    /// `awaiting_release`), `messaging.queue.expired` (in flight past their
    /// lease: their consumer died or lost the queue) and
    /// `messaging.queue.oldest_pending_age` (seconds the pending message
    /// that has waited longest has waited since it became receivable: since
    /// it was sent, or since its delay or backoff ended; 0 when none waits).
    /// Off by default. A transport reports what it can tell: the database
    /// queues all three; SQS its approximate counts, and `memory://` its
    /// counts and `expired`, neither the age while messages wait.
    ///
    /// Each observation counts the queue's rows on the database queues (the
    /// count `app queues` shows): a read of every row of the table, about
    /// 150 ms of the server's time for a table of 1,000,000 rows on the
    /// 2-core machine of the benchmarks. Every process asked observes alike,
    /// so ask one of them (all report the same numbers), every 30 s or so.
    ///
    /// ```no_run
    /// # use std::time::Duration;
    /// # fn configure(setup: &mut messaging::Setup) {
    /// setup.queue_gauges(Duration::from_secs(30));
    /// # }
    /// ```
    pub fn queue_gauges(&mut self, every: Duration) -> &mut Self {
        self.queue_gauges = Some(every.max(Duration::from_millis(10)));
        self
    }
}
