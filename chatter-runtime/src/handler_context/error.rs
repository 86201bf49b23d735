//! [`StageError`]: why the Atomic-Write Handle refused a write or a message.

use crate::broker::BrokerError;
use crate::document::{ContractViolations, DocumentError};

/// A write or message the Atomic-Write Handle refused; nothing was staged.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StageError {
    /// No batch is active: the command is not a participant, or its partition key did not resolve.
    #[error(
        "no Cosmos batch is active for this delivery: the command is not document-reliable or its partition key did not resolve, so writes cannot be staged"
    )]
    NoActiveBatch,
    /// The batch would exceed Cosmos's operation limit.
    #[error(
        "a Cosmos TransactionalBatch holds at most {limit} operations (the inbox marker included); this write would exceed it"
    )]
    TooManyOperations {
        /// The limit.
        limit: usize,
    },
    /// The document is not a JSON object.
    #[error("a staged document must serialize to a JSON object")]
    NotAnObject,
    /// The document's partition-key value differs from the batch's.
    #[error(
        "the document's partition-key value at {paths} is {found}, but this delivery's batch is for {expected}: a TransactionalBatch writes one logical partition"
    )]
    PartitionKeyMismatch {
        /// The container's paths, as `[/a, /b]`.
        paths: String,
        /// The batch's values.
        expected: String,
        /// The document's values.
        found: String,
    },
    /// The document could not be serialized.
    #[error("the document could not be serialized to JSON")]
    Encode(#[source] serde_json::Error),
    /// A reserved id, an over-long id, or an outbox document that cannot be built.
    #[error(transparent)]
    Document(#[from] DocumentError),
    /// The message's Outbox Document would violate the Outbox Document Contract: the relay could
    /// never publish it.
    #[error("the message cannot be sent")]
    OutboxContract(#[from] ContractViolations),
    /// A standalone-inbox command that names no lease container sent a message: its messages
    /// commit as Outbox Documents beside its marker, which only a relay publishes.
    #[error(
        "the standalone-inbox command `{command}` sends a message but names no lease container: its sent messages commit with its inbox marker as Outbox Documents of the idempotency container, which a relay publishes; add `lease = \"...\"` to its `#[inbox(...)]`"
    )]
    InboxWithoutLease {
        /// The command name.
        command: &'static str,
    },
    /// The configured broker would refuse the message every time.
    #[error("the message cannot be sent: the broker would refuse it every time")]
    Unpublishable(#[from] BrokerError),
}
