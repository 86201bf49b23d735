//! The document tier: the Document-Tier Batch-Lifecycle Behavior around every handler call.
//!
//! For a participant delivery: resolve the partition key, require a message id, stage the inbox
//! marker as op 0, run the handler (which stages its writes and outbox documents), then execute the
//! one TransactionalBatch exactly once. A 409 on op 0 is only a *candidate* duplicate: it is
//! acknowledged only after a point-read proves the conflicting document is a genuine inbox marker
//! for the same message id.

mod error;
mod rejection;

pub use error::{BatchFailure, PipelineError};
use error::{INBOX_NOT_UNDONE, NOTHING_COMMITTED};
pub use rejection::Rejection;

use std::panic::AssertUnwindSafe;
use std::sync::Arc;

use futures::FutureExt;
use serde_json::Value;

use crate::atomic_write::{AtomicWriteHandle, HandlerContext, ReadScope};
use crate::backoff;
use crate::broker::Broker;
use crate::cosmos::charge::RequestMeter;
use crate::cosmos::store::{self, BatchOperation};
use crate::cosmos::{
    ContainerClient, CosmosConnection, CosmosStoreError, PartitionKey, ReadOutcome,
};
use crate::document;
use crate::inbox::{InboxOutcome, StandaloneInbox};
use crate::partition_key;
use crate::registry::RegisteredCommand;
use crate::relay::after_commit::{AfterCommit, Committed};
use crate::state::AppState;
use std::collections::HashMap;

/// How a delivery ended when it did not fail.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Outcome {
    /// The batch committed: the inbox marker, the handler's writes and its outbox documents.
    Committed {
        /// Operations in the batch, the inbox marker included.
        operations: usize,
    },
    /// The inbox marker already existed for this message id: nothing was committed again.
    Duplicate,
    /// A standalone-inbox command's handler ran to completion and its marker is completed
    /// (`taken_over`: a pending marker of an earlier attempt was taken over).
    InboxCompleted {
        /// Whether an earlier attempt's pending marker was taken over.
        taken_over: bool,
    },
    /// The command's partition key did not resolve, so exactly-once was **not** in force: no
    /// batch and no inbox marker guarded the delivery. The handler ran, its writes were refused
    /// and its messages were published directly; a redelivery runs it again.
    HandledAtLeastOnce,
}

/// Runs handlers inside the batch lifecycle.
#[derive(Clone)]
pub(crate) struct Pipeline {
    cosmos: CosmosConnection,
    broker: Arc<dyn Broker>,
    charges: Arc<RequestMeter>,
    state: Arc<AppState>,
    /// The Standalone Inbox Gate of each standalone-inbox command, by command name.
    inboxes: Arc<HashMap<&'static str, StandaloneInbox>>,
    /// Publish after commit, by the database and container a command writes (empty: off).
    after_commit: Arc<HashMap<(String, String), AfterCommit>>,
}

impl std::fmt::Debug for Pipeline {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pipeline")
            .field("cosmos", &self.cosmos)
            .finish_non_exhaustive()
    }
}

impl Pipeline {
    /// A pipeline writing through `cosmos` and publishing pass-through messages on `broker`
    /// (the runtime's brokers by messaging system, as the relay publishes, so a handler's send
    /// is checked against and published to the broker its message names), summing what its
    /// requests were billed in `charges`.
    pub(crate) fn new(
        cosmos: CosmosConnection,
        broker: Arc<dyn Broker>,
        charges: Arc<RequestMeter>,
        state: Arc<AppState>,
    ) -> Self {
        Self {
            cosmos,
            broker,
            charges,
            state,
            inboxes: Arc::default(),
            after_commit: Arc::default(),
        }
    }

    /// The same pipeline publishing each committed batch's Outbox Documents right after the
    /// commit, where `after_commit` has the command's container.
    pub(crate) fn with_after_commit(
        mut self,
        after_commit: HashMap<(String, String), AfterCommit>,
    ) -> Self {
        self.after_commit = Arc::new(after_commit);
        self
    }

