//! Attribute macros of the `messaging` framework. Use them through the
//! `messaging` crate (`#[messaging::queue]`, ...); generated code refers only
//! to `::messaging`, so this crate is never a direct dependency of an app.
//!
//! This file only documents and delegates: each macro lives in its own
//! module, where parsing and checking are apart from code generation.

mod attr;
// The runtime's cadence code (cron dialect, time zones, intervals),
// compiled here too: an expression the compiler accepts is read the same
// way when the service runs.
#[path = "../../messaging/src/schedule/cadence.rs"]
#[allow(dead_code)]
mod cadence;
// The runtime crate's duration parser, compiled here too: one syntax for
// macros, command line and URLs.
#[path = "../../messaging/src/duration.rs"]
mod duration;
mod handler;
// The runtime crate's "did you mean" distance, compiled here too.
#[path = "../../messaging/src/hint.rs"]
#[allow(dead_code)]
mod hint;
mod main_fn;
mod message;
mod queue;
mod schedule;

use proc_macro::TokenStream;

/// Declares a queue on a unit struct.
///
/// ```ignore
/// #[messaging::queue("orders.fifo", fifo, dlq = "orders-dlq.fifo", default_group = "orders",
///                    concurrency = 8, visibility = "30s", max_receives = 5)]
/// pub struct Orders;
/// ```
///
/// Options: the name (first, or `name = ".."`); `fifo`; `dlq = ".."`;
/// `default_group = ".."` (FIFO only); `concurrency = N` (default 1, strictly
/// sequential); `visibility = "30s"`; `max_receives = N` (default 5, then the
/// dead-letter queue); `idempotent` (database queues: an enqueue whose payload
/// equals the stored version of the same identity is discarded). Checked at compile time: a FIFO name ends with `.fifo`
/// and a standard one does not, the DLQ has the queue's kind, names use
/// letters, digits, `-`, `_`, `.` and at most 80 characters.
///
/// Equivalent code without the macro:
///
/// ```ignore
/// pub struct Orders;
/// impl messaging::Queue for Orders {
///     type Kind = messaging::Fifo;
///     type HasDefaultGroup = /* Yes when default_group is set */;
///     const SPEC: messaging::QueueSpec = messaging::QueueSpec { name: "orders.fifo", fifo: true, /* .. */ };
/// }
/// // plus a registration so that `#[messaging::main]` finds the queue
/// ```
#[proc_macro_attribute]
pub fn queue(args: TokenStream, item: TokenStream) -> TokenStream {
    queue::expand(args.into(), item.into()).into()
}

/// Declares a message type: its stable wire name, its version and how an
/// older version upcasts to the next.
///
/// ```ignore
/// #[messaging::message(name = "orders.placed", v = 2, id = order_id, group = customer_id)]
/// #[derive(Serialize, Deserialize)]
/// pub struct OrderPlaced { pub order_id: String, pub customer_id: String, pub coupon: Option<String> }
///
/// #[messaging::message(name = "orders.placed", v = 1, upcast = OrderPlaced)]
/// #[derive(Serialize, Deserialize)]
/// pub struct OrderPlacedV1 { pub order_id: String, pub customer_id: String }
/// impl From<OrderPlacedV1> for OrderPlaced { /* .. */ }
/// ```
///
/// Without `name` the type travels as a bare JSON body. `id = field` gives the
/// message its identity (FIFO deduplication id); `group = field` its FIFO
/// message group. Checked at compile time: `v ≥ 1`; the `upcast` target has the
/// same name, version `v + 1` and `From<Self>`; `id`/`group` name a string-like
/// field.
///
/// Equivalent code without the macro: `impl messaging::Message for OrderPlaced
/// { const NAME = Some("orders.placed"); const VERSION = 2; .. }` plus a
/// registration of the type and its upcast edge.
#[proc_macro_attribute]
pub fn message(args: TokenStream, item: TokenStream) -> TokenStream {
    message::expand(args.into(), item.into()).into()
}

