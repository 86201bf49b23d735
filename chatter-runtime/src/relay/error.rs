//! The relay's errors: why it did not start, and why a page failed.

use cosmos_change_feed::ChangeFeedError;

use super::contract::MonitoredContainersError;
use super::delivery::DeliverySettingsError;
use crate::broker::BrokerError;
use crate::cosmos::CosmosStoreError;

/// Why the relay did not start.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RelayError {
    /// The change-feed settings of the [`RelayOptions`](crate::relay::RelayOptions) cannot work
    /// together.
    #[error("invalid relay options")]
    InvalidOptions(#[source] cosmos_change_feed::InvalidOptions),
    /// [`RelayOptions::publish_timeout`](crate::relay::RelayOptions::publish_timeout) is zero: no
    /// publish could ever finish.
    #[error("invalid relay options: `publish_timeout` must be greater than zero")]
    ZeroPublishTimeout,
    /// [`RelayOptions::max_in_flight`](crate::relay::RelayOptions::max_in_flight) is zero: no
    /// document could ever be published.
    #[error("invalid relay options: `max_in_flight` must be greater than zero")]
    ZeroMaxInFlight,
    /// [`RelayOptions::backlog_interval`](crate::relay::RelayOptions::backlog_interval) is zero:
    /// the estimates would run back to back.
    #[error("invalid relay options: `backlog_interval` must be greater than zero")]
    ZeroBacklogInterval,
    /// [`RelayOptions::sweep_interval`](crate::relay::RelayOptions::sweep_interval) is zero: the
    /// sweeps would run back to back.
    #[error("invalid relay options: `sweep_interval` must be greater than zero")]
    ZeroSweepInterval,
    /// [`RelayOptions::handler_timeout`](crate::relay::RelayOptions::handler_timeout) is not
    /// greater than one document's publish and stamp
    /// ([`RelayOptions::publish_timeout`](crate::relay::RelayOptions::publish_timeout) plus
    /// [`RelayOptions::store_timeout`](crate::relay::RelayOptions::store_timeout)): a slow stamp
    /// would have its page cancelled after the publish, and the message published again.
    #[error(
        "invalid relay options: `handler_timeout` ({handler_timeout:?}) must be greater than \
         `publish_timeout` ({publish_timeout:?}) plus `store_timeout` ({store_timeout:?})"
    )]
    HandlerTimeoutTooShort {
        /// The page bound.
        handler_timeout: std::time::Duration,
        /// The publish bound.
        publish_timeout: std::time::Duration,
        /// The store-call bound.
        store_timeout: std::time::Duration,
    },
    /// The delivery settings are invalid.
    #[error(transparent)]
    Delivery(#[from] DeliverySettingsError),
    /// A monitored container breaks the contract (every violation of every container is listed).
    #[error(transparent)]
    Contract(#[from] MonitoredContainersError),
    /// A monitored or lease container could not be reached.
    #[error("the relay of `{database}/{container}` could not reach container `{missing}`")]
    Container {
        /// The database.
        database: String,
        /// The monitored container.
        container: String,
        /// The container that could not be reached, as `database/container`.
        missing: String,
        /// The store error (boxed: it is large, and this error is returned by value).
        #[source]
        source: Box<CosmosStoreError>,
    },
    /// Two standalone relays declare the same `(monitored, lease)` source identity: they
    /// would share one change-feed processor and its leases.
    #[error(
        "A standalone Cosmos outbox relay with the same declared source identity (MonitoredSourceIdentity '{monitored}', LeaseSourceIdentity '{lease}') is already registered. Two relays sharing a declared identity would share one change-feed processor and its leases, each draining half of the other's documents with its own settings. Supply DISTINCT MonitoredSourceIdentity/LeaseSourceIdentity values for distinct standalone relays over the same containers."
    )]
    DuplicateDeclaredIdentity {
        /// The declared monitored identity.
        monitored: String,
        /// The declared lease identity.
        lease: String,
    },
    /// Two relays without declared identities resolve to the same containers (account endpoint,
    /// database and container of the monitored and the lease container), and so to one
    /// change-feed processor name.
    #[error(
        "Two standalone Cosmos outbox relays resolved to the same ground-truth source identity (the same monitored and lease containers) and thus the same change-feed processor name '{processor_name}'. They would share that processor's leases, each draining part of the other's documents with its own settings. Declare distinct source identities for them, or register the relay once."
    )]
    SameGroundTruth {
        /// The shared processor name.
        processor_name: String,
    },
    /// A standalone relay monitors a container the runtime's pipeline relay already relays
    /// (one its commands write): each document would be published twice, by two processors.
    #[error(
        "A standalone Cosmos outbox relay monitors `{database}/{container}`, which this runtime's pipeline relay already relays (processor '{processor_name}'): two relays over one container publish each of its documents twice. Drop the standalone relay, or build the runtime without its relay (`RuntimeBuilder::without_relay`) if the standalone relay is to publish that container."
    )]
    OverPipelineContainer {
        /// The database.
        database: String,
        /// The container both would monitor.
        container: String,
        /// The pipeline relay's processor of that container.
        processor_name: String,
    },
    /// A change-feed processor did not start.
    #[error("the change-feed processor of `{database}/{container}` did not start")]
    Processor {
        /// The database.
        database: String,
        /// The monitored container.
        container: String,
        /// Why.
        #[source]
        source: ChangeFeedError,
    },
    /// The broker's setup does not meet what the relay needs of it
    /// ([`Broker::verify`](crate::broker::Broker::verify)); the error names the setting.
    #[error("the broker is not set up as the relay needs")]
    Broker(#[source] crate::broker::BrokerError),
}

