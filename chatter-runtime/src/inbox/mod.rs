//! The Standalone Inbox Gate: handling by message id for work whose side effects are not in
//! Cosmos (an HTTP call, another database, an email). There is no batch to join, so a **Claimed
//! Inbox Marker** per message id in a dedicated idempotency container makes a message id whose
//! handling completed never run again, and never run twice at the same time:
//!
//! 1. create the marker with `Completed: false` and `ClaimSeconds` (the claim period; the claim
//!    is renewed while the handler runs (`renewal.rs`), and the handler is stopped if it is
//!    lost, or once the claim timeout is up);
//! 2. on `201` run the handler, then mark it completed (a patch of `Completed: true`, or, with
//!    sent messages, one batch that also creates their Outbox Documents);
//!    on `409` read the marker back (a bounded number of times): completed, skip; its claim
//!    possibly live (`claim.rs`), refuse with [`InboxError::ClaimHeld`] without running
//!    anything; its claim over (released by a failed attempt, or run out after a crash), take it
//!    over with a replace conditioned on the ETag read, and run the handler; anything else, fail
//!    loudly so the message is delivered again rather than skipped.
//!
//! Markers are never deleted (only their `ttl` removes them, which must outlive a claim): a
//! handler that fails leaves its marker pending with its claim released, and the next delivery
//! takes it over.
//!
//! **The at-least-once edge**: a handler that ran while its completion failed (or whose process
//! died between the two) runs again on the next delivery, once its claim is over. Make the side
//! effect idempotent, or accept that.
//!
#![doc = include_str!("../../docs/inbox.md")]

pub(crate) mod claim;
mod options;
mod renewal;

pub use options::{
    DEFAULT_CLAIM_PERIOD, DEFAULT_CLOCK_MARGIN, DEFAULT_IDEMPOTENCY_KEY_PATH, InboxOptions,
    InboxOptionsError, MAX_CLAIM_TIMEOUT, MIN_RENEWAL_INTERVAL,
};

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;

use crate::cosmos::store::BatchOperation;
use crate::cosmos::store::{self, PatchOp, ReadOutcome};
use crate::cosmos::{ContainerClient, CosmosConnection, CosmosStoreError, PartitionKey};
use crate::document::inbox_marker::{self, CLAIM_SECONDS_FIELD, COMPLETED_FIELD};
use crate::document::{self, DocumentError};
use crate::registry::BoxError;

/// How a [`StandaloneInbox::receive`] ended when it did not fail.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum InboxOutcome {
    /// The message id was new: the handler ran and the marker is completed.
    Handled,
    /// A pending marker of an earlier attempt (which failed or crashed) was taken over: the
    /// handler ran (again) and the marker is completed.
    TakenOver,
    /// The message id was already handled: the handler did not run.
    AlreadyCompleted,
}

/// What the read-back of a conflicting claim decided.
enum Conflict {
    /// The message id was handled.
    Completed,
    /// This attempt took the claim over; its ETag, and when the write that took it began.
    TakenOver(Option<String>, tokio::time::Instant),
}