/// Declares a handler: an `async fn` whose first argument is the message and
/// whose other arguments are extractors (`MessageContext`, `State<T>`,
/// `Publisher`).
///
/// ```ignore
/// #[messaging::handler(queue = Orders, idempotent = "order-finalize", lease = "60s",
///                      retry(base = "1s", max = "5m"))]
/// async fn finalize(order: OrderPlaced, ctx: MessageContext, db: State<Db>) -> Result<(), HandlerError> {
///     Ok(())
/// }
/// ```
///
/// `idempotent = "scope"` runs the handler at most once per (message id,
/// scope): before calling it the worker claims the message for at most
/// `lease` (default 30 s) and never longer than the message stays invisible,
/// and the heartbeat extends both while the handler runs; so a `lease` longer
/// than the queue's `visibility` is allowed and capped. A delivery that finds
/// the claim held elsewhere is kept and tried again when that claim's lease
/// ends, without counting an attempt.
///
/// `timeout = "5m"` stops a run of the handler that takes longer: its
/// future is dropped where it waits, and the attempt fails like any other
/// (retried, then dead-lettered with the timeout as its reason). Without
/// one, a handler that waits for good (on a server gone from the network,
/// say) holds its message and its lane for good, since the heartbeat keeps
/// the message invisible while the handler runs.
///
/// One handler on a queue makes it a single-type queue; several make it a
/// multi-type queue routed by the envelope's type name. The function stays
/// callable as written.
///
/// Equivalent code without the macro: a type implementing the erased handler
/// trait that downcasts the decoded message, builds each extractor from the
/// delivery's context and calls `finalize`, plus a registration naming the
/// queue, the message type and the options.
#[proc_macro_attribute]
pub fn handler(args: TokenStream, item: TokenStream) -> TokenStream {
    handler::expand(args.into(), item.into()).into()
}

/// Declares a recurring message: a function that returns the message to
/// publish, run on a cron expression or an interval, once per tick across
/// every process of the app.
///
/// ```ignore
/// #[messaging::schedule("30 2 * * *", queue = Reports, tz = "Europe/Oslo", catch_up = "last")]
/// fn nightly_report(tick: Tick) -> ReportDue {
///     ReportDue { at: tick.local_time().to_owned() }
/// }
///
/// #[messaging::schedule(every = "5m", queue = Probes, jitter = "30s")]
/// async fn probe(db: State<Db>) -> Option<Probe> { db.stale_probe().await }
/// ```
///
/// The cadence: a cron expression first (Vixie cron: `minute hour
/// day-of-month month day-of-week`, or six fields with seconds first), or
/// `every = "5m"` (elapsed time, aligned to the Unix epoch). Options:
/// `queue = Type` (required); `name = ".."` (default: the function's path;
/// the key of its ledger row); `tz = "Europe/Oslo"` (the cron expression's
/// wall clock, default UTC; a repeated local time fires once, a skipped one
/// once at the end of the gap); `catch_up = "skip" | "last" | "all"` (ticks
/// missed while no process ran: skipped, the newest published, or all of
/// them up to 100); `group = ".."` (the FIFO message group); `jitter =
/// "30s"` (each tick published up to that long after its time). Checked at
/// compile time: the expression, the zone, the options, and the FIFO rules
/// of a send (a FIFO queue needs a group from `group`, the message or the
/// queue's `default_group`).
///
/// The function may be `async`; it takes `Tick`, `State<T>` and `Publisher`
/// and returns the message (`M`, `Option<M>`, or a `Result` of either).
/// It stays callable as written.
///
/// Equivalent code without the macro: a function that builds each argument
/// from the tick, calls this one and encodes the message, plus a
/// registration naming the schedule, its queue, its cadence and options.
#[proc_macro_attribute]
pub fn schedule(args: TokenStream, item: TokenStream) -> TokenStream {
    schedule::expand(args.into(), item.into()).into()
}

/// Turns `async fn main` into a service: tokio runtime, logging, the command
/// line (`run`, `validate`, `queues`), assembly and validation of everything
/// registered. The body, if any, is a setup hook.
///
/// ```ignore
/// #[messaging::main]
/// async fn main(setup: &mut messaging::Setup) -> anyhow::Result<()> {
///     setup.provide(Db::connect().await?);
///     Ok(())
/// }
/// ```
///
/// Equivalent code without the macro:
///
/// ```ignore
/// fn main() -> std::process::ExitCode {
///     fn hook(setup: &mut messaging::Setup) -> messaging::BoxFuture<'_, SetupResult> { /* the body */ }
///     messaging::cli::run_main(hook)
/// }
/// ```
#[proc_macro_attribute]
pub fn main(args: TokenStream, item: TokenStream) -> TokenStream {
    main_fn::expand(args.into(), item.into()).into()
}
