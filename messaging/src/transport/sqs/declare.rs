//! Declaring an SQS queue: it must exist with the declared kind, and its
//! redrive policy must bind it to the declared dead-letter queue. Queues are
//! created only when the URL asks for it (`create_queues=true`).

use std::collections::HashMap;

use aws_sdk_sqs::types::QueueAttributeName;
use aws_sdk_sqs::Client;

use super::slow::{answered, SLOW_CALL};
use super::{sdk, SqsOptions, SqsQueue};
use crate::error::TransportError;
use crate::queue::QueueSpec;

/// Finds (or, when allowed, creates) the queue and its DLQ, and checks them.
pub(super) async fn declare(
    client: &Client,
    options: &SqsOptions,
    spec: &QueueSpec,
) -> Result<SqsQueue, TransportError> {
    let dlq_url = match spec.dlq {
        Some(dlq) => {
            let url = find_or_create(client, options, dlq, spec.fifo, None).await?;
            let attributes = attributes(client, &url).await?;
            check_kind(dlq, spec.fifo, &attributes, "dead-letter queue")?;
            Some((url, attributes))
        }
        None => None,
    };
    let redrive = dlq_url
        .as_ref()
        .and_then(|(_, a)| a.get(&QueueAttributeName::QueueArn).cloned())
        .map(|arn| format!(r#"{{"deadLetterTargetArn":"{arn}","maxReceiveCount":"{}"}}"#, spec.redrive_after()));
    let url = find_or_create(client, options, spec.name, spec.fifo, redrive).await?;
    let attributes = attributes(client, &url).await?;
    check_kind(spec.name, spec.fifo, &attributes, "queue")?;
    if let Some(dlq) = spec.dlq {
        check_redrive(spec, dlq, &attributes)?;
    }
    let max_message_bytes = size_limit(&attributes);
    let dlq_max_message_bytes = dlq_url.as_ref().map_or(max_message_bytes, |(_, a)| size_limit(a));
    Ok(SqsQueue { spec: spec.clone(), url, dlq_url: dlq_url.map(|(u, _)| u), max_message_bytes, dlq_max_message_bytes })
}

/// A queue's own size limit (at most 1 MiB); a queue that does not report
/// one is held to the long-standing 256 KiB.
fn size_limit(attributes: &HashMap<QueueAttributeName, String>) -> usize {
    attributes
        .get(&QueueAttributeName::MaximumMessageSize)
        .and_then(|v| v.parse::<usize>().ok())
        .map_or(256 * 1024, |bytes| bytes.min(super::MAX_MESSAGE_BYTES))
}

async fn find_or_create(
    client: &Client,
    options: &SqsOptions,
    name: &str,
    fifo: bool,
    redrive: Option<String>,
) -> Result<String, TransportError> {
    let looked_up = client.get_queue_url().queue_name(name).send();
    match answered("GetQueueUrl", name, SLOW_CALL, looked_up).await {
        Ok(out) => out.queue_url().map(str::to_owned).ok_or_else(|| TransportError::QueueNotFound(name.to_owned())),
        Err(e) if e.as_service_error().is_some_and(|s| s.is_queue_does_not_exist()) => {
            if !options.create_queues {
                return Err(TransportError::Backend(format!(
                    "sqs: queue `{name}` does not exist; create it (and its redrive policy) with your infrastructure, \
                     or connect with `?create_queues=true` in development"
                )));
            }
            let mut request = client.create_queue().queue_name(name);
            if fifo {
                request = request.attributes(QueueAttributeName::FifoQueue, "true");
            }
            if let Some(policy) = redrive {
                request = request.attributes(QueueAttributeName::RedrivePolicy, policy);
            }
            let out = answered("CreateQueue", name, SLOW_CALL, request.send()).await;
            let out = out.map_err(|e| sdk(&format!("creating queue `{name}`"), e))?;
            tracing::info!(queue = name, "created the SQS queue (create_queues=true)");
            out.queue_url().map(str::to_owned).ok_or_else(|| TransportError::QueueNotFound(name.to_owned()))
        }
        Err(e) => Err(sdk(&format!("looking up queue `{name}`"), e)),
    }
}

async fn attributes(client: &Client, url: &str) -> Result<HashMap<QueueAttributeName, String>, TransportError> {
    let request = client.get_queue_attributes().queue_url(url).attribute_names(QueueAttributeName::All).send();
    let out =
        answered("GetQueueAttributes", url, SLOW_CALL, request).await.map_err(|e| sdk("GetQueueAttributes", e))?;
    Ok(out.attributes().cloned().unwrap_or_default())
}

fn check_kind(
    name: &str,
    fifo: bool,
    attributes: &HashMap<QueueAttributeName, String>,
    what: &str,
) -> Result<(), TransportError> {
    let is_fifo = attributes.get(&QueueAttributeName::FifoQueue).is_some_and(|v| v == "true");
    if is_fifo == fifo {
        return Ok(());
    }
    let kind = |f: bool| if f { "FIFO" } else { "standard" };
    Err(TransportError::Rejected(format!(
        "{what} `{name}` is a {} queue on SQS but is declared {}",
        kind(is_fifo),
        kind(fifo)
    )))
}

/// The queue's redrive policy must send to the declared DLQ, and only after
/// more receives than `max_receives`: the worker counts attempts and
/// dead-letters with the reason itself, SQS's redrive is the backstop for
/// receives that were not attempts (crashes, shutdowns, messages held behind
/// a FIFO group's failing head).
fn check_redrive(
    spec: &QueueSpec,
    dlq: &str,
    attributes: &HashMap<QueueAttributeName, String>,
) -> Result<(), TransportError> {
    let name = spec.name;
    let Some(policy) = attributes.get(&QueueAttributeName::RedrivePolicy) else {
        return Err(TransportError::Rejected(format!(
            "queue `{name}` has no redrive policy, but `{dlq}` is declared as its dead-letter queue; \
             set RedrivePolicy deadLetterTargetArn to `{dlq}`'s ARN"
        )));
    };
    let policy = serde_json::from_str::<serde_json::Value>(policy).unwrap_or_default();
    let target = policy.get("deadLetterTargetArn").and_then(|a| a.as_str());
    let target_name = target.and_then(|arn| arn.rsplit(':').next()).unwrap_or("");
    if target_name != dlq {
        return Err(TransportError::Rejected(format!(
            "queue `{name}` sends its dead letters to `{target_name}`, but `{dlq}` is declared; \
             fix the redrive policy or the `dlq` option"
        )));
    }
    // SQS writes the count as a number or a string depending on who set it.
    let count = policy.get("maxReceiveCount").and_then(|c| c.as_u64().or_else(|| c.as_str()?.parse().ok()));
    match count {
        // (1,000 is SQS's most: a max_receives of 1,000 leaves no room above.)
        Some(count) if count > u64::from(spec.max_receives) || count >= 1000 => Ok(()),
        _ => Err(TransportError::Rejected(format!(
            "queue `{name}`: the redrive policy's maxReceiveCount is {}, which must be above max_receives = {} \
             (the worker dead-letters, with the reason, after max_receives attempts; SQS's redrive is the backstop \
             for receives that were not attempts: crashes, shutdowns, FIFO messages held behind a failing one). \
             Set maxReceiveCount to {}",
            count.map_or_else(|| "missing".to_owned(), |c| c.to_string()),
            spec.max_receives,
            spec.redrive_after()
        ))),
    }
}

/// Messages in the queue: visible, in flight and delayed.
pub(super) async fn depth(client: &Client, url: &str) -> Result<u64, TransportError> {
    let (visible, in_flight, delayed) = counts(client, url).await?;
    Ok(visible + in_flight + delayed)
}

/// The queue's approximate counts: (visible, in flight, delayed).
pub(super) async fn counts(client: &Client, url: &str) -> Result<(u64, u64, u64), TransportError> {
    let request = client
        .get_queue_attributes()
        .queue_url(url)
        .attribute_names(QueueAttributeName::ApproximateNumberOfMessages)
        .attribute_names(QueueAttributeName::ApproximateNumberOfMessagesNotVisible)
        .attribute_names(QueueAttributeName::ApproximateNumberOfMessagesDelayed)
        .send();
    let out =
        answered("GetQueueAttributes", url, SLOW_CALL, request).await.map_err(|e| sdk("GetQueueAttributes", e))?;
    let read = |name: QueueAttributeName| {
        out.attributes().and_then(|a| a.get(&name)).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0)
    };
    Ok((
        read(QueueAttributeName::ApproximateNumberOfMessages),
        read(QueueAttributeName::ApproximateNumberOfMessagesNotVisible),
        read(QueueAttributeName::ApproximateNumberOfMessagesDelayed),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(count: &str) -> HashMap<QueueAttributeName, String> {
        let policy = format!(r#"{{"deadLetterTargetArn":"arn:aws:sqs:us-east-1:1:q-dlq","maxReceiveCount":{count}}}"#);
        HashMap::from([(QueueAttributeName::RedrivePolicy, policy)])
    }

    #[test]
    fn the_redrive_policy_must_leave_room_above_max_receives() {
        let mut spec = QueueSpec { dlq: Some("q-dlq"), max_receives: 5, ..QueueSpec::standard("q") };
        assert!(check_redrive(&spec, "q-dlq", &policy("10")).is_ok());
        assert!(check_redrive(&spec, "q-dlq", &policy("\"6\"")).is_ok(), "a count written as a string");
        let err = check_redrive(&spec, "q-dlq", &policy("5")).unwrap_err().to_string();
        assert!(err.contains("maxReceiveCount is 5, which must be above max_receives = 5"), "{err}");
        assert!(err.contains("Set maxReceiveCount to 10"), "{err}");
        // SQS's most is 1,000: a max_receives of 1,000 cannot have room above.
        spec.max_receives = 1000;
        assert_eq!(spec.redrive_after(), 1000);
        assert!(check_redrive(&spec, "q-dlq", &policy("1000")).is_ok());
    }
}
