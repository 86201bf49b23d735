//! The Brokered Message: what travels on the broker and what an Outbox Document carries.

use serde_json::{Map, Value};

/// The context key counting a message's deliveries (absent on the first). Kept with the
/// message: the consumers write it, the brokers and the dead-letter tools read it.
pub const ATTEMPTS_CONTEXT_KEY: &str = "Chatter.Delivery.Attempts";

/// The context key a dead letter carries its reason in.
pub const DEAD_LETTER_REASON_CONTEXT_KEY: &str = "Chatter.DeadLetter.Reason";

/// A message as the broker carries it and as an Outbox Document stores it.
///
/// The body is a string because the Outbox Document stores it as one (`MessageBody`); the relay
/// republishes it verbatim.
#[derive(Debug, Clone, PartialEq)]
pub struct BrokeredMessage {
    /// The message identity every dedup decision is keyed on (`MessageId`).
    pub message_id: String,
    /// Where the broker delivers it (`Destination`).
    pub destination: String,
    /// The body rendered as a string (`MessageBody`).
    pub body: String,
    /// The body's content type, e.g. `application/json` (`MessageContentType`).
    pub content_type: String,
    /// Headers and framework context (`MessageContext`, stored as a JSON string).
    pub context: Map<String, Value>,
}

impl BrokeredMessage {
    /// A JSON message with an empty context.
    pub fn json(
        message_id: impl Into<String>,
        destination: impl Into<String>,
        body: impl Into<String>,
    ) -> Self {
        Self {
            message_id: message_id.into(),
            destination: destination.into(),
            body: body.into(),
            content_type: "application/json".to_owned(),
            context: Map::new(),
        }
    }
}
