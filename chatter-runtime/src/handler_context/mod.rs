//! What a handler receives beside its command: the delivery's identity, the Atomic-Write Handle and
//! the outbox.

mod error;
mod read;

pub use error::StageError;
pub(crate) use read::ReadScope;
pub use read::{ETag, Query, ReadError, Versioned};

use std::sync::Arc;

use serde::Serialize;
use serde::de::DeserializeOwned;
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

/// A standalone-inbox command's sent messages: Outbox Documents of the idempotency container,
/// committed with the marker's completion.
#[derive(Debug)]
struct InboxSends {
    command: &'static str,
    paths: &'static [PartitionKeyPath],
    key: Vec<Value>,
    outbox: Vec<Value>,
}

/// The handler's view of the delivery it is handling.
///
/// For a participant (a registered command whose partition key resolved) every write staged here
/// and every message sent to the outbox commits in the delivery's one TransactionalBatch, after
/// the handler returns `Ok`. Nothing is written before that, and nothing at all if the handler fails.
///
/// # Examples
///
/// ```no_run
/// use chatter_runtime::{BoxError, HandlerContext};
/// use serde_json::json;
///
/// // Inside a `#[handler]` of a command partitioned on `/orderId`:
/// async fn stage(ctx: &mut HandlerContext, order_id: &str) -> Result<(), BoxError> {
///     // Reads see what is committed now.
///     if ctx.read::<serde_json::Value>(order_id).await?.is_some() {
///         return Ok(()); // placed before: nothing to write, nothing to send
///     }
///     ctx.upsert(json!({ "id": order_id, "orderId": order_id, "status": "placed" }))?;
///     // Committed with the writes, published once they commit.
///     let event_id = format!("{}:OrderPlaced", ctx.message_id());
///     ctx.send_json(&event_id, "order-events", &json!({ "orderId": order_id }))?;
///     Ok(())
/// }
/// ```
pub struct HandlerContext {
    message_id: String,
    redelivered: bool,
    handle: Option<AtomicWriteHandle>,
    /// Messages sent while no batch is active (a pass-through delivery): published after the
    /// handler succeeds.
    direct: Vec<BrokeredMessage>,
    /// Where a standalone-inbox command's sent messages go instead.
    inbox: Option<InboxSends>,
    /// The runtime's brokers, asked whether the one a sent message's messaging system names
    /// could ever carry it.
    broker: Arc<dyn Broker>,
    /// The delivery's partition, for reads (`None` when the delivery passes through).
    reads: Option<ReadScope>,
    /// The application state the runtime was given.
    state: Arc<crate::state::AppState>,
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
        handle: Option<(AtomicWriteHandle, ReadScope)>,
        broker: Arc<dyn Broker>,
        state: Arc<crate::state::AppState>,
    ) -> Self {
        let (handle, reads) = handle.unzip();
        Self {
            message_id,
            redelivered,
            handle,
            direct: Vec::new(),
            inbox: None,
            broker,
            reads,
            state,
        }
    }

    /// The context of a standalone-inbox command `command`: no batch, and its sent messages
    /// become Outbox Documents of the message id's partition at `paths` (no paths: the
    /// command names no lease, and a send is refused).
    pub(crate) fn for_inbox(
        message_id: String,
        redelivered: bool,
        command: &'static str,
        paths: &'static [PartitionKeyPath],
        broker: Arc<dyn Broker>,
        state: Arc<crate::state::AppState>,
    ) -> Self {
        let mut ctx = Self::new(message_id.clone(), redelivered, None, broker, state);
        ctx.inbox = Some(InboxSends {
            command,
            paths,
            key: vec![Value::String(message_id)],
            outbox: Vec::new(),
        });
        ctx
    }

    /// The Outbox Documents a standalone-inbox command's handler sent.
    pub(crate) fn into_inbox_outbox(self) -> Vec<Value> {
        self.inbox.map(|sends| sends.outbox).unwrap_or_default()
    }

    /// The application state of type `T` the runtime was given, if it was.
    pub(crate) fn state<T: Send + Sync + 'static>(&self) -> Option<crate::state::State<T>> {
        self.state.get::<T>()
    }

    /// Reads the document `id` of this delivery's partition as a `T`, with its [`ETag`];
    /// `None` when there is none. The read sees what is committed now (it is not part of the
    /// batch); its request charge counts to the command.
    ///
    /// # Errors
    ///
    /// No batch is active (nothing to read), the store failed, or the document is not a `T`.
    pub async fn read<T: DeserializeOwned>(
        &self,
        id: &str,
    ) -> Result<Option<Versioned<T>>, ReadError> {
        self.reads
            .as_ref()
            .ok_or(ReadError::NoActiveBatch)?
            .read(id)
            .await
    }

    /// Runs `query` within this delivery's partition and returns every item as a `T`, with its
    /// [`ETag`] (select whole documents, `SELECT * FROM c WHERE ...`, to get them). Like
    /// [`read`](Self::read), it sees committed state and its charge counts to the command.
    ///
    /// ```no_run
    /// # async fn demo(ctx: &chatter_runtime::HandlerContext) -> Result<(), Box<dyn std::error::Error>> {
    /// use chatter_runtime::Query;
    /// let query = Query::from("SELECT * FROM c WHERE c.kind = @kind").with_parameter("@kind", "seat")?;
    /// let seats = ctx.query::<serde_json::Value>(query).await?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// As [`read`](Self::read).
    pub async fn query<T: DeserializeOwned>(
        &self,
        query: Query,
    ) -> Result<Vec<Versioned<T>>, ReadError> {
        self.reads
            .as_ref()
            .ok_or(ReadError::NoActiveBatch)?
            .query(query)
            .await
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
        self.stage_replace(id, doc, None)
    }

    /// Stages a replace of the document `id` with `doc` that commits only while the stored
    /// document is still the version `etag` names (from [`read`](Self::read) or
    /// [`query`](Self::query)): if another delivery changed it since, the whole batch fails as
    /// a conflict ([`BatchFailure::Conflict`](crate::error::BatchFailure::Conflict)), nothing commits,
    /// and the delivery is tried again (the handler then reads the new version).
    pub fn replace_if_match(
        &mut self,
        id: &str,
        doc: impl Serialize,
        etag: &ETag,
    ) -> Result<(), StageError> {
        self.stage_replace(id, doc, Some(etag.0.clone()))
    }

    fn stage_replace(
        &mut self,
        id: &str,
        doc: impl Serialize,
        if_match: Option<String>,
    ) -> Result<(), StageError> {
        document::guard_not_reserved(id)?;
        let id = id.to_owned();
        let doc = serde_json::to_value(doc).map_err(StageError::Encode)?;
        let handle = self.handle()?;
        handle.ensure_room()?;
        handle.check_document(&doc)?;
        handle
            .writes
            .push(BatchOperation::Replace { id, doc, if_match });
        Ok(())
    }

    /// Stages a delete of the document `id` (in this delivery's partition) in the batch.
    pub fn delete(&mut self, id: &str) -> Result<(), StageError> {
        self.stage_delete(id, None)
    }

    /// Stages a delete of the document `id` that commits only while it is still the version
    /// `etag` names (see [`replace_if_match`](Self::replace_if_match)).
    pub fn delete_if_match(&mut self, id: &str, etag: &ETag) -> Result<(), StageError> {
        self.stage_delete(id, Some(etag.0.clone()))
    }

    fn stage_delete(&mut self, id: &str, if_match: Option<String>) -> Result<(), StageError> {
        document::guard_not_reserved(id)?;
        let handle = self.handle()?;
        handle.ensure_room()?;
        handle.writes.push(BatchOperation::Delete {
            id: id.to_owned(),
            if_match,
        });
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
    /// or content type), and one the broker its messaging system names (the default broker
    /// when it names none, as the relay chooses) would refuse every time
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
            None => match self.inbox.as_mut() {
                Some(sends) => {
                    if sends.paths.is_empty() {
                        return Err(StageError::InboxWithoutLease {
                            command: sends.command,
                        });
                    }
                    // The marker's completion is one more operation of the batch.
                    if sends.outbox.len() + 1 >= MAX_BATCH_OPERATIONS {
                        return Err(StageError::TooManyOperations {
                            limit: MAX_BATCH_OPERATIONS,
                        });
                    }
                    let doc = document::OutboxDocument::build(&message, sends.paths, &sends.key)?;
                    document::outbox_contract::verify(&doc)?;
                    self.broker.check(&message)?;
                    sends.outbox.push(doc);
                }
                None => {
                    self.broker.check(&message)?;
                    self.direct.push(message);
                }
            },
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
