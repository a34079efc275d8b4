//! The orders app of `examples/orders.rs` on Amazon SQS: the same queues,
//! messages and handlers; only the transport differs, and it is chosen by
//! configuration.
//!
//! On AWS (the queues, their DLQs and redrive policies provisioned by your
//! infrastructure; credentials from the standard AWS environment):
//!
//! ```text
//! MESSAGING_URL=sqs://eu-west-1 cargo run --example sqs_orders --features sqs
//! ```
//!
//! Locally, against moto_server (`pip install 'moto[server]'`), letting the
//! framework create the queues (a development-only option):
//!
//! ```text
//! moto_server -p 5000 &
//! AWS_ACCESS_KEY_ID=test AWS_SECRET_ACCESS_KEY=test \
//! MESSAGING_URL='sqs://us-east-1?endpoint=http://127.0.0.1:5000&create_queues=true' \
//!   cargo run --example sqs_orders --features sqs
//! ```

#[path = "shared/orders_app.rs"]
mod orders_app;

use messaging::prelude::*;
use orders_app::{Db, OrderPlaced, OrderPlacedV1, Orders};

/// Why the example refuses to run elsewhere.
#[derive(Debug)]
struct NotSqs(&'static str);

impl std::fmt::Display for NotSqs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "this example runs on Amazon SQS, not on {}: set MESSAGING_URL=sqs://REGION \
             (see the top of examples/sqs_orders.rs for running it against moto_server)",
            self.0
        )
    }
}

impl std::error::Error for NotSqs {}

#[messaging::main]
async fn main(setup: &mut Setup) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    let system = setup.transport().system();
    if system != "aws_sqs" {
        return Err(Box::new(NotSqs(system)));
    }
    setup.provide(Db::default());
    setup.run_mode(RunMode::Drain);
    let publisher = setup.publisher();
    setup.spawn(async move {
        let orders = [
            OrderPlaced { order_id: "S1".into(), customer_id: "ada".into(), coupon: None },
            OrderPlaced { order_id: "S2".into(), customer_id: "grace".into(), coupon: Some("SPRING".into()) },
        ];
        // One SendMessageBatch request for both.
        for (order, result) in orders.iter().zip(publisher.send_batch::<Orders, _>(&orders).await) {
            match result {
                Ok(id) => println!("published order {} as {id}", order.order_id),
                Err(e) => eprintln!("could not publish order {}: {e}", order.order_id),
            }
        }
        let old = OrderPlacedV1 { order_id: "S3".into(), customer_id: "linus".into() };
        match publisher.send::<Orders, _>(&old).group("linus").await {
            Ok(id) => println!("published order S3 as v1 ({id})"),
            Err(e) => eprintln!("could not publish order S3: {e}"),
        }
    });
    Ok(())
}
