//! Why the runtime would not start, and why a dispatch failed.

use crate::broker::BrokerError;
use crate::cosmos::CosmosStoreError;
use crate::pipeline::PipelineError;
use crate::registry::RegistryError;

/// Why `start()` failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StartError {
    /// A broker given with [`RuntimeBuilder::broker_for`](crate::RuntimeBuilder::broker_for)
    /// under a blank messaging-system name, or under one given before.
    #[error("messaging system `{name}` {problem}: give each broker its own non-blank name")]
    MessagingSystem {
        /// The name as given (trimmed).
        name: String,
        /// What is wrong with it.
        problem: &'static str,
    },
    /// The registrations conflict; every problem is listed.
    #[error(transparent)]
    Registry(#[from] RegistryError),
    /// The Cosmos connection could not be made.
    #[error(transparent)]
    Cosmos(#[from] CosmosStoreError),
    /// A command's container could not be reached.
    #[error(
        "command `{command}` writes to container `{database}/{container}`, which could not be reached \
         (chatter never creates containers: create it; in development, with \
         `chatter_runtime::provision::ensure_container`)"
    )]
    Container {
        /// The command.
        command: &'static str,
        /// The database.
        database: &'static str,
        /// The container.
        container: &'static str,
        /// The store error (boxed: it is large, and this error is returned by value).
        #[source]
        source: Box<CosmosStoreError>,
    },
    /// The change-feed relay did not start (e.g. a monitored container breaks the contract).
    #[error(transparent)]
    Relay(#[from] crate::relay::error::RelayError),
    /// The broker could never carry a command's dead letters (e.g. `<destination>.dead-letter`
    /// is longer than AMQP allows): choose a shorter destination.
    #[error("the dead letters of command `{command}` could never be published to `{dead_letters}`")]
    DeadLetters {
        /// The command name.
        command: &'static str,
        /// Its dead-letter destination.
        dead_letters: String,
        /// The broker's refusal.
        #[source]
        source: BrokerError,
    },
    /// A standalone-inbox command's idempotency container cannot serve it (missing, or
    /// partitioned by another path).
    #[error("the standalone inbox of command `{command}` cannot start")]
    Inbox {
        /// The command name.
        command: &'static str,
        /// Why.
        #[source]
        source: Box<crate::inbox::InboxSetupError>,
    },
    /// Two standalone-inbox commands name one idempotency container: its markers are keyed by
    /// message id alone, so a message id handled by one would be skipped by the other.
    #[error(
        "standalone-inbox commands `{first}` and `{second}` share the idempotency container '{database}/{container}'; markers are keyed by message id alone, so one would skip the other's messages: give each its own container"
    )]
    SharedIdempotencyContainer {
        /// The first command.
        first: &'static str,
        /// The second command.
        second: &'static str,
        /// The database.
        database: &'static str,
        /// The container.
        container: &'static str,
    },
    /// A handler takes application state (`State<T>`) of a type the runtime was not given
    /// ([`RuntimeBuilder::state`](crate::RuntimeBuilder::state)).
    #[error(
        "handler `{handler}` ({location}) takes `State<{state_type}>`, but the runtime was given no `{state_type}`: add `.state(value)` to the RuntimeBuilder"
    )]
    MissingState {
        /// The handler's path.
        handler: &'static str,
        /// Where it was written.
        location: crate::registry::SourceLocation,
        /// The state type.
        state_type: &'static str,
    },
    /// [`RuntimeBuilder::consumer_concurrency`](crate::RuntimeBuilder::consumer_concurrency)
    /// is 0 or above 65535, the largest prefetch a broker can be asked for.
    #[error(
        "consumer concurrency {concurrency} is out of range: a consumer handles 1 to 65535 deliveries at once"
    )]
    ConsumerConcurrency {
        /// The concurrency that was set.
        concurrency: usize,
    },
    /// [`RuntimeBuilder::delivery_timeout`](crate::RuntimeBuilder::delivery_timeout) is zero:
    /// no delivery could ever be handled.
    #[error("the delivery timeout must be greater than zero")]
    ZeroDeliveryTimeout,
    /// [`RuntimeBuilder::lane_wait_limit`](crate::RuntimeBuilder::lane_wait_limit) is zero:
    /// every delivery waiting behind its key would be returned to the broker at once, over and
    /// over.
    #[error("the lane wait limit must be greater than zero")]
    ZeroLaneWaitLimit,
    /// The broker's setup does not meet what chatter needs of it
    /// ([`Broker::verify`](crate::broker::Broker::verify)); the error names the setting.
    #[error("the broker is not set up as chatter needs")]
    Broker {
        /// What [`verify`](crate::broker::Broker::verify) found.
        #[source]
        source: BrokerError,
    },
    /// A command's destination could not be consumed.
    #[error("chatter could not subscribe to destination `{destination}`")]
    Subscribe {
        /// The destination.
        destination: &'static str,
        /// The broker error.
        #[source]
        source: BrokerError,
    },
}

/// Why a dispatched command was not handled.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DispatchError {
    /// The command type is not registered with this runtime.
    #[error(
        "command type `{command}` is not registered with this runtime; derive `DocumentReliable` on it and bind a `#[handler]`"
    )]
    NotRegistered {
        /// The Rust type name.
        command: &'static str,
    },
    /// The command could not be serialized.
    #[error("the command could not be serialized to JSON")]
    Encode(#[source] serde_json::Error),
    /// The document tier failed; nothing was committed.
    #[error(transparent)]
    Pipeline(#[from] PipelineError),
}

impl DispatchError {
    /// The handler's rejection, when it refused the command for good
    /// ([`PipelineError::Rejected`]).
    pub fn rejection(&self) -> Option<&crate::pipeline::Rejection> {
        match self {
            Self::Pipeline(error) => error.rejection(),
            _ => None,
        }
    }
}
