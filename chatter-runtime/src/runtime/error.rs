//! Why the runtime would not start, and why a dispatch failed.

use crate::cosmos::CosmosStoreError;
use crate::registry::{BoxError, RegistryError};

/// Why `start()` failed.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// The registrations conflict; every problem is listed.
    #[error(transparent)]
    Registry(#[from] RegistryError),
    /// The Cosmos connection could not be made.
    #[error("chatter could not connect to Cosmos DB: {0}")]
    Cosmos(#[from] CosmosStoreError),
}

/// Why a dispatched command was not handled.
#[derive(Debug, thiserror::Error)]
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
    #[error("the command could not be serialized to JSON: {0}")]
    Encode(#[source] serde_json::Error),
    /// The command's JSON does not decode into the command type.
    #[error("the message body does not decode into the command: {0}")]
    Decode(#[source] serde_json::Error),
    /// The handler returned an error; nothing was committed.
    #[error("handler of `{command}` failed: {source}")]
    Handler {
        /// The command name.
        command: &'static str,
        /// The handler's error.
        #[source]
        source: BoxError,
    },
}
