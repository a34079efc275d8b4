// Every option of `#[messaging::handler]`, every extractor, both return
// types, and several handlers sharing one (multi-type) queue.
use messaging::prelude::*;

#[messaging::queue("billing.fifo", fifo, dlq = "billing-dlq.fifo", default_group = "billing")]
pub struct Billing;

#[messaging::queue("notifications")]
pub struct Notifications;

#[messaging::message(name = "billing.charged", v = 1, id = charge_id, group = account)]
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Charged {
    pub charge_id: String,
    pub account: String,
    pub cents: u64,
}

#[messaging::message(name = "billing.refunded", v = 1)]
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Refunded {
    pub charge_id: String,
}

#[messaging::message]
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Notice {
    pub text: String,
}

#[derive(Default)]
pub struct Ledger;

// Billing carries two message types: a multi-type queue.
#[messaging::handler(
    queue = Billing,
    idempotent = "charge-ledger",
    lease = "20s",
    retry(base = "500ms", max = "2m"),
    timeout = "90s"
)]
async fn record_charge(
    charge: Charged,
    ctx: MessageContext,
    ledger: State<Ledger>,
    publisher: Publisher,
) -> Result<(), HandlerError> {
    let _ = (ctx.message_id(), ctx.group_id(), &*ledger);
    let notice = Notice { text: format!("charged {} cents", charge.cents) };
    publisher.send::<Notifications, _>(&notice).await?;
    Ok(())
}

#[messaging::handler(queue = Billing, idempotent = "refund-ledger")]
async fn record_refund(refund: Refunded, ledger: State<Ledger>) {
    let _ = (refund.charge_id, &*ledger);
}

#[messaging::handler(queue = Notifications, retry(max = "10m"))]
async fn notify(notice: Notice, ctx: MessageContext) -> Result<(), HandlerError> {
    if notice.text.is_empty() {
        return Err(HandlerError::permanent(std::io::Error::other(format!("empty notice {}", ctx.message_id()))));
    }
    Ok(())
}

fn main() {
    // The functions stay callable as written.
    let _ = (record_charge, record_refund, notify);
}
