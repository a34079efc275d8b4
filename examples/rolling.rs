//! A rolling deploy, seen from the old build. This build knows
//! `rolling.order` v1; a replica of the newer build, deployed beside it,
//! publishes v2. The old build gives that message back without charging an
//! attempt, for a newer replica to take (the log says so at INFO). Here no
//! newer replica ever comes, so once `wait_for_newer` has passed since it
//! was sent (`ROLLING_WAIT_SECS`, 6 here; 15 minutes by default) it
//! fails like any other message and goes to the dead letters, its reason
//! the decode error.
//!
//! ```text
//! cargo run --example rolling
//! cargo run --example rolling -- --transport sqlite://rolling.db?migrate=true
//! ```

use std::time::{Duration, Instant};

use messaging::prelude::*;
use messaging::transport::Outgoing;

/// The orders, with their dead letters.
#[messaging::queue("rolling-orders", dlq = "rolling-orders-dlq", max_receives = 2)]
struct Orders;

/// An order, as this (old) build knows it.
#[messaging::message(name = "rolling.order", v = 1)]
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Order {
    /// Its number.
    id: u32,
}

#[messaging::handler(queue = Orders, retry(base = "500ms", max = "1s"))]
async fn take(order: Order) {
    println!("handled order {} (v1, which this build knows)", order.id);
}

/// What a replica of the newer build publishes: `rolling.order` v2.
const FROM_THE_NEWER_BUILD: &[u8] = br#"{"type":"rolling.order","v":2,"data":{"id":2,"gift_wrap":true}}"#;

#[messaging::main]
async fn main(setup: &mut Setup) -> anyhow::Result<()> {
    let seconds = std::env::var("ROLLING_WAIT_SECS").ok().and_then(|s| s.parse().ok()).unwrap_or(6);
    let wait = Duration::from_secs(seconds);
    setup.wait_for_newer(wait).run_mode(RunMode::Drain);
    let publisher = setup.publisher();
    let transport = setup.transport().clone();
    // Spawned: it runs with `run` only, and the drain waits for it.
    setup.spawn(async move {
        if let Err(e) = show(publisher, transport, wait).await {
            eprintln!("the example failed: {e:#}");
            std::process::exit(1);
        }
    });
    Ok(())
}

/// Publishes order 1 as v1 and order 2 as the newer build does, then waits
/// for order 2 to reach the dead letters and says why it is there.
async fn show(
    publisher: Publisher,
    transport: std::sync::Arc<dyn messaging::transport::Transport>,
    wait: Duration,
) -> anyhow::Result<()> {
    let sent = Instant::now();
    publisher.send::<Orders, _>(&Order { id: 1 }).await?;
    let newer = Outgoing { body: FROM_THE_NEWER_BUILD.to_vec().into(), ..Outgoing::default() };
    let id = transport.send("rolling-orders", newer).await?;
    println!(
        "published order 1 as v1, and order 2 as v2 (as the newer build does); waiting {wait:?} for a newer build"
    );
    let letters = transport.dead_letters().ok_or_else(|| anyhow::anyhow!("this transport keeps no dead letters"))?;
    loop {
        let found = letters.peek("rolling-orders", 100).await?.into_iter().find(|l| l.message_id == id);
        if let Some(letter) = found {
            println!(
                "order 2 waited {:.0?} for a newer build, none came, and it went to the dead letters: {}",
                sent.elapsed(),
                letter.reason.unwrap_or_default()
            );
            return Ok(());
        }
        anyhow::ensure!(sent.elapsed() < wait + Duration::from_secs(60), "order 2 never reached the dead letters");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}
