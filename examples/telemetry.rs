//! Telemetry of a small service: consumer spans enriched with a tenant,
//! handlers that see the producer's trace, metrics and health over HTTP.
//!
//! ```text
//! cargo run --example telemetry                                  # handles the demo readings, exits
//! cargo run --example telemetry -- run --serve --http 9090       # then: curl localhost:9090/metrics
//!                                                                # (messaging_queue_depth: what the queue holds)
//! OTEL_EXPORTER_OTLP_ENDPOINT=http://localhost:4318 OTEL_SERVICE_NAME=meters \
//!     cargo run --example telemetry --features otlp               # traces and metrics to a collector
//! MESSAGING_LOG_FORMAT=json cargo run --example telemetry        # JSON log lines
//! ```
//!
//! Without an exporter nothing records the spans, so the handler reports that
//! the message carries no trace context; with one, it prints the trace id it
//! shares with the publisher.

use messaging::prelude::*;
use tracing_opentelemetry::OpenTelemetrySpanExt as _;

#[messaging::queue("meter-readings", dlq = "meter-readings-dlq")]
struct Readings;

/// One reading of an electricity meter.
#[messaging::message(name = "meters.reading", v = 1)]
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Reading {
    meter: String,
    kwh: f64,
}

#[messaging::handler(queue = Readings)]
async fn record(reading: Reading, ctx: MessageContext) {
    let trace = match ctx.producer_context() {
        Some(producer) => format!("trace {}", producer.trace_id()),
        None => "no trace context (set OTEL_EXPORTER_OTLP_ENDPOINT to export traces)".to_owned(),
    };
    println!(
        "handled reading of {} ({} kWh) for tenant {}; {trace}",
        reading.meter,
        reading.kwh,
        ctx.attribute("tenant").unwrap_or("?")
    );
}

#[messaging::main]
async fn main(setup: &mut Setup) -> Result<(), PublishError> {
    // Every consumer span gets the tenant the producer put in the attributes.
    setup.enrich(|span, ctx| {
        if let Some(tenant) = ctx.attribute("tenant") {
            span.set_attribute("app.tenant", tenant.to_owned());
        }
    });
    // What the queue holds (by status), what is held past its lease and the
    // oldest message's age, as gauges: for alerts on a backlog that grows.
    setup.queue_gauges(std::time::Duration::from_secs(15));
    setup.run_mode(RunMode::Drain);
    let publisher = setup.publisher();
    setup.spawn(async move {
        for (meter, tenant, kwh) in [("m-1", "north", 12.5), ("m-2", "south", 3.25)] {
            let reading = Reading { meter: meter.to_owned(), kwh };
            // The publish span is the parent of the handler's span.
            let sent = publisher.send::<Readings, _>(&reading).attribute("tenant", tenant).await;
            if let Err(e) = sent {
                eprintln!("could not publish the reading of {meter}: {e}");
            }
        }
    });
    Ok(())
}
