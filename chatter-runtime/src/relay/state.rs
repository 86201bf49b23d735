//! What an operator's tools cannot see from the leases alone: which leases this instance holds
//! under a Drain Suspension. Each processor of a relay host keeps one document of its own in
//! its lease container, rewritten only when that set changes; `chatter leases` reads it.
//!
//! The lease documents keep the .NET shape, so the state sits beside them under an id no lease
//! has (`chatter-relay-state:...`), with fields no lease document has.

use std::sync::Arc;
use std::time::Duration;

use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use super::suspension::DrainGate;
use crate::cosmos::ContainerClient;
use crate::error_chain::ErrorChain;

/// The id prefix of a relay state document.
pub(crate) const STATE_ID_PREFIX: &str = "chatter-relay-state:";
/// The field naming the processor of a relay state document.
pub(crate) const STATE_PROCESSOR_FIELD: &str = "chatterRelayProcessor";
/// The field naming the instance (the leases' `Owner`) of a relay state document.
pub(crate) const STATE_INSTANCE_FIELD: &str = "chatterRelayInstance";
/// The field listing the suspended lease tokens of a relay state document.
pub(crate) const STATE_SUSPENDED_FIELD: &str = "chatterSuspendedLeases";

/// Publishes one processor's suspended leases into its lease container.
pub(super) struct StatePublisher {
    pub(super) processor_name: String,
    pub(super) instance: String,
    pub(super) leases: Arc<ContainerClient>,
    pub(super) gate: Arc<DrainGate>,
    /// How often the set is looked at (the lease renew interval).
    pub(super) every: Duration,
    pub(super) store_timeout: Duration,
}

impl StatePublisher {
    pub(super) async fn run(self, stop: CancellationToken) {
        // Nothing is written while nothing was ever suspended: a quiet relay costs nothing.
        let mut written: Vec<String> = Vec::new();
        let mut warned = false;
        loop {
            tokio::select! {
                () = stop.cancelled() => return,
                () = tokio::time::sleep(self.every) => {}
            }
            let suspended = self.gate.suspended_leases();
            if suspended == written {
                continue;
            }
            match self.write(&suspended).await {
                Ok(()) => {
                    written = suspended;
                    warned = false;
                }
                Err(error) if !warned => {
                    tracing::warn!(processor = self.processor_name, error = %ErrorChain(&error), "chatter relay could not record its suspended leases for operators' tools; it tries again");
                    warned = true;
                }
                Err(_) => {}
            }
        }
    }

    async fn write(&self, suspended: &[String]) -> Result<(), crate::cosmos::CosmosStoreError> {
        let id = format!("{STATE_ID_PREFIX}{}:{}", self.processor_name, self.instance);
        let doc: Value = json!({
            "id": id,
            STATE_PROCESSOR_FIELD: self.processor_name,
            STATE_INSTANCE_FIELD: self.instance,
            STATE_SUSPENDED_FIELD: suspended,
        });
        let key = azure_data_cosmos::models::PartitionKey::from(id.clone());
        crate::cosmos::store::bounded(
            "upsert_item",
            self.store_timeout,
            crate::cosmos::store::upsert_item(&self.leases, key, &doc),
        )
        .await
        .map(|_| ())
    }
}
