//! The drain: what the relay does with each change-feed page of a monitored container.
//!
//! Per page (catalog 6.3's order): the [Drain Suspension](super::suspension) gate is consulted
//! once, above every document; a suspended lease's page is refused whole and not checkpointed.
//! Then per document:
//!
//! 1. Only genuine pending Outbox Documents pass the pending gate; everything else (the handler's
//!    own documents, inbox markers, delivered documents, the relay's own stamps coming back) is
//!    skipped.
//! 2. The [Outbox Document Contract](crate::document::outbox_contract) verifies it. A document
//!    whose own fields prove it can never be published, or that the broker will refuse every time
//!    ([`BrokerError::is_permanent`]), is stamped `undeliverable` (one op, no ttl), then logged at
//!    Error, and the page goes on past it.
//! 3. Otherwise it is published, and only after the broker confirmed stamped delivered with a TTL
//!    in one patch. A failed publish stamps nothing and fails the page, so the change-feed
//!    processor does not checkpoint past it: at-least-once, never lost. A failed stamp after a
//!    publish is a Confirmation Failure, counted by the gate.
//!
//! Every stamp that lands mints a [`ConfirmationReceipt`]; the page's receipts are presented to
//! the gate once, after the whole page.

use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;

use super::delivery::DeliverySettings;
use super::diagnostics;
use super::suspension::{ConfirmationReceipt, DrainGate};
use crate::broker::{Broker, BrokerError};
use crate::cosmos::{self, ContainerClient, CosmosStoreError};
use crate::document::{self, ContractViolations, outbox, outbox_contract};
use crate::partition_key::{self, PartitionKeyPath};

/// What one page did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DrainReport {
    /// Published and stamped delivered.
    pub published: usize,
    /// Not pending Outbox Documents: left untouched.
    pub skipped: usize,
    /// Pending but never publishable: stamped `undeliverable`, not published.
    pub undeliverable: usize,
}

/// Why a pending Outbox Document was stamped `undeliverable`.
#[derive(Debug, Clone, thiserror::Error)]
pub(crate) enum UndeliverableReason {
    /// The document's own fields violate the Outbox Document Contract.
    #[error(transparent)]
    Contract(ContractViolations),
    /// The broker refuses the message every time.
    #[error(
        "The broker refuses outbox document '{message_id}' every time it is published: {refusal}. \
         The document's own persisted fields prove this, so redraining it would fail identically; \
         correct the writer that produced it."
    )]
    BrokerRefusal {
        /// The document's `MessageId`.
        message_id: String,
        /// The broker's permanent refusal.
        refusal: Arc<BrokerError>,
    },
}

/// Why a page failed; the processor reads it again.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DrainError {
    /// The lease is suspended: nothing was published and the page is not checkpointed.
    #[error(
        "The Cosmos Outbox Relay has suspended draining lease '{lease_token}': its documents \
         published but could not be marked delivered, so every redrain republished them. The \
         batch is not checkpointed and re-surfaces once draining resumes."
    )]
    Suspended {
        /// The suspended lease.
        lease_token: String,
    },
    /// The broker did not confirm; the document stays pending.
    #[error(
        "publishing outbox message '{message_id}' to `{destination}` failed; it stays pending and is published again"
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
    /// Published, but the delivered stamp failed (a Confirmation Failure): it will be published
    /// again (consumers dedup), until the gate suspends the lease.
    #[error(
        "outbox message '{message_id}' was published but stamping it delivered failed; it stays pending and is published again"
    )]
    Confirmation {
        /// The message id.
        message_id: String,
        /// The store error.
        #[source]
        source: CosmosStoreError,
    },
    /// An undeliverable document could not be stamped; nothing was published, so this is no
    /// Confirmation Failure.
    #[error("outbox document '{id}' is undeliverable and stamping it so failed")]
    UndeliverableStamp {
        /// The document id.
        id: String,
        /// The store error.
        #[source]
        source: CosmosStoreError,
    },
}

/// What one document did.
enum Processed {
    Skipped,
    Published(ConfirmationReceipt),
    Undeliverable(ConfirmationReceipt),
}

/// Drains the pages of one monitored container, for one change-feed processor.
#[derive(Clone)]
pub struct Drain {
    broker: Arc<dyn Broker>,
    container: Arc<ContainerClient>,
    partition_key_paths: &'static [PartitionKeyPath],
    settings: DeliverySettings,
    gate: Arc<DrainGate>,
    publish_timeout: Duration,
    store_timeout: Duration,
}

/// The default bound of one publish and of one stamp.
pub(crate) const DEFAULT_DRAIN_TIMEOUT: Duration = Duration::from_secs(30);

impl std::fmt::Debug for Drain {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Drain")
            .field("partition_key_paths", &self.partition_key_paths)
            .field("settings", &self.settings)
            .field("gate", &self.gate)
            .finish_non_exhaustive()
    }
}

impl Drain {
    /// A drain for the processor `source_identity`, publishing on `broker` and stamping in
    /// `container`, whose partition-key path(s) are `partition_key_paths`; its Drain Suspension
    /// gate runs on the system clock.
    pub fn new(
        source_identity: impl Into<String>,
        broker: Arc<dyn Broker>,
        container: Arc<ContainerClient>,
        partition_key_paths: &'static [PartitionKeyPath],
        settings: DeliverySettings,
    ) -> Self {
        Self {
            broker,
            container,
            partition_key_paths,
            settings,
            gate: Arc::new(DrainGate::new(source_identity)),
            publish_timeout: DEFAULT_DRAIN_TIMEOUT,
            store_timeout: DEFAULT_DRAIN_TIMEOUT,
        }
    }

