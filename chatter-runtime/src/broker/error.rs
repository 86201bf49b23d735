//! What can go wrong talking to a broker.

/// The source of a [`BrokerError::Transport`]: the underlying client's error.
pub type TransportError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// An error from a [`Broker`](super::Broker), a [`Subscription`](super::Subscription) or the
/// settlement of a [`Delivery`](super::Delivery).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum BrokerError {
    /// The destination cannot name a queue on this broker (empty, or too long for AMQP): a
    /// protocol limit no broker setting can lift.
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
    /// The broker did not take responsibility for the message (the publisher confirm was a
    /// nack): it was not published and may be retried.
    #[error("the broker refused message `{message_id}` for `{destination}`: {reason}")]
    Rejected {
        /// The message's `MessageId`.
        message_id: String,
        /// The message's `Destination`.
        destination: String,
        /// What the broker answered.
        reason: String,
    },
    /// The broker refuses the destination or the message because of how it is set up (a
    /// permission, a queue declared with other arguments, a message-size limit, no route):
    /// nothing was published. An operator can change that setting, after which the same message
    /// is taken, so this is never a verdict on the message: the relay keeps the document pending
    /// and publishes it once the broker takes it.
    #[error("the broker refuses `{destination}`: {reply}; {fix}", fix = refusal.fix())]
    Refused {
        /// The message's `Destination`.
        destination: String,
        /// What kind of setting refuses it.
        refusal: Refusal,
        /// The broker's own reply, e.g. `406 PRECONDITION_FAILED - inequivalent arg 'durable'`.
        reply: String,
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
    /// The broker is set up in a way chatter cannot rely on (found by
    /// [`Broker::verify`](super::Broker::verify) when the runtime starts): `setting` names what
    /// to change and `fix` how.
    #[error("broker setting {setting} {problem}; {fix}")]
    Misconfigured {
        /// The setting, e.g. ``duplicate_window of stream `ORDERS` ``.
        setting: String,
        /// What is wrong with its value.
        problem: String,
        /// What an operator does about it.
        fix: String,
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
            Self::InvalidDestination { .. } => error_type!(BrokerError::InvalidDestination),
            Self::InvalidMessage { .. } => error_type!(BrokerError::InvalidMessage),
            Self::Rejected { .. } => error_type!(BrokerError::Rejected),
            Self::Refused { .. } => error_type!(BrokerError::Refused),
            Self::Undecodable { .. } => error_type!(BrokerError::Undecodable),
            Self::SettlementLost { .. } => error_type!(BrokerError::SettlementLost),
            Self::Timeout { .. } => error_type!(BrokerError::Timeout),
            Self::Misconfigured { .. } => error_type!(BrokerError::Misconfigured),
            Self::Transport { .. } => error_type!(BrokerError::Transport),
        }
    }

    /// Whether the broker will refuse this message every time, whatever the state of the broker,
    /// its settings or the connection: [`InvalidDestination`](Self::InvalidDestination) and
    /// [`InvalidMessage`](Self::InvalidMessage), verdicts on the message's own fields against
    /// the protocol's limits.
    ///
    /// The relay stamps a pending Outbox Document whose publish fails permanently
    /// `undeliverable` instead of retrying it forever; every other error (a lost connection, a
    /// publisher-confirm nack, a timeout, a [refusal](Self::Refused) an operator can lift) is
    /// not, and the document is published again.
    pub fn is_permanent(&self) -> bool {
        matches!(
            self,
            Self::InvalidDestination { .. } | Self::InvalidMessage { .. }
        )
    }

    /// The setting that refuses the message, when the broker [refused](Self::Refused) it.
    pub fn refusal(&self) -> Option<Refusal> {
        match self {
            Self::Refused { refusal, .. } => Some(*refusal),
            _ => None,
        }
    }

    /// A [`BrokerError::Transport`] for `operation`.
    pub fn transport(operation: impl Into<String>, source: impl Into<TransportError>) -> Self {
        Self::Transport {
            operation: operation.into(),
            source: source.into(),
        }
    }
}

/// What kind of broker setting [refuses](BrokerError::Refused) a destination or a message; each
/// names the fix an operator applies.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Refusal {
    /// The broker's user may not declare or write to the destination (AMQP 403
    /// `ACCESS_REFUSED`).
    AccessRefused,
    /// The destination exists with other settings than the ones it is declared with, e.g. a
    /// queue another service declared non-durable (AMQP 406 `PRECONDITION_FAILED` on
    /// `queue.declare`).
    ConflictingDeclaration,
    /// The destination is held exclusively by another connection (AMQP 405 `RESOURCE_LOCKED`).
    Locked,
    /// The message is larger than the broker is configured to take (AMQP 406
    /// `PRECONDITION_FAILED` on `basic.publish`).
    TooLarge,
    /// The broker has no route to the destination (the message was returned as unroutable).
    Unroutable,
    /// No stream of the broker stores the destination's subject (NATS JetStream: the publish
    /// found no responders).
    NoStream,
    /// The message's context names a messaging system (`Chatter.Infrastructure.Type`) the
    /// runtime has no broker for ([`MessagingSystems`](super::MessagingSystems)).
    UnknownMessagingSystem,
}

impl Refusal {
    /// What an operator changes so the broker takes the message.
    pub fn fix(self) -> &'static str {
        match self {
            Self::AccessRefused => {
                "grant the broker user the configure and write permissions on the destination \
                 (RabbitMQ: `rabbitmqctl set_permissions`)"
            }
            Self::ConflictingDeclaration => {
                "the destination exists with other settings than chatter declares (a durable \
                 classic or quorum queue without arguments besides x-queue-type and \
                 x-delivery-limit): delete it or declare it so, and the waiting messages are \
                 published"
            }
            Self::Locked => {
                "another connection holds the destination exclusively: close that connection or \
                 make the queue non-exclusive"
            }
            Self::TooLarge => {
                "the message is larger than the broker's configured maximum: raise the limit \
                 (RabbitMQ: `max_message_size`)"
            }
            Self::Unroutable => {
                "the broker has no route to the destination: declare the queue or bind it"
            }
            Self::NoStream => {
                "no JetStream stream stores the subject: add it to a stream's subjects \
                 (`nats stream edit <stream> --subjects ...`, or `nats stream add`)"
            }
            Self::UnknownMessagingSystem => {
                "register a broker under that name (`RuntimeBuilder::broker_for`) and restart, \
                 or correct the message context's `Chatter.Infrastructure.Type`"
            }
        }
    }
}
