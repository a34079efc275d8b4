//! A harness for testing your own app: start its registered handlers on
//! `memory://` inside a `#[tokio::test]`, publish, and await what happened to
//! a message.
//!
//! ```no_run
//! # use messaging::prelude::*;
//! # #[messaging::queue("emails")] pub struct Emails;
//! # #[messaging::message(name = "email.send", v = 1)]
//! # #[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
//! # pub struct SendEmail { to: String }
//! # #[messaging::handler(queue = Emails)]
//! # async fn send(_m: SendEmail) -> Result<(), HandlerError> { Ok(()) }
//! use messaging::testing::TestApp;
//!
//! #[tokio::test]
//! async fn sends_the_email() {
//!     let app = TestApp::start().await.unwrap();
//!     let id = app.publisher().send::<Emails, _>(&SendEmail { to: "a@example.com".into() }).await.unwrap();
//!     app.handled(&id).await.unwrap();
//!     app.stop().await;
//! }
//! ```

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::Notify;

use crate::app::{App, Running, Setup};
use crate::error::Error;
use crate::observe::{DispatchEvent, Observer, Outcome};
use crate::publish::Publisher;
use crate::queue::QueueSpec;
use crate::transport::memory::MemoryTransport;
use crate::transport::{MessageId, Transport};

/// A running app on a fresh `memory://` transport.
pub struct TestApp {
    running: Running,
    publisher: Publisher,
    transport: Arc<dyn Transport>,
    log: Arc<EventLog>,
    queues: Vec<QueueSpec>,
    timeout: Duration,
}

impl std::fmt::Debug for TestApp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TestApp").field("running", &self.running).finish_non_exhaustive()
    }
}

/// A deferred change to the app's [`Setup`].
type Configure = Box<dyn FnOnce(&mut Setup) + Send>;

/// Configures a [`TestApp`].
pub struct TestAppBuilder {
    only: Option<Vec<&'static str>>,
    configure: Vec<Configure>,
    timeout: Duration,
    transport: Option<Arc<dyn Transport>>,
}

impl std::fmt::Debug for TestAppBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TestAppBuilder")
            .field("only", &self.only)
            .field("timeout", &self.timeout)
            .finish_non_exhaustive()
    }
}

/// Why an expectation of the harness failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TestError {
    /// The expected outcome did not happen in time.
    #[error("message `{message_id}`: expected {expected} within {timeout:?}; what happened: {history:?}")]
    Timeout {
        /// The message.
        message_id: String,
        /// What was awaited.
        expected: String,
        /// The timeout.
        timeout: Duration,
        /// Every outcome recorded for the message.
        history: Vec<Outcome>,
    },
}

#[derive(Default)]
struct EventLog {
    events: Mutex<HashMap<MessageId, Vec<Outcome>>>,
    changed: Notify,
}

impl Observer for Arc<EventLog> {
    fn on_dispatch(&self, event: &DispatchEvent) {
        self.events
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .entry(event.message_id.clone())
            .or_default()
            .push(event.outcome.clone());
        self.changed.notify_waiters();
    }
}

impl TestApp {
    /// Starts every handler registered in this test binary.
    pub async fn start() -> Result<TestApp, Error> {
        Self::builder().start().await
    }

    /// A builder to provide states, add behaviours or pick queues.
    pub fn builder() -> TestAppBuilder {
        TestAppBuilder { only: None, configure: Vec::new(), timeout: Duration::from_secs(5), transport: None }
    }

    /// A publisher on the app's transport.
    pub fn publisher(&self) -> &Publisher {
        &self.publisher
    }

    /// The app's transport (for dead-letter inspection and the like).
    pub fn transport(&self) -> &Arc<dyn Transport> {
        &self.transport
    }

    /// Every outcome recorded so far for a message.
    pub fn history(&self, message_id: &str) -> Vec<Outcome> {
        self.log.events.lock().unwrap_or_else(|p| p.into_inner()).get(message_id).cloned().unwrap_or_default()
    }

    /// Waits until the message was handled successfully.
    pub async fn handled(&self, message_id: &str) -> Result<(), TestError> {
        self.wait_for(message_id, "handled", |h| h.contains(&Outcome::Handled), false).await
    }

    /// Waits until the message failed and was scheduled for retry `times` times.
    pub async fn retried(&self, message_id: &str, times: usize) -> Result<(), TestError> {
        let expected = format!("retried {times} time(s)");
        self.wait_for(
            message_id,
            &expected,
            |h| {
                h.iter().filter(|o| matches!(o, Outcome::Retried { .. } | Outcome::Undecodable { .. })).count() >= times
            },
            false,
        )
        .await
    }

