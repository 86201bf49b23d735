//! The Standalone Inbox Gate: handling by message id for work whose side effects are not in
//! Cosmos (an HTTP call, another database, an email). There is no batch to join, so a **Claimed
//! Inbox Marker** per message id in a dedicated idempotency container makes a message id whose
//! handling completed never run again, in two phases:
//!
//! 1. create the marker with `Completed: false` (the claim);
//! 2. on `201` run the handler, then patch `Completed: true`;
//!    on `409` read the marker back (a bounded number of times): completed, skip; still pending
//!    (an attempt that crashed or failed), take it over and run the handler; anything else, fail
//!    loudly so the message is delivered again rather than skipped.
//!
//! Markers are never deleted (only their `ttl` removes them): a handler that fails leaves its
//! marker pending, and the next delivery takes it over.
//!
//! **The at-least-once edges**: a handler that ran while its completion patch failed (or whose
//! process died between the two) runs again on the next delivery, which takes the pending marker
//! over; and a duplicate delivered while the first attempt is still running (another instance)
//! finds the marker pending and takes it over too, so both run. Make the side effect idempotent,
//! or accept that. (Within one runtime, deliveries of one message id are handled one after
//! another.)

mod options;

pub use options::{DEFAULT_IDEMPOTENCY_KEY_PATH, InboxOptions, InboxOptionsError};

use std::future::Future;
use std::sync::Arc;

use serde_json::Value;
use time::OffsetDateTime;

use crate::cosmos::store::{self, ReadOutcome};
use crate::cosmos::{ContainerClient, CosmosConnection, CosmosStoreError, PartitionKey};
use crate::document::inbox_marker::{self, COMPLETED_FIELD};
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
    /// The handler failed; its marker stays pending, and the next delivery takes it over.
    #[error("the handler of message '{message_id}' failed; its inbox marker stays pending")]
    Handler {
        /// The message id.
        message_id: String,
        /// The handler's error.
        #[source]
        source: BoxError,
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
    /// Checks `options`, then the idempotency container: it exists and is partitioned by the
    /// options' path (chatter never creates it; `cosmos::provision::ensure_container` does in
    /// development).
    ///
    /// # Errors
    ///
    /// [`InboxSetupError`]: options that cannot work, a container that cannot be read or is
    /// partitioned otherwise.
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
        Ok(Self {
            container,
            options: Arc::new(options),
        })
    }

    /// Runs `handler` for `message_id` unless a completed marker says it ran: claims the id with
    /// a marker, runs the handler, marks the id completed (see the module docs for the conflict
    /// and take-over paths, and the at-least-once edges).
    ///
    /// # Errors
    ///
    /// [`InboxError`]: a blank or over-long id (nothing written), a claim the store refused or
    /// a conflict that could not be confirmed (handler not run), the handler's own error
    /// (marker left pending), a completion that could not be written (handler ran).
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
            OffsetDateTime::now_utc(),
        )
        .map_err(marker_error)?;
        let key = PartitionKey::from(message_id.to_owned());
        let outcome = match self.claim(key.clone(), &marker).await {
            Ok(()) => InboxOutcome::Handled,
            Err(error) if error.is_status(409) => {
                match self.confirm(key.clone(), &marker_id, message_id).await {
                    Some(true) => return Ok(InboxOutcome::AlreadyCompleted),
                    Some(false) => InboxOutcome::TakenOver,
                    None => {
                        return Err(InboxError::UnconfirmedConflict {
                            message_id: message_id.to_owned(),
                        });
                    }
                }
            }
            Err(error) => {
                return Err(InboxError::Claim {
                    message_id: message_id.to_owned(),
                    source: Box::new(error),
                });
            }
        };
        if outcome == InboxOutcome::TakenOver {
            tracing::info!(
                message_id,
                "chatter inbox takes over a pending marker: an earlier attempt did not complete"
            );
        }
        handler().await.map_err(|source| InboxError::Handler {
            message_id: message_id.to_owned(),
            source: source.into(),
        })?;
        let completed = [(&*format!("/{COMPLETED_FIELD}"), Value::Bool(true))];
        store::bounded(
            "patch_item",
            self.options.store_timeout,
            store::patch_item(&self.container, key, &marker_id, &completed),
        )
        .await
        .map_err(|source| InboxError::Completion {
            message_id: message_id.to_owned(),
            source: Box::new(source),
        })?;
        Ok(outcome)
    }

    async fn claim(&self, key: PartitionKey, marker: &Value) -> Result<(), CosmosStoreError> {
        store::bounded(
            "create_item",
            self.options.store_timeout,
            store::create_item(&self.container, key, marker),
        )
        .await
        .map(|_| ())
    }

    /// Reads the conflicting marker back: `Some(completed)` for a genuine marker of
    /// `message_id`; `None` when none was confirmed within the budget (a 404 is read again
    /// after the interval while attempts remain; anything else ends it).
    async fn confirm(&self, key: PartitionKey, marker_id: &str, message_id: &str) -> Option<bool> {
        let attempts = self.options.read_back_attempts;
        for attempt in 1..=attempts {
            let read = store::bounded(
                "read_item",
                self.options.store_timeout,
                store::read_item(&self.container, key.clone(), marker_id),
            )
            .await;
            match read {
                Ok(ReadOutcome::Found { document, .. })
                    if document::is_genuine_inbox_marker(&document, message_id) =>
                {
                    return Some(inbox_marker::is_completed(&document));
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
