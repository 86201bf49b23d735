//! The participant path, phase by phase: stage the inbox marker, run the handler, mark the
//! Outbox Documents for publish after commit, execute the one batch, and on a 409 on the marker
//! confirm the duplicate by a point-read.

use std::sync::Arc;

use serde_json::Value;

use crate::cosmos::store::{self, BatchOperation, BatchOutcome};
use crate::cosmos::{ContainerClient, CosmosStoreError, PartitionKey, ReadOutcome};
use crate::document;
use crate::handler_context::{AtomicWriteHandle, HandlerContext, ReadScope};
use crate::partition_key;
use crate::registry::{CommandRegistration, RegisteredCommand};
use crate::relay::after_commit::{AfterCommit, Committed, KeyTurn, Ticket};

use super::error::NOTHING_COMMITTED;
use super::{BatchFailure, Outcome, Pipeline, PipelineError, run_handler};

/// Where a delivery's batch goes, resolved before the handler runs: a key Cosmos cannot take
/// (an array or object value) fails before any side effect of the handler.
struct BatchTarget {
    marker_id: String,
    container: Arc<ContainerClient>,
    key: PartitionKey,
}

/// The batch's operations, `[marker, writes.., outbox documents..]`, and what each one is, to
/// name the one that fails (the batch consumes them).
struct StagedBatch {
    operations: Vec<BatchOperation>,
    /// How many operations come before the Outbox Documents (the marker and the writes).
    writes: usize,
    labels: Vec<(&'static str, String)>,
}

/// A batch's Outbox Documents on their way to publish after commit: marked in flight before the
/// batch executes (the relay here may read them before it returns), published once it commits.
///
/// Field order is drop order, and it matters: when the batch does not commit, the `tickets`
/// (the documents' in-flight marks) are dropped before the `turn`, so the key's next batch never
/// sees this one's marks.
struct AfterCommitBatch<'a> {
    after_commit: &'a AfterCommit,
    outbox: Vec<Value>,
    ids: Vec<String>,
    tickets: Vec<Ticket>,
    /// One batch of a key at a time in this process: released once the commit is numbered, or,
    /// when the batch does not commit, once the delivery's handling returns (after the
    /// duplicate's confirming read).
    turn: KeyTurn,
}

impl Pipeline {
    /// A participant delivery: marker, handler, one batch, executed once.
    pub(super) async fn handle_in_batch(
        &self,
        command: &RegisteredCommand,
        body: Value,
        message_id: &str,
        redelivered: bool,
        partition_key: Vec<Value>,
    ) -> Result<Outcome, PipelineError> {
        let registration = command.registration;
        let name = registration.command_name;
        let (marker, target) = self
            .batch_target(registration, message_id, &partition_key)
            .await?;
        let handle = self
            .run_participant(
                command,
                body,
                message_id,
                redelivered,
                &partition_key,
                &target,
            )
            .await?;
        let publishing = self
            .begin_after_commit(registration, &partition_key, &handle)
            .await;
        let batch = StagedBatch::of(marker, handle);
        let count = batch.operations.len();
        let outcome = store::execute_batch(&target.container, target.key.clone(), batch.operations)
            .await
            .map_err(cosmos_error(name, message_id))?;
        self.charges.command(outcome.request_charge);
        if !outcome.is_success() {
            return self
                .settle_failed_batch(name, message_id, target, &batch.labels, &outcome)
                .await;
        }
        tracing::debug!(
            command = name,
            message_id,
            operations = count,
            request_charge = outcome.request_charge,
            "chatter batch committed"
        );
        if let Some(publishing) = publishing {
            publishing.committed(partition_key, &outcome, batch.writes);
        }
        Ok(Outcome::Committed { operations: count })
    }

    /// The marker (op 0), and the container and the SDK key of a delivery.
    async fn batch_target(
        &self,
        registration: &CommandRegistration,
        message_id: &str,
        partition_key: &[Value],
    ) -> Result<(Value, BatchTarget), PipelineError> {
        let name = registration.command_name;
        let marker_error = |source| PipelineError::Marker {
            command: name,
            message_id: message_id.to_owned(),
            source,
        };
        let marker_id = document::inbox_id(message_id).map_err(marker_error)?;
        let marker = document::inbox_marker(
            message_id,
            registration.partition_key,
            partition_key,
            crate::clock::now_utc(),
        )
        .map_err(marker_error)?;
        let cosmos_error = cosmos_error(name, message_id);
        let container = self
            .cosmos
            .container(registration.database, registration.container)
            .await
            .map_err(&cosmos_error)?;
        let key = partition_key::sdk_key(partition_key).map_err(|e| cosmos_error(e.into()))?;
        let target = BatchTarget {
            marker_id,
            container,
            key,
        };
        Ok((marker, target))
    }

