//! Cosmos DB access: the connection (SDK client + account endpoint + container-handle cache),
//! reading back what chatter wrote, and what its requests cost ([`RequestCharges`]). Creating
//! databases and containers for development is [`provision`](crate::provision)'s.
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
//!
#![doc = include_str!("../../docs/store.md")]

pub(crate) mod charge;
mod connection;
mod error;
pub(crate) mod outbox_query;
pub(crate) mod store;

pub use charge::RequestCharges;
#[cfg(feature = "embedded")]
pub use connection::EMBEDDED_ENDPOINT;
pub use connection::{CosmosConnection, EMULATOR_KEY};
pub use error::{CREDENTIAL_ENV, CosmosStoreError, ENDPOINT_ENV, KEY_ENV};
pub use store::{ReadOutcome, read_item};

/// Builds the SDK's partition key from JSON values, one per partition-key path.
pub use crate::partition_key::sdk_key as partition_key;

/// The ids chatter gives the documents it writes beside yours, to read them back by id: the
/// inbox marker of a message id, and the Outbox Document of a sent message's id.
pub use crate::document::id::{inbox_id, outbox_id};

/// The SDK types that appear in this module's signatures.
pub use azure_data_cosmos::CosmosClient;
pub use azure_data_cosmos::clients::ContainerClient;
pub use azure_data_cosmos::models::PartitionKey;
