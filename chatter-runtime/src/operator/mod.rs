//! What an operator asks of a container chatter relays, without running a relay: the pending
//! Outbox Documents by destination and age, the `undeliverable` ones with the contract
//! violations that made them so, and who serves each lease; and the repairs an operator makes
//! (requeue, give up), planned before they are applied. The `chatter` command-line tool prints
//! and runs these.
//!
#![doc = include_str!("../../docs/cli.md")]

mod leases;
pub(crate) mod outbox;
mod repair;

pub use crate::relay::identity::relay_instance;
pub use leases::{LeaseServed, LeaseView, estimate_backlog, survey_leases};
pub use outbox::{
    IdMismatchedDocument, MessageSource, OutboxSurvey, PendingByDestination, UndeliverableDocument,
    survey_outbox,
};
pub use repair::{
    AppliedChange, OPERATOR_REASON_FIELD, PlannedChange, RefusedChange, RepairPlan, Selection,
    apply, plan_give_up, plan_requeue,
};
