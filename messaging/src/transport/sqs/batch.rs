//! Calls that settle receipts ten at a time (`DeleteMessageBatch`,
//! `ChangeMessageVisibilityBatch`): one result per receipt, in order, from
//! the entries each call says succeeded or failed.

use std::future::Future;

use aws_sdk_sqs::types::BatchResultErrorEntry;

use super::{handle, MAX_BATCH};
use crate::error::TransportError;
use crate::transport::Receipt;

/// What one batch call answered: the ids of the entries that succeeded, and
/// the entries that failed.
pub(super) struct Answer {
    ok: Vec<String>,
    failed: Vec<(String, String)>,
}

impl Answer {
    /// The answer of a call from its successful entries' ids and its failed entries.
    pub(super) fn of<'a>(ok: impl IntoIterator<Item = &'a str>, failed: &[BatchResultErrorEntry]) -> Answer {
        Answer {
            ok: ok.into_iter().map(str::to_owned).collect(),
            failed: failed.iter().map(|f| (f.id().to_owned(), f.code().to_owned())).collect(),
        }
    }
}

/// Receipt handles that SQS no longer knows, or whose message is no longer
/// in flight: the receipt is stale, not the call.
const STALE: [&str; 3] = ["ReceiptHandleIsInvalid", "MessageNotInflight", "InvalidParameterValue"];

/// Settles `receipts` by `call`, ten per call. `call` takes (entry id,
/// receipt handle) pairs; a receipt without a handle fails alone, a failed
/// call fails its ten, and `what` names the call in errors.
pub(super) async fn settle<F, Fut>(receipts: &[Receipt], what: &str, mut call: F) -> Vec<Result<(), TransportError>>
where
    F: FnMut(Vec<(String, String)>) -> Fut,
    Fut: Future<Output = Result<Answer, TransportError>>,
{
    let mut results = Vec::with_capacity(receipts.len());
    for chunk in receipts.chunks(MAX_BATCH) {
        let mut local: Vec<Option<Result<(), TransportError>>> = (0..chunk.len()).map(|_| None).collect();
        let mut entries = Vec::with_capacity(chunk.len());
        for (i, receipt) in chunk.iter().enumerate() {
            match handle(receipt) {
                Ok(h) => entries.push((i.to_string(), h.to_owned())),
                Err(e) => local[i] = Some(Err(e)),
            }
        }
        if !entries.is_empty() {
            match call(entries).await {
                Err(e) => {
                    for slot in local.iter_mut().filter(|s| s.is_none()) {
                        *slot = Some(Err(e.clone()));
                    }
                }
                Ok(answer) => {
                    let len = local.len();
                    let index = |id: &str| id.parse::<usize>().ok().filter(|&i| i < len);
                    for id in &answer.ok {
                        if let Some(i) = index(id) {
                            local[i] = Some(Ok(()));
                        }
                    }
                    for (id, code) in &answer.failed {
                        if let Some(i) = index(id) {
                            local[i] = Some(Err(if STALE.contains(&code.as_str()) {
                                TransportError::StaleReceipt
                            } else {
                                TransportError::Backend(format!("sqs: {what} failed for a message ({code})"))
                            }));
                        }
                    }
                }
            }
        }
        results.extend(
            local
                .into_iter()
                .map(|r| r.unwrap_or_else(|| Err(TransportError::Backend(format!("sqs: no {what} result"))))),
        );
    }
    results
}
