// The three ways a send to a FIFO queue gets its message group id, and the
// options shared by every send.
use messaging::prelude::*;

#[messaging::queue("orders.fifo", fifo)]
pub struct Orders;

#[messaging::queue("audit.fifo", fifo, default_group = "audit")]
pub struct Audit;

#[messaging::message(name = "orders.placed", v = 1)]
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct OrderPlaced {
    pub order_id: String,
}

#[messaging::message(name = "orders.shipped", v = 1, id = order_id, group = customer_id)]
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct OrderShipped {
    pub order_id: String,
    pub customer_id: String,
}

async fn publish(p: Publisher) -> Result<(), PublishError> {
    let placed = OrderPlaced { order_id: "A1".into() };
    let shipped = OrderShipped { order_id: "A1".into(), customer_id: "ada".into() };

    // 1. `.group(..)` at the call, in any position of the chain.
    let _: MessageId = p.send::<Orders, _>(&placed).group("customer-42").await?;
    p.send::<Orders, _>(&placed).dedup_id("A1").attribute("tenant", "t1").group("c-1").await?;
    // 2. The message's `group = field` (and its `id = field` as dedup id).
    p.send::<Orders, _>(&shipped).await?;
    p.send::<Orders, _>(&shipped).attribute("tenant", "t1").await?;
    // 3. The queue's `default_group`.
    p.send::<Audit, _>(&placed).await?;
    p.send::<Audit, _>(&placed).dedup_id("A1").await?;
    // `.group(..)` overrides the other two.
    p.send::<Audit, _>(&shipped).group("override").await?;
    Ok(())
}

fn main() {
    let _ = publish;
}
