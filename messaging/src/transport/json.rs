//! The JSON shapes of messages and dead letters, format 1: what `show
//! --json` and `dlq peek --json` print and the console's API serves. Fields
//! may be added; renaming or removing one makes format 2.

use serde_json::{json, Value};

use super::{DeadLetter, MessageReport};

/// A time in milliseconds since the Unix epoch, as RFC 3339 in UTC.
pub fn rfc3339(ms: i64) -> String {
    let at = std::time::UNIX_EPOCH + std::time::Duration::from_millis(u64::try_from(ms).unwrap_or(0));
    humantime::format_rfc3339_millis(at).to_string()
}

/// A body as JSON when it is JSON, else as text.
pub fn decoded(body: &[u8]) -> Value {
    serde_json::from_slice(body).unwrap_or_else(|_| Value::String(String::from_utf8_lossy(body).into_owned()))
}

impl MessageReport {
    /// This message as `show --json` prints it: the report's fields, the
    /// decoded `body`, the envelope's `type` and `version` (null for a bare
    /// body), and the waiting `deferred` version with its body.
    pub fn to_json(&self) -> Value {
        let mut value = serde_json::to_value(self).unwrap_or_else(|_| json!({}));
        let envelope = self.envelope();
        value["body"] = decoded(&self.body);
        value["type"] = json!(envelope.as_ref().map(|(name, _)| name));
        value["version"] = json!(envelope.as_ref().map(|(_, v)| v));
        if let Some(deferred) = &self.deferred {
            value["deferred"]["body"] = decoded(&deferred.body);
        }
        value
    }
}

impl DeadLetter {
    /// This dead letter as `dlq peek --json` prints it.
    pub fn to_json(&self) -> Value {
        json!({
            "message_id": self.message_id.as_str(),
            "type": self.type_name(),
            "group_id": self.group_id,
            "receive_count": self.receive_count,
            "reason": self.reason,
            "history": self.history,
            "attributes": &*self.attributes,
            // When its last attempt failed (none known on SQS, which keeps no history).
            "failed_at": self.history.last().map(|a| rfc3339(a.at_ms)),
            "body": decoded(&self.body),
        })
    }
}
