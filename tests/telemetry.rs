//! Telemetry across the queue hop, read back through an in-memory span
//! exporter and metric reader: the consumer span joins the producer's trace
//! (memory, SQLite, SQS), metric names/units/tags/values after successes,
//! failures and an in-progress idempotent claim, the enrichment hook (also
//! when it panics), `without_observability`, and `/health` turning 503 when
//! a queue disappears; through an outbox, the relay's span links to the
//! producer's while the consumer continues the producer's trace, the
//! outbox's gauges, and the queue gauges (on when asked for).

mod fixtures;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use messaging::prelude::*;
use messaging::testing::TestApp;
use messaging::transport::Transport;
use opentelemetry::trace::{SpanKind, TraceContextExt as _, TracerProvider as _};
use opentelemetry::{KeyValue, Value};
use opentelemetry_sdk::metrics::data::{AggregatedMetrics, MetricData};
use opentelemetry_sdk::metrics::{InMemoryMetricExporter, PeriodicReader, SdkMeterProvider};
use opentelemetry_sdk::trace::{InMemorySpanExporter, SdkTracerProvider, SpanData};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tracing::Instrument as _;
use tracing_opentelemetry::OpenTelemetrySpanExt as _;
use tracing_subscriber::layer::SubscriberExt;

// --- the exporters, installed once per test binary ---------------------------------------

struct Otel {
    spans: InMemorySpanExporter,
    metrics: InMemoryMetricExporter,
    meter: SdkMeterProvider,
}

/// Installs the OpenTelemetry layer and meter provider (before any app is built).
fn otel() -> &'static Otel {
    static OTEL: OnceLock<Otel> = OnceLock::new();
    OTEL.get_or_init(|| {
        let spans = InMemorySpanExporter::default();
        let tracer = SdkTracerProvider::builder().with_simple_exporter(spans.clone()).build();
        let subscriber =
            tracing_subscriber::registry().with(tracing_opentelemetry::layer().with_tracer(tracer.tracer("tests")));
        tracing::subscriber::set_global_default(subscriber).expect("the only subscriber");
        let metrics = InMemoryMetricExporter::default();
        let meter = SdkMeterProvider::builder()
            .with_reader(PeriodicReader::builder(metrics.clone()).build())
            .with_reader(messaging::telemetry::prometheus_reader().expect("a Prometheus reader"))
            .build();
        opentelemetry::global::set_meter_provider(meter.clone());
        Otel { spans, metrics, meter }
    })
}

fn attribute<'a>(attributes: impl IntoIterator<Item = &'a KeyValue>, key: &str) -> Option<Value> {
    attributes.into_iter().find(|kv| kv.key.as_str() == key).map(|kv| kv.value.clone())
}

fn text(value: Option<Value>) -> Option<String> {
    value.map(|v| v.as_str().into_owned())
}