    /// Bounds each publish (broker confirm included) by `publish` and each stamp by `store`
    /// (defaults `DEFAULT_DRAIN_TIMEOUT`). A publish past its bound fails the page like any
    /// failed publish; a stamp past its bound is a failed stamp.
    pub fn with_timeouts(mut self, publish: Duration, store: Duration) -> Self {
        self.publish_timeout = publish;
        self.store_timeout = store;
        self
    }

    #[cfg(any(test, feature = "test-support"))]
    /// The same drain with its gate on `clock` (and no suspension state).
    pub fn with_clock(mut self, clock: Arc<dyn super::suspension::MonotonicClock>) -> Self {
        self.gate = Arc::new(DrainGate::with_clock(
            self.gate.source_identity().to_owned(),
            clock,
        ));
        self
    }

    /// The Drain Suspension gate of this drain's processor.
    pub fn gate(&self) -> &Arc<DrainGate> {
        &self.gate
    }

    /// Drains one page of `lease_token` in order; stops at the first document that could not be
    /// published and stamped, so nothing after it is checkpointed.
    pub async fn drain(
        &self,
        lease_token: &str,
        documents: &[Value],
    ) -> Result<DrainReport, DrainError> {
        // Metrics `drain.batches` and `drain.batch.size` go here: recorded before the gate (R6.39).
        if !self.gate.permit_drain(lease_token) {
            return Err(DrainError::Suspended {
                lease_token: lease_token.to_owned(),
            });
        }
        let mut report = DrainReport::default();
        let mut receipt = None;
        for doc in documents {
            match self.process(lease_token, doc).await {
                Ok(Processed::Skipped) => report.skipped += 1,
                Ok(Processed::Published(minted)) => {
                    report.published += 1;
                    receipt = Some(minted);
                }
                Ok(Processed::Undeliverable(minted)) => {
                    report.undeliverable += 1;
                    receipt = Some(minted);
                }
                Err(error) => {
                    if let DrainError::Confirmation { source, .. } = &error {
                        self.gate.record_confirmation_failure(lease_token, source);
                    }
                    return Err(error);
                }
            }
        }
        self.gate.record_confirmation_success(lease_token, receipt);
        Ok(report)
    }

    async fn process(&self, lease_token: &str, doc: &Value) -> Result<Processed, DrainError> {
        if !document::is_pending_outbox(doc) {
            return Ok(Processed::Skipped);
        }
        // The pending gate admits only documents whose `id` is a string.
        let Some(id) = doc.get(outbox::ID_FIELD).and_then(Value::as_str) else {
            return Ok(Processed::Skipped);
        };
        let message = match outbox_contract::verify(doc) {
            Ok(verified) => verified.into_message(),
            Err(violations) => {
                let reason = UndeliverableReason::Contract(violations);
                return self.give_up(lease_token, doc, id, &reason).await;
            }
        };
        let message_id = message.message_id.clone();
        let destination = message.destination.clone();
        // `Broker::publish` refuses what `Broker::check` would, with the same permanent error.
        let published = tokio::time::timeout(self.publish_timeout, self.broker.publish(message))
            .await
            .unwrap_or_else(|_| {
                Err(BrokerError::Timeout {
                    operation: format!("publish `{message_id}` to `{destination}`"),
                    after: self.publish_timeout,
                    source: None,
                })
            });
        match published {
            Ok(()) => {}
            Err(refusal) if refusal.is_permanent() => {
                let reason = UndeliverableReason::BrokerRefusal {
                    message_id,
                    refusal: Arc::new(refusal),
                };
                return self.give_up(lease_token, doc, id, &reason).await;
            }
            Err(source) => {
                return Err(DrainError::Publish {
                    message_id,
                    destination,
                    source,
                });
            }
        }
        let stamp = outbox::delivered_stamp(
            &self.settings.delivered_status,
            self.settings.delivered_ttl_seconds,
        );
        let receipt =
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
        Ok(Processed::Published(receipt))
    }

    /// Stamps `undeliverable` (one op, no ttl: the document is kept for a person to inspect),
    /// then logs. A failed stamp propagates as itself, with nothing logged.
    async fn give_up(
        &self,
        lease_token: &str,
        doc: &Value,
        id: &str,
        reason: &UndeliverableReason,
    ) -> Result<Processed, DrainError> {
        let stamp = outbox::undeliverable_stamp();
        let receipt =
            self.patch(doc, id, &stamp)
                .await
                .map_err(|source| DrainError::UndeliverableStamp {
                    id: id.to_owned(),
                    source,
                })?;
        diagnostics::undeliverable(self.gate.source_identity(), lease_token, id, reason);
        Ok(Processed::Undeliverable(receipt))
    }

    /// One patch keyed by the document's id and the partition key recovered from the document at
    /// the declared path(s) (a missing value is a JSON `null` component).
    async fn patch(
        &self,
        doc: &Value,
        id: &str,
        ops: &[(&str, Value)],
    ) -> Result<ConfirmationReceipt, CosmosStoreError> {
        let values = partition_key::read_back_or_null(doc, self.partition_key_paths);
        let key = partition_key::sdk_key(&values)?;
        cosmos::store::bounded(
            "patch_item",
            self.store_timeout,
            cosmos::store::patch_item(&self.container, key, id, ops),
        )
        .await?;
        Ok(ConfirmationReceipt)
    }
}
