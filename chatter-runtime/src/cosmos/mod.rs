//! Cosmos DB access: the connection (SDK client + account endpoint + container-handle cache),
//! development provisioning, and the thin item operations the pipeline and the relay call.
//!
//! Only the official SDK (`azure_data_cosmos`) talks to Cosmos. Where the connection comes
//! from ([`CosmosConnection::resolve`]):
//!
//! | Setting | Store |
//! |---|---|
//! | `CHATTER_COSMOS_ENDPOINT` (+ `CHATTER_COSMOS_KEY`) | that account or emulator; loopback endpoints default to the emulator key |
//! | nothing, feature `embedded` (default) | the SDK's in-memory emulator, in process, not persisted |
//! | nothing, no `embedded` | an error naming the variables |
//!
//! `chatter-emulator` serves the same in-memory emulator over HTTP for multi-process setups.

mod connection;
mod error;
pub mod provision;
pub mod store;

/// Builds the SDK's partition key from JSON values, one per partition-key path.
pub use crate::partition_key::sdk_key as partition_key;
#[cfg(feature = "embedded")]
pub use connection::EMBEDDED_ENDPOINT;
pub use connection::{CosmosConnection, EMULATOR_KEY};
pub use error::{CosmosStoreError, ENDPOINT_ENV, KEY_ENV};
pub use store::{
    BatchOperation, BatchOperationOutcome, BatchOutcome, ContainerSettings, ReadOutcome,
    WriteOutcome, execute_batch, patch_item, read_container_properties, read_item,
};

/// The SDK types that appear in this module's signatures.
pub use azure_data_cosmos::clients::ContainerClient;
pub use azure_data_cosmos::models::PartitionKey;
