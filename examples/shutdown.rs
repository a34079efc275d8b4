//! Graceful shutdown with slow handlers. Each `Job` prints `started N`,
//! takes `SLOW_MS` milliseconds (default 60 s), then prints `finished N`;
//! `SLOW_JOBS=N` publishes N jobs at startup.
//!
//! The first Ctrl-C (or SIGTERM) stops receiving and lets running handlers
//! finish within the grace period (`--grace`, default 30 s), then releases
//! what was not handled. A second one stops at once: running handlers are
//! stopped, their messages released for another consumer, and the process
//! exits with status 130 within two seconds, saying what it released.
//!
//! ```text
//! SLOW_JOBS=4 cargo run --example shutdown -- --transport sqlite://jobs.db?migrate=true run
//! # Ctrl-C: waits for the two running jobs (up to 30 s); Ctrl-C again: out at once
//! ```

use std::time::Duration;

use messaging::prelude::*;

/// The jobs, handled two at a time.
#[messaging::queue("slow-jobs", concurrency = 2, visibility = "2m")]
struct Jobs;

/// One job.
#[messaging::message(name = "slow.job", v = 1)]
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Job {
    /// Its number.
    n: u64,
}

#[messaging::handler(queue = Jobs)]
async fn work(job: Job) {
    println!("started {}", job.n);
    let ms = std::env::var("SLOW_MS").ok().and_then(|v| v.parse().ok()).unwrap_or(60_000);
    tokio::time::sleep(Duration::from_millis(ms)).await;
    println!("finished {}", job.n);
}

#[messaging::main]
async fn main(setup: &mut Setup) -> Result<(), PublishError> {
    let jobs: u64 = std::env::var("SLOW_JOBS").ok().and_then(|v| v.parse().ok()).unwrap_or(0);
    let publisher = setup.publisher();
    setup.spawn(async move {
        for n in 0..jobs {
            if let Err(e) = publisher.send::<Jobs, _>(&Job { n }).await {
                eprintln!("could not publish job {n}: {e}");
            }
        }
    });
    Ok(())
}
