//! Options of the SQL transports, given as query parameters of the URL:
//! `sqlite://app.db?retention=1d&retry_abandoned=false&poll=250ms`.

use std::time::Duration;

use crate::error::Error;

/// Options of a SQL transport.
#[derive(Debug, Clone, PartialEq, Eq)]
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
    /// The PostgreSQL schema of the framework's tables (`schema=`; default:
    /// the connection's current schema).
    pub schema: Option<String>,
    /// The most connections the pool opens (`max_connections=`; default:
    /// the database's, [`super::Dialect::MAX_CONNECTIONS`]).
    pub max_connections: Option<u32>,
}

impl Default for SqlOptions {
    fn default() -> Self {
        SqlOptions {
            retention: Duration::ZERO,
            retry_abandoned: true,
            poll: Duration::from_secs(1),
            migrate: false,
            claims_retention: Duration::from_secs(7 * 24 * 3600),
            schema: None,
            max_connections: None,
        }
    }
}

/// The framework's parameters.
const OURS: [&str; 7] =
    ["retention", "claims_retention", "poll", "retry_abandoned", "migrate", "schema", "max_connections"];

/// Parameters of sqlx's SQLite and PostgreSQL drivers, passed to them (one,
/// `port`, is two edits from `poll`).
const DRIVER: [&str; 19] = [
    "mode",
    "cache",
    "immutable",
    "vfs",
    "sslmode",
    "sslrootcert",
    "sslcert",
    "sslkey",
    "sslnegotiation",
    "statement-cache-capacity",
    "host",
    "hostaddr",
    "port",
    "dbname",
    "user",
    "password",
    "application_name",
    "options",
    "extra_float_digits",
];

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
                "schema" => options.schema = Some(schema_name(value).map_err(bad)?.to_owned()),
                "max_connections" => options.max_connections = Some(pool_size(value).map_err(bad)?),
                _ => {
                    // The driver's own parameters pass through; a near miss
                    // of ours is a typo. (sqlx's PostgreSQL driver ignores a
                    // parameter it does not know: `retension=1d` would have
                    // kept nothing, silently.)
                    if !DRIVER.contains(&key) {
                        if let Some(ours) = crate::hint::nearest(key, OURS) {
                            return Err(bad(format!("unknown parameter `{key}`: did you mean `{ours}`?")));
                        }
                    }
                    kept.push(pair)
                }
            }
        }
        let rest = if kept.is_empty() { base.to_owned() } else { format!("{base}?{}", kept.join("&")) };
        Ok((options, rest))
    }
}

/// The largest pool `max_connections=` takes: PostgreSQL's own default
/// `max_connections` is 100 for the whole server.
const MAX_POOL: u32 = 1_000;

/// A pool size: a whole number from 3 to [`MAX_POOL`]. On PostgreSQL one
/// connection of the pool listens for new messages for as long as the
/// store lives, and a worker's lease, acknowledgements and heartbeat each
/// want one at once: with fewer they wait for each other.
fn pool_size(value: &str) -> Result<u32, String> {
    match value.parse::<u32>() {
        Ok(n) if (3..=MAX_POOL).contains(&n) => Ok(n),
        _ => Err(format!("`max_connections={value}`: write a whole number from 3 to {MAX_POOL}")),
    }
}

/// A schema name we can write into statements unquoted: lowercase ASCII
/// letters, digits and `_`, not starting with a digit, at most 63 bytes
/// (PostgreSQL's identifier limit).
fn schema_name(name: &str) -> Result<&str, String> {
    let fits = !name.is_empty()
        && name.len() <= 63
        && name.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
        && !name.as_bytes()[0].is_ascii_digit();
    if fits {
        Ok(name)
    } else {
        Err(format!(
            "`schema={name}`: a schema name is 1 to 63 lowercase letters, digits and `_`, not starting with a digit"
        ))
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
        let (o, rest) = SqlOptions::parse("postgres://u@h/db?max_connections=30&sslmode=disable").unwrap();
        assert_eq!((o.max_connections, rest.as_str()), (Some(30), "postgres://u@h/db?sslmode=disable"));
        for bad in ["0", "2", "-3", "ten", "", "1001"] {
            let err = SqlOptions::parse(&format!("postgres://u@h/db?max_connections={bad}")).unwrap_err().to_string();
            assert!(err.contains("write a whole number from 3 to 1000"), "{bad}: {err}");
        }
        let (o, rest) = SqlOptions::parse("postgres://u@h/db?schema=jobs_1&sslmode=disable").unwrap();
        assert_eq!((o.schema.as_deref(), rest.as_str()), (Some("jobs_1"), "postgres://u@h/db?sslmode=disable"));
        for bad in ["", "Jobs", "1jobs", "jobs;drop", "a.b", "\"x\""] {
            let err = SqlOptions::parse(&format!("postgres://u@h/db?schema={bad}")).unwrap_err().to_string();
            assert!(err.contains("a schema name is 1 to 63 lowercase letters"), "{bad}: {err}");
        }
    }

    #[test]
    fn a_near_miss_of_a_parameter_names_the_one_meant() {
        for (url, meant) in [
            ("postgres://u@h/db?retension=1d", "retention"),
            ("postgres://u@h/db?migrat=true", "migrate"),
            ("sqlite://a.db?pol=5s", "poll"),
            ("sqlite://a.db?retry_abandonned=false", "retry_abandoned"),
        ] {
            let err = SqlOptions::parse(url).unwrap_err().to_string();
            assert!(err.contains(&format!("did you mean `{meant}`?")), "{url}: {err}");
        }
        // The drivers' own parameters pass through, `port` too (two edits from `poll`).
        let (_, rest) = SqlOptions::parse("postgres://u@h/db?port=5433&sslmode=disable&application_name=x").unwrap();
        let err = SqlOptions::parse("postgres://u@h/db?max_connection=4").unwrap_err().to_string();
        assert!(err.contains("did you mean `max_connections`?"), "{err}");
        assert_eq!(rest, "postgres://u@h/db?port=5433&sslmode=disable&application_name=x");
    }
}
