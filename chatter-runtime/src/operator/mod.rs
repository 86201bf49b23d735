//! What an operator asks of a container chatter relays, without running a relay: the pending
//! Outbox Documents by destination and age, and the `undeliverable` ones with the contract
//! violations that made them so. The `chatter` command-line tool prints these.

mod outbox;

pub use outbox::{OutboxSurvey, PendingByDestination, UndeliverableDocument, survey_outbox};
