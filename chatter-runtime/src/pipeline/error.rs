//! Errors of the document tier: staging (returned to the handler) and the batch lifecycle.

use crate::cosmos::CosmosStoreError;
use crate::document::DocumentError;
use crate::registry::BoxError;

/// What a failed attempt of a batched command left: nothing.
pub(crate) const NOTHING_COMMITTED: &str = "nothing was committed";

/// What a failed attempt of a standalone-inbox command left: its marker pending, and whatever
/// its handler did outside Cosmos.
pub(crate) const INBOX_NOT_UNDONE: &str =
    "its inbox marker stays pending, and what the handler did outside Cosmos is not undone";

/// Why a delivery was not handled.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PipelineError {
    /// A participant arrived without a message id.
    #[error(
        "Document-tier reliability participant '{command}' requires a non-empty MessageId: the once-only guarantee cannot be honored without a message identity to dedup by."
    )]
    MissingMessageId {
        /// The command name.
        command: &'static str,
    },
    /// The message body is not JSON at all.
    #[error("the body of `{command}` message '{message_id}' is not JSON")]
    NotJson {
        /// The command name.
        command: &'static str,
        /// The message id.
        message_id: String,
        /// Why.
        #[source]
        source: serde_json::Error,
    },
    /// The message body is JSON but does not decode into the command.
    #[error("the body of `{command}` message '{message_id}' does not decode")]
    Decode {
        /// The command name.
        command: &'static str,
        /// The message id.
        message_id: String,
        /// Why.
        #[source]
        source: serde_json::Error,
    },
    /// The inbox marker could not be built (e.g. the message id makes an over-long item id).
    #[error("the inbox marker of `{command}` message '{message_id}' could not be built")]
    Marker {
        /// The command name.
        command: &'static str,
        /// The message id.
        message_id: String,
        /// Why.
        #[source]
        source: DocumentError,
    },
    /// The handler failed; nothing was committed (`undone` says what that means for the
    /// command: a standalone-inbox handler's side effects outside Cosmos are not undone).
    #[error("handler of `{command}` failed on message '{message_id}'; {undone}")]
    Handler {
        /// The command name.
        command: &'static str,
        /// The message id.
        message_id: String,
        /// What the attempt left: "nothing was committed" for a batched command; for a
        /// standalone-inbox command, a pending marker and the handler's side effects.
        undone: &'static str,
        /// The handler's error.
        #[source]
        source: BoxError,
    },
    /// The handler rejected the command ([`Rejection`](crate::Rejection)): nothing was
    /// committed, and it is never tried again (the consumer dead-letters it at once with the
    /// reason).
    #[error(
        "handler of `{command}` rejected message '{message_id}': {rejection}; {undone} and it is not tried again"
    )]
    Rejected {
        /// The command name.
        command: &'static str,
        /// The message id.
        message_id: String,
        /// What the attempt left: "nothing was committed" for a batched command; for a
        /// standalone-inbox command, a pending marker and the handler's side effects.
        undone: &'static str,
        /// The handler's rejection.
        rejection: super::Rejection,
    },
    /// The handler (or the command's deserialization) panicked; nothing was committed. Counted
    /// as a failed attempt: retried, then dead-lettered.
    #[error("handler of `{command}` panicked on message '{message_id}': {panic}; {undone}")]
    HandlerPanicked {
        /// The command name.
        command: &'static str,
        /// The message id.
        message_id: String,
        /// What the attempt left: "nothing was committed" for a batched command; for a
        /// standalone-inbox command, a pending marker and the handler's side effects.
        undone: &'static str,
        /// The panic's message.
        panic: String,
    },
    /// The attempt (the handler, or a Cosmos call of its batch) did not finish within the
    /// consumer's delivery timeout. Counted as a failed attempt: retried, then dead-lettered.
    /// Whether its batch committed is unknown; the retry finds out through the inbox marker.
    #[error("handling `{command}` message '{message_id}' did not finish within {after:?}")]
    TimedOut {
        /// The command name.
        command: &'static str,
        /// The message id.
        message_id: String,
        /// The delivery timeout.
        after: std::time::Duration,
    },
    /// Cosmos refused the batch, or a 409 on the inbox marker could not be confirmed as a duplicate.
    #[error(
        "the batch of `{command}` message '{message_id}' did not commit: {reason} (batch status {status}, per-operation status codes {operation_statuses:?})"
    )]
    BatchFailed {
        /// The command name.
        command: &'static str,
        /// The message id.
        message_id: String,
        /// What went wrong.
        reason: BatchFailure,
        /// The batch's HTTP status.
        status: u16,
        /// Per-operation status codes, op 0 being the inbox marker.
        operation_statuses: Vec<u16>,
        /// The store error, when confirming a conflicting marker failed (boxed: it is large).
        #[source]
        source: Option<Box<CosmosStoreError>>,
    },
    /// A Cosmos call failed.
    #[error("Cosmos call for `{command}` message '{message_id}' failed")]
    Cosmos {
        /// The command name.
        command: &'static str,
        /// The message id.
        message_id: String,
        /// The store error (boxed: it is large, and this error is returned by value).
        #[source]
        source: Box<CosmosStoreError>,
    },
    /// The Standalone Inbox Gate of a standalone-inbox command failed (the source says at which
    /// step: the claim, an unconfirmed conflict, the completion).
    #[error("the standalone inbox of `{command}` failed on message '{message_id}'")]
    Inbox {
        /// The command name.
        command: &'static str,
        /// The message id.
        message_id: String,
        /// The gate's error.
        #[source]
        source: crate::inbox::InboxError,
    },
    /// A pass-through delivery's message could not be published.
    #[error("publishing a message sent by the handler of `{command}` failed")]
    Publish {
        /// The command name.
        command: &'static str,
        /// The broker error.
        #[source]
        source: crate::broker::BrokerError,
    },
}