/// The finished spans named `name`, waiting (spans end after the outcome is reported).
async fn spans_named(name: &str, count: usize) -> Vec<SpanData> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let found: Vec<SpanData> =
            otel().spans.get_finished_spans().expect("spans").into_iter().filter(|s| s.name == name).collect();
        if found.len() >= count || Instant::now() > deadline {
            return found;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// A metric's data points for `queue` as (attributes, value), after a flush.
fn points(name: &str, queue: &str) -> Vec<(HashMap<String, String>, f64)> {
    let otel = otel();
    otel.meter.force_flush().expect("flush");
    let snapshots = otel.metrics.get_finished_metrics().expect("metrics");
    let Some(latest) = snapshots.last() else { return Vec::new() };
    let mut found = Vec::new();
    for scope in latest.scope_metrics().filter(|s| s.scope().name() == "messaging") {
        for metric in scope.metrics().filter(|m| m.name() == name) {
            let mut push = |attrs: Vec<&KeyValue>, value: f64| {
                let attrs: HashMap<String, String> =
                    attrs.into_iter().map(|kv| (kv.key.to_string(), kv.value.as_str().into_owned())).collect();
                if attrs.get("messaging.destination.name").map(String::as_str) == Some(queue) {
                    found.push((attrs, value));
                }
            };
            match metric.data() {
                AggregatedMetrics::U64(MetricData::Sum(sum)) => {
                    sum.data_points().for_each(|p| push(p.attributes().collect(), p.value() as f64))
                }
                AggregatedMetrics::U64(MetricData::Gauge(gauge)) => {
                    gauge.data_points().for_each(|p| push(p.attributes().collect(), p.value() as f64))
                }
                AggregatedMetrics::F64(MetricData::Gauge(gauge)) => {
                    gauge.data_points().for_each(|p| push(p.attributes().collect(), p.value()))
                }
                // Histograms: the count of recordings.
                AggregatedMetrics::F64(MetricData::Histogram(h)) => {
                    h.data_points().for_each(|p| push(p.attributes().collect(), p.count() as f64))
                }
                other => panic!("unexpected data for {name}: {other:?}"),
            }
        }
    }
    found
}

/// The value of the point whose `error.type` is `error` (None: no error.type).
fn value(points: &[(HashMap<String, String>, f64)], error: Option<&str>) -> f64 {
    points.iter().filter(|(a, _)| a.get("error.type").map(String::as_str) == error).map(|(_, v)| v).sum()
}

fn unit_of(name: &str) -> String {
    let otel = otel();
    otel.meter.force_flush().expect("flush");
    let snapshots = otel.metrics.get_finished_metrics().expect("metrics");
    snapshots
        .last()
        .and_then(|rm| {
            rm.scope_metrics().flat_map(|s| s.metrics()).find(|m| m.name() == name).map(|m| m.unit().to_owned())
        })
        .unwrap_or_default()
}

// --- trace propagation -------------------------------------------------------------------

#[messaging::message(name = "tele.job", v = 1)]
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Job {
    n: u32,
    /// `ok`, `flaky` (fails its first receive), `poison` (fails permanently).
    kind: String,
}

fn job(n: u32, kind: &str) -> Job {
    Job { n, kind: kind.to_owned() }
}

/// What handlers saw: the producer's context (trace id, span id) and the
/// names of the message's attributes.
type Seen = Arc<Mutex<Vec<(String, String, Vec<String>)>>>;

#[messaging::queue("tele-traced")]
struct Traced;

#[messaging::handler(queue = Traced)]
async fn traced(_job: Job, ctx: MessageContext, seen: State<Seen>) {
    if let Some(producer) = ctx.producer_context() {
        let mut names: Vec<String> = ctx.attributes().keys().cloned().collect();
        names.sort();
        seen.lock().unwrap().push((producer.trace_id().to_string(), producer.span_id().to_string(), names));
    }
}

/// Publishes one message inside a parent span and checks the hop.
async fn assert_consumer_joins_producer_trace(transport: Option<Arc<dyn Transport>>, system: &str) {
    otel();
    let seen = Seen::default();
    let s = seen.clone();
    let mut builder = TestApp::builder().only::<Traced>().timeout(Duration::from_secs(20)).setup(move |setup| {
        setup.provide(s);
    });
    if let Some(transport) = transport {
        builder = builder.transport(transport);
    }
    let app = builder.start().await.expect("app");
    let root = tracing::info_span!("request");
    let root_trace = root.context().span().span_context().trace_id();
    let id = app.publisher().send::<Traced, _>(&job(1, "ok")).instrument(root.clone()).await.expect("sent");
    app.handled(&id).await.expect("handled");
    app.stop().await;

    let producers: Vec<SpanData> = spans_named("send tele-traced", 1)
        .await
        .into_iter()
        .filter(|s| s.span_context.trace_id() == root_trace)
        .collect();
    assert_eq!(producers.len(), 1, "one producer span in the request's trace");
    let producer = &producers[0];
    assert_eq!(producer.span_kind, SpanKind::Producer);
    assert_eq!(text(attribute(&producer.attributes, "messaging.system")).as_deref(), Some(system));
    assert_eq!(text(attribute(&producer.attributes, "messaging.destination.name")).as_deref(), Some("tele-traced"));
    assert_eq!(text(attribute(&producer.attributes, "messaging.operation.type")).as_deref(), Some("send"));
    assert_eq!(text(attribute(&producer.attributes, "messaging.message.id")).as_deref(), Some(id.as_ref()));

    let consumers: Vec<SpanData> = spans_named("process tele-traced", 1)
        .await
        .into_iter()
        .filter(|s| text(attribute(&s.attributes, "messaging.message.id")).as_deref() == Some(id.as_ref()))
        .collect();
    assert_eq!(consumers.len(), 1, "one consumer span for the message");
    let consumer = &consumers[0];
    assert_eq!(consumer.span_kind, SpanKind::Consumer);
    assert_eq!(consumer.span_context.trace_id(), root_trace, "the consumer continues the producer's trace");
    assert_eq!(consumer.parent_span_id, producer.span_context.span_id(), "child of the producer span");
    assert_eq!(text(attribute(&consumer.attributes, "messaging.operation.name")).as_deref(), Some("process"));
    assert_eq!(text(attribute(&consumer.attributes, "messaging.system")).as_deref(), Some(system));
    assert_eq!(attribute(&consumer.attributes, "messaging.message.receive_count"), Some(Value::I64(1)));

    let seen = seen.lock().unwrap().clone();
    assert_eq!(
        seen,
        [(
            producer.span_context.trace_id().to_string(),
            producer.span_context.span_id().to_string(),
            vec!["traceparent".to_owned()]
        )],
        "MessageContext::producer_context is the producer span; an empty tracestate is not sent (SQS refuses it)"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn through_an_outbox_the_relay_links_to_the_producer_and_the_consumer_continues_its_trace() {
    otel();
    let file = fixtures::SqliteFile::new();
    let outbox = messaging::transport::Outbox::connect(&format!("{}&migrate=true", file.url)).await.expect("outbox");
    let pool = messaging::sqlx::SqlitePool::connect(&file.url).await.expect("pool");
    // A row of a queue this app does not declare: it stays, for the gauges.
    messaging::sqlx::query(
        "INSERT INTO messaging_outbox (queue, message_id, fifo, payload, created_at, next_at) \
         VALUES ('tele-elsewhere', 'm-1', 0, x'7b7d', 0, 0)",
    )
    .execute(&pool)
    .await
    .expect("a row");
    let transport = messaging::transport::connect("memory://").await.expect("memory");
    let mut app = messaging::App::new(transport).await.expect("app");
    app.only_queues(&["tele-traced"]);
    let seen = Seen::default();
    app.setup().provide(seen.clone());
    app.setup().outbox(outbox).dlq_depth_interval(Duration::from_millis(50));
    let publisher = app.setup().publisher();
    let running = app.start().expect("start");
    let root = tracing::info_span!("request");
    let root_trace = root.context().span().span_context().trace_id();
    let id = async {
        // A deferred BEGIN, while the relay claims: the publish must write
        // first (a read before it once met SQLITE_BUSY here).
        let mut tx = pool.begin().await.expect("begin");
        let id = publisher.send::<Traced, _>(&job(7, "ok")).in_transaction(&mut tx).await.expect("in the tx");
        publisher.commit(tx).await.expect("commit");
        id
    }
    .instrument(root.clone())
    .await;
    let deadline = Instant::now() + Duration::from_secs(10);
    while seen.lock().unwrap().is_empty() {
        assert!(Instant::now() < deadline, "not relayed and handled");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let producer = spans_named("send tele-traced", 1)
        .await
        .into_iter()
        .find(|s| s.span_context.trace_id() == root_trace)
        .expect("the producer span, in the request's trace");
    assert_eq!(text(attribute(&producer.attributes, "messaging.message.id")).as_deref(), Some(id.as_ref()));
    let relays: Vec<SpanData> = spans_named("relay tele-traced", 1)
        .await
        .into_iter()
        .filter(|s| s.links.iter().any(|l| l.span_context.span_id() == producer.span_context.span_id()))
        .collect();
    assert_eq!(relays.len(), 1, "one relay span linked to the producer span");
    assert_eq!(relays[0].span_kind, SpanKind::Producer);
    assert_eq!(text(attribute(&relays[0].attributes, "messaging.operation.name")).as_deref(), Some("relay"));
    let seen = seen.lock().unwrap().clone();
    assert_eq!(
        (seen[0].0.as_str(), seen[0].1.as_str()),
        (producer.span_context.trace_id().to_string().as_str(), producer.span_context.span_id().to_string().as_str()),
        "the handler's producer context is the publishing span, not the relay's"
    );
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let depth = points("messaging.outbox.depth", "tele-elsewhere");
        let age = points("messaging.outbox.oldest_age", "tele-elsewhere");
        if depth.first().map(|p| p.1) == Some(1.0) && age.first().is_some_and(|p| p.1 > 1e9) {
            break;
        }
        assert!(Instant::now() < deadline, "outbox gauges: depth {depth:?}, age {age:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(unit_of("messaging.outbox.oldest_age"), "s");
    running.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn the_consumer_span_joins_the_producer_trace_in_memory() {
    assert_consumer_joins_producer_trace(None, "memory").await;
}

#[cfg(feature = "sqlite")]
#[tokio::test(flavor = "multi_thread")]
async fn the_consumer_span_joins_the_producer_trace_on_sqlite() {
    let file = fixtures::SqliteFile::new();
    let transport = messaging::transport::connect(&format!("{}&migrate=true", file.url)).await.expect("sqlite");
    assert_consumer_joins_producer_trace(Some(transport), "sqlite").await;
}

#[cfg(feature = "sqs")]
#[tokio::test(flavor = "multi_thread")]
async fn the_consumer_span_joins_the_producer_trace_on_sqs() {
    let moto = fixtures::SqsServer::start();
    let transport = messaging::transport::connect(&moto.url(true)).await.expect("sqs");
    assert_consumer_joins_producer_trace(Some(transport), "aws_sqs").await;
}

// --- metrics -------------------------------------------------------------------------------

#[derive(Debug)]
struct Flaky;

impl std::fmt::Display for Flaky {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("flaky downstream")
    }
}

impl std::error::Error for Flaky {}

#[messaging::queue("tele-metered", dlq = "tele-metered-dlq", max_receives = 3)]
struct Metered;

#[messaging::handler(queue = Metered, retry(base = "10ms", max = "20ms"))]
async fn metered(job: Job, ctx: MessageContext) -> Result<(), HandlerError> {
    match job.kind.as_str() {
        "flaky" if ctx.receive_count() == 1 => Err(HandlerError::transient(Flaky)),
        "poison" => Err(HandlerError::permanent(std::io::Error::other("cannot parse the invoice"))),
        _ => Ok(()),
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn consume_and_send_metrics_carry_names_units_tags_and_values() {
    otel();
    let app = TestApp::builder()
        .only::<Metered>()
        .setup(|setup| {
            setup.dlq_depth_interval(Duration::from_millis(20));
        })
        .start()
        .await
        .expect("app");
    let p = app.publisher();
    let ok = p.send::<Metered, _>(&job(1, "ok")).await.expect("sent");
    let flaky = p.send::<Metered, _>(&job(2, "flaky")).await.expect("sent");
    let poison = p.send::<Metered, _>(&job(3, "poison")).await.expect("sent");
    app.handled(&ok).await.expect("ok handled");
    app.handled(&flaky).await.expect("flaky handled on its second receive");
    app.dead_lettered(&poison).await.expect("poison dead-lettered");

    let deadline = Instant::now() + Duration::from_secs(10);
    while value(&points("messaging.dlq.depth", "tele-metered"), None) < 1.0 {
        assert!(
            Instant::now() < deadline,
            "the DLQ depth gauge never showed the poison message: {:?}",
            points("messaging.dlq.depth", "tele-metered")
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(value(&points("messaging.dlq.depth", "tele-metered"), None), 1.0, "tagged per queue");
    app.stop().await;
    assert_eq!(points("messaging.dlq.depth", "tele-metered"), Vec::new(), "a stopped app reports no depth");

    let consumed = points("messaging.client.consumed.messages", "tele-metered");
    assert_eq!(value(&consumed, None), 2.0, "ok, and flaky on its second receive: {consumed:?}");
    assert_eq!(value(&consumed, Some("Flaky")), 1.0, "error.type names the error's type: {consumed:?}");
    assert_eq!(value(&consumed, Some("Error")), 1.0, "the permanent std::io::Error: {consumed:?}");
    for (attrs, _) in &consumed {
        assert_eq!(attrs.get("messaging.system").map(String::as_str), Some("memory"));
        assert_eq!(attrs.get("messaging.operation.name").map(String::as_str), Some("process"));
    }
    let durations = points("messaging.process.duration", "tele-metered");
    assert_eq!(value(&durations, None), 2.0, "one duration per successful dispatch");
    assert_eq!(value(&durations, Some("Flaky")), 1.0);
    assert_eq!(unit_of("messaging.process.duration"), "s");
    assert_eq!(unit_of("messaging.client.consumed.messages"), "{message}");

    let sent = points("messaging.client.sent.messages", "tele-metered");
    assert_eq!(value(&sent, None), 3.0, "{sent:?}");
    assert!(sent.iter().all(|(a, _)| a.get("messaging.operation.name").map(String::as_str) == Some("send")));
}

#[messaging::queue("tele-claims")]
struct Claims;

#[messaging::handler(queue = Claims, idempotent = "tele", lease = "5s", retry(base = "10ms", max = "20ms"))]
async fn claimed(_job: Job) {}

#[tokio::test(flavor = "multi_thread")]
async fn a_message_in_progress_elsewhere_counts_as_message_in_progress() {
    otel();
    let app = TestApp::builder()
        .only::<Claims>()
        .setup(|setup| {
            setup.idempotency_store(fixtures::busy_once());
        })
        .start()
        .await
        .expect("app");
    let id = app.publisher().send::<Claims, _>(&job(1, "ok")).await.expect("sent");
    app.handled(&id).await.expect("handled after the claim frees up");
    app.stop().await;
    let consumed = points("messaging.client.consumed.messages", "tele-claims");
    assert_eq!(value(&consumed, Some("MessageInProgress")), 1.0, "{consumed:?}");
    assert_eq!(value(&consumed, None), 1.0, "{consumed:?}");
}

#[messaging::queue("tele-quiet")]
struct Quiet;

#[messaging::handler(queue = Quiet)]
async fn quiet(_job: Job) {}

#[tokio::test(flavor = "multi_thread")]
async fn without_observability_records_no_metrics_but_keeps_spans() {
    otel();
    let app = TestApp::builder()
        .only::<Quiet>()
        .setup(|setup| {
            setup.without_observability();
        })
        .start()
        .await
        .expect("app");
    let id = app.publisher().send::<Quiet, _>(&job(1, "ok")).await.expect("sent");
    app.handled(&id).await.expect("handled");
    app.stop().await;
    assert!(points("messaging.client.consumed.messages", "tele-quiet").is_empty());
    assert!(points("messaging.client.sent.messages", "tele-quiet").is_empty());
    assert!(points("messaging.process.duration", "tele-quiet").is_empty());
    assert_eq!(spans_named("process tele-quiet", 1).await.len(), 1, "spans are still emitted");
}

#[messaging::queue("tele-gauged", visibility = "1s")]
struct Gauged;

/// What the app of the gauges' tests consumes (each its own queue, so that
/// no other test's gauges report it).
#[messaging::queue("tele-gauging")]
struct Gauging;

#[messaging::handler(queue = Gauging)]
async fn gauging(_job: Job) {}

#[messaging::queue("tele-ungauged")]
struct Ungauged;

#[messaging::handler(queue = Ungauged)]
async fn ungauged(_job: Job) {}

/// The value of the point of `name` for `queue` whose `messaging.message.status`
/// is `status` (any point when `None`), if there is one.
fn point(name: &str, queue: &str, status: Option<&str>) -> Option<f64> {
    points(name, queue)
        .into_iter()
        .find(|(a, _)| status.is_none() || a.get("messaging.message.status").map(String::as_str) == status)
        .map(|(_, v)| v)
}

/// The queue gauges of a SQLite queue that this app declares and does not
/// consume: one message held past its lease by a consumer that stopped (no
/// receive of the queue takes it back), one due, two delayed (sent first:
/// they do not count toward the pending age until they are due).
#[tokio::test(flavor = "multi_thread")]
async fn the_queue_gauges_show_depth_by_status_what_is_held_past_its_lease_and_the_pending_age() {
    otel();
    let file = fixtures::SqliteFile::new();
    let transport = messaging::transport::connect(&format!("{}&migrate=true", file.url)).await.expect("connect");
    transport.declare(&<Gauged as Queue>::SPEC).await.expect("declare");
    let publisher = Publisher::new(transport.clone());
    let delayed_at = Instant::now();
    for n in [2, 3] {
        publisher.send::<Gauged, _>(&job(n, "ok")).delay(Duration::from_secs(3600)).await.expect("sent");
    }
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    publisher.send::<Gauged, _>(&job(1, "ok")).await.expect("sent");
    // A consumer takes it and stops: its lease (1 s) runs out.
    let held = transport.receive("tele-gauged", 10, Duration::from_secs(5)).await.expect("receive");
    assert_eq!(held.len(), 1, "the due message, not the delayed ones");
    drop(held);
    let pending_at = Instant::now();
    publisher.send::<Gauged, _>(&job(4, "ok")).await.expect("sent");
    tokio::time::sleep(Duration::from_millis(1_200)).await;

    // The app consumes another queue and observes every queue it declares.
    let app = TestApp::builder()
        .transport(transport.clone())
        .only::<Gauging>()
        .setup(|setup| {
            setup.queue_gauges(Duration::from_millis(20));
        })
        .start()
        .await
        .expect("app");
    let depth = |status| point("messaging.queue.depth", "tele-gauged", Some(status));
    let expected = [("pending", 1.0), ("sleeping", 2.0), ("in_flight", 1.0), ("awaiting_release", 0.0)];
    let deadline = Instant::now() + Duration::from_secs(10);
    while expected.iter().any(|&(status, n)| depth(status) != Some(n))
        || point("messaging.queue.expired", "tele-gauged", None) != Some(1.0)
    {
        assert!(
            Instant::now() < deadline,
            "the queue gauges never showed 1 pending, 2 sleeping, 1 in flight and expired: depth {:?}, expired {:?}",
            points("messaging.queue.depth", "tele-gauged"),
            points("messaging.queue.expired", "tele-gauged"),
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Measured from the pending message's send: the delayed ones, sent
    // 1.5 s earlier and not due for an hour, do not count, nor does the
    // one held past its lease, which is not pending.
    let (since_pending, since_delayed) = (pending_at.elapsed(), delayed_at.elapsed());
    let age = point("messaging.queue.oldest_pending_age", "tele-gauged", None).expect("an age");
    assert!(
        age >= 1.2 && age <= since_pending.as_secs_f64() + 0.5 && age < since_delayed.as_secs_f64() - 1.0,
        "the pending age {age} s: the pending message was sent {since_pending:?} ago, the delayed ones {since_delayed:?}"
    );
    let tagged = points("messaging.queue.depth", "tele-gauged");
    assert!(tagged.iter().all(|(a, _)| a.get("messaging.system").map(String::as_str) == Some("sqlite")), "{tagged:?}");
    assert_eq!(unit_of("messaging.queue.depth"), "{message}");
    assert_eq!(unit_of("messaging.queue.expired"), "{message}");
    assert_eq!(unit_of("messaging.queue.oldest_pending_age"), "s");
    app.stop().await;
    // The SDK still calls the gauges; a stopped app reports nothing.
    for gauge in ["messaging.queue.depth", "messaging.queue.expired", "messaging.queue.oldest_pending_age"] {
        assert_eq!(points(gauge, "tele-gauged"), Vec::new(), "{gauge} after the stop");
    }
}

/// Without `queue_gauges`, no queue gauge is registered.
#[tokio::test(flavor = "multi_thread")]
async fn the_queue_gauges_are_off_unless_asked_for() {
    otel();
    let app = TestApp::builder().only::<Ungauged>().start().await.expect("app");
    let id = app.publisher().send::<Ungauged, _>(&job(9, "ok")).await.expect("sent");
    app.handled(&id).await.expect("handled");
    tokio::time::sleep(Duration::from_millis(100)).await;
    // (The other test's app, on SQLite, observes every queue of this binary.)
    let of_this_app: Vec<_> = points("messaging.queue.depth", "tele-ungauged")
        .into_iter()
        .filter(|(a, _)| a.get("messaging.system").map(String::as_str) == Some("memory"))
        .collect();
    assert_eq!(of_this_app, Vec::new());
    app.stop().await;
}

// --- enrichment ----------------------------------------------------------------------------

#[messaging::queue("tele-enriched")]
struct Enriched;

#[messaging::handler(queue = Enriched)]
async fn enriched(_job: Job) {}

#[tokio::test(flavor = "multi_thread")]
async fn the_enrich_hook_tags_consumer_spans_and_a_panicking_hook_is_contained() {
    otel();
    let app = TestApp::builder()
        .only::<Enriched>()
        .setup(|setup| {
            setup.enrich(|span, ctx| {
                let tenant = ctx.attribute("tenant").unwrap_or_default().to_owned();
                if tenant == "boom" {
                    panic!("the enrich hook fails for tenant boom");
                }
                span.set_attribute("app.tenant", tenant);
            });
        })
        .start()
        .await
        .expect("app");
    let p = app.publisher();
    let acme = p.send::<Enriched, _>(&job(1, "ok")).attribute("tenant", "acme").await.expect("sent");
    let boom = p.send::<Enriched, _>(&job(2, "ok")).attribute("tenant", "boom").await.expect("sent");
    app.handled(&acme).await.expect("handled");
    app.handled(&boom).await.expect("handled although its hook panicked");
    app.stop().await;
    let spans = spans_named("process tele-enriched", 2).await;
    let tenant_of = |id: &MessageId| {
        spans
            .iter()
            .find(|s| text(attribute(&s.attributes, "messaging.message.id")).as_deref() == Some(id.as_ref()))
            .map(|s| text(attribute(&s.attributes, "app.tenant")))
    };
    assert_eq!(tenant_of(&acme), Some(Some("acme".to_owned())));
    assert_eq!(tenant_of(&boom), Some(None), "the panicking hook added nothing, and the span still ended");
}

// --- health and scrape endpoint -----------------------------------------------------------

/// A plain HTTP/1.1 GET: (status, body).
async fn get(addr: SocketAddr, path: &str) -> (u16, String) {
    let mut stream = tokio::net::TcpStream::connect(addr).await.expect("connect");
    let request = format!("GET {path} HTTP/1.1\r\nHost: test\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await.expect("send");
    let mut response = String::new();
    stream.read_to_string(&mut response).await.expect("read");
    let status = response.split_whitespace().nth(1).and_then(|s| s.parse().ok()).unwrap_or(0);
    let body = response.split_once("\r\n\r\n").map(|(_, b)| b.to_owned()).unwrap_or_default();
    (status, body)
}

#[messaging::queue("tele-health")]
struct Health;

#[messaging::handler(queue = Health)]
async fn healthy(_job: Job) {}

#[cfg(feature = "sqlite")]
#[tokio::test(flavor = "multi_thread")]
async fn health_turns_503_when_a_table_is_dropped_and_metrics_are_scraped() {
    otel();
    let file = fixtures::SqliteFile::new();
    let transport = messaging::transport::connect(&format!("{}&migrate=true", file.url)).await.expect("sqlite");
    let mut app = TestApp::builder().only::<Health>().transport(transport).start().await.expect("app");
    let addr = app.serve_http("127.0.0.1:0".parse().expect("addr")).await.expect("serving");
    assert!(addr.ip().is_loopback());
    let id = app.publisher().send::<Health, _>(&job(1, "ok")).await.expect("sent");
    app.handled(&id).await.expect("handled");

    let (status, body) = get(addr, "/health").await;
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("healthy"), "{body}");
    assert_eq!(get(addr, "/ready").await.0, 200);
    let (status, metrics) = get(addr, "/metrics").await;
    assert_eq!(status, 200);
    assert!(metrics.contains("messaging_client_consumed_messages"), "{metrics}");
    assert!(metrics.contains("tele-health"), "{metrics}");

    // The queue's table disappears (an operator mistake): health says which queue.
    let pool = sqlx::SqlitePool::connect(&file.url).await.expect("pool");
    sqlx::query("DROP TABLE messaging_messages").execute(&pool).await.expect("drop");
    let (status, body) = get(addr, "/health").await;
    assert_eq!(status, 503, "{body}");
    let report: serde_json::Value = serde_json::from_str(&body).expect("json");
    assert_eq!(report["status"], "unhealthy");
    let failing = report["failing"].as_array().expect("a list of failing queues");
    let health = failing.iter().find(|f| f["queue"] == "tele-health").expect("tele-health is listed");
    assert!(health["error"].as_str().unwrap_or_default().contains("messaging_messages"), "{body}");
    app.stop().await;
}

/// One SQS API call (JSON protocol; moto routes by the credential scope of
/// the Authorization header and does not check the signature) → body.
#[cfg(feature = "sqs")]
async fn sqs_call(endpoint: SocketAddr, action: &str, body: &str) -> String {
    let mut stream = tokio::net::TcpStream::connect(endpoint).await.expect("moto");
    let request = format!(
        "POST / HTTP/1.1\r\nHost: {endpoint}\r\nContent-Type: application/x-amz-json-1.0\r\n\
         X-Amz-Target: AmazonSQS.{action}\r\nAuthorization: AWS4-HMAC-SHA256 \
         Credential=test/20260101/us-east-1/sqs/aws4_request, SignedHeaders=host, Signature=0\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(request.as_bytes()).await.expect("send");
    let mut answer = String::new();
    stream.read_to_string(&mut answer).await.expect("answer");
    assert!(answer.starts_with("HTTP/1.1 200"), "{action}: {answer}");
    answer.split_once("\r\n\r\n").map(|(_, b)| b.to_owned()).unwrap_or_default()
}

#[cfg(feature = "sqs")]
#[tokio::test(flavor = "multi_thread")]
async fn health_turns_503_when_an_sqs_queue_is_deleted() {
    otel();
    let moto = fixtures::SqsServer::start();
    let transport = messaging::transport::connect(&moto.url(true)).await.expect("sqs");
    let mut app = TestApp::builder().only::<Health>().transport(transport).start().await.expect("app");
    let addr = app.serve_http("127.0.0.1:0".parse().expect("addr")).await.expect("serving");
    assert_eq!(get(addr, "/health").await.0, 200);
    // Delete the queue behind the app's back, through the SQS JSON protocol.
    let endpoint: SocketAddr = moto.endpoint.trim_start_matches("http://").parse().expect("moto address");
    let url = sqs_call(endpoint, "GetQueueUrl", r#"{"QueueName":"tele-health"}"#).await;
    let url: serde_json::Value = serde_json::from_str(&url).expect("json");
    let queue_url = url["QueueUrl"].as_str().expect("a queue URL").to_owned();
    sqs_call(endpoint, "DeleteQueue", &serde_json::json!({ "QueueUrl": queue_url }).to_string()).await;
    let (status, body) = get(addr, "/health").await;
    assert_eq!(status, 503, "{body}");
    assert!(body.contains("tele-health"), "{body}");
    app.stop().await;
}

// --- schedules ------------------------------------------------------------------------

#[messaging::queue("tele-ticks")]
struct TeleTicks;

#[messaging::message(name = "tele.tick", v = 1)]
#[derive(Debug, Clone, Serialize, Deserialize)]
struct TeleTick {
    at: i64,
}

#[messaging::schedule(every = "100ms", queue = TeleTicks, name = "tele-tick")]
fn tele_tick(tick: messaging::schedule::Tick) -> TeleTick {
    TeleTick { at: tick.unix_ms() }
}

#[messaging::handler(queue = TeleTicks)]
async fn tele_tock(_tick: TeleTick) {}

#[tokio::test(flavor = "multi_thread")]
async fn each_tick_is_a_span_that_leads_to_the_consumer_and_is_counted() {
    otel();
    let app = TestApp::builder().only::<TeleTicks>().start().await.expect("app");
    let ticks = spans_named("schedule tele-tick", 3).await;
    let consumers = spans_named("process tele-ticks", 3).await;
    app.stop().await;
    assert!(ticks.len() >= 3, "a span per tick: {}", ticks.len());
    let published: Vec<&SpanData> = ticks
        .iter()
        .filter(|s| text(attribute(&s.attributes, "messaging.schedule.outcome")).as_deref() == Some("published"))
        .collect();
    assert!(published.len() >= 3, "{ticks:?}");
    let tick = published[0];
    assert_eq!(text(attribute(&tick.attributes, "messaging.schedule.name")).as_deref(), Some("tele-tick"));
    assert_eq!(text(attribute(&tick.attributes, "messaging.destination.name")).as_deref(), Some("tele-ticks"));
    assert!(text(attribute(&tick.attributes, "messaging.schedule.tick")).is_some_and(|t| t.ends_with('Z')));
    // The publish is the tick's child; the consumer continues its trace.
    let sends = spans_named("send tele-ticks", 3).await;
    let send = sends.iter().find(|s| s.parent_span_id == tick.span_context.span_id()).expect("the tick's send span");
    assert_eq!(send.span_kind, SpanKind::Producer);
    assert!(
        consumers.iter().any(|c| c.span_context.trace_id() == tick.span_context.trace_id()),
        "a consumer span in the tick's trace"
    );
    let counted = points("messaging.schedule.ticks", "tele-ticks");
    let outcome = |o: &str| -> f64 {
        counted
            .iter()
            .filter(|(a, _)| a.get("messaging.schedule.outcome").map(String::as_str) == Some(o))
            .map(|(_, v)| v)
            .sum()
    };
    assert!(outcome("published") >= 3.0, "{counted:?}");
    assert!(counted.iter().all(|(a, _)| a.get("messaging.schedule.name").map(String::as_str) == Some("tele-tick")));
    assert_eq!(unit_of("messaging.schedule.ticks"), "{tick}");
}
