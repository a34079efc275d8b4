//! [`IdempotencyClaim`]: the idempotency claim of the message being handled, for
//! handlers that want their side effect and the claim's completion to commit
//! in one database transaction (exactly once, even across a crash).

use std::sync::atomic::Ordering;
use std::sync::Arc;

use super::{FromContext, Requirement, RequirementKind, Resources};
use crate::claims::ClaimState;
use crate::context::MessageContext;
use crate::error::HandlerError;

/// The idempotency claim of the message being handled. Only for handlers with
/// `idempotent = "scope"` (checked at startup).
///
/// By default the framework completes the claim after the handler returns.
/// Between the side effect and that completion a crash would leave the claim
/// open, and the message would run again once the lease expires. When the
/// side effect is a write to the same database as the claims, complete the
/// claim in that write's transaction instead:
///
/// ```no_run
/// # #[cfg(feature = "postgres")]
/// # mod example {
/// # use messaging::prelude::*;
/// # use messaging::sqlx::{self, PgPool};
/// # #[messaging::queue("orders")] pub struct Orders;
/// # #[messaging::message(name = "orders.placed", v = 1)]
/// # #[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
/// # pub struct OrderPlaced { order_id: String }
/// #[messaging::handler(queue = Orders, idempotent = "order-finalize", lease = "20s")]
/// async fn finalize(order: OrderPlaced, claim: IdempotencyClaim, db: State<PgPool>) -> Result<(), HandlerError> {
///     let mut tx = db.begin().await?;
///     sqlx::query("INSERT INTO invoices (order_id) VALUES ($1)").bind(&order.order_id).execute(&mut *tx).await?;
///     claim.complete_in(&mut tx).await?;   // fails, and rolls back, if the claim was lost
///     tx.commit().await?;
///     Ok(())
/// }
/// # }
/// # fn main() {}
/// ```
#[derive(Debug, Clone)]
pub struct IdempotencyClaim {
    state: Arc<ClaimState>,
}

#[cfg(any(feature = "postgres", feature = "sqlite"))]
#[derive(Debug, thiserror::Error)]
#[error("the idempotency claim on `{message_id}` (scope `{scope}`) was lost: its lease expired and another delivery took it")]
struct ClaimLost {
    message_id: String,
    scope: &'static str,
}

#[derive(Debug, thiserror::Error)]
#[error("`IdempotencyClaim` is only available in handlers with `idempotent = \"scope\"`")]
struct NotIdempotent;

impl IdempotencyClaim {
    /// The message id the claim is on.
    pub fn message_id(&self) -> &str {
        &self.state.message_id
    }

    /// The idempotency scope.
    pub fn scope(&self) -> &'static str {
        self.state.scope
    }

    /// Whether the claim was completed already (by [`IdempotencyClaim::complete_in`]).
    pub fn is_completed(&self) -> bool {
        self.state.completed.load(Ordering::Acquire)
    }

    #[cfg(any(feature = "postgres", feature = "sqlite"))]
    fn lost(&self) -> HandlerError {
        HandlerError::transient(ClaimLost { message_id: self.state.message_id.clone(), scope: self.state.scope })
    }

    /// Completes the claim inside `conn`: a transaction (`&mut tx`) on the
    /// PostgreSQL or SQLite database that holds the claims. Commit the
    /// transaction for the completion to count; on error, roll back.
    #[cfg(any(feature = "postgres", feature = "sqlite"))]
    pub async fn complete_in<C: ClaimsConnection + ?Sized>(&self, conn: &mut C) -> Result<(), HandlerError> {
        use crate::transport::sql::{statements, Driver};
        let sql = self.state.sql.clone().unwrap_or_default();
        let now = crate::transport::sql::local_ms().saturating_add(sql.offset_ms);
        let tables = crate::transport::sql::Tables::in_schema(sql.schema.as_deref());
        let text = tables.sql(&[statements::CLAIM_COMPLETE]);
        let args = [self.message_id().into(), self.scope().into(), self.state.processor.as_str().into(), now.into()];
        let done = C::Database::execute(conn.connection(), &text, &args).await.map_err(HandlerError::transient)?;
        self.finish(done)
    }

    #[cfg(any(feature = "postgres", feature = "sqlite"))]
    fn finish(&self, rows: u64) -> Result<(), HandlerError> {
        if rows == 1 {
            self.state.completed.store(true, Ordering::Release);
            Ok(())
        } else {
            Err(self.lost())
        }
    }

    pub(crate) fn new(state: Arc<ClaimState>) -> Self {
        IdempotencyClaim { state }
    }
}

impl FromContext for IdempotencyClaim {
    fn from_context(ctx: &MessageContext, _: &Resources) -> Result<Self, HandlerError> {
        ctx.claim().map(IdempotencyClaim::new).ok_or_else(|| HandlerError::permanent(NotIdempotent))
    }

    fn requirement() -> Option<Requirement> {
        Some(Requirement {
            type_id: std::any::TypeId::of::<IdempotencyClaim>(),
            type_name: "IdempotencyClaim",
            kind: RequirementKind::IdempotentHandler,
        })
    }
}

/// A connection or transaction on a database that can hold idempotency
/// claims, for [`IdempotencyClaim::complete_in`]: a `Transaction`, a
/// `PgConnection` or a `SqliteConnection`.
#[cfg(any(feature = "postgres", feature = "sqlite"))]
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not a connection to a database that holds idempotency claims",
    label = "pass `&mut tx`, a transaction on the PostgreSQL or SQLite database of the claims"
)]
pub trait ClaimsConnection: Send {
    /// The database.
    type Database: crate::transport::sql::Dialect;

    /// The connection to run the completion on.
    fn connection(&mut self) -> &mut <Self::Database as sqlx::Database>::Connection;
}

#[cfg(any(feature = "postgres", feature = "sqlite"))]
impl<DB: crate::transport::sql::Dialect> ClaimsConnection for sqlx::Transaction<'_, DB> {
    type Database = DB;

    fn connection(&mut self) -> &mut DB::Connection {
        self
    }
}

#[cfg(feature = "postgres")]
impl ClaimsConnection for sqlx::PgConnection {
    type Database = sqlx::Postgres;

    fn connection(&mut self) -> &mut sqlx::PgConnection {
        self
    }
}

#[cfg(feature = "sqlite")]
impl ClaimsConnection for sqlx::SqliteConnection {
    type Database = sqlx::Sqlite;

    fn connection(&mut self) -> &mut sqlx::SqliteConnection {
        self
    }
}
