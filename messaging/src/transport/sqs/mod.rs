//! `sqs://REGION`: Amazon SQS (aws-sdk-sqs).
//!
//! Configured by the standard AWS environment (credentials chain, region,
//! `AWS_ENDPOINT_URL` / `AWS_ENDPOINT_URL_SQS`). Publishing uses
//! `SendMessageBatch` (10 entries and 1 MiB per request, each message's size
//! checked first against its queue's `MaximumMessageSize`); consuming long-polls up to 10 messages, deletes in batches,
//! extends visibility for slow handlers and retries by setting the visibility
//! from the receive count. Queues are never created unless the URL asks for
//! it (`?create_queues=true`, for development and tests).

mod batch;
mod dead_letters;
mod declare;
mod options;
mod outgoing;
mod slow;
mod text;

use std::collections::HashMap;
use std::sync::{Arc, RwLock};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use aws_sdk_sqs::error::{DisplayErrorContext, SdkError};
use aws_sdk_sqs::types::{
    ChangeMessageVisibilityBatchRequestEntry, DeleteMessageBatchRequestEntry, MessageAttributeValue,
    MessageSystemAttributeName, SendMessageBatchRequestEntry,
};
use aws_sdk_sqs::Client;

/// The AWS SDK for SQS, re-exported so that code using
/// [`SqsTransport::client`] names the same version.
pub use aws_sdk_sqs;
pub use options::SqsOptions;

use crate::boxed::BoxFuture;
use crate::error::{Error, TransportError};
use crate::queue::QueueSpec;
use crate::transport::{Attributes, DeadLetters, Delivery, MessageId, Outgoing, Receipt, Transport};

/// The largest message SQS accepts on any queue (body plus attributes); each
/// queue's `MaximumMessageSize` may set less, and is what sends are checked
/// against.
pub const MAX_MESSAGE_BYTES: usize = 1024 * 1024;
/// The largest `SendMessageBatch` request (the sum of its messages).
const MAX_REQUEST_BYTES: usize = 1024 * 1024;
/// The most entries per batch request.
const MAX_BATCH: usize = 10;
/// The longest per-message delay on a standard queue.
const MAX_DELAY: Duration = Duration::from_secs(900);
/// The longest visibility timeout SQS accepts.
const MAX_VISIBILITY: Duration = Duration::from_secs(12 * 3600);

/// A declared queue: its URL and, if any, its dead-letter queue's.
#[derive(Debug, Clone)]
struct SqsQueue {
    spec: QueueSpec,
    url: String,
    dlq_url: Option<String>,
    /// The queue's `MaximumMessageSize`.
    max_message_bytes: usize,
    /// The dead-letter queue's `MaximumMessageSize` (the queue's when it has none).
    dlq_max_message_bytes: usize,
}

/// The Amazon SQS transport.
pub struct SqsTransport {
    client: Client,
    options: SqsOptions,
    queues: RwLock<HashMap<String, SqsQueue>>,
    requests: std::sync::atomic::AtomicU64,
}

impl std::fmt::Debug for SqsTransport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SqsTransport").field("options", &self.options).finish_non_exhaustive()
    }
}

/// Connects to SQS as the URL says: `sqs://REGION` (or `sqs://` for the
/// environment's region), with options as query parameters.
pub async fn connect(url: &str) -> Result<SqsTransport, Error> {
    let options = SqsOptions::parse(url)?;
    let mut loader = aws_config::defaults(aws_config::BehaviorVersion::latest()).timeout_config(
        aws_config::timeout::TimeoutConfig::builder()
            .connect_timeout(Duration::from_secs(3))
            // Long polls last up to 20 s.
            .operation_attempt_timeout(Duration::from_secs(25))
            .build(),
    );
    if let Some(region) = &options.region {
        loader = loader.region(aws_config::Region::new(region.clone()));
    }
    if let Some(endpoint) = &options.endpoint {
        loader = loader.endpoint_url(endpoint);
    }
    let config = loader.load().await;
    if config.region().is_none() {
        return Err(Error::Config {
            url: url.to_owned(),
            reason: "no AWS region: write sqs://REGION (e.g. sqs://eu-west-1) or set AWS_REGION".into(),
        });
    }
    Ok(SqsTransport {
        client: Client::new(&config),
        options,
        queues: RwLock::new(HashMap::new()),
        requests: std::sync::atomic::AtomicU64::new(0),
    })
}