/// Why a [`StandaloneInbox::receive`] failed. The message should be delivered again (except
/// for an id no marker can be made of).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum InboxError {
    /// The message id is empty or blank; nothing was written and the handler did not run.
    #[error(
        "A brokered message must carry a non-null, non-whitespace message id for the Cosmos inbox to claim it. The handler was not run and no marker was written; set a message id upstream (a raw Azure Service Bus producer must set one) or accept this loud failure."
    )]
    BlankMessageId,
    /// No marker can be made of the message id (its marker id is too long for Cosmos);
    /// nothing was written and the handler did not run.
    #[error("no inbox marker can be made for message id '{message_id}'")]
    Marker {
        /// The message id.
        message_id: String,
        /// Why.
        #[source]
        source: DocumentError,
    },
    /// The marker could not be created (the handler did not run).
    #[error(
        "the inbox marker of message '{message_id}' could not be created; the handler did not run"
    )]
    Claim {
        /// The message id.
        message_id: String,
        /// The store error.
        #[source]
        source: Box<CosmosStoreError>,
    },
    /// The marker id conflicted with a document that could not be confirmed, within the
    /// read-back budget, as this message id's marker; the handler did not run.
    #[error(
        "The Cosmos inbox observed a create-conflict for message id '{message_id}' but could not confirm the conflicting document is a genuine Chatter inbox marker for that id within the read-back budget. Redelivering rather than silently skipping the handler (an unconfirmed 409 could be an app-authored id collision whose first delivery would otherwise be lost)."
    )]
    UnconfirmedConflict {
        /// The message id.
        message_id: String,
    },
    /// Another attempt of the message id holds a claim that may still be live (its handler may
    /// be running now, in this process or another): the handler was not run, so it never runs
    /// twice at once. Try again later: the claim ends completed (then the copy is a duplicate),
    /// runs out within `for_at_most`, or is renewed by its running handler.
    #[error(
        "message '{message_id}' is claimed by another attempt whose handler may still be running (its claim runs out within {for_at_most:?} unless that handler renews it); the handler was not run, try again later"
    )]
    ClaimHeld {
        /// The message id.
        message_id: String,
        /// How long the claim can stay live at most.
        for_at_most: Duration,
    },
    /// The handler failed; its marker stays pending (its claim released), and the next
    /// delivery takes it over. The handler's side effects, if any, are not undone.
    #[error(
        "the handler of message '{message_id}' failed; its inbox marker stays pending and what the handler did outside Cosmos is not undone"
    )]
    Handler {
        /// The message id.
        message_id: String,
        /// The handler's error.
        #[source]
        source: BoxError,
    },
    /// The handler ran longer than the claim timeout and was stopped where it waited; its
    /// marker stays pending (its claim released).
    #[error(
        "the handler of message '{message_id}' did not finish within the inbox's claim timeout ({after:?}) and was stopped; its inbox marker stays pending"
    )]
    TimedOut {
        /// The message id.
        message_id: String,
        /// The claim timeout.
        after: Duration,
    },
    /// The handler's claim was lost while it ran: no renewal landed before the claim's end (the
    /// store unreachable for the claim period), or another attempt took it over. The handler
    /// was stopped where it waited and nothing of it committed; the next delivery runs it
    /// again.
    #[error(
        "the claim of message '{message_id}' was lost while its handler ran ({why}) and the handler was stopped; nothing of it committed, and the next delivery runs it again"
    )]
    ClaimLost {
        /// The message id.
        message_id: String,
        /// Why.
        why: &'static str,
    },
    /// The handler ran, but its completion (the patch, or the batch that also commits its sent
    /// messages) was refused (e.g. 412: its claim ran out and another attempt took it over);
    /// nothing of it committed, and the attempt that holds the claim now runs the handler
    /// again.
    #[error(
        "the handler of message '{message_id}' ran but the batch completing its inbox marker did not commit (batch status {status}, per-operation status codes {operation_statuses:?}); the next delivery runs it again"
    )]
    CompletionRefused {
        /// The message id.
        message_id: String,
        /// The batch's HTTP status.
        status: u16,
        /// Per-operation status codes, the marker's first.
        operation_statuses: Vec<u16>,
    },
    /// Replacing a claim that was over with this attempt's failed (e.g. throttled); the handler
    /// did not run.
    #[error(
        "the claim of message '{message_id}' was over but could not be taken over (batch status {status}, per-operation status codes {operation_statuses:?}); the handler did not run"
    )]
    TakeOverRefused {
        /// The message id.
        message_id: String,
        /// The batch's HTTP status.
        status: u16,
        /// Per-operation status codes.
        operation_statuses: Vec<u16>,
    },
    /// The runtime has no gate for this command (it was not started with it).
    #[error("no standalone inbox was started for this command")]
    NotStarted,
    /// The handler ran, but marking it completed failed: the next delivery takes the pending
    /// marker over and runs the handler again.
    #[error(
        "the handler of message '{message_id}' ran but its inbox marker could not be marked completed; the next delivery runs it again"
    )]
    Completion {
        /// The message id.
        message_id: String,
        /// The store error.
        #[source]
        source: Box<CosmosStoreError>,
    },
}