impl PipelineError {
    /// The error's type and variant, as spans name it (`error.type`).
    pub(crate) fn type_name(&self) -> &'static str {
        match self {
            Self::MissingMessageId { .. } => error_type!(PipelineError::MissingMessageId),
            Self::NotJson { .. } => error_type!(PipelineError::NotJson),
            Self::Decode { .. } => error_type!(PipelineError::Decode),
            Self::Marker { .. } => error_type!(PipelineError::Marker),
            Self::Handler { .. } => error_type!(PipelineError::Handler),
            Self::Rejected { .. } => error_type!(PipelineError::Rejected),
            Self::HandlerPanicked { .. } => error_type!(PipelineError::HandlerPanicked),
            Self::TimedOut { .. } => error_type!(PipelineError::TimedOut),
            Self::BatchFailed { .. } => error_type!(PipelineError::BatchFailed),
            Self::Cosmos { .. } => error_type!(PipelineError::Cosmos),
            Self::Publish { .. } => error_type!(PipelineError::Publish),
            Self::Inbox { .. } => error_type!(PipelineError::Inbox),
        }
    }

    /// Whether the attempt may have committed although it failed: it timed out, a Cosmos call
    /// (a standalone-inbox completion among them) failed without an answer that says the
    /// batch did not commit, or the inbox marker
    /// conflicted and reading it back failed (an earlier attempt may have committed). Only the
    /// inbox marker can tell.
    pub(crate) fn may_have_committed(&self) -> bool {
        matches!(
            self,
            Self::TimedOut { .. }
                | Self::Cosmos { .. }
                // A standalone-inbox completion that failed without an answer may have landed.
                | Self::Inbox {
                    source: crate::inbox::InboxError::Completion { .. },
                    ..
                }
                | Self::BatchFailed {
                    reason: BatchFailure::ConfirmationFailed,
                    ..
                }
        )
    }

    /// Whether this delivery can never succeed, however often it is tried: its body does not
    /// decode into the command (or is not JSON), it has no message id, no inbox marker can be
    /// built for its message id, its handler rejected it, or it sent a message from a
    /// standalone-inbox command that names no lease. The consumer dead-letters such a
    /// delivery at once; every other failure is tried again.
    pub fn is_permanent(&self) -> bool {
        // A standalone-inbox command without a lease can never send: retrying would only
        // repeat the side effect its handler did before the send.
        if let Self::Handler { source, .. } = self
            && matches!(
                source.downcast_ref::<crate::handler_context::StageError>(),
                Some(crate::handler_context::StageError::InboxWithoutLease { .. })
            )
        {
            return true;
        }
        matches!(
            self,
            Self::MissingMessageId { .. }
                | Self::NotJson { .. }
                | Self::Decode { .. }
                | Self::Marker { .. }
                | Self::Rejected { .. }
                | Self::Inbox {
                    source: crate::inbox::InboxError::BlankMessageId
                        | crate::inbox::InboxError::Marker { .. },
                    ..
                }
        )
    }

    /// How long at most another attempt's live claim of the message id (a standalone-inbox
    /// command) can hold it: the delivery was not handled, and is delivered again later
    /// without counting an attempt.
    pub(crate) fn claim_held(&self) -> Option<std::time::Duration> {
        match self {
            Self::Inbox {
                source: crate::inbox::InboxError::ClaimHeld { for_at_most, .. },
                ..
            } => Some(*for_at_most),
            _ => None,
        }
    }

    /// The handler's rejection, when it rejected the command.
    pub fn rejection(&self) -> Option<&super::Rejection> {
        match self {
            Self::Rejected { rejection, .. } => Some(rejection),
            _ => None,
        }
    }
}

