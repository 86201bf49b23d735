//! The document tier: the Document-Tier Batch-Lifecycle Behavior around every handler call.
//!
//! For a participant delivery: resolve the partition key, require a message id, stage the inbox
//! marker as op 0, run the handler (which stages its writes and outbox documents), then execute the
//! one TransactionalBatch exactly once. A 409 on op 0 is only a *candidate* duplicate: it is
//! acknowledged only after a point-read proves the conflicting document is a genuine inbox marker
//! for the same message id.
//!
//! | file | concern |
//! | --- | --- |
//! | `mod.rs` | [`Outcome`], the pipeline, which path a delivery takes, the keyless path, whether an attempt committed |
//! | `batch.rs` | the participant path, phase by phase: marker and target, the handler, publish after commit's marks, the batch, the duplicate's confirmation |
//! | `inbox.rs` | the standalone-inbox path: the handler inside its gate |
//! | `error.rs`, `rejection.rs` | [`PipelineError`], [`BatchFailure`], and the [`Rejection`] a handler refuses a command with |

mod batch;
mod error;
mod inbox;
mod rejection;

use batch::Marker;
use error::NOTHING_COMMITTED;
pub use error::{BatchFailure, PipelineError};
pub use rejection::Rejection;

use std::panic::AssertUnwindSafe;
use std::sync::Arc;

use futures::FutureExt;
use serde_json::Value;

use crate::backoff;
use crate::broker::Broker;
use crate::cosmos::CosmosConnection;
use crate::cosmos::charge::RequestMeter;
use crate::cosmos::store;
use crate::document;
use crate::handler_context::HandlerContext;
use crate::inbox::StandaloneInbox;
use crate::partition_key;
use crate::registry::RegisteredCommand;
use crate::relay::after_commit::AfterCommit;
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
        self.handle_in_batch(command, body, message_id, redelivered, partition_key)
            .await
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

    /// A command whose partition key did not resolve: the handler runs without a batch or a
    /// marker, its messages published directly (at least once).
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
