//! What a handler receives beside its command: the delivery's identity, the Atomic-Write Handle and
//! the outbox.

mod error;

pub use error::StageError;

use std::sync::Arc;

use serde::Serialize;
use serde_json::Value;

use crate::broker::Broker;
use crate::cosmos::store::BatchOperation;
use crate::document;
use crate::message::BrokeredMessage;
use crate::partition_key::{self, PartitionKeyPath};

/// Cosmos's limit on operations in one TransactionalBatch.
pub(crate) const MAX_BATCH_OPERATIONS: usize = 100;

/// The Atomic-Write Handle of a participant delivery: the partition and the operations staged so
/// far. Staging and counting are one action.
#[derive(Debug)]
pub(crate) struct AtomicWriteHandle {
    pub(crate) partition_key_paths: &'static [PartitionKeyPath],
    pub(crate) partition_key: Vec<Value>,
    /// Op 0 (the inbox marker) is staged by the pipeline; the handler's writes follow.
    pub(crate) writes: Vec<BatchOperation>,
    pub(crate) outbox: Vec<Value>,
}

impl AtomicWriteHandle {
    /// Operations in the batch, counting the inbox marker.
    pub(crate) fn staged_operation_count(&self) -> usize {
        1 + self.writes.len() + self.outbox.len()
    }

    fn ensure_room(&self) -> Result<(), StageError> {
        if self.staged_operation_count() >= MAX_BATCH_OPERATIONS {
            return Err(StageError::TooManyOperations {
                limit: MAX_BATCH_OPERATIONS,
            });
        }
        Ok(())
    }

    /// A handler document must carry the batch's partition-key values at the container's paths.
    fn check_document(&self, doc: &Value) -> Result<(), StageError> {
        let Some(object) = doc.as_object() else {
            return Err(StageError::NotAnObject);
        };
        if let Some(Value::String(id)) = object.get("id") {
            document::guard_not_reserved(id)?;
        }
        let found = partition_key::read_back(doc, self.partition_key_paths);
        if found.as_deref() != Some(self.partition_key.as_slice()) {
            return Err(StageError::PartitionKeyMismatch {
                paths: partition_key::display(self.partition_key_paths),
                expected: Value::Array(self.partition_key.clone()).to_string(),
                found: found.map_or_else(|| "nothing".to_owned(), |v| Value::Array(v).to_string()),
            });
        }
        Ok(())
    }
}

/// The handler's view of the delivery it is handling.
///
/// For a participant (a registered command whose partition key resolved) every write staged here
/// and every message sent to the outbox commits in the delivery's one TransactionalBatch, after
/// the handler returns `Ok`. Nothing is written before that, and nothing at all if the handler fails.
pub struct HandlerContext {
    message_id: String,
    redelivered: bool,
    handle: Option<AtomicWriteHandle>,
    /// Messages sent while no batch is active (a pass-through delivery): published after the
    /// handler succeeds.
    direct: Vec<BrokeredMessage>,
    /// The configured broker, asked whether it could ever carry a sent message.
    broker: Arc<dyn Broker>,
}

impl std::fmt::Debug for HandlerContext {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HandlerContext")
            .field("message_id", &self.message_id)
            .field("redelivered", &self.redelivered)
            .field("handle", &self.handle)
            .field("direct", &self.direct)
            .finish_non_exhaustive()
    }
}

impl HandlerContext {
    /// A context for one delivery; `handle` is `None` when the delivery passes through.
    pub(crate) fn new(
        message_id: String,
        redelivered: bool,
        handle: Option<AtomicWriteHandle>,
        broker: Arc<dyn Broker>,
    ) -> Self {
        Self {
            message_id,
            redelivered,
            handle,
            direct: Vec::new(),
            broker,
        }
    }

    pub(crate) fn into_parts(self) -> (Option<AtomicWriteHandle>, Vec<BrokeredMessage>) {
        (self.handle, self.direct)
    }

    /// The inbound message id, the identity the inbox marker deduplicates by.
    pub fn message_id(&self) -> &str {
        &self.message_id
    }

    /// Whether the broker delivered this message before.
    pub fn redelivered(&self) -> bool {
        self.redelivered
    }