/// Why a [`StandaloneInbox`] could not be built.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum InboxSetupError {
    /// The options cannot work.
    #[error(transparent)]
    Options(#[from] InboxOptionsError),
    /// The idempotency container could not be reached or read.
    #[error("the idempotency container '{database}/{container}' could not be read")]
    Container {
        /// The database.
        database: String,
        /// The container.
        container: String,
        /// The store error.
        #[source]
        source: Box<CosmosStoreError>,
    },
    /// The idempotency container's partition key is not the options' path.
    #[error(
        "the idempotency container '{database}/{container}' is partitioned by {actual:?}, not by the inbox's partition-key path '{declared}'"
    )]
    PartitionKeyPath {
        /// The database.
        database: String,
        /// The container.
        container: String,
        /// The options' path.
        declared: String,
        /// The container's paths.
        actual: Vec<String>,
    },
}

/// The Standalone Inbox Gate over one idempotency container. Cheap to clone; share one.
///
/// ```no_run
/// # async fn demo(cosmos: chatter_runtime::cosmos::CosmosConnection) -> Result<(), Box<dyn std::error::Error>> {
/// use chatter_runtime::inbox::{InboxOptions, StandaloneInbox};
///
/// let inbox = StandaloneInbox::new(&cosmos, InboxOptions::new("payments", "idempotency")).await?;
/// // In an HTTP webhook: the payment provider may call twice with the same event id.
/// let outcome = inbox
///     .receive("evt_1NqKz2", || async {
///         // charge the card, send the email ... (runs once per id, unless it fails)
///         Ok::<(), std::io::Error>(())
///     })
///     .await?;
/// println!("{outcome:?}");
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct StandaloneInbox {
    container: Arc<ContainerClient>,
    options: Arc<InboxOptions>,
}

impl std::fmt::Debug for StandaloneInbox {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StandaloneInbox")
            .field("options", &self.options)
            .finish_non_exhaustive()
    }
}

impl StandaloneInbox {
    /// Checks `options`, then the idempotency container: it exists, is partitioned by the
    /// options' path (chatter never creates it; `provision::ensure_container` does in
    /// development), and its default time-to-live, when markers carry no ttl of their own,
    /// keeps a pending marker longer than its claim can be live.
    ///
    /// # Errors
    ///
    /// [`InboxSetupError`]: options that cannot work (a marker ttl a claim could outlive among
    /// them), a container that cannot be read, is partitioned otherwise, or whose default
    /// time-to-live a claim could outlive.
    pub async fn new(
        cosmos: &CosmosConnection,
        options: InboxOptions,
    ) -> Result<Self, InboxSetupError> {
        options.validate()?;
        let unreadable = |source| InboxSetupError::Container {
            database: options.database.clone(),
            container: options.container.clone(),
            source: Box::new(source),
        };
        let container = cosmos
            .container_within(&options.database, &options.container, options.store_timeout)
            .await
            .map_err(unreadable)?;
        let settings = store::bounded(
            "read_container",
            options.store_timeout,
            store::read_container_properties(&container),
        )
        .await
        .map_err(unreadable)?;
        let declared = crate::partition_key::canonical(&options.partition_key_path);
        if !crate::partition_key::matches_container(
            &[declared.as_str()],
            &settings.partition_key_paths,
        ) {
            return Err(InboxSetupError::PartitionKeyPath {
                database: options.database.clone(),
                container: options.container.clone(),
                declared,
                actual: settings.partition_key_paths,
            });
        }
        // Without a marker ttl, the container's default decides when a marker goes.
        if options.marker_ttl_seconds.is_none_or(|ttl| ttl <= 0)
            && let Some(ttl) = settings.default_ttl.filter(|ttl| *ttl > 0)
        {
            options.check_marker_life(ttl, "the idempotency container's default time-to-live")?;
        }
        Ok(Self {
            container,
            options: Arc::new(options),
        })
    }

