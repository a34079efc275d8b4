//! An idempotency store that refuses claims for a while (its database
//! restarting or failing over): the handler did not run, so no attempt is
//! charged. Each message is held and tried again, handled once when the
//! store answers, and none is dead-lettered; `/ready` says why meanwhile.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use messaging::idempotency::IdempotencyStore;
use messaging::observe::Outcome;
use messaging::prelude::*;
use messaging::testing::TestApp;
use messaging::TransportError;

use crate::readiness::until_ready_is;

#[messaging::queue("claims-down-jobs", dlq = "claims-down-jobs-dlq", max_receives = 2)]
struct ClaimsDownJobs;

#[messaging::message(name = "test.claims_down.job", v = 1)]
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Job {
    n: u32,
}

type Ran = Arc<Mutex<Vec<u32>>>;

#[messaging::handler(queue = ClaimsDownJobs, idempotent = "claims-down", retry(base = "100ms", max = "100ms"))]
async fn on_job(job: Job, ran: State<Ran>) {
    ran.lock().unwrap().push(job.n);
}

/// The memory store, refusing every claim for `outage` from its first one;
/// `refused` counts the refusals.
fn refusing_for(outage: Duration, refused: Arc<AtomicUsize>) -> impl IdempotencyStore {
    let first = Mutex::new(None::<Instant>);
    crate::fixtures::ClaimsAnswered::new(move || {
        let first = *first.lock().unwrap().get_or_insert_with(Instant::now);
        (first.elapsed() < outage).then(|| {
            refused.fetch_add(1, Ordering::SeqCst);
            Err(TransportError::Backend("connection refused (the test's outage)".into()))
        })
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_store_outage_charges_no_attempt_and_every_message_runs_once_after_it() {
    const OUTAGE: Duration = Duration::from_secs(3);
    let ran: Ran = Arc::default();
    let refused = Arc::new(AtomicUsize::new(0));
    let store = refusing_for(OUTAGE, refused.clone());
    let r = ran.clone();
    let mut app = TestApp::builder()
        .only::<ClaimsDownJobs>()
        .timeout(Duration::from_secs(30))
        .setup(move |s| {
            s.provide(r).idempotency_store(store);
        })
        .start()
        .await
        .unwrap();
    let addr = app.serve_http("127.0.0.1:0".parse().unwrap()).await.unwrap();
    let started = Instant::now();
    let mut ids = Vec::new();
    for n in 0..5 {
        ids.push(app.publisher().send::<ClaimsDownJobs, _>(&Job { n }).await.unwrap());
    }
    // While the store refuses, the consumer says why it is not ready.
    crate::fixtures::eventually(Duration::from_secs(5), || refused.load(Ordering::SeqCst) > 0, || "no claim".into())
        .await;
    let body = until_ready_is(&addr.to_string(), 503, "while the store refuses").await;
    assert!(body.contains("the idempotency store refuses claims"), "{body}");
    for id in &ids {
        app.handled(id).await.unwrap();
    }
    assert!(started.elapsed() >= OUTAGE, "handled only once the store answered");
    let mut seen = ran.lock().unwrap().clone();
    seen.sort();
    assert_eq!(seen, [0, 1, 2, 3, 4], "each once");
    for id in &ids {
        let history = app.history(id);
        assert!(
            history.iter().all(|o| matches!(o, Outcome::ClaimsUnavailable { .. } | Outcome::Handled)),
            "no attempt charged: {history:?}"
        );
    }
    let dlq = app.transport().dead_letters().unwrap();
    assert_eq!(dlq.depth("claims-down-jobs").await.unwrap(), 0);
    until_ready_is(&addr.to_string(), 200, "once the store answers").await;
    app.stop().await;
}
