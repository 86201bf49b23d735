//! What can go wrong talking to a broker.

/// The source of a [`BrokerError::Transport`]: the underlying client's error.
pub type TransportError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// An error from a [`Broker`](super::Broker), a [`Subscription`](super::Subscription) or the
/// settlement of a [`Delivery`](super::Delivery).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum BrokerError {
    /// The destination cannot name a queue on this broker (empty, or too long for AMQP).
    #[error("invalid destination `{destination}`: {reason}")]
    InvalidDestination {
        /// The destination as given.
        destination: String,
        /// Why the broker cannot use it.
        reason: String,
    },
    /// The message cannot be carried by this broker as it is (e.g. a field longer than AMQP
    /// allows); nothing was published.
    #[error("message `{message_id}` for `{destination}` cannot be published: {reason}")]
    InvalidMessage {
        /// The message's `MessageId`.
        message_id: String,
        /// The message's `Destination`.
        destination: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The broker did not take responsibility for the message (publisher confirm was a nack, or
    /// the message was returned as unroutable): it was not published and may be retried.
    #[error("the broker refused message `{message_id}` for `{destination}`: {reason}")]
    Rejected {
        /// The message's `MessageId`.
        message_id: String,
        /// The message's `Destination`.
        destination: String,
        /// What the broker answered.
        reason: String,
    },
    /// A delivery could not be read back as a Brokered Message (e.g. a body that is not UTF-8,
    /// published by a foreign client). It was moved as it is to `<destination>.dead-letter`
    /// (or, if that failed, returned to its queue): it is not lost.
    #[error(
        "a delivery from `{destination}` (message id {message_id}) is not a Brokered Message: \
         {reason}; it was moved to the dead-letter queue"
    )]
    Undecodable {
        /// The queue it came from.
        destination: String,
        /// Its message id, or `<none>` when it carried none.
        message_id: String,
        /// What could not be read.
        reason: String,
    },
    /// An `ack` or `nack` could not reach the broker because the channel closed first; the broker
    /// redelivers the message (at-least-once), so the handler must tolerate seeing it again.
    #[error(
        "settling message `{message_id}` failed: the channel closed before the broker got the \
         {settlement}; the message will be redelivered"
    )]
    SettlementLost {
        /// The message's `MessageId`.
        message_id: String,
        /// `ack` or `nack`.
        settlement: &'static str,
    },
    /// The operation did not finish in time (e.g. a publish waiting for a lost connection to
    /// come back); it may be retried.
    #[error("broker {operation} timed out after {after:?}")]
    Timeout {
        /// What was being done.
        operation: String,
        /// The bound that elapsed.
        after: std::time::Duration,
        /// The last failure of the attempts made before the bound elapsed, if any.
        #[source]
        source: Option<Box<BrokerError>>,
    },
    /// The broker client failed (connection refused or lost, channel closed by the server...).
    #[error("broker {operation} failed")]
    Transport {
        /// What was being done, e.g. `connect` or `queue.declare \`orders\``.
        operation: String,
        /// The client's error.
        #[source]
        source: TransportError,
    },
}

impl BrokerError {
    /// The error's type and variant, as metrics and spans name it (`error.type`).
    pub(crate) fn type_name(&self) -> &'static str {
        match self {
            Self::InvalidDestination { .. } => "chatter_runtime::BrokerError::InvalidDestination",
            Self::InvalidMessage { .. } => "chatter_runtime::BrokerError::InvalidMessage",
            Self::Rejected { .. } => "chatter_runtime::BrokerError::Rejected",
            Self::Undecodable { .. } => "chatter_runtime::BrokerError::Undecodable",
            Self::SettlementLost { .. } => "chatter_runtime::BrokerError::SettlementLost",
            Self::Timeout { .. } => "chatter_runtime::BrokerError::Timeout",
            Self::Transport { .. } => "chatter_runtime::BrokerError::Transport",
        }
    }

    /// Whether the broker will refuse this message every time, whatever the state of the broker
    /// or the connection: [`InvalidDestination`](Self::InvalidDestination) and
    /// [`InvalidMessage`](Self::InvalidMessage), verdicts on the message's own fields.
    ///
    /// The relay stamps a pending Outbox Document whose publish fails permanently
    /// `undeliverable` instead of retrying it forever; every other error (a lost connection, a
    /// publisher-confirm nack, a timeout) is transient and the document is published again.
    pub fn is_permanent(&self) -> bool {
        matches!(
            self,
            Self::InvalidDestination { .. } | Self::InvalidMessage { .. }
        )
    }

    /// A [`BrokerError::Transport`] for `operation`.
    pub fn transport(operation: impl Into<String>, source: impl Into<TransportError>) -> Self {
        Self::Transport {
            operation: operation.into(),
            source: source.into(),
        }
    }
}
