//! What an operator's tools cannot see from the leases alone: which leases this instance holds
//! under a Drain Suspension. Each processor of a relay host keeps one document of its own in
//! its lease container, rewritten only when that set changes; `chatter leases` reads it.
//!
//! The lease documents keep the .NET shape, so the state sits beside them under an id no lease
//! has (`chatter-relay-state:` and a hash of processor and instance), with fields no lease
//! document has. It exists only while a lease is suspended: deleted when the set empties and
//! when the relay stops. An instance that crashed while suspended leaves its document behind;
//! it carries a `ttl` of a day (rewritten twice a day while a lease stays suspended), so where
//! the lease container has TTL on, that goes too.

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

/// How long a state document lives without being rewritten (where the lease container has TTL
/// on, as chatter's own lease containers have): a relay gone for good leaves nothing for long.
const STATE_TTL: Duration = Duration::from_secs(24 * 3600);

/// How long a stopping relay spends on its state document at most (each of a write in flight
/// and the delete), so a store that is down does not hold up the stop.
const STOP_BOUND: Duration = Duration::from_secs(5);

impl StatePublisher {
    pub(super) async fn run(self, stop: CancellationToken) {
        // What the store holds, as far as this instance knows: nothing written while nothing
        // was ever suspended, so a quiet relay costs nothing. `None` after a failed write (it
        // may have landed or not): the next look writes whatever the set is then.
        let mut written: Option<Vec<String>> = Some(Vec::new());
        let mut written_at = tokio::time::Instant::now();
        let mut warned = false;
        loop {
            tokio::select! {
                () = stop.cancelled() => {
                    if written.as_ref().is_none_or(|set| !set.is_empty()) {
                        self.remove_at_stop().await;
                    }
                    return;
                }
                () = tokio::time::sleep(self.every) => {}
            }
            let suspended = self.gate.suspended_leases();
            // A non-empty set is rewritten before its document would expire.
            let stale = !suspended.is_empty() && written_at.elapsed() > STATE_TTL / 2;
            if written.as_ref() == Some(&suspended) && !stale {
                continue;
            }
            let result = {
                let writing = self.write(&suspended);
                tokio::pin!(writing);
                tokio::select! {
                    () = stop.cancelled() => {
                        // The write ends first (briefly), so it does not land after the delete
                        // (unless it outlasts the bound).
                        let _ = tokio::time::timeout(STOP_BOUND, &mut writing).await;
                        self.remove_at_stop().await;
                        return;
                    }
                    result = &mut writing => result,
                }
            };
            match result {
                Ok(()) => {
                    written = Some(suspended);
                    written_at = tokio::time::Instant::now();
                    warned = false;
                }
                Err(error) => {
                    written = None;
                    if !warned {
                        tracing::warn!(processor = self.processor_name, error = %ErrorChain(&error), "chatter relay could not record its suspended leases for operators' tools; it tries again");
                        warned = true;
                    }
                }
            }
        }
    }

    /// The document's id: the prefix and a hash of processor and instance (an instance name is
    /// a host name, which may hold characters a Cosmos id may not).
    fn id(&self) -> String {
        use sha2::{Digest, Sha256};
        let digest = Sha256::digest(format!("{}\n{}", self.processor_name, self.instance));
        let hex: String = digest[..16].iter().map(|b| format!("{b:02x}")).collect();
        format!("{STATE_ID_PREFIX}{hex}")
    }

    /// Deletes the document as the relay stops (nothing is suspended by a relay that is gone),
    /// bounded by [`STOP_BOUND`]: left behind, it names an instance that owns no lease.
    async fn remove_at_stop(&self) {
        let bound = self.store_timeout.min(STOP_BOUND);
        if let Err(error) = crate::cosmos::store::bounded("delete_item", bound, self.remove()).await
        {
            tracing::warn!(processor = self.processor_name, error = %ErrorChain(&error), "chatter relay could not remove its suspended-lease record as it stopped; `chatter leases` ignores it (its instance owns no lease)");
        }
    }

    /// Deletes the document; one that is not there is fine.
    async fn remove(&self) -> Result<(), crate::cosmos::CosmosStoreError> {
        let id = self.id();
        let key = azure_data_cosmos::models::PartitionKey::from(id.clone());
        crate::cosmos::store::delete_item(&self.leases, key, &id)
            .await
            .map(|_| ())
    }

    /// Records `suspended`: the document when it holds any lease, none when it is empty.
    async fn write(&self, suspended: &[String]) -> Result<(), crate::cosmos::CosmosStoreError> {
        if suspended.is_empty() {
            return crate::cosmos::store::bounded("delete_item", self.store_timeout, self.remove())
                .await;
        }
        let id = self.id();
        let doc: Value = json!({
            "id": id,
            STATE_PROCESSOR_FIELD: self.processor_name,
            STATE_INSTANCE_FIELD: self.instance,
            STATE_SUSPENDED_FIELD: suspended,
            "ttl": STATE_TTL.as_secs(),
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
