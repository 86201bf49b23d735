//! The error type of the document layer: ids, partition-key stamping, wire shapes.
//!
//! Where the catalog quotes the C# message, the `Display` text here is that message verbatim:
//! the message text is part of the observable contract.

/// Something wrong with an id, a partition-key path, a value to stamp, or a persisted document.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum DocumentError {
    /// The composed `{kind}:{encoded}` id is over Cosmos DB's 1023-character limit (catalog 0.1).
    #[error(
        "The composed Cosmos item id is {length} characters, which exceeds Cosmos DB's 1023-character id limit. \
         Supply a shorter message id."
    )]
    IdTooLong {
        /// The composed id's length in UTF-16 code units (what the C# `string.Length` counts).
        length: usize,
    },

    /// The id kind is empty or whitespace (R2.81).
    #[error("A document-id kind is required.")]
    MissingKind,

    /// The id kind contains a Cosmos-forbidden id character (R2.80).
    #[error(
        "A document-id kind must not contain the Cosmos-forbidden id characters '/', '\\\\', '?', or '#'."
    )]
    InvalidKind {
        /// The rejected kind.
        kind: String,
    },

    /// No partition-key path was given to stamp with (R2.91).
    #[error("A container partition-key path is required to stamp the document.")]
    MissingPartitionKeyPath,

    /// A partition-key path has no property name in it, e.g. `/` or `` (an empty path).
    #[error("A partition-key path segment must contain at least one property name.")]
    EmptyPartitionKeyPath {
        /// The rejected path.
        path: String,
    },

    /// The number of values to stamp differs from the number of partition-key paths (R2.91).
    #[error(
        "Expected '{expected}' partition-key value(s) to match the path segment count but got '{actual}'."
    )]
    PartitionKeyCountMismatch {
        /// How many paths the container declares.
        expected: usize,
        /// How many values were given.
        actual: usize,
    },

    /// A partition-key path's root segment is a field the document itself needs (R2.68, R2.90).
    ///
    /// `reserved` is rendered the way the C# `string.Join(", ", set)` renders its reserved set:
    /// insertion order, e.g. `[id, _chatterType, status, MessageId, ...]`.
    #[error(
        "The container partition-key path '{path}' targets the Chatter-reserved field '{root}'. A co-resident \
         document cannot be stamped on a partition-key path whose root segment is one of [{}] without overwriting \
         a required field. Use a non-reserved partition-key path for the container.",
        reserved.join(", ")
    )]
    ReservedPartitionKeyPath {
        /// The offending path, as given.
        path: String,
        /// Its root segment.
        root: String,
        /// The document's reserved root fields, in declaration order.
        reserved: Vec<String>,
    },

    /// An application payload's top-level `id` is in the Chatter-reserved namespace (catalog 2.2).
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
