//! Process-wide setup for `#[messaging::main]` binaries: the `tracing`
//! subscriber (logs, `RUST_LOG`, text or JSON), the OpenTelemetry providers,
//! and the Prometheus registry behind `/metrics`.

use std::sync::RwLock;

use opentelemetry_sdk::metrics::SdkMeterProvider;
use opentelemetry_sdk::trace::SdkTracerProvider;
use opentelemetry_sdk::Resource;
use tracing_subscriber::filter::{LevelFilter, Targets};
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{EnvFilter, Layer};

/// How log lines are written to stderr.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum LogFormat {
    /// Human-readable lines (the default).
    #[default]
    Text,
    /// One JSON object per line, for log shippers.
    Json,
}

impl LogFormat {
    /// `MESSAGING_LOG_FORMAT=json` selects JSON; anything else text.
    pub fn from_env() -> Self {
        match std::env::var("MESSAGING_LOG_FORMAT") {
            Ok(v) if v.trim().eq_ignore_ascii_case("json") => LogFormat::Json,
            _ => LogFormat::Text,
        }
    }
}

/// What [`init`] sets up.
#[derive(Debug, Clone, Default)]
#[non_exhaustive]
pub struct TelemetryConfig {
    /// How logs are written.
    pub log_format: LogFormat,
    /// Whether to keep metrics for the Prometheus `/metrics` endpoint.
    pub prometheus: bool,
}

impl TelemetryConfig {
    /// The configuration the environment asks for (`MESSAGING_LOG_FORMAT`).
    pub fn from_env() -> Self {
        TelemetryConfig { log_format: LogFormat::from_env(), prometheus: false }
    }

    /// Sets the log format.
    pub fn log_format(mut self, format: LogFormat) -> Self {
        self.log_format = format;
        self
    }

    /// Keeps metrics for `/metrics` (see [`Running::serve_http`](crate::Running::serve_http)).
    pub fn prometheus(mut self, on: bool) -> Self {
        self.prometheus = on;
        self
    }
}

/// Keeps the exporters [`init`] started; dropping it flushes and stops them.
/// Hold it until the end of `main`.
#[must_use = "dropping the guard stops the exporters"]
#[derive(Debug, Default)]
pub struct TelemetryGuard {
    tracer: Option<SdkTracerProvider>,
    meter: Option<SdkMeterProvider>,
}

impl Drop for TelemetryGuard {
    fn drop(&mut self) {
        if let Some(tracer) = self.tracer.take() {
            if let Err(e) = tracer.shutdown() {
                eprintln!("warning: flushing traces at exit failed: {e}");
            }
        }
        if let Some(meter) = self.meter.take() {
            if let Err(e) = meter.shutdown() {
                eprintln!("warning: flushing metrics at exit failed: {e}");
            }
        }
    }
}

/// Installs logging and OpenTelemetry for the whole process:
///
/// * logs to stderr, filtered by `RUST_LOG` (default: `info` for the
///   application and the framework, `warn` for the dependencies), as text
///   (coloured only on a terminal) or JSON;
/// * with the `otlp` feature and `OTEL_EXPORTER_OTLP_ENDPOINT` set: spans
///   (the framework's `DEBUG` spans of target `messaging`, and every span at
///   `INFO` and above, whatever `RUST_LOG` says) and metrics exported
///   over OTLP/HTTP, with `service.name` from `OTEL_SERVICE_NAME` (else the
///   executable's name);
/// * with `config.prometheus`: metrics kept for `/metrics`.
///
/// Without an exporter no meter provider is installed, so recording metrics
/// costs nothing. Does nothing where a subscriber is installed already.
pub fn init(config: TelemetryConfig) -> TelemetryGuard {
    let resource = resource();
    let mut guard = TelemetryGuard::default();
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(DEFAULT_FILTER));
    let fmt = match config.log_format {
        LogFormat::Text => tracing_subscriber::fmt::layer().with_writer(std::io::stderr).with_ansi(colours()).boxed(),
        LogFormat::Json => tracing_subscriber::fmt::layer().json().with_writer(std::io::stderr).boxed(),
    };
    let tracer = otlp::tracer_provider(&resource);
    let spans = tracer.as_ref().map(|provider| {
        use opentelemetry::trace::TracerProvider as _;
        let spans = Targets::new().with_default(LevelFilter::INFO).with_target("messaging", LevelFilter::DEBUG);
        tracing_opentelemetry::layer().with_tracer(provider.tracer("messaging")).with_filter(spans)
    });
    let installed = tracing_subscriber::registry().with(fmt.with_filter(filter)).with(spans).try_init();
    if installed.is_ok() {
        if let Some(provider) = tracer {
            opentelemetry::global::set_tracer_provider(provider.clone());
            guard.tracer = Some(provider);
        }
    }

    let mut meter = SdkMeterProvider::builder().with_resource(resource.clone());
    let mut readers = 0;
    if config.prometheus {
        match prometheus_reader() {
            Ok(reader) => {
                meter = meter.with_reader(reader);
                readers += 1;
            }
            Err(e) => tracing::warn!("/metrics will be empty: {e}"),
        }
    }
    let (meter, exported) = otlp::with_metric_exporter(meter);
    readers += usize::from(exported);
    if readers > 0 {
        let provider = meter.build();
        opentelemetry::global::set_meter_provider(provider.clone());
        guard.meter = Some(provider);
    }
    guard
}

