// The README's "Your own service", as written there (the library and the
// binary in one file), so that the README's code keeps compiling; the run
// mode is the only addition, so that this test exits by itself.
use messaging::prelude::*;

#[messaging::queue("shop-orders", dlq = "shop-orders-dlq", max_receives = 2)]
pub struct Orders;

#[messaging::message(name = "shop.order", v = 1)]
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Order { pub sku: String, pub qty: u32 }

#[messaging::handler(queue = Orders)]
async fn take(order: Order) -> Result<(), HandlerError> {
    check(&order)?;                                               // `?` on anyhow,
    let _n: u32 = order.sku.trim_start_matches("SKU-").parse()?;  // std errors, String…
    Ok(())
}

fn check(order: &Order) -> anyhow::Result<()> {
    anyhow::ensure!(order.qty > 0, "quantity must be positive, got {}", order.qty);
    Ok(())
}

#[messaging::main]
async fn main(setup: &mut Setup) -> anyhow::Result<()> {
    setup.run_mode(RunMode::Drain);
    setup.publisher().send::<Orders, _>(&Order { sku: "SKU-1".into(), qty: 2 }).await?;
    Ok(())
}
