//! The drain: what the relay does with each change-feed page of a monitored container.
//!
//! Only genuine pending Outbox Documents pass the gate (`_chatterType == "outbox"`,
//! `status == "pending"`, `id == "outbox:" + encode(MessageId)`); everything else (the handler's
//! own documents, inbox markers, delivered documents, the relay's own stamp coming back through the
//! change feed) is skipped. A pending document is reconstructed verbatim, published, and only after
//! the broker confirmed it stamped delivered with a TTL in one patch. A failed publish stamps
//! nothing and fails the page, so the change-feed processor does not checkpoint past it and the
//! page is read again: at-least-once, never lost.

use std::sync::Arc;

use serde_json::Value;

use crate::broker::{Broker, BrokerError};
use crate::cosmos::{self, ContainerClient, CosmosStoreError};
use crate::document::{self, OutboxDocument, outbox};

/// What the relay stamps on a delivered document.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeliverySettings {
    /// The `status` value of a delivered document (default `"delivered"`).
    pub delivered_status: String,
    /// The `ttl` (seconds) stamped with it, so Cosmos purges delivered documents (default 86 400,
    /// one day). Must be positive.
    pub delivered_ttl_seconds: i64,
}

impl Default for DeliverySettings {
    fn default() -> Self {
        Self {
            delivered_status: outbox::STATUS_DELIVERED.to_owned(),
            delivered_ttl_seconds: 86_400,
        }
    }
}

impl DeliverySettings {
    /// Rejects settings that would never purge or would look pending again.
    pub fn validate(&self) -> Result<(), String> {
        if self.delivered_ttl_seconds <= 0 {
            return Err(format!(
                "the delivered ttl must be positive seconds, got {}",
                self.delivered_ttl_seconds
            ));
        }
        let status = self.delivered_status.trim();
        if status.is_empty() || status == outbox::STATUS_PENDING {
            return Err(format!(
                "the delivered status must be non-blank and not `pending`, got {:?}",
                self.delivered_status
            ));
        }
        Ok(())
    }
}

/// What one page did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DrainReport {
    /// Published and stamped delivered.
    pub published: usize,
    /// Not pending Outbox Documents: left untouched.
    pub skipped: usize,
    /// Pending but not reconstructible: stamped `undeliverable`, not published.
    pub undeliverable: usize,
}

/// Why a page failed; the processor reads it again.
#[derive(Debug, thiserror::Error)]
pub enum DrainError {
    /// The broker did not confirm; the document stays pending.
    #[error(
        "publishing outbox message '{message_id}' to `{destination}` failed; it stays pending and is published again: {source}"
    )]
    Publish {
        /// The message id.
        message_id: String,
        /// The destination.
        destination: String,
        /// The broker error.
        #[source]
        source: BrokerError,
    },
    /// Published, but the delivered stamp failed: it will be published again (consumers dedup).
    #[error(
        "outbox message '{message_id}' was published but stamping it delivered failed; it stays pending and is published again: {source}"
    )]
    Confirmation {
        /// The message id.
        message_id: String,
        /// The store error.
        #[source]
        source: CosmosStoreError,
    },
    /// An undeliverable document could not be stamped.
    #[error(
        "outbox document '{id}' is undeliverable ({reason}) and stamping it so failed: {source}"
    )]
    UndeliverableStamp {
        /// The document id.
        id: String,
        /// Why it is undeliverable.
        reason: String,
        /// The store error.
        #[source]
        source: CosmosStoreError,
    },
    /// A pending document without a string `id` (R3.32).
    #[error("A pending outbox document is missing its 'id'; cannot stamp it.")]
    MissingId,
}

/// Drains the pages of one monitored container.
#[derive(Clone)]
pub struct Drain {
    broker: Arc<dyn Broker>,
    container: Arc<ContainerClient>,
    partition_key_paths: &'static [&'static str],
    settings: DeliverySettings,
}

impl std::fmt::Debug for Drain {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Drain")
            .field("partition_key_paths", &self.partition_key_paths)
            .field("settings", &self.settings)
            .finish_non_exhaustive()
    }
}

impl Drain {
    /// A drain publishing on `broker` and stamping in `container`, whose partition-key path(s) are
    /// `partition_key_paths`.
    pub fn new(
        broker: Arc<dyn Broker>,
        container: Arc<ContainerClient>,
        partition_key_paths: &'static [&'static str],
        settings: DeliverySettings,
    ) -> Self {
        Self {
            broker,
            container,
            partition_key_paths,
            settings,
        }
    }

    /// Drains one page in order; stops at the first document that could not be published and
    /// stamped, so nothing after it is checkpointed.
    pub async fn drain(&self, documents: &[Value]) -> Result<DrainReport, DrainError> {
        let mut report = DrainReport::default();
        for doc in documents {
            if !document::is_pending_outbox(doc) {
                report.skipped += 1;
                continue;
            }
            let id = doc
                .get(outbox::ID_FIELD)
                .and_then(Value::as_str)
                .ok_or(DrainError::MissingId)?;
            let message = match OutboxDocument::from_json(doc).and_then(|d| d.to_message()) {
                Ok(message) => message,
                Err(reason) => {
                    self.stamp_undeliverable(doc, id, reason.to_string())
                        .await?;
                    report.undeliverable += 1;
                    continue;
                }
            };
            let message_id = message.message_id.clone();
            let destination = message.destination.clone();
            self.broker
                .publish(message)
                .await
                .map_err(|source| DrainError::Publish {
                    message_id: message_id.clone(),
                    destination: destination.clone(),
                    source,
                })?;
            let stamp = [
                (
                    "/status",
                    Value::from(self.settings.delivered_status.as_str()),
                ),
                ("/ttl", Value::from(self.settings.delivered_ttl_seconds)),
            ];
            self.patch(doc, id, &stamp)
                .await
                .map_err(|source| DrainError::Confirmation {
                    message_id: message_id.clone(),
                    source,
                })?;
            tracing::debug!(
                message_id,
                destination,
                "chatter relay published outbox message"
            );
            report.published += 1;
        }
        Ok(report)
    }

    async fn stamp_undeliverable(
        &self,
        doc: &Value,
        id: &str,
        reason: String,
    ) -> Result<(), DrainError> {
        let stamp = [("/status", Value::from(outbox::STATUS_UNDELIVERABLE))];
        match self.patch(doc, id, &stamp).await {
            Ok(()) => {
                tracing::error!(
                    id,
                    reason,
                    "chatter relay stamped an outbox document undeliverable; it will not be published"
                );
                Ok(())
            }
            Err(source) => Err(DrainError::UndeliverableStamp {
                id: id.to_owned(),
                reason,
                source,
            }),
        }
    }

    /// One patch keyed by the document's id and the partition key recovered from the document at
    /// the declared path(s) (R3.31: a missing value is a JSON `null` component).
    async fn patch(
        &self,
        doc: &Value,
        id: &str,
        ops: &[(&str, Value)],
    ) -> Result<(), CosmosStoreError> {
        let values: Vec<Value> = self
            .partition_key_paths
            .iter()
            .map(|path| {
                document::values_at_paths(doc, &[path])
                    .and_then(|mut v| v.pop())
                    .unwrap_or(Value::Null)
            })
            .collect();
        let key = cosmos::partition_key(&values)?;
        cosmos::patch_item(&self.container, key, id, ops)
            .await
            .map(|_| ())
    }
}
