//! What a handler receives beside its command.

/// The handler's view of the delivery it is handling.
#[derive(Debug)]
pub struct HandlerContext {
    message_id: String,
    redelivered: bool,
}

impl HandlerContext {
    /// A context for one delivery.
    pub(crate) fn new(message_id: String, redelivered: bool) -> Self {
        Self { message_id, redelivered }
    }

    /// The inbound message id, the identity the inbox marker deduplicates by.
    pub fn message_id(&self) -> &str {
        &self.message_id
    }

    /// Whether the broker delivered this message before.
    pub fn redelivered(&self) -> bool {
        self.redelivered
    }
}
