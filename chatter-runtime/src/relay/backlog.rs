//! The backlog of each lease this instance owns: the pending Outbox Documents after its
//! checkpoint, estimated on an interval by reading the change feed from there
//! ([`cosmos_change_feed::ChangeFeedEstimator`]), exported as a gauge and kept for the health
//! report. Runs only with metrics on.
//!
//! The estimate follows the lease documents, so after a split each child lease reports the
//! documents of its own range from the checkpoint it inherited, and a parent left behind is not
//! counted twice.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use cosmos_change_feed::{ChangeFeedEstimator, ErrorChain};
use tokio_util::sync::CancellationToken;

use super::options::RelayOptions;
use crate::cosmos::ContainerClient;
use crate::document;
use crate::telemetry::metrics::SourceMetrics;

/// Estimates one processor's owned leases every `backlog_interval`.
pub(super) struct Estimator {
    pub(super) processor_name: String,
    pub(super) instance: String,
    pub(super) monitored: Arc<ContainerClient>,
    pub(super) leases: Arc<ContainerClient>,
    pub(super) options: RelayOptions,
    pub(super) metrics: Arc<SourceMetrics>,
    /// The last estimate per owned lease, for the health report.
    pub(super) last: Arc<Mutex<HashMap<String, u64>>>,
}

/// The estimator that reads the backlog of the relay's processor `processor_name` with the
/// processor's own options, as the backlog gauge, the sweep and `chatter leases` read it.
pub(crate) fn estimator(
    processor_name: &str,
    monitored: &Arc<ContainerClient>,
    leases: &Arc<ContainerClient>,
    options: &RelayOptions,
) -> ChangeFeedEstimator {
    ChangeFeedEstimator::new(processor_name, Arc::clone(monitored), Arc::clone(leases))
        .options(options.processor.clone())
}

impl Estimator {
    pub(super) async fn run(self, stop: CancellationToken) {
        let estimator = estimator(
            &self.processor_name,
            &self.monitored,
            &self.leases,
            &self.options,
        );
        loop {
            tokio::select! {
                () = stop.cancelled() => return,
                () = tokio::time::sleep(self.options.backlog_interval) => {}
            }
            let estimate = tokio::select! {
                () = stop.cancelled() => return,
                estimate = estimator.estimate(document::is_pending_outbox) => estimate,
            };
            let leases = match estimate {
                Ok(leases) => leases,
                Err(error) => {
                    tracing::warn!(
                        processor = self.processor_name,
                        error = %ErrorChain(&error),
                        "chatter relay could not list its leases to estimate their backlog"
                    );
                    continue;
                }
            };
            let mut owned = HashMap::new();
            for lease in leases {
                if lease.owner.as_deref() != Some(self.instance.as_str()) {
                    continue;
                }
                match lease.pending {
                    Ok(pending) => {
                        self.metrics.backlog(&lease.lease_token, pending);
                        owned.insert(lease.lease_token, pending);
                    }
                    Err(error) => tracing::warn!(
                        processor = self.processor_name,
                        lease_token = lease.lease_token,
                        error = %ErrorChain(&error),
                        "chatter relay could not estimate a lease's backlog"
                    ),
                }
            }
            // Leases no longer owned (taken over, or split) leave the health report.
            *self.last.lock().unwrap_or_else(PoisonError::into_inner) = owned;
        }
    }
}
