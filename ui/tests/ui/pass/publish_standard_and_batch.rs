// Standard queues take a per-message delay; batches take a group, attributes
// and (on standard queues) a delay too.
use std::time::Duration;

use messaging::prelude::*;

#[messaging::queue("emails")]
pub struct Emails;

#[messaging::queue("orders.fifo", fifo)]
pub struct Orders;

#[messaging::message(name = "emails.welcome", v = 1)]
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Welcome {
    pub to: String,
}

async fn publish(p: Publisher) -> Result<(), PublishError> {
    let mail = Welcome { to: "ada@example.com".into() };
    p.send::<Emails, _>(&mail).await?;
    p.send::<Emails, _>(&mail).delay(Duration::from_secs(30)).await?;
    p.send::<Emails, _>(&mail)
        .delay(Duration::from_millis(500))
        .dedup_id("welcome-ada")
        .attribute("locale", "en")
        .await?;

    let mails = vec![mail.clone(), Welcome { to: "grace@example.com".into() }];
    let results: Vec<Result<MessageId, PublishError>> = p.send_batch::<Emails, _>(&mails).await;
    assert_eq!(results.len(), 2);
    let _ = p.send_batch::<Emails, _>(&mails).delay(Duration::from_secs(5)).attribute("k", "v").await;
    let _ = p.send_batch::<Orders, _>(&mails).group("welcome").await;
    let _ = p.send_batch::<Orders, _>(&mails).attribute("k", "v").group("welcome").await;
    Ok(())
}

fn main() {
    let _ = publish;
}
