//! The integration tests, in one binary: each module is what used to be a
//! test binary of its own, and linking sqlx, the AWS SDK and OpenTelemetry
//! once instead of ten times is most of the suite's build time.
//!
//! Everything registered with `#[messaging::queue]`, `#[messaging::message]`
//! and `#[messaging::handler]` in any module is in this binary's registry, so
//! queue and message names must be unique across the modules, and a test
//! starts only its own queues (`only_queues`, `TestApp::builder().only`).
//! `App::new` declares every queue of the binary on its transport.
//!
//! Kept in binaries of their own: `validation` (deliberately conflicting
//! registrations), `telemetry` and `otlp` (each installs the process-global
//! tracing subscriber and meter provider), `schedules` (every app runs the
//! schedules registered in its binary), `chaos` (run
//! apart, one test at a time). The model test and the idempotency-store
//! tests live in the library crate (`transport/sql/tests/`).
//!
//! The modules that run this binary as a child process (`sql_crash`,
//! `sql_processes`, `sqs_crash`, `sql_clock`) name their ignored entry points with
//! [`fixtures::entry_point`], which adds the module's path.

#[path = "../fixtures/mod.rs"]
mod fixtures;

mod claims_down;
mod cli;
mod console;
mod console_browser;
mod envelope;
mod outbox;
mod publish;
mod publish_tx;
mod readiness;
mod rolling;
mod sql_app_lock;
mod sql_batches;
mod sql_claims;
#[cfg(all(feature = "postgres", target_os = "linux"))]
mod sql_clock;
mod sql_crash;
mod sql_errors;
mod sql_held;
mod sql_migrations;
mod sql_poison;
mod sql_processes;
mod sql_schema;
mod sql_write_lock;
mod sqs;
mod sqs_crash;
mod worker;