impl RelayError {
    /// Whether this is a refusal of a relay's identity (raised before any container is read).
    pub fn is_identity_conflict(&self) -> bool {
        matches!(
            self,
            Self::DuplicateDeclaredIdentity { .. }
                | Self::SameGroundTruth { .. }
                | Self::OverPipelineContainer { .. }
        )
    }
}

/// Why a page failed; the processor reads it again.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DrainError {
    /// The lease is suspended: nothing was published and the page is not checkpointed.
    #[error(
        "The Cosmos Outbox Relay has suspended draining lease '{lease_token}': its documents \
         published but could not be marked delivered, so every redrain republished them. The \
         batch is not checkpointed and re-surfaces once draining resumes."
    )]
    Suspended {
        /// The suspended lease.
        lease_token: String,
    },
    /// The broker did not confirm; the document stays pending.
    #[error(
        "publishing outbox message '{message_id}' to `{destination}` failed; it stays pending and is published again"
    )]
    Publish {
        /// The message id.
        message_id: String,
        /// The destination.
        destination: String,
        /// The broker error.
        #[source]
        source: BrokerError,
    },
    /// The broker refuses the document because of one of its settings (a permission, a
    /// conflicting queue, a size limit, no route): nothing was published or stamped, the
    /// document stays pending, and the lease is blocked until the setting is changed.
    #[error(
        "the broker refuses outbox message '{message_id}' for `{destination}` because of how it \
         is set up; it stays pending and is published once the broker takes it"
    )]
    Refused {
        /// The message id.
        message_id: String,
        /// The destination.
        destination: String,
        /// The broker's refusal: its reply and the fix.
        #[source]
        source: BrokerError,
    },
    /// Published, but the delivered stamp failed (a Confirmation Failure): it will be published
    /// again (consumers dedup), until the gate suspends the lease; one publish after commit
    /// published is only stamped again by the relay of its process.
    #[error(
        "outbox message '{message_id}' was published but stamping it delivered failed; it stays pending and is tried again"
    )]
    Confirmation {
        /// The message id.
        message_id: String,
        /// The store error.
        #[source]
        source: CosmosStoreError,
    },
    /// The page was cancelled (its handler timeout elapsed) after publishing messages that were
    /// not marked delivered: a Confirmation Failure, as each will be published again. Never
    /// returned (the page's future is gone); it is the cause the gate counts.
    #[error(
        "the page of lease '{lease_token}' was cancelled after publishing {unconfirmed} \
         message(s) that were not marked delivered; they are published again"
    )]
    Cancelled {
        /// The lease.
        lease_token: String,
        /// Messages the broker confirmed whose stamp had not landed.
        unconfirmed: usize,
    },
    /// The lease went to another instance while its page was being drained: no document was
    /// started after that, and the page is not checkpointed here (the new owner reads it again
    /// and skips what was stamped).
    #[error(
        "the lease '{lease_token}' went to another instance while its page was drained; the \
         rest of the page is left to the new owner"
    )]
    LeaseLost {
        /// The lost lease.
        lease_token: String,
    },
    /// A standalone relay's body resolver failed: nothing was published or stamped.
    #[error(
        "the body resolver failed on outbox message '{message_id}'; it stays pending and is resolved again"
    )]
    Resolver {
        /// The document's message id.
        message_id: String,
        /// The resolver's error.
        #[source]
        source: crate::registry::BoxError,
    },
    /// The broker can never take the message a standalone relay's body resolver built for a
    /// document ([`BrokerError::is_permanent`], e.g. a destination no queue can be named): the
    /// resolver is at fault, not the document's persisted fields, so nothing is published or
    /// stamped and the lease is blocked, as for a broker setting, until the resolver builds a
    /// message the broker takes (or an operator gives the document up).
    #[error(
        "the broker can never take the message '{message_id}' for `{destination}` that the body \
         resolver built for outbox document '{id}'; the document stays pending and its lease is \
         blocked until the body resolver builds a message the broker takes (or an operator gives \
         the document up with `chatter outbox give-up`)"
    )]
    ResolvedMessageRefused {
        /// The document id.
        id: String,
        /// The resolved message's id.
        message_id: String,
        /// The resolved message's destination.
        destination: String,
        /// The broker's permanent refusal.
        #[source]
        source: BrokerError,
    },
    /// A standalone relay's pending filter panicked on a document: nothing of the page was
    /// published or stamped, and the page is read again (as a filter that throws fails the
    /// batch in .NET), so the processor never checkpoints past the document.
    #[error(
        "the standalone relay's pending filter panicked on document '{id}' ({panic}); nothing of \
         the page was published and the page is read again"
    )]
    PendingFilterPanicked {
        /// The document id (empty when it has none).
        id: String,
        /// The panic's message.
        panic: String,
    },
    /// A document the body resolver built no message for could not be stamped delivered;
    /// nothing was published, so this is no Confirmation Failure.
    #[error(
        "outbox document '{id}' needs no message (its resolver built none) and stamping it delivered failed"
    )]
    DroppedStamp {
        /// The document id.
        id: String,
        /// The store error.
        #[source]
        source: CosmosStoreError,
    },
    /// An undeliverable document could not be stamped; nothing was published, so this is no
    /// Confirmation Failure.
    #[error("outbox document '{id}' is undeliverable and stamping it so failed")]
    UndeliverableStamp {
        /// The document id.
        id: String,
        /// The store error.
        #[source]
        source: CosmosStoreError,
    },
}

impl DrainError {
    /// The error's type and variant, as metrics and spans name it (`error.type`).
    pub(crate) fn type_name(&self) -> &'static str {
        match self {
            Self::Suspended { .. } => error_type!(DrainError::Suspended),
            Self::Publish { .. } => error_type!(DrainError::Publish),
            Self::Refused { .. } => error_type!(DrainError::Refused),
            Self::Confirmation { .. } => error_type!(DrainError::Confirmation),
            Self::Cancelled { .. } => error_type!(DrainError::Cancelled),
            Self::LeaseLost { .. } => error_type!(DrainError::LeaseLost),
            Self::Resolver { .. } => error_type!(DrainError::Resolver),
            Self::ResolvedMessageRefused { .. } => {
                error_type!(DrainError::ResolvedMessageRefused)
            }
            Self::PendingFilterPanicked { .. } => {
                error_type!(DrainError::PendingFilterPanicked)
            }
            Self::DroppedStamp { .. } => error_type!(DrainError::DroppedStamp),
            Self::UndeliverableStamp { .. } => error_type!(DrainError::UndeliverableStamp),
        }
    }
}