/// Why a batch did not commit ([`PipelineError::BatchFailed`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum BatchFailure {
    /// Cosmos rejected an operation other than the inbox marker (its per-operation status
    /// codes say which).
    #[error("Cosmos rejected the batch")]
    Rejected,
    /// A write conditioned on an ETag (`replace_if_match`, `delete_if_match`) found the
    /// document changed since it was read (412): another delivery wrote it first. Tried again:
    /// the handler then reads the new version.
    #[error(
        "document '{id}' changed since the handler read it ({operation}, 412 precondition failed); the delivery is tried again and reads the new version"
    )]
    Conflict {
        /// The operation (`replace`, `delete`).
        operation: &'static str,
        /// The document's id.
        id: String,
    },
    /// One of the handler's writes (or outbox documents) failed: the operation, the document
    /// and what the status means. Tried again like any failure (a handler that wants a 409 on
    /// its `create` or a 404 on its `replace` to be final reads first and rejects).
    #[error("{operation} of document '{id}' failed with {status}: {meaning}")]
    WriteFailed {
        /// The operation (`create`, `upsert`, `replace`, `delete`; `outbox create` for an
        /// outbox document).
        operation: &'static str,
        /// The document's id.
        id: String,
        /// Its status code.
        status: u16,
        /// What the status means for that operation.
        meaning: &'static str,
    },
    /// The inbox marker conflicted with a document that is not this message id's inbox marker.
    #[error(
        "the inbox marker conflicted with document '{marker_id}', which is not the inbox marker of this message id"
    )]
    ForeignMarker {
        /// The marker's id.
        marker_id: String,
    },
    /// The inbox marker conflicted, but reading the conflicting document back found nothing.
    #[error("the inbox marker conflicted but document '{marker_id}' could not be read back (404)")]
    MarkerMissing {
        /// The marker's id.
        marker_id: String,
    },
    /// The inbox marker conflicted and reading it back failed (e.g. throttled or unavailable):
    /// an earlier attempt may have committed.
    #[error("the inbox marker conflicted and confirming it failed")]
    ConfirmationFailed,
}