    /// The same pipeline handling standalone-inbox commands through `inboxes` (by command name).
    pub(crate) fn with_inboxes(mut self, inboxes: HashMap<&'static str, StandaloneInbox>) -> Self {
        self.inboxes = Arc::new(inboxes);
        self
    }

    /// Handles one delivery of `command` whose body (the command's JSON) is `body`.
    pub(crate) async fn handle(
        &self,
        command: &RegisteredCommand,
        body: Value,
        message_id: &str,
        redelivered: bool,
    ) -> Result<Outcome, PipelineError> {
        let registration = command.registration;
        let name = registration.command_name;
        if registration.standalone_inbox.is_some() {
            return self
                .handle_inbox(command, body, message_id, redelivered)
                .await;
        }
        let Some(partition_key) = registration.resolve_partition_key(&body) else {
            return self
                .pass_through(command, body, message_id, redelivered)
                .await;
        };
        if message_id.trim().is_empty() {
            return Err(PipelineError::MissingMessageId { command: name });
        }
        let paths = registration.partition_key;
        let marker_error = |source| PipelineError::Marker {
            command: name,
            message_id: message_id.to_owned(),
            source,
        };
        let marker_id = document::inbox_id(message_id).map_err(marker_error)?;
        let marker = document::inbox_marker(
            message_id,
            paths,
            &partition_key,
            crate::inbox::claim::now_utc(),
        )
        .map_err(marker_error)?;
        // Resolve the container and key before the handler runs: a key Cosmos cannot take (an
        // array or object value) fails before any side effect of the handler.
        let cosmos_error = |source| PipelineError::Cosmos {
            command: name,
            message_id: message_id.to_owned(),
            source: Box::new(source),
        };
        let container = self
            .cosmos
            .container(registration.database, registration.container)
            .await
            .map_err(cosmos_error)?;
        let key = partition_key::sdk_key(&partition_key).map_err(|e| cosmos_error(e.into()))?;
        let handle = AtomicWriteHandle {
            partition_key_paths: paths,
            partition_key: partition_key.clone(),
            writes: Vec::new(),
            outbox: Vec::new(),
        };
        let reads = ReadScope {
            container: Arc::clone(&container),
            partition_key: key.clone(),
            charges: Arc::clone(&self.charges),
        };
        let mut ctx = HandlerContext::new(
            message_id.to_owned(),
            redelivered,
            Some((handle, reads)),
            Arc::clone(&self.broker),
            Arc::clone(&self.state),
        );
        run_handler(command, body, &mut ctx, NOTHING_COMMITTED).await?;
        let (handle, _) = ctx.into_parts();
        let handle = handle.expect("a participant context keeps its handle");

        // What publish after commit needs of the Outbox Documents, the batch consumes them.
        let after_commit = self
            .after_commit
            .get(&(
                registration.database.to_owned(),
                registration.container.to_owned(),
            ))
            .filter(|_| !handle.outbox.is_empty());
        let outbox = after_commit.map(|_| handle.outbox.clone());
        // With publish after commit, one batch of a key at a time in this process: the order
        // its dispatches are numbered in is the key's commit order. Taken before the documents
        // are marked, so that on a failure their marks are dropped before the turn is.
        let turn = match after_commit {
            Some(after_commit) => Some(after_commit.turn(&partition_key).await),
            None => None,
        };
        let ids: Vec<String> = outbox
            .iter()
            .flatten()
            .map(|document| {
                document
                    .get(document::outbox::ID_FIELD)
                    .and_then(Value::as_str)
                    .unwrap_or_default()
                    .to_owned()
            })
            .collect();
        // Marked before the batch executes: the relay here may read them before it returns.
        let tickets = after_commit.map(|after_commit| after_commit.begin(&partition_key, &ids));
        let mut operations = Vec::with_capacity(handle.staged_operation_count());
        operations.push(BatchOperation::Create(marker));
        operations.extend(handle.writes);
        let writes = operations.len();
        operations.extend(handle.outbox.into_iter().map(BatchOperation::Create));
        let count = operations.len();
        // What each operation is, to name the one that fails (the batch consumes them).
        let labels: Vec<(&'static str, String)> = operations
            .iter()
            .enumerate()
            .map(|(i, op)| {
                let kind = if i >= writes {
                    "outbox create"
                } else {
                    op.kind()
                };
                (kind, op.id().to_owned())
            })
            .collect();

        let outcome = store::execute_batch(&container, key.clone(), operations)
            .await
            .map_err(cosmos_error)?;
        self.charges.command(outcome.request_charge);
        if outcome.is_success() {
            tracing::debug!(
                command = name,
                message_id,
                operations = count,
                request_charge = outcome.request_charge,
                "chatter batch committed"
            );
            if let (Some(after_commit), Some(outbox), Some(tickets)) =
                (after_commit, outbox, tickets)
            {
                let committed_at = std::time::Instant::now();
                let committed: Vec<Committed> = ids
                    .into_iter()
                    .zip(outbox)
                    .zip(outcome.operations.iter().skip(writes))
                    .map(|((id, document), written)| Committed {
                        id,
                        document,
                        etag: written.etag.clone(),
                    })
                    .collect();
                let number = after_commit.committed(&tickets, &committed);
                drop(turn);
                // Beside the command, which it never fails: what it does not publish, the
                // relay does.
                after_commit.spawn_publish(
                    partition_key.clone(),
                    committed,
                    tickets,
                    number,
                    committed_at,
                );
            }
            return Ok(Outcome::Committed { operations: count });
        }

        let statuses = outcome.status_codes();
        let failed_because = |reason: BatchFailure, source: Option<Box<CosmosStoreError>>| {
            PipelineError::BatchFailed {
                command: name,
                message_id: message_id.to_owned(),
                reason,
                status: outcome.status,
                operation_statuses: statuses.clone(),
                source,
            }
        };
        let failed = |reason: BatchFailure| failed_because(reason, None);
        if statuses.first() != Some(&409) {
            return Err(failed(failed_operation(&labels, &statuses)));
        }
        // A candidate duplicate: confirm against the conflicting document itself.
        match self
            .read_marker(&container, key, &marker_id, message_id)
            .await
        {
            Ok(Marker::Genuine) => {
                tracing::debug!(
                    command = name,
                    message_id,
                    "chatter duplicate delivery: inbox marker exists, nothing committed"
                );
                Ok(Outcome::Duplicate)
            }
            Ok(Marker::Foreign) => Err(failed(BatchFailure::ForeignMarker { marker_id })),
            Ok(Marker::Missing) => Err(failed(BatchFailure::MarkerMissing { marker_id })),
            Err(e) => Err(failed_because(
                BatchFailure::ConfirmationFailed,
                Some(Box::new(e)),
            )),
        }
    }

    /// Point-reads document `marker_id` (its charge counted to the command) and tells whether
    /// it is `message_id`'s inbox marker.
    async fn read_marker(
        &self,
        container: &ContainerClient,
        key: PartitionKey,
        marker_id: &str,
        message_id: &str,
    ) -> Result<Marker, CosmosStoreError> {
        let (read, request_charge) = store::read_item_charged(container, key, marker_id).await?;
        self.charges.command_extra(request_charge);
        Ok(match read {
            ReadOutcome::Found { document, .. }
                if document::is_genuine_inbox_marker(&document, message_id) =>
            {
                Marker::Genuine
            }
            ReadOutcome::Found { .. } => Marker::Foreign,
            ReadOutcome::NotFound => Marker::Missing,
        })
    }

    /// Whether an attempt of `message_id` committed: its inbox marker exists (for a
    /// standalone-inbox command: its claimed marker is completed). A read that fails
    /// (throttled, unavailable, timed out) is tried again with backoff until `timeout` has
    /// passed. `None` when no marker could guard it (the body has no partition key, the id makes
    /// no marker) or no read succeeded within `timeout`.
    pub(crate) async fn committed(
        &self,
        command: &RegisteredCommand,
        body: &Value,
        message_id: &str,
        timeout: std::time::Duration,
    ) -> Option<bool> {
        let registration = command.registration;
        // A standalone-inbox command: its claimed marker says whether it completed.
        if registration.standalone_inbox.is_some() {
            let inbox = self.inboxes.get(registration.command_name)?;
            return inbox.completed(message_id, timeout).await;
        }
        let partition_key = registration.resolve_partition_key(body)?;
        let marker_id = document::inbox_id(message_id).ok()?;
        let key = partition_key::sdk_key(&partition_key).ok()?;
        let deadline = crate::deadline::deadline_after(timeout);
        let mut backoff = backoff::marker_read();
        loop {
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            let read = async {
                let container = self
                    .cosmos
                    .container(registration.database, registration.container)
                    .await?;
                self.read_marker(&container, key.clone(), &marker_id, message_id)
                    .await
            };
            match store::bounded("read_item", left, read).await {
                Ok(marker) => return Some(marker == Marker::Genuine),
                Err(error) => {
                    let delay = backoff.next_delay();
                    if tokio::time::Instant::now() + delay >= deadline {
                        tracing::warn!(command = registration.command_name, message_id, error = %crate::error_chain::ErrorChain(&error), "chatter could not read the inbox marker to tell whether the delivery committed");
                        return None;
                    }
                    tracing::debug!(command = registration.command_name, message_id, error = %crate::error_chain::ErrorChain(&error), "reading the inbox marker failed; asking again");
                    tokio::time::sleep(delay).await;
                }
            }
        }
    }

    /// A standalone-inbox command: the handler runs inside the gate (no batch); its sent
    /// messages commit as Outbox Documents in one batch with the marker's completion, and the
    /// relay of the idempotency container publishes them. So a broker outage after the
    /// handler's side effect never runs it again, and no sent message is lost.
    async fn handle_inbox(
        &self,
        command: &RegisteredCommand,
        body: Value,
        message_id: &str,
        redelivered: bool,
    ) -> Result<Outcome, PipelineError> {
        let name = command.registration.command_name;
        let inbox_error = |source| PipelineError::Inbox {
            command: name,
            message_id: message_id.to_owned(),
            source,
        };
        let Some(inbox) = self.inboxes.get(name) else {
            return Err(inbox_error(crate::inbox::InboxError::NotStarted));
        };
        let handled = inbox
            .receive_committing(message_id, || {
                self.run_inbox(command, body, message_id, redelivered)
            })
            .await;
        match handled {
            Ok(InboxOutcome::AlreadyCompleted) => Ok(Outcome::Duplicate),
            Ok(outcome) => Ok(Outcome::InboxCompleted {
                taken_over: outcome == InboxOutcome::TakenOver,
            }),
            // The handler's own failure keeps its meaning (a rejection stays permanent).
            Err(crate::inbox::InboxError::Handler { source, message_id }) => {
                match source.downcast::<PipelineError>() {
                    Ok(error) => Err(*error),
                    Err(source) => Err(inbox_error(crate::inbox::InboxError::Handler {
                        message_id,
                        source,
                    })),
                }
            }
            Err(error) => Err(inbox_error(error)),
        }
    }

    /// Runs a standalone-inbox command's handler; the Outbox Documents of what it sent, to
    /// commit with its marker's completion.
    async fn run_inbox(
        &self,
        command: &RegisteredCommand,
        body: Value,
        message_id: &str,
        redelivered: bool,
    ) -> Result<Vec<Value>, PipelineError> {
        let registration = command.registration;
        let paths = match registration.standalone_inbox {
            Some(inbox) if !registration.lease.is_empty() => inbox.outbox_partition_key,
            _ => &[],
        };
        let mut ctx = HandlerContext::for_inbox(
            message_id.to_owned(),
            redelivered,
            registration.command_name,
            paths,
            Arc::clone(&self.broker),
            Arc::clone(&self.state),
        );
        run_handler(command, body, &mut ctx, INBOX_NOT_UNDONE).await?;
        Ok(ctx.into_inbox_outbox())
    }

    async fn pass_through(
        &self,
        command: &RegisteredCommand,
        body: Value,
        message_id: &str,
        redelivered: bool,
    ) -> Result<Outcome, PipelineError> {
        let mut ctx = HandlerContext::new(
            message_id.to_owned(),
            redelivered,
            None,
            Arc::clone(&self.broker),
            Arc::clone(&self.state),
        );
        run_handler(command, body, &mut ctx, NOTHING_COMMITTED).await?;
        let (_, direct) = ctx.into_parts();
        for message in direct {
            self.broker
                .publish(message)
                .await
                .map_err(|source| PipelineError::Publish {
                    command: command.registration.command_name,
                    source,
                })?;
        }
        Ok(Outcome::HandledAtLeastOnce)
    }
}

/// Which operation of a batch failed, from the per-operation status codes (the first that is
/// not a success nor a 424, "failed because another did"): a conflict for a 412, a named write
/// for any other; [`BatchFailure::Rejected`] when none can be told.
fn failed_operation(labels: &[(&'static str, String)], statuses: &[u16]) -> BatchFailure {
    let Some((position, status)) = statuses
        .iter()
        .enumerate()
        .find(|(_, status)| **status >= 400 && **status != 424)
    else {
        return BatchFailure::Rejected;
    };
    let Some((operation, id)) = labels.get(position).cloned() else {
        return BatchFailure::Rejected;
    };
    if *status == 412 {
        return BatchFailure::Conflict { operation, id };
    }
    let meaning = match (*status, operation) {
        (409, _) => "a document with this id already exists in the partition",
        (404, _) => "no document with this id exists in the partition",
        (413, _) => "the document is larger than Cosmos allows",
        (400, _) => "Cosmos refused the document as malformed",
        (403, _) => "the account refused the write (a permission, or the partition is full)",
        (429, _) => "the request rate was too large (throttled)",
        _ => "Cosmos refused the operation",
    };
    BatchFailure::WriteFailed {
        operation,
        id,
        status: *status,
        meaning,
    }
}

/// What a point-read of an inbox marker's id found.
#[derive(Debug, PartialEq, Eq)]
enum Marker {
    /// The inbox marker of the message id: an attempt of it committed.
    Genuine,
    /// Another document under the marker's id.
    Foreign,
    /// Nothing.
    Missing,
}

/// Runs the handler (decoding the command first). A panic in either is caught and returned as
/// [`PipelineError::HandlerPanicked`]: a failed attempt like any other, so the consumer retries
/// and then dead-letters the delivery instead of returning it to the broker unsettled, where it
/// would be delivered and panic again without end.
async fn run_handler(
    command: &RegisteredCommand,
    body: Value,
    ctx: &mut HandlerContext,
    undone: &'static str,
) -> Result<(), PipelineError> {
    let name = command.registration.command_name;
    let message_id = ctx.message_id().to_owned();
    let attempt = async {
        let future =
            (command.handler.invoke)(body, ctx).map_err(|source| PipelineError::Decode {
                command: name,
                message_id: message_id.clone(),
                source,
            })?;
        future
            .await
            .map_err(|source| match source.downcast::<Rejection>() {
                Ok(rejection) => PipelineError::Rejected {
                    command: name,
                    message_id: message_id.clone(),
                    undone,
                    rejection: *rejection,
                },
                Err(source) => PipelineError::Handler {
                    command: name,
                    message_id: message_id.clone(),
                    undone,
                    source,
                },
            })
    };
    // Unwind safety: after a panic the context and its staged writes are dropped unused.
    match AssertUnwindSafe(attempt).catch_unwind().await {
        Ok(result) => result,
        Err(payload) => Err(PipelineError::HandlerPanicked {
            command: name,
            message_id,
            undone,
            panic: crate::error_chain::panic_message(payload.as_ref()),
        }),
    }
}
