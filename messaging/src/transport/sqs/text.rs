//! The characters SQS carries. A body or attribute value with any other
//! character is refused for the whole request, so the transport makes every
//! message sendable before it goes out.

use std::borrow::Cow;

use crate::error::TransportError;
use crate::transport::sqs_text_char;

/// The most attributes SQS takes per message.
pub(super) const MAX_ATTRIBUTES: usize = 10;

/// The message body as SQS text. Envelopes are JSON, where the characters SQS
/// refuses (control characters, U+FFFE, U+FFFF) can only stand inside
/// strings; they are written as `\uXXXX` escapes, which decode to the same
/// value.
pub(super) fn body(bytes: &[u8]) -> Result<Cow<'_, str>, TransportError> {
    let text = std::str::from_utf8(bytes)
        .map_err(|_| TransportError::Rejected("SQS message bodies must be UTF-8 text".into()))?;
    if text.chars().all(sqs_text_char) {
        return Ok(Cow::Borrowed(text));
    }
    let mut escaped = String::with_capacity(text.len() + 16);
    for c in text.chars() {
        if sqs_text_char(c) {
            escaped.push(c);
        } else {
            escaped.push_str(&format!("\\u{:04x}", u32::from(c)));
        }
    }
    Ok(Cow::Owned(escaped))
}

/// A framework-written attribute value (a dead-letter reason, say) as SQS
/// text: characters SQS refuses become U+FFFD. Published attributes were
/// checked when the message was built.
pub(super) fn attribute_value(value: &str) -> Cow<'_, str> {
    if value.chars().all(sqs_text_char) {
        Cow::Borrowed(value)
    } else {
        Cow::Owned(value.chars().map(|c| if sqs_text_char(c) { c } else { '\u{FFFD}' }).collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_body_with_refused_characters_is_escaped_to_the_same_json() {
        let value = serde_json::json!({ "note": "a\u{FFFE}b\u{FFFF}c", "tab": "\t" });
        let json = serde_json::to_string(&value).expect("json");
        let sent = body(json.as_bytes()).expect("utf-8");
        assert!(sent.chars().all(sqs_text_char), "{sent}");
        assert!(sent.contains("\\ufffe") && sent.contains("\\uffff"), "{sent}");
        assert_eq!(serde_json::from_str::<serde_json::Value>(&sent).expect("json"), value);
        assert!(matches!(body(b"plain"), Ok(Cow::Borrowed("plain"))));
        assert!(body(&[0xff, 0xfe]).is_err());
    }

    #[test]
    fn an_attribute_value_keeps_what_sqs_carries() {
        assert_eq!(attribute_value("decode failed at \u{0}: é"), "decode failed at \u{FFFD}: é");
        assert!(matches!(attribute_value("fine\ttext"), Cow::Borrowed(_)));
    }
}
