//! What an operator asks of a container chatter relays, without running a relay: the pending
//! Outbox Documents by destination and age, the `undeliverable` ones with the contract
//! violations that made them so, and who serves each lease. The `chatter` command-line tool
//! prints these.

mod leases;
pub(crate) mod outbox;

pub use leases::{LeaseServed, LeaseView, survey_leases};
pub use outbox::{OutboxSurvey, PendingByDestination, UndeliverableDocument, survey_outbox};
