//! Every error chatter returns, in one place.
//!
//! An error's `Display` says what failed and its [`source`](std::error::Error::source) says
//! why; print the whole chain with [`ErrorChain`]. Texts the .NET module fixes (so both sides
//! report the same problem the same way) are kept word for word.
//!
//! | error | returned by |
//! | --- | --- |
//! | [`StartError`] | [`start()`](crate::start), [`RuntimeBuilder::start`](crate::RuntimeBuilder::start) |
//! | [`RegistryError`] | registrations that conflict ([`StartError::Registry`]) |
//! | [`RelayError`] | a relay that cannot start ([`StartError::Relay`]) |
//! | [`DispatchError`], [`PipelineError`] | [`Runtime::dispatch`](crate::Runtime::dispatch), and what a failed delivery is retried or dead-lettered with |
//! | [`StageError`] | the [`HandlerContext`](crate::HandlerContext)'s staging calls |
//! | [`BrokerError`] | a [`Broker`](crate::broker::Broker) |
//! | [`CosmosStoreError`] | a Cosmos DB call or connection |
//! | [`ReadError`] | the [`HandlerContext`](crate::HandlerContext)'s reads |
//! | [`RelayNotIdle`] | [`Runtime::relay_idle`](crate::Runtime::relay_idle) |
//! | [`StandaloneRelayError`] | [`StandaloneRelayBuilder::build`](crate::relay::StandaloneRelayBuilder::build) |
//! | [`DrainError`] | why a relay's page failed: the source of a change-feed handler failure, and what `error.type` names |
//! | [`InboxError`], [`InboxSetupError`], [`InboxOptionsError`] | the [`StandaloneInbox`](crate::inbox::StandaloneInbox) |
//!
//! Every public error is here; an error that arises in one module is there too
//! ([`broker::BrokerError`](crate::broker::BrokerError), [`inbox::InboxError`](crate::inbox::InboxError),
//! [`relay::StandaloneRelayError`](crate::relay::StandaloneRelayError)).
//!
//! One rule for `#[non_exhaustive]`: every public enum of errors or outcomes carries it (match
//! them with a `_` arm), so a new failure is not a breaking change. Structs whose fields are a
//! wire shape or what the derive fills in (`BrokeredMessage`, `CommandRegistration`) do not: they
//! are built with struct literals. A two-state result that is complete by nature
//! ([`ReadOutcome`](crate::cosmos::ReadOutcome): found or not found) stays exhaustive too.

pub use crate::broker::{BrokerError, Refusal, TransportError};
pub use crate::cosmos::CosmosStoreError;
pub use crate::document::DocumentError;
pub use crate::document::outbox_contract::{ContractViolation, ContractViolations};
pub use crate::error_chain::ErrorChain;
pub use crate::handler_context::{ReadError, StageError};
pub use crate::inbox::{InboxError, InboxOptionsError, InboxSetupError};
pub use crate::partition_key::PartitionKeyError;
pub use crate::pipeline::{BatchFailure, PipelineError};
pub use crate::registry::{RegistrationProblem, RegistryError};
pub use crate::relay::contract::{
    MonitoredContainerError, MonitoredContainerViolation, MonitoredContainersError,
};
pub use crate::relay::delivery::DeliverySettingsError;
pub use crate::relay::error::{DrainError, RelayError};
pub use crate::relay::standalone::StandaloneRelayError;
pub use crate::runtime::{DispatchError, RelayNotIdle, StartError};
pub use cosmos_change_feed::{
    ChangeFeedError, InvalidOptions, ProcessorOption, RequestError, StoreError,
};