    /// The resolved partition-key values of this delivery's batch, or `None` when it passes through.
    pub fn partition_key(&self) -> Option<&[Value]> {
        self.handle.as_ref().map(|h| h.partition_key.as_slice())
    }

    /// Operations staged so far, counting the inbox marker (0 when no batch is active).
    pub fn staged_operation_count(&self) -> usize {
        self.handle
            .as_ref()
            .map_or(0, AtomicWriteHandle::staged_operation_count)
    }

    fn handle(&mut self) -> Result<&mut AtomicWriteHandle, StageError> {
        self.handle.as_mut().ok_or(StageError::NoActiveBatch)
    }

    fn stage(
        &mut self,
        doc: impl Serialize,
        op: fn(Value) -> BatchOperation,
    ) -> Result<(), StageError> {
        let doc = serde_json::to_value(doc).map_err(StageError::Encode)?;
        let handle = self.handle()?;
        handle.ensure_room()?;
        handle.check_document(&doc)?;
        handle.writes.push(op(doc));
        Ok(())
    }

    /// Stages a create of `doc` in the batch.
    pub fn create(&mut self, doc: impl Serialize) -> Result<(), StageError> {
        self.stage(doc, BatchOperation::Create)
    }

    /// Stages an upsert of `doc` in the batch.
    pub fn upsert(&mut self, doc: impl Serialize) -> Result<(), StageError> {
        self.stage(doc, BatchOperation::Upsert)
    }

    /// Stages a replace of the document `id` with `doc` in the batch.
    pub fn replace(&mut self, id: &str, doc: impl Serialize) -> Result<(), StageError> {
        document::guard_not_reserved(id)?;
        let id = id.to_owned();
        let doc = serde_json::to_value(doc).map_err(StageError::Encode)?;
        let handle = self.handle()?;
        handle.ensure_room()?;
        handle.check_document(&doc)?;
        handle.writes.push(BatchOperation::Replace { id, doc });
        Ok(())
    }

    /// Stages a delete of the document `id` (in this delivery's partition) in the batch.
    pub fn delete(&mut self, id: &str) -> Result<(), StageError> {
        document::guard_not_reserved(id)?;
        let handle = self.handle()?;
        handle.ensure_room()?;
        handle
            .writes
            .push(BatchOperation::Delete { id: id.to_owned() });
        Ok(())
    }

    /// Sends `message` through the outbox.
    ///
    /// For a participant the Outbox Document is staged in the batch and the relay publishes it after
    /// the batch commits. For a pass-through delivery the message is published directly once the
    /// handler has succeeded.
    ///
    /// A message that could never be published is refused here, before anything is staged: one
    /// whose Outbox Document would violate the Outbox Document Contract (e.g. a blank destination
    /// or content type), and one the configured broker would refuse every time
    /// ([`Broker::check`], e.g. an id longer than AMQP allows). A handler therefore never writes
    /// a document the relay would have to stamp `undeliverable`.
    pub fn send(&mut self, mut message: BrokeredMessage) -> Result<(), StageError> {
        crate::telemetry::trace_context::persist_current(&mut message);
        match self.handle.as_mut() {
            Some(handle) => {
                handle.ensure_room()?;
                let doc = document::OutboxDocument::build(
                    &message,
                    handle.partition_key_paths,
                    &handle.partition_key,
                )?;
                document::outbox_contract::verify(&doc)?;
                self.broker.check(&message)?;
                handle.outbox.push(doc);
            }
            None => {
                self.broker.check(&message)?;
                self.direct.push(message);
            }
        }
        Ok(())
    }

    /// Sends `body` as JSON under `message_id` to `destination` through the outbox (see
    /// [`send`](Self::send)).
    ///
    /// The arguments come in the order of [`BrokeredMessage::json`]: the message's identity,
    /// then where it goes, then what it says.
    pub fn send_json(
        &mut self,
        message_id: &str,
        destination: &str,
        body: &impl Serialize,
    ) -> Result<(), StageError> {
        let body = serde_json::to_string(body).map_err(StageError::Encode)?;
        self.send(BrokeredMessage::json(message_id, destination, body))
    }
}
