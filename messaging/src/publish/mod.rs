//! Publishing: [`Publisher::send`] and [`Publisher::send_batch`], typed builders
//! whose type state enforces the FIFO rules at compile time.
//!
//! * a FIFO queue needs a message group id, from `.group(..)`, from the
//!   message's `group = field`, or from the queue's `default_group`: with none
//!   of them, `.await` does not compile;
//! * `.delay(..)` exists only on standard queues.
//!
//! Publishing never panics; every failure is a [`PublishError`] value.

mod batch;
mod checks;
mod encoded;
mod single;
mod state;
mod withheld;

use std::sync::Arc;

pub use batch::BatchBuilder;
pub use checks::{MAX_ATTRIBUTES, MAX_ID_LEN};
pub(crate) use encoded::EncodedSend;
pub use single::SendBuilder;
pub use state::{DelaySupported, GroupResolved, Grouped, ScheduleGroupResolved, Ungrouped};
pub(crate) use withheld::Withheld;

use crate::envelope::Encoded;
use crate::error::PublishError;
use crate::message::Message;
use crate::queue::{Queue, QueueSpec};
use crate::telemetry::Telemetry;
use crate::transport::{Attributes, Outbox, Outgoing, Transport};
use checks::{check_attributes, check_id};

/// Sends messages to queues. Cheap to clone; handlers get one with the
/// `Publisher` extractor.
#[derive(Clone)]
pub struct Publisher {
    transport: Arc<dyn Transport>,
    telemetry: Arc<Telemetry>,
    /// The outbox of publishes inside a transaction that the transport does
    /// not take; shared by every publisher of one app, so that one set after
    /// a publisher was made still serves it.
    outbox: OutboxSlot,
    /// Where sends are counted instead of made: the publishers of a setup
    /// that a command other than `run` runs ([`Withheld`]).
    withheld: Option<Arc<Withheld>>,
}

/// Where the publishers of an app find its outbox.
pub(crate) type OutboxSlot = Arc<std::sync::RwLock<Option<Outbox>>>;

impl std::fmt::Debug for Publisher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Publisher").field("transport", &self.transport.system()).finish()
    }
}

impl Publisher {
    /// Commits the application's transaction `tx` in which messages were
    /// published ([`SendBuilder::in_transaction`]), then wakes this
    /// process's waiting receivers at once. On SQLite a plain
    /// `tx.commit()` gives the framework no signal, and receivers find the
    /// messages at their next poll (`poll=`); on PostgreSQL the commit
    /// itself wakes them (`NOTIFY`), and this is the same as `tx.commit()`.
    #[cfg(any(feature = "postgres", feature = "sqlite"))]
    pub async fn commit<DB: crate::transport::sql::Dialect>(
        &self,
        tx: sqlx::Transaction<'_, DB>,
    ) -> Result<(), sqlx::Error> {
        tx.commit().await?;
        self.transport.wake_receivers();
        if let Some(outbox) = self.outbox() {
            outbox.wake();
        }
        Ok(())
    }

    /// A publisher on a transport. Queues must have been declared on it
    /// (the app does that at startup).
    pub fn new(transport: Arc<dyn Transport>) -> Self {
        Publisher {
            transport,
            telemetry: Arc::new(Telemetry::default()),
            outbox: OutboxSlot::default(),
            withheld: None,
        }
    }

    /// This publisher with `outbox`: publishes inside a transaction on the
    /// outbox's database, to queues whose transport does not take that
    /// transaction, are written there for a relay to send. Relays run in
    /// the processes whose app has the outbox (`run`, [`App::start`](crate::App::start));
    /// in an app, [`Setup::outbox`](crate::Setup::outbox) gives it to every
    /// publisher.
    pub fn with_outbox(self, outbox: Outbox) -> Self {
        Publisher { outbox: Arc::new(std::sync::RwLock::new(Some(outbox))), ..self }
    }