/// Installs a text subscriber that prints to stderr, filtered by `RUST_LOG`
/// (default `info`), and nothing else. Does nothing if one is already
/// installed. [`init`] is the complete setup.
pub fn init_logging() {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(DEFAULT_FILTER));
    let _ =
        tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).with_ansi(colours()).try_init();
}

/// The log filter without `RUST_LOG`: INFO for the application and the
/// framework, WARN for the dependencies whose INFO lines are their own
/// business (connection pools, exporters, HTTP stacks, the AWS SDK).
///
/// ERROR for sqlx's pool connections: their one warning is "error occurred
/// while testing the connection on-release" (a ping after each statement),
/// once per connection whenever the database goes away, beside the
/// framework's own warning that says what failed and what happens to the
/// messages (four of them in a row when PostgreSQL stopped under a
/// consumer, tried from outside).
const DEFAULT_FILTER: &str = "info,sqlx=warn,sqlx_core::pool::connection=error,opentelemetry=warn,opentelemetry_sdk=warn,opentelemetry_otlp=warn,\
    hyper=warn,hyper_util=warn,h2=warn,tower=warn,axum=warn,reqwest=warn,rustls=warn,aws_config=warn,\
    aws_smithy_runtime=warn,aws_sdk_sqs=warn";

/// Colours only for a terminal: a log file or a pipe gets plain text.
fn colours() -> bool {
    use std::io::IsTerminal as _;
    std::io::stderr().is_terminal()
}

/// `service.name` from `OTEL_SERVICE_NAME`, else the executable's name.
fn resource() -> Resource {
    let named = std::env::var("OTEL_SERVICE_NAME").is_ok_and(|v| !v.trim().is_empty());
    let executable = std::env::current_exe().ok().and_then(|p| p.file_stem().map(|s| s.to_string_lossy().into_owned()));
    match (named, executable) {
        (false, Some(name)) => Resource::builder().with_service_name(name).build(),
        _ => Resource::builder().build(),
    }
}

/// The registry `/metrics` renders.
static REGISTRY: RwLock<Option<prometheus::Registry>> = RwLock::new(None);

/// A metric reader that keeps metrics for the `/metrics` endpoint of
/// [`Running::serve_http`](crate::Running::serve_http). [`init`] adds one when
/// asked; add it yourself to a meter provider you build:
///
/// ```no_run
/// use messaging::telemetry::opentelemetry;
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let provider = opentelemetry_sdk::metrics::SdkMeterProvider::builder()
///     .with_reader(messaging::telemetry::prometheus_reader()?)
///     .build();
/// opentelemetry::global::set_meter_provider(provider);
/// # Ok(()) }
/// ```
pub fn prometheus_reader() -> Result<opentelemetry_prometheus::PrometheusExporter, crate::Error> {
    let registry = prometheus::Registry::new();
    let reader = opentelemetry_prometheus::exporter()
        .with_registry(registry.clone())
        .build()
        .map_err(|e| crate::Error::Telemetry(format!("the Prometheus reader could not be built: {e}")))?;
    *REGISTRY.write().unwrap_or_else(|p| p.into_inner()) = Some(registry);
    Ok(reader)
}