/// An SDK error as one readable line: the messages of the error and its
/// causes. The SDK's `DisplayErrorContext` appends the whole error's `Debug`
/// too, a screenful of connector internals on every failed call while SQS
/// was unreachable (seen from outside: each acknowledgement's warning);
/// that goes to the debug log instead.
pub(crate) fn sdk<E, R>(what: &str, e: SdkError<E, R>) -> TransportError
where
    E: std::error::Error + 'static,
    R: std::fmt::Debug + 'static,
{
    tracing::debug!("sqs: {what} failed: {}", DisplayErrorContext(&e));
    TransportError::Backend(format!("sqs: {what} failed: {}", causes(&e)))
}

/// `e` and its sources, by their messages, joined with ": " (a source whose
/// message its error already shows is left out).
fn causes(e: &(dyn std::error::Error + 'static)) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(cause) = source {
        let message = cause.to_string();
        if !text.contains(&message) {
            text.push_str(": ");
            text.push_str(&message);
        }
        source = cause.source();
    }
    text
}

fn seconds(d: Duration) -> i32 {
    d.as_secs_f64().ceil().min(i32::MAX as f64) as i32
}

impl SqsTransport {
    fn queue(&self, name: &str) -> Result<SqsQueue, TransportError> {
        self.queues
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .get(name)
            .cloned()
            .ok_or_else(|| TransportError::QueueNotFound(name.to_owned()))
    }

    /// The SDK client (for tools).
    pub fn client(&self) -> &Client {
        &self.client
    }

    /// SQS API requests made so far by sends, receives, deletes, visibility
    /// changes and dead-letter operations (not by startup declaration).
    pub fn requests(&self) -> u64 {
        self.requests.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Counts one API request.
    pub(super) fn count(&self) {
        self.requests.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }

    /// Counts one API request, `what` on the queue at `url`, and awaits it,
    /// saying so if it goes unanswered for long ([`slow::answered`]; a
    /// receive's long poll `wait` is not counted as slow).
    pub(super) async fn call<T>(
        &self,
        what: &str,
        url: &str,
        wait: Duration,
        request: impl std::future::Future<Output = T>,
    ) -> T {
        self.count();
        slow::answered(what, url, wait + slow::SLOW_CALL, request).await
    }
}

fn delivery_of(m: &aws_sdk_sqs::types::Message) -> Option<Delivery> {
    let handle = m.receipt_handle()?;
    let system = m.attributes();
    let get = |name: MessageSystemAttributeName| system.and_then(|a| a.get(&name)).cloned();
    let receive_count =
        get(MessageSystemAttributeName::ApproximateReceiveCount).and_then(|v| v.parse().ok()).unwrap_or(1);
    let sent_at = get(MessageSystemAttributeName::SentTimestamp)
        .and_then(|v| v.parse::<u64>().ok())
        .map_or_else(SystemTime::now, |ms| UNIX_EPOCH + Duration::from_millis(ms));
    let attributes: Attributes = m
        .message_attributes()
        .map(|a| a.iter().filter_map(|(k, v)| Some((k.clone(), v.string_value()?.to_owned()))).collect())
        .unwrap_or_default();
    Some(Delivery {
        // A message relayed from an outbox keeps the id its publish returned.
        message_id: attributes
            .get(crate::transport::MESSAGE_ID_ATTRIBUTE)
            .map_or_else(|| MessageId::from(m.message_id().unwrap_or_default()), |id| MessageId::from(id.as_str())),
        body: bytes::Bytes::copy_from_slice(m.body().unwrap_or_default().as_bytes()),
        receipt: Receipt { key: 0, token: 0, locator: 0, handle: Some(Arc::from(handle)) },
        receive_count,
        group_id: get(MessageSystemAttributeName::MessageGroupId),
        attributes: Arc::new(attributes),
        sent_at,
        // SQS keeps no mark of an expired visibility apart from a failure's.
        suspect: false,
    })
}

fn handle(receipt: &Receipt) -> Result<&str, TransportError> {
    receipt.handle.as_deref().ok_or(TransportError::StaleReceipt)
}

impl Transport for SqsTransport {
    fn system(&self) -> &'static str {
        "aws_sqs"
    }

