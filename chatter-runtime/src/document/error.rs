//! The error type of the document layer: ids, partition-key stamping, wire shapes.
//!
//! Where the catalog quotes the C# message, the `Display` text here is that message verbatim:
//! the message text is part of the observable contract.

use crate::partition_key::PartitionKeyError;

/// Something wrong with an id, a partition-key path, a value to stamp, or a persisted document.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum DocumentError {
    /// The composed `{kind}:{encoded}` id is over Cosmos DB's 1023-character limit.
    #[error(
        "The composed Cosmos item id is {length} characters, which exceeds Cosmos DB's 1023-character id limit. \
         Supply a shorter message id."
    )]
    IdTooLong {
        /// The composed id's length in UTF-16 code units (what the C# `string.Length` counts).
        length: usize,
    },

    /// The id kind is empty or whitespace.
    #[error("A document-id kind is required.")]
    MissingKind,

    /// The id kind contains a Cosmos-forbidden id character.
    #[error(
        "A document-id kind must not contain the Cosmos-forbidden id characters '/', '\\\\', '?', or '#'."
    )]
    InvalidKind {
        /// The rejected kind.
        kind: String,
    },

    /// The document's partition key could not be stamped.
    #[error(transparent)]
    PartitionKey(#[from] PartitionKeyError),

    /// An application payload's top-level `id` is in the Chatter-reserved namespace.
    #[error(
        "The item id '{id}' is in the Chatter-reserved id namespace ('outbox:'/'inbox:'). Application documents \
         must not author reserved-prefix ids through the public staging surface; the framework owns this namespace \
         (defense-in-depth — the marker-409 duplicate decision is confirmed against the conflicting doc, not \
         inferred from the reserved namespace)."
    )]
    ReservedId {
        /// The rejected id.
        id: String,
    },

    /// A timestamp outside the range a .NET `DateTime` can carry (years 0001–9999).
    #[error(
        "The timestamp {timestamp} is outside the years 0001-9999 a ReceivedAtUtc value can carry."
    )]
    TimestampOutOfRange {
        /// The rejected timestamp, as `time` displays it.
        timestamp: String,
    },

    /// A persisted Outbox Document lacks a field, or carries it with the wrong JSON kind.
    #[error("The outbox document cannot be read: {reason}.")]
    MalformedOutboxDocument {
        /// What is wrong, naming the field.
        reason: String,
    },
}