/// The metrics in the Prometheus text format, or `None` without a reader.
pub(crate) fn gather_prometheus() -> Option<Result<String, String>> {
    let registry = REGISTRY.read().unwrap_or_else(|p| p.into_inner()).clone()?;
    use prometheus::Encoder as _;
    let mut text = Vec::new();
    Some(
        prometheus::TextEncoder::new()
            .encode(&registry.gather(), &mut text)
            .map_err(|e| e.to_string())
            .map(|()| String::from_utf8_lossy(&text).into_owned()),
    )
}

/// OTLP export, when built with the `otlp` feature and configured by the
/// standard environment variables.
#[cfg(feature = "otlp")]
mod otlp {
    use opentelemetry_sdk::metrics::MeterProviderBuilder;
    use opentelemetry_sdk::trace::SdkTracerProvider;
    use opentelemetry_sdk::Resource;

    fn configured(signal: &str) -> bool {
        let set = |name: &str| std::env::var(name).is_ok_and(|v| !v.trim().is_empty());
        set("OTEL_EXPORTER_OTLP_ENDPOINT") || set(&format!("OTEL_EXPORTER_OTLP_{signal}_ENDPOINT"))
    }

    pub(super) fn tracer_provider(resource: &Resource) -> Option<SdkTracerProvider> {
        if !configured("TRACES") {
            return None;
        }
        match opentelemetry_otlp::SpanExporter::builder().with_http().build() {
            Ok(exporter) => {
                Some(SdkTracerProvider::builder().with_resource(resource.clone()).with_batch_exporter(exporter).build())
            }
            Err(e) => {
                eprintln!("warning: OTLP trace export is off: {e}");
                None
            }
        }
    }

    pub(super) fn with_metric_exporter(builder: MeterProviderBuilder) -> (MeterProviderBuilder, bool) {
        if !configured("METRICS") {
            return (builder, false);
        }
        match opentelemetry_otlp::MetricExporter::builder().with_http().build() {
            Ok(exporter) => (builder.with_periodic_exporter(exporter), true),
            Err(e) => {
                eprintln!("warning: OTLP metric export is off: {e}");
                (builder, false)
            }
        }
    }
}

/// Without the `otlp` feature there is no exporter.
#[cfg(not(feature = "otlp"))]
mod otlp {
    use opentelemetry_sdk::metrics::MeterProviderBuilder;
    use opentelemetry_sdk::trace::SdkTracerProvider;
    use opentelemetry_sdk::Resource;

    pub(super) fn tracer_provider(_: &Resource) -> Option<SdkTracerProvider> {
        if std::env::var("OTEL_EXPORTER_OTLP_ENDPOINT").is_ok_and(|v| !v.trim().is_empty()) {
            eprintln!(
                "warning: OTEL_EXPORTER_OTLP_ENDPOINT is set but this binary was built without the `otlp` feature \
                 of `messaging`; nothing is exported"
            );
        }
        None
    }

    pub(super) fn with_metric_exporter(builder: MeterProviderBuilder) -> (MeterProviderBuilder, bool) {
        (builder, false)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::printed::Printed;

    #[test]
    fn the_default_filter_keeps_sqlx_s_release_pings_out() {
        let printed = Printed::default();
        let subscriber = printed.subscriber().with_env_filter(EnvFilter::new(DEFAULT_FILTER)).finish();
        tracing::subscriber::with_default(subscriber, || {
            tracing::warn!(target: "sqlx_core::pool::connection", "error occurred while testing the connection on-release");
            tracing::warn!(target: "sqlx_core::pool::inner", "error from `before_acquire`");
            tracing::info!(target: "sqlx::query", "a statement");
            tracing::info!(target: "messaging::worker", "receiving again");
        });
        let text = printed.text();
        assert!(!text.contains("on-release"), "{text}");
        assert!(!text.contains("a statement"), "{text}");
        assert!(text.contains("before_acquire"), "other warnings of sqlx stay: {text}");
        assert!(text.contains("receiving again"), "{text}");
    }
}
