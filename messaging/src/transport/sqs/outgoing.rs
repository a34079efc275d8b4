//! Outgoing messages: the checks before sending (size, delay, group,
//! attributes), the request entries and one `SendMessageBatch` call.

use super::*;

impl SqsTransport {
    /// A message's size as SQS counts it: body (as sent, escapes included),
    /// attribute names, types and values.
    pub(super) fn size(m: &Outgoing) -> usize {
        Self::size_of(&m.body, &m.attributes)
    }

    /// The size of a body with these attributes, as [`SqsTransport::size`].
    pub(super) fn size_of(body: &[u8], attributes: &Attributes) -> usize {
        let body = text::body(body).map_or(body.len(), |b| b.len());
        body + attributes.iter().map(|(k, v)| k.len() + v.len() + "String".len()).sum::<usize>()
    }

    /// Checks one message before sending: size, delay, group id. Returns the
    /// size.
    pub(super) fn check(q: &SqsQueue, m: &Outgoing) -> Result<usize, TransportError> {
        let spec = &q.spec;
        let size = Self::size(m);
        if size > q.max_message_bytes {
            return Err(TransportError::Rejected(format!(
                "the message is {size} bytes with its attributes; SQS queue `{}` accepts at most {} (its MaximumMessageSize)",
                spec.name, q.max_message_bytes
            )));
        }
        if let Some(delay) = m.delay.filter(|d| !d.is_zero()) {
            if spec.fifo {
                return Err(TransportError::Rejected(format!("FIFO queue `{}` takes no per-message delay", spec.name)));
            }
            if delay > MAX_DELAY {
                return Err(TransportError::Rejected(format!(
                    "a delay of {delay:?} exceeds the SQS maximum of 15 minutes"
                )));
            }
        }
        if spec.fifo && m.group_id.as_deref().is_none_or(str::is_empty) {
            return Err(TransportError::Rejected(format!("FIFO queue `{}` needs a message group id", spec.name)));
        }
        Ok(size)
    }

    /// The message's attributes as SQS takes them: no empty values (SQS
    /// refuses them; an absent attribute reads the same to our consumers).
    pub(super) fn attributes_of(m: &Outgoing) -> Result<HashMap<String, MessageAttributeValue>, TransportError> {
        if m.attributes.len() > text::MAX_ATTRIBUTES {
            return Err(TransportError::Rejected(format!(
                "the message has {} attributes; SQS takes at most {}",
                m.attributes.len(),
                text::MAX_ATTRIBUTES
            )));
        }
        m.attributes
            .iter()
            .filter(|(_, v)| !v.is_empty())
            .map(|(k, v)| {
                let value = MessageAttributeValue::builder()
                    .data_type("String")
                    .string_value(text::attribute_value(v))
                    .build()
                    .map_err(|e| TransportError::Rejected(format!("attribute `{k}`: {e}")))?;
                Ok((k.clone(), value))
            })
            .collect()
    }

    pub(super) fn entry(
        index: usize,
        spec: &QueueSpec,
        m: &Outgoing,
    ) -> Result<SendMessageBatchRequestEntry, TransportError> {
        let mut entry = SendMessageBatchRequestEntry::builder()
            .id(index.to_string())
            .message_body(text::body(&m.body)?)
            .set_message_attributes(Some(Self::attributes_of(m)?).filter(|a| !a.is_empty()));
        if spec.fifo {
            entry = entry.set_message_group_id(m.group_id.clone());
            // Without an explicit id, deduplicate by content (each send is distinct).
            let dedup = m.dedup_id.clone().unwrap_or_else(|| MessageId::random().to_string());
            entry = entry.message_deduplication_id(dedup);
        } else if let Some(delay) = m.delay.filter(|d| !d.is_zero()) {
            entry = entry.delay_seconds(seconds(delay));
        }
        entry.build().map_err(|e| TransportError::Rejected(format!("invalid batch entry: {e}")))
    }

    /// Sends up to 10 checked messages in one request; one result per message.
    pub(super) async fn send_chunk(
        &self,
        url: &str,
        entries: Vec<(usize, SendMessageBatchRequestEntry)>,
    ) -> Vec<(usize, Result<MessageId, TransportError>)> {
        let indices: Vec<usize> = entries.iter().map(|(i, _)| *i).collect();
        let request = self
            .client
            .send_message_batch()
            .queue_url(url)
            .set_entries(Some(entries.into_iter().map(|(_, e)| e).collect()));
        match self.call("SendMessageBatch", url, Duration::ZERO, request.send()).await {
            Err(e) => {
                let err = sdk("SendMessageBatch", e).to_string();
                indices.into_iter().map(|i| (i, Err(TransportError::Backend(err.clone())))).collect()
            }
            Ok(out) => {
                let mut results: HashMap<usize, Result<MessageId, TransportError>> = HashMap::new();
                for ok in out.successful() {
                    if let Ok(i) = ok.id().parse::<usize>() {
                        results.insert(i, Ok(MessageId::from(ok.message_id())));
                    }
                }
                for failed in out.failed() {
                    if let Ok(i) = failed.id().parse::<usize>() {
                        let message = failed.message().unwrap_or("no reason given");
                        let text = format!("SQS refused the message ({}): {message}", failed.code());
                        // Only the sender's faults are the message's: the
                        // others (SQS's own) may pass on a retry.
                        let error = if failed.sender_fault() {
                            TransportError::Rejected(text)
                        } else {
                            TransportError::Backend(text)
                        };
                        results.insert(i, Err(error));
                    }
                }
                indices
                    .into_iter()
                    .map(|i| {
                        (
                            i,
                            results
                                .remove(&i)
                                .unwrap_or(Err(TransportError::Backend("sqs: no result for a batch entry".into()))),
                        )
                    })
                    .collect()
            }
        }
    }
}
