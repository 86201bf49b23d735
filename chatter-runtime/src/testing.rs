//! Internals for chatter's own integration tests (feature `test-support`).
//!
//! The tests in `tests/` drive pieces of the relay and the document tier directly: a drain with
//! a manual clock, the Drain Suspension gate, the Monitored Container Contract on hand-made
//! settings, the store calls that plant documents. Nothing here is part of the public API and
//! nothing here is stable; an application never enables this feature.

pub use crate::cosmos::store::{
    BatchOperation, BatchOperationOutcome, BatchOutcome, ContainerSettings, ReadOutcome,
    WriteOutcome, create_item, execute_batch, patch_item, read_container_properties, read_item,
    upsert_item,
};
pub use crate::document::{OutboxDocument, inbox_id, outbox_id, outbox_contract::verify};
pub use crate::registry::{HandlerRegistration, RegisteredCommand, Registry};
pub use crate::relay::contract::{check, verify_all};
pub use crate::relay::delivery::DeliverySettings;
pub use crate::relay::drain::{Drain, DrainError, DrainReport};
pub use crate::relay::identity::{RelaySource, SourceIdentity, distinct_sources};
pub use crate::relay::suspension::{
    ConfirmationReceipt, DrainGate, ManualClock, MonotonicClock, SystemClock,
};