    /// Waits until the message is in a dead-letter queue (after a permanent
    /// failure or after the receive limit).
    pub async fn dead_lettered(&self, message_id: &str) -> Result<(), TestError> {
        self.wait_for(
            message_id,
            "dead-lettered",
            |h| h.iter().any(|o| matches!(o, Outcome::DeadLettered { .. })),
            true,
        )
        .await
    }

    async fn wait_for(
        &self,
        message_id: &str,
        expected: &str,
        done: impl Fn(&[Outcome]) -> bool,
        look_in_dlq: bool,
    ) -> Result<(), TestError> {
        let deadline = tokio::time::Instant::now() + self.timeout;
        loop {
            let changed = self.log.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            if done(&self.history(message_id)) || (look_in_dlq && self.in_dead_letters(message_id).await) {
                return Ok(());
            }
            let poll = tokio::time::Instant::now() + Duration::from_millis(if look_in_dlq { 10 } else { 250 });
            tokio::select! {
                _ = &mut changed => {}
                _ = tokio::time::sleep_until(poll.min(deadline)) => {}
            }
            if tokio::time::Instant::now() >= deadline {
                return Err(TestError::Timeout {
                    message_id: message_id.to_owned(),
                    expected: expected.to_owned(),
                    timeout: self.timeout,
                    history: self.history(message_id),
                });
            }
        }
    }

    async fn in_dead_letters(&self, message_id: &str) -> bool {
        let Some(dl) = self.transport.dead_letters() else { return false };
        for spec in self.queues.iter().filter(|q| q.dlq.is_some()) {
            if let Ok(letters) = dl.peek(spec.name, usize::MAX).await {
                if letters.iter().any(|l| l.message_id == message_id) {
                    return true;
                }
            }
        }
        false
    }

    /// The running app (to pause a schedule, say).
    pub fn running(&self) -> &Running {
        &self.running
    }

    /// Stops the app gracefully.
    pub async fn stop(self) {
        self.running.stop().await;
    }

    /// Serves `/health`, `/ready` and `/metrics` on `addr` (see
    /// [`Running::serve_http`]); returns the bound address.
    pub async fn serve_http(&mut self, addr: std::net::SocketAddr) -> Result<std::net::SocketAddr, Error> {
        self.running.serve_http(addr).await
    }
}

impl TestAppBuilder {
    /// Runs only the handlers of queue `Q` (call again to add more queues).
    pub fn only<Q: crate::queue::Queue>(mut self) -> Self {
        self.only.get_or_insert_with(Vec::new).push(Q::SPEC.name);
        self
    }

    /// Configures the app's [`Setup`] (provide states, behaviours...).
    pub fn setup(mut self, configure: impl FnOnce(&mut Setup) + Send + 'static) -> Self {
        self.configure.push(Box::new(configure));
        self
    }

    /// How long the `handled`/`retried`/`dead_lettered` waits last (5 s by default).
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// Runs the app's schedules on a clock that reads `at` now and advances
    /// with tokio's: under `#[tokio::test(start_paused = true)]`, a test
    /// sleeps through hours of ticks in an instant. (Without it the
    /// schedules tick by the machine's clock.)
    ///
    /// ```no_run
    /// # use messaging::testing::TestApp;
    /// # async fn f() {
    /// let midnight = std::time::UNIX_EPOCH + std::time::Duration::from_secs(1_767_225_600);
    /// let app = TestApp::builder().clock_at(midnight).start().await.unwrap();
    /// tokio::time::sleep(std::time::Duration::from_secs(3 * 3600)).await; // three hours of ticks
    /// # }
    /// ```
    pub fn clock_at(self, at: std::time::SystemTime) -> Self {
        self.setup(move |setup| setup.clock = crate::scheduler::Clock::tokio_at(at))
    }

    /// Runs on `transport` instead of a fresh in-memory one (a SQLite file,
    /// PostgreSQL, SQS...), to test against the semantics used in production.
    pub fn transport(mut self, transport: Arc<dyn Transport>) -> Self {
        self.transport = Some(transport);
        self
    }

    /// Validates, declares the queues on a new `memory://` transport and starts.
    pub async fn start(self) -> Result<TestApp, Error> {
        let transport: Arc<dyn Transport> = match self.transport {
            Some(transport) => transport,
            None => Arc::new(MemoryTransport::new()),
        };
        let mut app = App::new(transport.clone()).await?;
        if let Some(only) = &self.only {
            app.only_queues(only);
        }
        let log = Arc::new(EventLog::default());
        app.setup().observer(log.clone()).grace_period(Duration::from_secs(2));
        app.set_receive_wait(Duration::from_secs(1));
        for configure in self.configure {
            configure(app.setup());
        }
        let queues = app.registry().queues().to_vec();
        let publisher = app.setup().publisher();
        let running = app.start()?;
        Ok(TestApp { running, publisher, transport, log, queues, timeout: self.timeout })
    }
}
