//! The type states of the send builders and the compile-time FIFO rules.

use crate::message::{No, Yes};
use crate::queue::{Fifo, Standard};

/// Type state: no explicit group id was given.
#[derive(Debug, Clone, Copy)]
pub struct Ungrouped;
/// Type state: `.group(..)` was called.
#[derive(Debug, Clone, Copy)]
pub struct Grouped;

/// Holds when a send to queue `Q` of message `M` has a message group id, or
/// does not need one. `Self` is `(queue kind, builder state, queue has
/// default group, message has group field)`.
#[diagnostic::on_unimplemented(
    message = "cannot publish `{M}` to FIFO queue `{Q}` without a message group id",
    label = "this send has no message group id",
    note = "a FIFO queue needs a group id; give it in one of three ways:\n  1. call `.group(\"...\")` on the send before `.await`,\n  2. name a field of the message: `#[messaging::message(.., group = field)]` on `{M}`,\n  3. give the queue a default: `#[messaging::queue(.., default_group = \"...\")]` on `{Q}`"
)]
pub trait GroupResolved<Q, M> {}

// `do_not_recommend`: the error shows the message above, not these tuples.
#[diagnostic::do_not_recommend]
impl<Q, M, G, A, B> GroupResolved<Q, M> for (Standard, G, A, B) {}
#[diagnostic::do_not_recommend]
impl<Q, M, A, B> GroupResolved<Q, M> for (Fifo, Grouped, A, B) {}
#[diagnostic::do_not_recommend]
impl<Q, M, B> GroupResolved<Q, M> for (Fifo, Ungrouped, Yes, B) {}
#[diagnostic::do_not_recommend]
impl<Q, M> GroupResolved<Q, M> for (Fifo, Ungrouped, No, Yes) {}

/// Holds for queue kinds that accept a per-message delay (standard queues).
#[diagnostic::on_unimplemented(
    message = "FIFO queue `{Q}` does not accept a per-message delay",
    label = "`.delay(..)` is only available on standard queues",
    note = "remove `.delay(..)`, or publish to a standard queue: a FIFO queue delivers each group in order, so one message cannot be held back on its own"
)]
pub trait DelaySupported<Q> {}

impl<Q> DelaySupported<Q> for Standard {}

/// Holds when a schedule publishing `M` to queue `Q` has a message group
/// id, or needs none: the rules of [`GroupResolved`], for
/// `#[messaging::schedule]`, whose fix is its `group = ".."` option.
#[diagnostic::on_unimplemented(
    message = "a schedule cannot publish `{M}` to FIFO queue `{Q}` without a message group id",
    label = "this schedule's messages have no message group id",
    note = "a FIFO queue needs a group id; give it in one of three ways:\n  1. add `group = \"...\"` to `#[messaging::schedule(..)]`,\n  2. name a field of the message: `#[messaging::message(.., group = field)]` on `{M}`,\n  3. give the queue a default: `#[messaging::queue(.., default_group = \"...\")]` on `{Q}`"
)]
pub trait ScheduleGroupResolved<Q, M> {}

#[diagnostic::do_not_recommend]
impl<Q, M, G, A, B> ScheduleGroupResolved<Q, M> for (Standard, G, A, B) {}
#[diagnostic::do_not_recommend]
impl<Q, M, A, B> ScheduleGroupResolved<Q, M> for (Fifo, Grouped, A, B) {}
#[diagnostic::do_not_recommend]
impl<Q, M, B> ScheduleGroupResolved<Q, M> for (Fifo, Ungrouped, Yes, B) {}
#[diagnostic::do_not_recommend]
impl<Q, M> ScheduleGroupResolved<Q, M> for (Fifo, Ungrouped, No, Yes) {}
