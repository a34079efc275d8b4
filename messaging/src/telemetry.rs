//! Logging setup for `#[messaging::main]` binaries (`RUST_LOG` filtering).

/// Installs a `tracing` subscriber that prints to stderr, filtered by
/// `RUST_LOG` (default `info`). Does nothing if one is already installed.
pub fn init_logging() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let _ = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).try_init();
}
