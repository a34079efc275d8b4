//! Choosing a backend from a URL (`--transport` / `MESSAGING_URL`).

use std::sync::Arc;

use super::{memory::MemoryTransport, Transport};
use crate::error::Error;

/// The transport used when none is configured: the embedded SQLite database
/// `messaging.db` in the working directory, created and migrated on first use.
#[cfg(feature = "sqlite")]
pub const DEFAULT_URL: &str = "sqlite://messaging.db?migrate=true";

/// The transport used when none is configured (`memory://` in builds without
/// the `sqlite` feature).
#[cfg(not(feature = "sqlite"))]
pub const DEFAULT_URL: &str = "memory://";

/// Opens the backend a URL names, like [`connect`], for a command that only
/// reads: a SQLite database file that does not exist is an error rather
/// than created, and `migrate=true` is ignored (the tables are not changed).
pub(crate) async fn connect_existing(url: &str) -> Result<Arc<dyn Transport>, Error> {
    #[cfg(feature = "sqlite")]
    if url.starts_with("sqlite:") {
        let (_, rest) = super::sql::SqlOptions::parse(url)?;
        if let Some(file) = super::sql::missing_sqlite_file(&rest) {
            // `run` and `migrate` create the file, but not its directory.
            let fix = match super::sql::sqlite_directory_problem(&file) {
                Some(problem) => format!("its directory {problem} either"),
                None => "`run` or `migrate` creates it".to_owned(),
            };
            return Err(Error::Command(format!(
                "there is no database file `{}` ({url}): nothing has run on it yet; {fix}, or name another with \
                 --transport",
                file.display()
            )));
        }
    }
    connect(&without_migrate(url)).await
}

/// For a command that creates a SQLite database file but not its tables
/// (`run` without `--migrate`, `publish`, on a URL without `migrate=true`):
/// an error naming the fix when the file does not exist, rather than an
/// empty file left behind and the same schema problem once per queue.
pub(crate) fn refuse_new_file_without_tables(url: &str) -> Result<(), Error> {
    #[cfg(feature = "sqlite")]
    if url.starts_with("sqlite:") {
        let (options, rest) = super::sql::SqlOptions::parse(url)?;
        if options.migrate {
            return Ok(());
        }
        if let Some(file) = super::sql::missing_sqlite_file(&rest) {
            // `migrate=true` would not help where the file cannot be made.
            let why = match super::sql::sqlite_directory_problem(&file) {
                Some(problem) => format!("its directory {problem}: create it, or name another file"),
                None if read_only(url) => "a read-only URL (`mode=ro`) does not create it".to_owned(),
                None => format!(
                    "this URL does not create the tables: add `migrate=true` to it (`{}`), or run `migrate` first",
                    with_migrate(url)
                ),
            };
            return Err(Error::Command(format!("there is no database file `{}` ({url}), and {why}", file.display())));
        }
    }
    #[cfg(not(feature = "sqlite"))]
    let _ = url;
    Ok(())
}

/// Whether SQLite URL `url` opens its file read-only (`mode=ro`).
#[cfg(feature = "sqlite")]
fn read_only(url: &str) -> bool {
    url.split_once('?').is_some_and(|(_, query)| query.split('&').any(|p| p == "mode=ro"))
}

/// `url` with `migrate=true` among its parameters.
pub(crate) fn with_migrate(url: &str) -> String {
    let separator = if url.contains('?') { '&' } else { '?' };
    format!("{url}{separator}migrate=true")
}

/// `url` without a `migrate=` parameter.
fn without_migrate(url: &str) -> String {
    let Some((base, query)) = url.split_once('?') else { return url.to_owned() };
    let kept: Vec<&str> = query.split('&').filter(|p| p.split('=').next() != Some("migrate")).collect();
    if kept.is_empty() {
        base.to_owned()
    } else {
        format!("{base}?{}", kept.join("&"))
    }
}

/// Opens the backend a URL names: `sqlite://FILE`, `sqlite::memory:`,
/// `postgres://USER@HOST/DB`, `sqs://REGION` (feature `sqs`), `memory://`. Database URLs take
/// the framework's options as query parameters (`migrate=true`, `retention=1d`,
/// `retry_abandoned=false`, `poll=250ms`, `claims_retention=7d`; the README's
/// table), and pass the rest to the driver.
pub async fn connect(url: &str) -> Result<Arc<dyn Transport>, Error> {
    // `sqlite::memory:`: a database in memory, with the database queues' semantics.
    let scheme_only = url.strip_prefix("sqlite::memory:").map(|_| ("sqlite", ""));
    let (scheme, _rest) = scheme_only.or_else(|| url.split_once("://")).ok_or_else(|| Error::Config {
        url: url.to_owned(),
        reason: "expected SCHEME://..., e.g. memory://, sqlite://app.db or postgres://user@host/db".into(),
    })?;
    #[allow(unused_variables)] // used only when a database feature is disabled
    let unavailable = |feature: &str| Error::Config {
        url: url.to_owned(),
        reason: format!("this build has no `{scheme}` transport; enable the `{feature}` feature of `messaging`"),
    };
    match scheme {
        "memory" => Ok(Arc::new(MemoryTransport::from_url(url)?)),
        "sqlite" => {
            #[cfg(feature = "sqlite")]
            {
                Ok(Arc::new(super::sql::connect::<sqlx::Sqlite>(url).await?))
            }
            #[cfg(not(feature = "sqlite"))]
            {
                Err(unavailable("sqlite"))
            }
        }
        "postgres" | "postgresql" => {
            #[cfg(feature = "postgres")]
            {
                Ok(Arc::new(super::sql::connect::<sqlx::Postgres>(url).await?))
            }
            #[cfg(not(feature = "postgres"))]
            {
                Err(unavailable("postgres"))
            }
        }
        "sqs" => {
            #[cfg(feature = "sqs")]
            {
                Ok(Arc::new(super::sqs::connect(url).await?))
            }
            #[cfg(not(feature = "sqs"))]
            {
                Err(unavailable("sqs"))
            }
        }
        other => Err(Error::Config {
            url: url.to_owned(),
            reason: format!("unknown scheme `{other}`; known: sqlite://, postgres://, sqs://, memory://"),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::without_migrate;

    #[test]
    fn a_read_only_open_drops_only_the_migrate_parameter() {
        assert_eq!(without_migrate("sqlite://a.db?migrate=true"), "sqlite://a.db");
        assert_eq!(
            without_migrate("sqlite://a.db?poll=1s&migrate=true&retention=1d"),
            "sqlite://a.db?poll=1s&retention=1d"
        );
        assert_eq!(without_migrate("postgres://u@h/db"), "postgres://u@h/db");
    }
}
