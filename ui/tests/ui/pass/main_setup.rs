// `#[messaging::main]` with a setup hook that returns a `Result`: provides a
// state, publishes, and drains (so that this test exits by itself).
use std::sync::atomic::{AtomicUsize, Ordering};

use messaging::prelude::*;

#[messaging::queue("jobs")]
pub struct Jobs;

#[messaging::message(name = "jobs.requested", v = 1)]
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct JobRequested {
    pub id: u32,
}

#[derive(Default)]
pub struct Counter {
    handled: AtomicUsize,
}

#[messaging::handler(queue = Jobs)]
async fn run_job(job: JobRequested, counter: State<Counter>) {
    counter.handled.fetch_add(job.id as usize, Ordering::SeqCst);
}

#[messaging::main]
async fn main(setup: &mut Setup) -> Result<(), PublishError> {
    setup.provide(Counter::default());
    setup.run_mode(RunMode::Drain);
    let publisher = setup.publisher();
    publisher.send::<Jobs, _>(&JobRequested { id: 1 }).await?;
    Ok(())
}