    fn declare<'a>(&'a self, spec: &'a QueueSpec) -> BoxFuture<'a, Result<(), TransportError>> {
        Box::pin(async move {
            let queue = declare::declare(&self.client, &self.options, spec).await?;
            self.queues.write().unwrap_or_else(|p| p.into_inner()).insert(spec.name.to_owned(), queue);
            Ok(())
        })
    }

    fn send<'a>(&'a self, queue: &'a str, message: Outgoing) -> BoxFuture<'a, Result<MessageId, TransportError>> {
        Box::pin(async move {
            let q = self.queue(queue)?;
            Self::check(&q, &message)?;
            let mut request = self
                .client
                .send_message()
                .queue_url(&q.url)
                .message_body(text::body(&message.body)?)
                .set_message_attributes(Some(Self::attributes_of(&message)?).filter(|a| !a.is_empty()));
            if q.spec.fifo {
                let dedup = message.dedup_id.clone().unwrap_or_else(|| MessageId::random().to_string());
                request = request.set_message_group_id(message.group_id.clone()).message_deduplication_id(dedup);
            } else if let Some(delay) = message.delay.filter(|d| !d.is_zero()) {
                request = request.delay_seconds(seconds(delay));
            }
            let out = self.call("SendMessage", &q.url, Duration::ZERO, request.send()).await;
            let out = out.map_err(|e| sdk("SendMessage", e))?;
            Ok(MessageId::from(out.message_id().unwrap_or_default()))
        })
    }