    /// Runs `handler` for `message_id` unless a completed marker says it ran: claims the id with
    /// a marker, runs the handler (for at most [`InboxOptions::claim_timeout`]), marks the id
    /// completed (see the module docs for the conflict and take-over paths, and the
    /// at-least-once edges).
    ///
    /// # Errors
    ///
    /// [`InboxError`]: a blank or over-long id (nothing written), a claim the store refused, a
    /// conflict that could not be confirmed or a claim still live in another attempt (handler
    /// not run), the handler's own error or timeout (claim released or left to expire), a
    /// completion that could not be written (handler ran).
    pub async fn receive<F, Fut, E>(
        &self,
        message_id: &str,
        handler: F,
    ) -> Result<InboxOutcome, InboxError>
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<(), E>>,
        E: Into<BoxError>,
    {
        self.receive_committing(message_id, || async {
            handler().await.map(|()| Vec::new())
        })
        .await
    }

    /// [`receive`](Self::receive) whose handler also returns documents (Outbox Documents of the
    /// message id's partition) that commit in one batch with the marker's completion.
    pub(crate) async fn receive_committing<F, Fut, E>(
        &self,
        message_id: &str,
        handler: F,
    ) -> Result<InboxOutcome, InboxError>
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<Vec<Value>, E>>,
        E: Into<BoxError>,
    {
        // The handler's deadline counts from before the claim is written, so it always ends
        // before the claim the store records can be over.
        let started = tokio::time::Instant::now();
        if message_id.trim().is_empty() {
            return Err(InboxError::BlankMessageId);
        }
        let marker_error = |source| InboxError::Marker {
            message_id: message_id.to_owned(),
            source,
        };
        let marker_id = document::inbox_id(message_id).map_err(marker_error)?;
        let marker = inbox_marker::claimed_marker(
            message_id,
            &self.options.partition_key_path,
            self.options.marker_ttl_seconds,
            self.options.claim_seconds(),
            crate::clock::now_utc(),
        )
        .map_err(marker_error)?;
        let key = PartitionKey::from(message_id.to_owned());
        // The claim lasts from before its write: this process stops the handler before any
        // reader may judge it over.
        let created_at = tokio::time::Instant::now();
        let (outcome, claim_etag, claimed_at) = match self.claim(key.clone(), &marker).await {
            Ok(etag) => (InboxOutcome::Handled, etag, created_at),
            Err(error) if error.is_status(409) => {
                match self
                    .take_over(key.clone(), &marker_id, &marker, message_id)
                    .await?
                {
                    Conflict::Completed => return Ok(InboxOutcome::AlreadyCompleted),
                    Conflict::TakenOver(etag, at) => (InboxOutcome::TakenOver, etag, at),
                }
            }
            Err(error) => {
                return Err(InboxError::Claim {
                    message_id: message_id.to_owned(),
                    source: Box::new(error),
                });
            }
        };
        let deadline = started
            .checked_add(self.options.claim_timeout)
            .unwrap_or_else(claim::far_future);
        let claim = renewal::Claim::new(claim_etag, claimed_at, self.options.period());
        let received_at = marker
            .get(inbox_marker::RECEIVED_AT_UTC_FIELD)
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_owned();
        let lost = |why: &'static str| {
            tracing::warn!(
                message_id,
                why,
                "chatter inbox lost the claim of a running handler and stopped it; nothing of it committed, and the next delivery runs it again"
            );
            InboxError::ClaimLost {
                message_id: message_id.to_owned(),
                why,
            }
        };
        // The handler runs while its claim is renewed, and is polled only while the claim has
        // not ended; a claim lost stops it where it waits.
        let (stop, stopping) = tokio::sync::watch::channel(false);
        let keeping = self.keep(
            key.clone(),
            &marker_id,
            &received_at,
            &claim,
            claimed_at,
            deadline,
            stopping,
            message_id,
        );
        tokio::pin!(keeping);
        // The handler's future lives in this block only: once it settled (returned, timed out)
        // or its claim was lost, it is dropped at once, before the claim is released or the
        // completion written (a release may wait out the store timeout, and the handler must
        // be gone before the claim can be taken over; seed 9104127).
        let settled = {
            let handling = tokio::time::timeout_at(deadline, handler());
            tokio::pin!(handling);
            let guarded = renewal::WhileClaimed {
                claim: &claim,
                handler: handling.as_mut(),
            };
            tokio::pin!(guarded);
            tokio::select! {
                // The claim first: a lost claim stops the handler before its next step.
                biased;
                lost_why = &mut keeping => Err(lost_why),
                handled = &mut guarded => Ok(handled),
            }
        };
        let handled = match settled {
            Err(lost_why) => {
                return Err(lost(match lost_why {
                    Some(renewal::Lost::TakenOver) => "another attempt took it over, or it is gone",
                    Some(renewal::Lost::RanOut) | None => "no renewal landed before it ended",
                }));
            }
            Ok(handled) => {
                // A renewal under way finishes first: its ETag is the one to complete on.
                let _ = stop.send(true);
                let _ = keeping.await;
                match handled {
                    Some(handled) => handled,
                    None => return Err(lost("it ended before the handler's next step (a pause?)")),
                }
            }
        };
        let claim_etag = claim.etag();
        let released = |etag: Option<String>| {
            let key = key.clone();
            let (marker_id, received_at) = (&marker_id, &received_at);
            async move {
                self.release(key, marker_id, etag.as_deref(), received_at, message_id)
                    .await;
            }
        };
        let documents = match handled {
            Ok(Ok(documents)) => documents,
            Ok(Err(source)) => {
                // Nothing runs under the claim any more: the next copy need not wait it out.
                released(claim_etag).await;
                return Err(InboxError::Handler {
                    message_id: message_id.to_owned(),
                    source: source.into(),
                });
            }
            Err(_) => {
                released(claim_etag).await;
                return Err(InboxError::TimedOut {
                    message_id: message_id.to_owned(),
                    after: self.options.claim_timeout,
                });
            }
        };
        let completing = |etag: Option<String>| {
            self.complete(
                key.clone(),
                &marker_id,
                &marker,
                etag,
                &documents,
                message_id,
            )
        };
        match completing(claim_etag).await {
            Err(InboxError::CompletionRefused {
                operation_statuses, ..
            }) if operation_statuses.first() == Some(&412) => {
                // A renewal whose answer was lost changed the ETag: still this attempt's
                // claim, it completes on the new one.
                match self.still_ours(key.clone(), &marker_id, &received_at).await {
                    Some(etag) => completing(Some(etag)).await?,
                    None => {
                        return Err(InboxError::CompletionRefused {
                            message_id: message_id.to_owned(),
                            status: 412,
                            operation_statuses,
                        });
                    }
                }
            }
            completed => completed?,
        }
        Ok(outcome)
    }

    /// Marks the claim completed: a patch of `Completed` alone, or, with `documents`, one batch
    /// that replaces the marker completed (only while it is still this attempt's claim) and
    /// creates them.
    async fn complete(
        &self,
        key: PartitionKey,
        marker_id: &str,
        marker: &Value,
        claim_etag: Option<String>,
        documents: &[Value],
        message_id: &str,
    ) -> Result<(), InboxError> {
        let failed = |source| InboxError::Completion {
            message_id: message_id.to_owned(),
            source: Box::new(source),
        };
        if documents.is_empty() {
            // Only while the marker is still this attempt's claim: a late completion must not
            // mark completed a claim another attempt took over and is running under.
            let completed = format!("/{COMPLETED_FIELD}");
            let patching = async {
                match claim_etag.as_deref() {
                    Some(etag) => {
                        let set = [PatchOp::Set(completed.clone(), Value::Bool(true))];
                        store::patch_item_if_match(&self.container, key, marker_id, &set, etag)
                            .await
                    }
                    None => {
                        let set = [(completed.as_str(), Value::Bool(true))];
                        store::patch_item(&self.container, key, marker_id, &set).await
                    }
                }
            };
            let patched = store::bounded("patch_item", self.options.store_timeout, patching).await;
            return match patched {
                Ok(_) => Ok(()),
                Err(error) if error.is_status(412) => Err(InboxError::CompletionRefused {
                    message_id: message_id.to_owned(),
                    status: 412,
                    operation_statuses: vec![412],
                }),
                Err(error) => Err(failed(error)),
            };
        }
        // Copied into the batch: a completion refused on a stale ETag is written again.
        let mut marker = marker.clone();
        marker[COMPLETED_FIELD] = Value::Bool(true);
        let operations = std::iter::once(BatchOperation::Replace {
            id: marker_id.to_owned(),
            doc: marker,
            if_match: claim_etag,
        })
        .chain(documents.iter().cloned().map(BatchOperation::Create))
        .collect();
        let outcome = store::bounded(
            "execute_batch",
            self.options.store_timeout,
            store::execute_batch(&self.container, key, operations),
        )
        .await
        .map_err(failed)?;
        if outcome.is_success() {
            return Ok(());
        }
        Err(InboxError::CompletionRefused {
            message_id: message_id.to_owned(),
            status: outcome.status,
            operation_statuses: outcome.status_codes(),
        })
    }

    /// Gives up this attempt's claim after its handler failed or timed out (`ClaimSeconds: 0`,
    /// only while the marker is still this claim), so the next copy runs at once. A release
    /// that fails is harmless: the claim then runs out.
    async fn release(
        &self,
        key: PartitionKey,
        marker_id: &str,
        claim_etag: Option<&str>,
        received_at: &str,
        message_id: &str,
    ) {
        let Some(etag) = claim_etag else {
            return;
        };
        let released = [PatchOp::Set(
            format!("/{CLAIM_SECONDS_FIELD}"),
            Value::from(0),
        )];
        let release = |etag: String| {
            let key = key.clone();
            let released = &released;
            async move {
                store::bounded(
                    "patch_item",
                    self.options.store_timeout,
                    store::patch_item_if_match(&self.container, key, marker_id, released, &etag),
                )
                .await
            }
        };
        let mut patched = release(etag.to_owned()).await;
        if patched.as_ref().is_err_and(|error| error.is_status(412)) {
            // A renewal whose answer was lost changed the ETag: released on the new one while
            // the claim is still this attempt's.
            if let Some(etag) = self.still_ours(key.clone(), marker_id, received_at).await {
                patched = release(etag).await;
            }
        }
        if let Err(error) = patched {
            tracing::debug!(message_id, error = %crate::error_chain::ErrorChain(&error), "chatter inbox could not release the claim of a failed attempt; the next copy waits for it to run out");
        }
    }

    /// Whether `message_id`'s marker says it completed, read with backoff until `within` has
    /// passed; `None` when no read succeeded by then (or no marker can be made of the id).
    pub(crate) async fn completed(&self, message_id: &str, within: Duration) -> Option<bool> {
        let marker_id = document::inbox_id(message_id).ok()?;
        let key = PartitionKey::from(message_id.to_owned());
        let deadline = tokio::time::Instant::now()
            .checked_add(within)
            .unwrap_or_else(claim::far_future);
        let mut backoff = crate::backoff::marker_read();
        loop {
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            let read = store::bounded(
                "read_item",
                left.min(self.options.store_timeout),
                store::read_item(&self.container, key.clone(), &marker_id),
            )
            .await;
            match read {
                Ok(ReadOutcome::Found { document, .. }) => {
                    return Some(
                        document::is_genuine_inbox_marker(&document, message_id)
                            && inbox_marker::is_completed(&document),
                    );
                }
                Ok(ReadOutcome::NotFound) => return Some(false),
                Err(error) => {
                    let delay = backoff.next_delay();
                    if tokio::time::Instant::now() + delay >= deadline {
                        tracing::warn!(message_id, error = %crate::error_chain::ErrorChain(&error), "chatter could not read the inbox marker to tell whether the message completed");
                        return None;
                    }
                    tokio::time::sleep(delay).await;
                }
            }
        }
    }

    /// Creates the claim; its ETag, when the store gave one.
    async fn claim(
        &self,
        key: PartitionKey,
        marker: &Value,
    ) -> Result<Option<String>, CosmosStoreError> {
        store::bounded(
            "create_item",
            self.options.store_timeout,
            store::create_item(&self.container, key, marker),
        )
        .await
        .map(|written| written.etag)
    }

    /// After the claim conflicted: reads the marker back and decides. Completed: skip. A claim
    /// that may still be live: [`InboxError::ClaimHeld`], nothing run. A claim that is over
    /// (released by a failed attempt, or run out): replaced by this attempt's `marker`, only
    /// while it is the version read (so of two take-overs one wins; the other reads again).
    async fn take_over(
        &self,
        key: PartitionKey,
        marker_id: &str,
        marker: &Value,
        message_id: &str,
    ) -> Result<Conflict, InboxError> {
        for _ in 0..self.options.read_back_attempts {
            let Some((stored, etag)) = self.confirm(key.clone(), marker_id, message_id).await
            else {
                break;
            };
            if inbox_marker::is_completed(&stored) {
                return Ok(Conflict::Completed);
            }
            let now = crate::clock::now_utc();
            let previous = match claim::state(&stored, &self.options, now) {
                claim::State::Live { for_at_most } => {
                    return Err(InboxError::ClaimHeld {
                        message_id: message_id.to_owned(),
                        for_at_most,
                    });
                }
                over => over,
            };
            let replace = BatchOperation::Replace {
                id: marker_id.to_owned(),
                doc: marker.clone(),
                if_match: etag,
            };
            // The claim taken over lasts from before this write.
            let at = tokio::time::Instant::now();
            let outcome = store::bounded(
                "execute_batch",
                self.options.store_timeout,
                store::execute_batch(&self.container, key.clone(), vec![replace]),
            )
            .await
            .map_err(|source| InboxError::Claim {
                message_id: message_id.to_owned(),
                source: Box::new(source),
            })?;
            if outcome.is_success() {
                claim::log_take_over(message_id, &previous);
                let etag = outcome.operations.first().and_then(|op| op.etag.clone());
                return Ok(Conflict::TakenOver(etag, at));
            }
            // 412: another attempt took it over or completed it first; read again. 404: it
            // expired meanwhile; reading again finds nothing and fails loudly below.
            if !matches!(outcome.status_codes().first(), Some(412 | 404)) {
                return Err(InboxError::TakeOverRefused {
                    message_id: message_id.to_owned(),
                    status: outcome.status,
                    operation_statuses: outcome.status_codes(),
                });
            }
        }
        Err(InboxError::UnconfirmedConflict {
            message_id: message_id.to_owned(),
        })
    }

    /// Reads the conflicting marker back: the genuine marker of `message_id` with its ETag;
    /// `None` when none was confirmed within the budget (a 404 is read again after the interval
    /// while attempts remain; anything else ends it).
    async fn confirm(
        &self,
        key: PartitionKey,
        marker_id: &str,
        message_id: &str,
    ) -> Option<(Value, Option<String>)> {
        let attempts = self.options.read_back_attempts;
        for attempt in 1..=attempts {
            let read = store::bounded(
                "read_item",
                self.options.store_timeout,
                store::read_item(&self.container, key.clone(), marker_id),
            )
            .await;
            match read {
                Ok(ReadOutcome::Found { document, etag })
                    if document::is_genuine_inbox_marker(&document, message_id) =>
                {
                    return Some((document, etag));
                }
                Ok(ReadOutcome::NotFound) if attempt < attempts => {
                    tokio::time::sleep(self.options.read_back_interval).await;
                }
                _ => return None,
            }
        }
        None
    }
}
