//! The Brokered Message: what travels on the broker and what an Outbox Document carries.

use serde_json::{Map, Value};

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