    fn send_batch<'a>(
        &'a self,
        queue: &'a str,
        messages: Vec<Outgoing>,
    ) -> BoxFuture<'a, Vec<Result<MessageId, TransportError>>> {
        Box::pin(async move {
            let q = match self.queue(queue) {
                Ok(q) => q,
                Err(_) => return crate::transport::unknown_queue(queue, &messages),
            };
            let mut results: Vec<Option<Result<MessageId, TransportError>>> =
                (0..messages.len()).map(|_| None).collect();
            // Chunks of at most 10 entries and 1 MiB (or the queue's smaller limit).
            let max_request = MAX_REQUEST_BYTES.min(q.max_message_bytes);
            let mut chunk: Vec<(usize, SendMessageBatchRequestEntry)> = Vec::new();
            let mut chunk_bytes = 0;
            let mut chunks = Vec::new();
            for (i, m) in messages.iter().enumerate() {
                let entry = Self::check(&q, m).and_then(|size| Ok((size, Self::entry(i, &q.spec, m)?)));
                match entry {
                    Err(e) => results[i] = Some(Err(e)),
                    Ok((size, entry)) => {
                        if chunk.len() == MAX_BATCH || chunk_bytes + size > max_request {
                            chunks.push(std::mem::take(&mut chunk));
                            chunk_bytes = 0;
                        }
                        chunk_bytes += size;
                        chunk.push((i, entry));
                    }
                }
            }
            if !chunk.is_empty() {
                chunks.push(chunk);
            }
            for chunk in chunks {
                for (i, result) in self.send_chunk(&q.url, chunk).await {
                    results[i] = Some(result);
                }
            }
            results.into_iter().map(|r| r.unwrap_or(Err(TransportError::Backend("sqs: unsent".into())))).collect()
        })
    }

    fn receive<'a>(
        &'a self,
        queue: &'a str,
        max: usize,
        wait: Duration,
    ) -> BoxFuture<'a, Result<Vec<Delivery>, TransportError>> {
        Box::pin(async move {
            let q = self.queue(queue)?;
            // Whole seconds, rounded down: the worker waits for a receive in
            // flight at shutdown, within the grace period.
            let wait = Duration::from_secs(wait.min(Duration::from_secs(20)).as_secs());
            let request = self
                .client
                .receive_message()
                .queue_url(&q.url)
                .max_number_of_messages(max.clamp(1, MAX_BATCH) as i32)
                .wait_time_seconds(wait.as_secs() as i32)
                .visibility_timeout(seconds(q.spec.visibility.min(MAX_VISIBILITY)))
                .message_system_attribute_names(MessageSystemAttributeName::ApproximateReceiveCount)
                .message_system_attribute_names(MessageSystemAttributeName::SentTimestamp)
                .message_system_attribute_names(MessageSystemAttributeName::MessageGroupId)
                .message_attribute_names("All")
                .send();
            let out = self.call("ReceiveMessage", &q.url, wait, request).await.map_err(|e| sdk("ReceiveMessage", e))?;
            Ok(out.messages().iter().filter_map(delivery_of).collect())
        })
    }

    fn ack<'a>(&'a self, queue: &'a str, receipts: Vec<Receipt>) -> BoxFuture<'a, Vec<Result<(), TransportError>>> {
        Box::pin(async move {
            let q = match self.queue(queue) {
                Ok(q) => q,
                Err(_) => return crate::transport::unknown_queue(queue, &receipts),
            };
            let what = "DeleteMessageBatch";
            batch::settle(&receipts, what, |entries| async {
                let entries = entries
                    .into_iter()
                    .map(|(id, h)| DeleteMessageBatchRequestEntry::builder().id(id).receipt_handle(h).build())
                    .collect::<Result<Vec<_>, _>>()
                    .map_err(|e| TransportError::Backend(format!("sqs: {e}")))?;
                let request = self.client.delete_message_batch().queue_url(&q.url).set_entries(Some(entries)).send();
                let out = self.call(what, &q.url, Duration::ZERO, request).await.map_err(|e| sdk(what, e))?;
                Ok(batch::Answer::of(out.successful().iter().map(|s| s.id()), out.failed()))
            })
            .await
        })
    }

    fn release<'a>(&'a self, queue: &'a str, receipts: Vec<Receipt>) -> BoxFuture<'a, Vec<Result<(), TransportError>>> {
        Box::pin(self.change_visibility_all(queue, receipts, Duration::ZERO))
    }

    fn extend_all<'a>(
        &'a self,
        queue: &'a str,
        receipts: Vec<Receipt>,
        visibility: Duration,
    ) -> BoxFuture<'a, Vec<Result<(), TransportError>>> {
        Box::pin(self.change_visibility_all(queue, receipts, visibility))
    }

    fn nack<'a>(
        &'a self,
        queue: &'a str,
        receipt: Receipt,
        delay: Duration,
    ) -> BoxFuture<'a, Result<(), TransportError>> {
        Box::pin(async move { self.change_visibility(queue, &receipt, delay).await })
    }

    fn extend<'a>(
        &'a self,
        queue: &'a str,
        receipt: &'a Receipt,
        visibility: Duration,
    ) -> BoxFuture<'a, Result<(), TransportError>> {
        Box::pin(self.change_visibility(queue, receipt, visibility))
    }

    fn max_batch(&self) -> usize {
        MAX_BATCH
    }

    fn concurrent_receives(&self) -> usize {
        // A receive is a network round trip of at most 10 messages; with two
        // going, the next one is usually back before the lanes run dry. (An
        // idle queue then costs two empty long polls per wait instead of one.)
        2
    }

    fn max_delay(&self) -> Duration {
        MAX_DELAY
    }

    fn depth<'a>(&'a self, queue: &'a str) -> BoxFuture<'a, Result<u64, TransportError>> {
        Box::pin(async move {
            let q = self.queue(queue)?;
            self.count();
            declare::depth(&self.client, &q.url).await
        })
    }

    fn counts<'a>(&'a self, queue: &'a str) -> BoxFuture<'a, Result<crate::transport::QueueCounts, TransportError>> {
        Box::pin(async move {
            let q = self.queue(queue)?;
            self.count();
            let (pending, in_flight, sleeping) = declare::counts(&self.client, &q.url).await?;
            let dead = match q.dlq_url {
                Some(_) => Some(DeadLetters::depth(self, queue).await?),
                None => None,
            };
            Ok(crate::transport::QueueCounts {
                pending: Some(pending),
                sleeping: Some(sleeping),
                in_flight: Some(in_flight),
                // SQS has no such state: a publish while a message is handled
                // is another message.
                awaiting_release: Some(0),
                dead,
                // SQS counts what is not visible, not why.
                expired: None,
                oldest_sent_at_ms: None,
                oldest_pending_since_ms: None,
            })
        })
    }

    fn postpones(&self, spec: &QueueSpec) -> bool {
        // A FIFO message goes back with the rest of its group, and each of
        // them would be charged a receive toward the redrive policy.
        !spec.fifo
    }

    fn dead_letters(&self) -> Option<&dyn DeadLetters> {
        Some(self)
    }
}

