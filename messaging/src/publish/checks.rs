//! What every transport accepts in ids and attributes: the Amazon SQS rules,
//! applied everywhere so that a service moves between transports by
//! configuration alone.

use crate::error::PublishError;
use crate::transport::sqs_text_char;
use crate::transport::Attributes;

/// The longest identity, group or deduplication id (the Amazon SQS limit,
/// applied everywhere so that a service can move between transports).
pub const MAX_ID_LEN: usize = 128;

/// The most attributes a message may carry: SQS takes 10 per message, and two
/// are kept for the trace context (`traceparent`, `tracestate`).
pub const MAX_ATTRIBUTES: usize = 8;

/// The longest attribute name SQS accepts.
const MAX_ATTRIBUTE_NAME_LEN: usize = 256;

/// Checks an identifier: 1 to 128 printable ASCII characters.
pub(super) fn check_id(field: &'static str, id: Option<&str>) -> Result<(), PublishError> {
    let Some(id) = id else { return Ok(()) };
    let reason = if id.is_empty() {
        "it is empty".to_owned()
    } else if id.len() > MAX_ID_LEN {
        format!("it is {} characters long; the limit is {MAX_ID_LEN}", id.len())
    } else if let Some(c) = id.chars().find(|c| !c.is_ascii_graphic()) {
        format!("it contains {c:?}; use printable ASCII characters without spaces")
    } else {
        return Ok(());
    };
    Err(PublishError::InvalidId { field, reason })
}

/// Checks the attributes set with `.attribute(..)`: at most
/// [`MAX_ATTRIBUTES`], names of ASCII letters, digits, `_`, `-` and `.`, and
/// non-empty values of characters SQS can carry.
pub(super) fn check_attributes(attributes: &Attributes) -> Result<(), PublishError> {
    if attributes.len() > MAX_ATTRIBUTES {
        return Err(PublishError::TooManyAttributes { count: attributes.len(), max: MAX_ATTRIBUTES });
    }
    for (name, value) in attributes {
        if let Some(reason) = name_problem(name).or_else(|| value_problem(value)) {
            return Err(PublishError::InvalidAttribute { name: name.clone(), reason });
        }
    }
    Ok(())
}

fn name_problem(name: &str) -> Option<String> {
    let lower = name.to_ascii_lowercase();
    if name.is_empty() || name.len() > MAX_ATTRIBUTE_NAME_LEN {
        Some(format!("a name is 1 to {MAX_ATTRIBUTE_NAME_LEN} characters long"))
    } else if let Some(c) = name.chars().find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'))) {
        Some(format!("the name contains {c:?}; use ASCII letters, digits, `_`, `-` and `.`"))
    } else if lower.starts_with("aws.") || lower.starts_with("amazon.") {
        Some("names starting with `AWS.` or `Amazon.` are reserved by SQS".to_owned())
    } else if name.starts_with('.') || name.ends_with('.') || name.contains("..") {
        Some("a name neither starts nor ends with `.` and has no `..`".to_owned())
    } else {
        None
    }
}

fn value_problem(value: &str) -> Option<String> {
    if value.is_empty() {
        return Some("the value is empty; SQS carries no empty attribute (leave the attribute out)".to_owned());
    }
    value.chars().find(|&c| !sqs_text_char(c)).map(|c| {
        format!("the value contains {c:?}, which SQS does not carry (it takes tab, newline, carriage return and printable Unicode)")
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn attributes(pairs: &[(&str, &str)]) -> Attributes {
        pairs.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect()
    }

    fn problem(pairs: &[(&str, &str)]) -> Option<String> {
        check_attributes(&attributes(pairs)).err().map(|e| e.to_string())
    }

    #[test]
    fn valid_attributes_pass() {
        assert_eq!(problem(&[]), None);
        assert_eq!(problem(&[("tenant", "acme"), ("trace.origin-id_2", "a b\tc é 😀")]), None);
        let eight: Vec<(String, String)> = (0..8).map(|i| (format!("k{i}"), "v".to_owned())).collect();
        let eight: Vec<(&str, &str)> = eight.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        assert_eq!(problem(&eight), None);
    }

    #[test]
    fn each_rule_names_the_attribute_and_the_fix() {
        let nine: Vec<(String, String)> = (0..9).map(|i| (format!("k{i}"), "v".to_owned())).collect();
        let nine: Vec<(&str, &str)> = nine.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        assert!(problem(&nine).unwrap().contains("at most 8 attributes"), "{:?}", problem(&nine));
        let cases = [
            (("tenant", ""), "`tenant`: the value is empty"),
            (("tenant", "a\u{0}b"), "contains '\\0'"),
            (("tenant", "\u{FFFF}"), "contains '\\u{ffff}'"),
            (("", "v"), "1 to 256 characters"),
            (("has space", "v"), "contains ' '"),
            (("AWS.trace", "v"), "reserved by SQS"),
            (("amazon.x", "v"), "reserved by SQS"),
            ((".x", "v"), "neither starts nor ends"),
            (("x.", "v"), "neither starts nor ends"),
            (("a..b", "v"), "neither starts nor ends"),
        ];
        for ((name, value), expected) in cases {
            let message = problem(&[(name, value)]).unwrap_or_default();
            assert!(message.contains(expected), "{name:?}={value:?}: {message}");
        }
        let long = "n".repeat(257);
        assert!(problem(&[(&long, "v")]).unwrap().contains("1 to 256 characters"));
    }
}
