//! Options of the SQL transports, given as query parameters of the URL:
//! `sqlite://app.db?retention=1d&retry_abandoned=false&poll=250ms`.

use std::time::Duration;

use crate::error::Error;

/// Options of a SQL transport.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct SqlOptions {
    /// How long processed messages are kept (`retention=`; default 0: deleted at once).
    pub retention: Duration,
    /// Whether a message whose lease expired is retried (`retry_abandoned=`; default true)
    /// rather than moved to Error.
    pub retry_abandoned: bool,
    /// How often an idle receiver looks for messages that no signal announced
    /// (`poll=`; PostgreSQL NOTIFY and in-process wake-ups make it a fallback).
    pub poll: Duration,
    /// Run the migrations when connecting (`migrate=true`).
    pub migrate: bool,
    /// How long completed idempotency claims are kept (`claims_retention=`;
    /// default 7 days). Keep it longer than any redelivery can take.
    pub claims_retention: Duration,
}

impl Default for SqlOptions {
    fn default() -> Self {
        SqlOptions {
            retention: Duration::ZERO,
            retry_abandoned: true,
            poll: Duration::from_secs(1),
            migrate: false,
            claims_retention: Duration::from_secs(7 * 24 * 3600),
        }
    }
}

impl SqlOptions {
    /// Takes the framework's parameters out of `url`; returns the options and
    /// the URL left for the database driver.
    pub(crate) fn parse(url: &str) -> Result<(SqlOptions, String), Error> {
        let mut options = SqlOptions::default();
        let Some((base, query)) = url.split_once('?') else { return Ok((options, url.to_owned())) };
        let mut kept = Vec::new();
        let bad = |reason: String| Error::Config { url: url.to_owned(), reason };
        for pair in query.split('&').filter(|p| !p.is_empty()) {
            let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
            match key {
                "retention" => options.retention = crate::duration::parse_duration(value).map_err(bad)?,
                "claims_retention" => options.claims_retention = crate::duration::parse_duration(value).map_err(bad)?,
                "poll" => {
                    options.poll = crate::duration::parse_duration(value).map_err(bad)?;
                    if options.poll.is_zero() {
                        return Err(bad("`poll` must be longer than zero".into()));
                    }
                }
                "retry_abandoned" => {
                    options.retry_abandoned = parse_bool(value)
                        .ok_or_else(|| bad(format!("`retry_abandoned={value}`: write true or false")))?
                }
                "migrate" => {
                    options.migrate =
                        parse_bool(value).ok_or_else(|| bad(format!("`migrate={value}`: write true or false")))?
                }
                _ => kept.push(pair),
            }
        }
        let rest = if kept.is_empty() { base.to_owned() } else { format!("{base}?{}", kept.join("&")) };
        Ok((options, rest))
    }
}

fn parse_bool(text: &str) -> Option<bool> {
    match text {
        "true" | "1" | "yes" | "" => Some(true),
        "false" | "0" | "no" => Some(false),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn takes_out_the_framework_parameters() {
        let (o, rest) =
            SqlOptions::parse("sqlite://a.db?mode=rwc&retention=1h&retry_abandoned=false&poll=250ms").unwrap();
        assert_eq!(rest, "sqlite://a.db?mode=rwc");
        assert_eq!(o.retention, Duration::from_secs(3600));
        assert!(!o.retry_abandoned);
        assert_eq!(o.poll, Duration::from_millis(250));
        let (o, rest) = SqlOptions::parse("postgres://u@h/db").unwrap();
        assert_eq!((o, rest.as_str()), (SqlOptions::default(), "postgres://u@h/db"));
        assert!(SqlOptions::parse("sqlite://a.db?retention=forever").is_err());
        // The README's examples, in the one duration syntax (a unit always).
        let (o, _) = SqlOptions::parse("sqlite://a.db?retention=1d&claims_retention=7d").unwrap();
        assert_eq!((o.retention, o.claims_retention), (Duration::from_secs(86_400), Duration::from_secs(7 * 86_400)));
        assert!(SqlOptions::parse("sqlite://a.db?retention=60").is_err());
        assert!(SqlOptions::parse("sqlite://a.db?poll=0s").is_err());
    }
}
