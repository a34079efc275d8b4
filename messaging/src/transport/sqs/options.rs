//! Options of the SQS transport, from its URL:
//! `sqs://eu-west-1?endpoint=http://127.0.0.1:4566&create_queues=true`.

use crate::error::Error;

/// Options of the SQS transport.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SqsOptions {
    /// The region (`sqs://REGION`); the environment's when empty.
    pub region: Option<String>,
    /// An endpoint other than AWS's (`endpoint=`; `AWS_ENDPOINT_URL_SQS` works too).
    pub endpoint: Option<String>,
    /// Create missing queues (`create_queues=true`): for development and tests
    /// only; in production, infrastructure owns the queues.
    pub create_queues: bool,
}

impl SqsOptions {
    /// Parses an `sqs://` URL.
    pub fn parse(url: &str) -> Result<SqsOptions, Error> {
        let bad = |reason: String| Error::Config { url: url.to_owned(), reason };
        let rest = url.strip_prefix("sqs://").ok_or_else(|| bad("expected sqs://REGION".into()))?;
        let (region, query) = rest.split_once('?').unwrap_or((rest, ""));
        let mut options = SqsOptions {
            region: Some(region.trim_end_matches('/').to_owned()).filter(|r| !r.is_empty()),
            ..SqsOptions::default()
        };
        for pair in query.split('&').filter(|p| !p.is_empty()) {
            let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
            match key {
                "endpoint" => options.endpoint = Some(value.to_owned()),
                "create_queues" => {
                    options.create_queues = match value {
                        "true" | "1" | "" => true,
                        "false" | "0" => false,
                        other => return Err(bad(format!("`create_queues={other}`: write true or false"))),
                    }
                }
                other => return Err(bad(format!("unknown option `{other}`; known: endpoint, create_queues"))),
            }
        }
        Ok(options)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_region_endpoint_and_creation() {
        let o = SqsOptions::parse("sqs://eu-west-1?endpoint=http://127.0.0.1:5000&create_queues=true").unwrap();
        assert_eq!(o.region.as_deref(), Some("eu-west-1"));
        assert_eq!(o.endpoint.as_deref(), Some("http://127.0.0.1:5000"));
        assert!(o.create_queues);
        assert_eq!(SqsOptions::parse("sqs://").unwrap(), SqsOptions::default());
        assert!(SqsOptions::parse("sqs://x?creat_queues=1").is_err());
    }
}