impl SqsTransport {
    /// Sets the visibility of many deliveries to `after` from now, ten per
    /// `ChangeMessageVisibilityBatch`.
    async fn change_visibility_all(
        &self,
        queue: &str,
        receipts: Vec<Receipt>,
        after: Duration,
    ) -> Vec<Result<(), TransportError>> {
        let q = match self.queue(queue) {
            Ok(q) => q,
            Err(_) => return crate::transport::unknown_queue(queue, &receipts),
        };
        let what = "ChangeMessageVisibilityBatch";
        let timeout = seconds(after.min(MAX_VISIBILITY));
        batch::settle(&receipts, what, |entries| async {
            let entries = entries
                .into_iter()
                .map(|(id, h)| {
                    ChangeMessageVisibilityBatchRequestEntry::builder()
                        .id(id)
                        .receipt_handle(h)
                        .visibility_timeout(timeout)
                        .build()
                })
                .collect::<Result<Vec<_>, _>>()
                .map_err(|e| TransportError::Backend(format!("sqs: {e}")))?;
            let request =
                self.client.change_message_visibility_batch().queue_url(&q.url).set_entries(Some(entries)).send();
            let out = self.call(what, &q.url, Duration::ZERO, request).await.map_err(|e| sdk(what, e))?;
            Ok(batch::Answer::of(out.successful().iter().map(|s| s.id()), out.failed()))
        })
        .await
    }

    async fn change_visibility(&self, queue: &str, receipt: &Receipt, after: Duration) -> Result<(), TransportError> {
        let q = self.queue(queue)?;
        let request = self
            .client
            .change_message_visibility()
            .queue_url(&q.url)
            .receipt_handle(handle(receipt)?)
            .visibility_timeout(seconds(after.min(MAX_VISIBILITY)))
            .send();
        let result = self.call("ChangeMessageVisibility", &q.url, Duration::ZERO, request).await;
        match result {
            Ok(_) => Ok(()),
            Err(e) => {
                let invalid = e.as_service_error().is_some_and(|s| {
                    s.is_receipt_handle_is_invalid() || s.meta().code() == Some("InvalidParameterValue")
                });
                if invalid {
                    Err(TransportError::StaleReceipt)
                } else {
                    Err(sdk("ChangeMessageVisibility", e))
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_sdk_error_reads_as_its_causes_without_the_debug_dump() {
        let refused = std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "Connection refused (os error 111)");
        let e: SdkError<std::io::Error, ()> = SdkError::timeout_error(refused);
        let text = sdk("DeleteMessageBatch", e).to_string();
        assert_eq!(text, "sqs: DeleteMessageBatch failed: request has timed out: Connection refused (os error 111)");
    }
}