    /// Runs the handler with a context that stages its writes and messages in the partition of
    /// `target`; what it staged.
    async fn run_participant(
        &self,
        command: &RegisteredCommand,
        body: Value,
        message_id: &str,
        redelivered: bool,
        partition_key: &[Value],
        target: &BatchTarget,
    ) -> Result<AtomicWriteHandle, PipelineError> {
        let handle = AtomicWriteHandle {
            partition_key_paths: command.registration.partition_key,
            partition_key: partition_key.to_vec(),
            writes: Vec::new(),
            outbox: Vec::new(),
        };
        let reads = ReadScope {
            container: Arc::clone(&target.container),
            partition_key: target.key.clone(),
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
        Ok(handle.expect("a participant context keeps its handle"))
    }

    /// With publish after commit on for the command's container and documents to publish: the
    /// key's turn, then the documents marked in flight. Taken before the documents are marked,
    /// so that on a failure their marks are dropped before the turn is; the order the turns
    /// are taken in is the key's commit order in this process.
    async fn begin_after_commit(
        &self,
        registration: &CommandRegistration,
        partition_key: &[Value],
        handle: &AtomicWriteHandle,
    ) -> Option<AfterCommitBatch<'_>> {
        if handle.outbox.is_empty() {
            return None;
        }
        let container = (
            registration.database.to_owned(),
            registration.container.to_owned(),
        );
        let after_commit = self.after_commit.get(&container)?;
        let outbox = handle.outbox.clone();
        let turn = after_commit.turn(partition_key).await;
        let ids: Vec<String> = outbox
            .iter()
            .map(|document| {
                document
                    .get(document::outbox::ID_FIELD)
                    .and_then(Value::as_str)
                    .unwrap_or_default()
                    .to_owned()
            })
            .collect();
        let tickets = after_commit.begin(partition_key, &ids);
        Some(AfterCommitBatch {
            after_commit,
            outbox,
            ids,
            tickets,
            turn,
        })
    }

    /// A batch that did not commit: a 409 on the marker is a candidate duplicate, confirmed
    /// against the conflicting document itself; anything else names the operation that failed.
    async fn settle_failed_batch(
        &self,
        name: &'static str,
        message_id: &str,
        target: BatchTarget,
        labels: &[(&'static str, String)],
        outcome: &BatchOutcome,
    ) -> Result<Outcome, PipelineError> {
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
            return Err(failed(failed_operation(labels, &statuses)));
        }
        let BatchTarget {
            marker_id,
            container,
            key,
        } = target;
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
    pub(super) async fn read_marker(
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
}

impl StagedBatch {
    fn of(marker: Value, handle: AtomicWriteHandle) -> Self {
        let mut operations = Vec::with_capacity(handle.staged_operation_count());
        operations.push(BatchOperation::Create(marker));
        operations.extend(handle.writes);
        let writes = operations.len();
        operations.extend(handle.outbox.into_iter().map(BatchOperation::Create));
        let labels = operations
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
        Self {
            operations,
            writes,
            labels,
        }
    }
}

impl AfterCommitBatch<'_> {
    /// The batch committed: its documents numbered in the key's commit order (then the key's
    /// turn is released) and published on a task beside the command, which it never fails:
    /// what it does not publish, the relay does.
    fn committed(self, partition_key: Vec<Value>, outcome: &BatchOutcome, writes: usize) {
        let committed_at = std::time::Instant::now();
        let committed: Vec<Committed> = self
            .ids
            .into_iter()
            .zip(self.outbox)
            .zip(outcome.operations.iter().skip(writes))
            .map(|((id, document), written)| Committed {
                id,
                document,
                etag: written.etag.clone(),
            })
            .collect();
        let number = self.after_commit.committed(&self.tickets, &committed);
        drop(self.turn);
        self.after_commit.spawn_publish(
            partition_key,
            committed,
            self.tickets,
            number,
            committed_at,
        );
    }
}

/// A Cosmos call of the delivery that failed.
fn cosmos_error<'a>(
    command: &'static str,
    message_id: &'a str,
) -> impl Fn(CosmosStoreError) -> PipelineError + 'a {
    move |source| PipelineError::Cosmos {
        command,
        message_id: message_id.to_owned(),
        source: Box::new(source),
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
pub(super) enum Marker {
    /// The inbox marker of the message id: an attempt of it committed.
    Genuine,
    /// Another document under the marker's id.
    Foreign,
    /// Nothing.
    Missing,
}
