//! OTLP export: with `OTEL_EXPORTER_OTLP_ENDPOINT` set, `telemetry::init`
//! sends the framework's spans and metrics over OTLP/HTTP. A stand-in
//! collector on loopback records what arrives.
#![cfg(feature = "otlp")]

use std::sync::{Arc, Mutex};

use messaging::prelude::*;
use messaging::telemetry::{init, TelemetryConfig};
use messaging::testing::TestApp;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};

/// Requests received: (path, body).
type Received = Arc<Mutex<Vec<(String, Vec<u8>)>>>;

/// Accepts HTTP/1.1 requests (keep-alive included) and answers 200 to each.
async fn collector(listener: tokio::net::TcpListener, received: Received) {
    loop {
        let Ok((stream, _)) = listener.accept().await else { return };
        let received = received.clone();
        tokio::spawn(async move {
            let mut stream = BufReader::new(stream);
            loop {
                let mut request_line = String::new();
                if stream.read_line(&mut request_line).await.unwrap_or(0) == 0 {
                    return;
                }
                let path = request_line.split_whitespace().nth(1).unwrap_or_default().to_owned();
                let mut length = 0;
                loop {
                    let mut header = String::new();
                    if stream.read_line(&mut header).await.unwrap_or(0) == 0 {
                        return;
                    }
                    let header = header.trim_end();
                    if header.is_empty() {
                        break;
                    }
                    if let Some((name, value)) = header.split_once(':') {
                        if name.eq_ignore_ascii_case("content-length") {
                            length = value.trim().parse().unwrap_or(0);
                        }
                    }
                }
                let mut body = vec![0; length];
                if stream.read_exact(&mut body).await.is_err() {
                    return;
                }
                received.lock().unwrap().push((path, body));
                let reply = "HTTP/1.1 200 OK\r\nContent-Type: application/x-protobuf\r\nContent-Length: 0\r\n\r\n";
                if stream.get_mut().write_all(reply.as_bytes()).await.is_err() {
                    return;
                }
            }
        });
    }
}

#[messaging::queue("otlp-jobs")]
struct Jobs;

#[messaging::message(name = "otlp.job", v = 1)]
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Job {
    n: u32,
}

#[messaging::handler(queue = Jobs)]
async fn job(_job: Job) {}

fn contains(haystack: &[u8], needle: &str) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle.as_bytes())
}

#[test]
fn spans_and_metrics_are_exported_over_otlp_http() {
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().unwrap();
    let received = Received::default();
    let listener = runtime.block_on(tokio::net::TcpListener::bind("127.0.0.1:0")).unwrap();
    let endpoint = format!("http://{}", listener.local_addr().unwrap());
    runtime.spawn(collector(listener, received.clone()));

    // The standard variables, as an operator would set them.
    std::env::set_var("OTEL_EXPORTER_OTLP_ENDPOINT", &endpoint);
    std::env::set_var("OTEL_SERVICE_NAME", "otlp-test-service");
    let guard = init(TelemetryConfig::from_env());

    runtime.block_on(async {
        let app = TestApp::builder().only::<Jobs>().start().await.unwrap();
        let id = app.publisher().send::<Jobs, _>(&Job { n: 1 }).await.unwrap();
        app.handled(&id).await.unwrap();
        app.stop().await;
    });
    // Dropping the guard flushes both exporters (as at the end of `main`).
    // The collector records a request before answering it, so all is here.
    drop(guard);

    let received = received.lock().unwrap();
    let paths: Vec<&str> = received.iter().map(|(p, _)| p.as_str()).collect();
    let traces: Vec<&Vec<u8>> = received.iter().filter(|(p, _)| p == "/v1/traces").map(|(_, b)| b).collect();
    let metrics: Vec<&Vec<u8>> = received.iter().filter(|(p, _)| p == "/v1/metrics").map(|(_, b)| b).collect();
    assert!(!traces.is_empty(), "no traces exported; requests: {paths:?}");
    assert!(!metrics.is_empty(), "no metrics exported; requests: {paths:?}");
    assert!(traces.iter().any(|b| contains(b, "process otlp-jobs")), "the consumer span was exported");
    assert!(traces.iter().any(|b| contains(b, "send otlp-jobs")), "the producer span was exported");
    assert!(traces.iter().any(|b| contains(b, "otlp-test-service")), "service.name from OTEL_SERVICE_NAME");
    assert!(metrics.iter().any(|b| contains(b, "messaging.client.consumed.messages")));
}