    /// A publisher of an app: its metrics, its outbox.
    pub(crate) fn of_app(
        transport: Arc<dyn Transport>,
        telemetry: Arc<Telemetry>,
        outbox: OutboxSlot,
        withheld: Option<Arc<Withheld>>,
    ) -> Self {
        Publisher { transport, telemetry, outbox, withheld }
    }

    /// The outbox, if one is configured.
    pub fn outbox(&self) -> Option<Outbox> {
        self.outbox.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// The transport this publisher sends through.
    pub fn transport(&self) -> &Arc<dyn Transport> {
        &self.transport
    }

    /// Starts sending one message to queue `Q`; `.await` the builder to send.
    ///
    /// ```no_run
    /// # use messaging::prelude::*;
    /// # #[messaging::queue("orders.fifo", fifo)] pub struct Orders;
    /// # #[messaging::message(name = "orders.placed", v = 1)]
    /// # #[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
    /// # pub struct OrderPlaced { order_id: String }
    /// # async fn example(publisher: &Publisher, placed: OrderPlaced) -> Result<(), PublishError> {
    /// let id = publisher.send::<Orders, _>(&placed).group("customer-42").await?;
    /// # let _ = id;
    /// # Ok(())
    /// # }
    /// ```
    pub fn send<'a, Q: Queue, M: Message>(&'a self, message: &'a M) -> SendBuilder<'a, Q, M, Ungrouped> {
        SendBuilder::new(self, message)
    }

    /// Starts sending several messages to queue `Q`; `.await` gives one result
    /// per message, in input order.
    pub fn send_batch<'a, Q: Queue, M: Message>(&'a self, messages: &'a [M]) -> BatchBuilder<'a, Q, M, Ungrouped> {
        BatchBuilder::new(self, messages)
    }
}

/// Options shared by single and batch sends.
#[derive(Debug, Clone, Default)]
struct SendOptions {
    group: Option<String>,
    dedup_id: Option<String>,
    identity: Option<String>,
    priority: i32,
    delay: Option<std::time::Duration>,
    attributes: Attributes,
}

impl SendOptions {
    /// Encodes `message` for queue `spec`, applying the group/dedup rules.
    fn outgoing<M: Message>(
        &self,
        spec: &QueueSpec,
        message: &M,
        max_delay: std::time::Duration,
    ) -> Result<Outgoing, PublishError> {
        let encoded = Encoded {
            body: crate::envelope::encode(message)?,
            group: message.group_id(),
            identity: message.message_id(),
            ignored: Vec::new(),
        };
        self.outgoing_encoded(spec, encoded, max_delay)
    }

    /// The group/dedup rules and checks for a message already encoded.
    fn outgoing_encoded(
        &self,
        spec: &QueueSpec,
        message: Encoded,
        max_delay: std::time::Duration,
    ) -> Result<Outgoing, PublishError> {
        // The typed API does not compile a delay on a FIFO queue; a send
        // built at run time (the command line's) learns it here.
        if spec.fifo && self.delay.is_some() {
            return Err(PublishError::DelayOnFifo { queue: spec.name });
        }
        let body = message.body.into();
        let group_id = if spec.fifo {
            let group = self.group.clone().or(message.group).or_else(|| spec.default_group.map(str::to_owned));
            match group {
                Some(g) if !g.is_empty() => Some(g),
                _ => return Err(PublishError::EmptyGroup { queue: spec.name }),
            }
        } else {
            self.group.clone()
        };
        let identity = self.identity.clone().or(message.identity);
        let dedup_id = self.dedup_id.clone().or_else(|| identity.clone());
        check_id("identity", identity.as_deref())?;
        check_id("deduplication id", dedup_id.as_deref())?;
        check_id("group id", group_id.as_deref())?;
        check_attributes(&self.attributes)?;
        if let Some(delay) = self.delay {
            if delay > max_delay {
                return Err(PublishError::DelayTooLong { requested: delay, max: max_delay });
            }
        }
        Ok(Outgoing {
            body,
            group_id,
            dedup_id,
            delay: self.delay,
            attributes: self.attributes.clone(),
            identity,
            priority: self.priority,
        })
    }
}
