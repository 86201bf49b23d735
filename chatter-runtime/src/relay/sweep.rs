//! The stranded-document sweep: every [`sweep_interval`](RelayOptions::sweep_interval), each
//! relay looks over the feed ranges of the leases it owns for pending Outbox Documents their
//! lease has already read past, and puts each back on the change feed.
//!
//! A document is **stranded** when it is pending (the drain's own pending gate, and a
//! standalone relay's pending filter: what the filter turns away is not stranded), older than
//! [`stranded_after`](RelayOptions::stranded_after), and absent from the change feed after its
//! lease's checkpoint. The change feed is read in "latest version" mode, so a document appears
//! there once, at its last write: when a read from the checkpoint to the end does not return
//! it, that last write lies before the checkpoint, and no drain of this lease will ever see it.
//! The pending documents are queried *before* the change feed is read, so a document written or
//! changed in between is found in the read and left alone. A document the lease has not read
//! yet is in that read by construction: it is never written again (its key's order holds).
//!
//! Each document the read does not return is repaired by a no-op write: a server-side patch
//! setting `status` to `pending` again, conditional on the ETag the query read. The write gives
//! the document a new position at the end of its feed range's change feed, where the lease
//! reads it and the drain publishes it as usual. Only when that write lands is the document
//! stranded: logged at Error (naming it, its lease and its age), counted
//! (`chatter.messaging.outbox.stranded`) and shown in the lease's health. A document that
//! changed meanwhile fails the condition and is left as it is: stamped after the query, with
//! the lease's checkpoint then moved past its stamp before the read, it is absent from the read
//! without ever having been stranded. A write that fails otherwise is logged at Warn and the
//! document judged again at the next sweep.
//!
//! The same sweep records the age of the oldest pending document of each owned lease (the
//! `chatter.messaging.outbox.pending.oldest_age` gauge and
//! [`LeaseHealth::oldest_pending_age`](crate::health::LeaseHealth::oldest_pending_age)): a stall users
//! can alert on, whatever its cause.
//!
//! Cost: one query of the pending Outbox Documents of each owned feed range per sweep, and,
//! only when it finds documents older than `stranded_after`, one read of the change feed after
//! every lease's checkpoint (the backlog estimate's read).

use std::collections::{HashMap, HashSet};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use azure_data_cosmos::feed::FeedScope;
use cosmos_change_feed::{ChangeFeedEstimator, FeedRange, LeaseDocument, lease_scope, read_leases};
use futures::StreamExt;
use serde_json::Value;
use tokio_util::sync::CancellationToken;

use super::diagnostics;
use super::options::RelayOptions;
use super::resolver::PendingFilter;
use crate::cosmos::store::{PatchOp, bounded, patch_item_if_match};
use crate::cosmos::{ContainerClient, CosmosStoreError};
use crate::document::outbox::{ID_FIELD, MESSAGE_ID_FIELD, STATUS_PATH, STATUS_PENDING};
use crate::document::{self};
use crate::partition_key::{self, PartitionKeyPath};
use crate::telemetry::metrics::SourceMetrics;

/// The most documents older than `stranded_after` one sweep judges per lease: a lease far
/// behind (blocked, say) holds many such documents that are not stranded, and the sweep must not
/// hold them all. The rest are judged by later sweeps, once the lease moved on.
const MAX_CANDIDATES_PER_LEASE: usize = 1_000;

/// What the last sweep found on one owned lease, for the health report.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct SweepFinding {
    /// The age of the oldest pending document of the lease's feed range; `None` when none.
    pub(crate) oldest_pending_age: Option<Duration>,
    /// The pending documents the sweeps found behind the lease's checkpoint since this
    /// instance owns it (each logged at Error and put back on the change feed).
    pub(crate) stranded: u64,
}

/// The last sweep's finding per owned lease of one processor.
#[derive(Debug, Default, Clone)]
pub(crate) struct SweepFindings(Arc<Mutex<HashMap<String, SweepFinding>>>);

impl SweepFindings {
    pub(crate) fn of(&self, lease_token: &str) -> Option<SweepFinding> {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(lease_token)
            .copied()
    }

    fn replace(&self, findings: HashMap<String, SweepFinding>) {
        *self.0.lock().unwrap_or_else(PoisonError::into_inner) = findings;
    }
}

/// Sweeps one processor's owned leases every `sweep_interval`.
pub(super) struct Sweeper {
    pub(super) processor_name: String,
    pub(super) instance: String,
    pub(super) monitored: Arc<ContainerClient>,
    pub(super) leases: Arc<ContainerClient>,
    pub(super) partition_key_paths: &'static [PartitionKeyPath],
    pub(super) pending_filter: Option<PendingFilter>,
    pub(super) options: RelayOptions,
    pub(super) metrics: Option<Arc<SourceMetrics>>,
    pub(super) findings: SweepFindings,
}

/// A pending document older than `stranded_after`, to be judged.
struct Candidate {
    id: String,
    message_id: String,
    key: Vec<Value>,
    etag: Option<String>,
    age: Duration,
}

/// One owned lease as a sweep sees it.
struct Swept {
    lease_token: String,
    finding: SweepFinding,
    candidates: Vec<Candidate>,
}

impl Sweeper {
    pub(super) async fn run(self, stop: CancellationToken) {
        let estimator = super::backlog::estimator(
            &self.processor_name,
            &self.monitored,
            &self.leases,
            &self.options,
        );
        let mut scope = None;
        loop {
            tokio::select! {
                () = stop.cancelled() => return,
                () = tokio::time::sleep(self.options.sweep_interval) => {}
            }
            tokio::select! {
                () = stop.cancelled() => return,
                () = self.sweep(&estimator, &mut scope) => {}
            }
        }
    }

    /// One sweep; what fails is logged and tried again at the next one.
    async fn sweep(&self, estimator: &ChangeFeedEstimator, scope: &mut Option<String>) {
        let timeout = self.options.processor.store_timeout;
        let owned = match self.owned_leases(scope, timeout).await {
            Ok(owned) => owned,
            Err(error) => {
                diagnostics::sweep_failed(&self.processor_name, None, &error);
                return;
            }
        };
        let mut swept = Vec::with_capacity(owned.len());
        for (lease, range) in owned {
            match self.pending_of(&lease, range).await {
                Ok(lease_swept) => swept.push(lease_swept),
                Err(error) => {
                    diagnostics::sweep_failed(
                        &self.processor_name,
                        Some(&lease.lease_token),
                        &error,
                    );
                }
            }
        }
        if swept.iter().any(|s| !s.candidates.is_empty()) {
            self.judge(estimator, &mut swept).await;
        }
        let mut findings = HashMap::with_capacity(swept.len());
        for mut lease in swept {
            // Counted since this instance owns the lease: a repaired document is no longer
            // found, yet what was found stays visible.
            if let Some(before) = self.findings.of(&lease.lease_token) {
                lease.finding.stranded += before.stranded;
            }
            if let Some(metrics) = &self.metrics {
                let age = lease.finding.oldest_pending_age.unwrap_or_default();
                metrics.oldest_pending_age(&lease.lease_token, age.as_secs_f64());
            }
            findings.insert(lease.lease_token, lease.finding);
        }
        // Leases no longer owned leave the health report.
        self.findings.replace(findings);
    }

    /// The leases of this processor on this monitored container that this instance owns, with
    /// their feed ranges.
    async fn owned_leases(
        &self,
        scope: &mut Option<String>,
        timeout: Duration,
    ) -> Result<Vec<(LeaseDocument, FeedRange)>, SweepError> {
        let scope = match scope {
            Some(scope) => scope.clone(),
            None => {
                let read = tokio::time::timeout(timeout, lease_scope(&self.monitored))
                    .await
                    .map_err(|_| SweepError::TimedOut(timeout))??;
                scope.insert(read).clone()
            }
        };
        let leases = tokio::time::timeout(timeout, read_leases(&self.leases, &self.processor_name))
            .await
            .map_err(|_| SweepError::TimedOut(timeout))??;
        Ok(leases
            .into_iter()
            .filter(|lease| {
                lease.monitored_container.as_deref() == Some(scope.as_str())
                    && lease.owner.as_deref() == Some(self.instance.as_str())
            })
            .filter_map(|lease| {
                let range = lease.feed_range_token.parse::<FeedRange>().ok()?;
                Some((lease, range))
            })
            .collect())
    }

    /// The pending documents of `lease`'s feed range: the oldest one's age, and those older than
    /// `stranded_after` (at most [`MAX_CANDIDATES_PER_LEASE`]; none for a lease without a
    /// checkpoint, which has read past nothing).
    async fn pending_of(
        &self,
        lease: &LeaseDocument,
        range: FeedRange,
    ) -> Result<Swept, SweepError> {
        const OPERATION: &str = "query_items";
        let timeout = self.options.processor.store_timeout;
        let query = crate::cosmos::outbox_query::outbox_query("*", STATUS_PENDING)?;
        // Since the Unix epoch by this instance's clock (a `_ts` is the store's).
        let now = Duration::try_from(crate::clock::now_utc() - time::OffsetDateTime::UNIX_EPOCH)
            .unwrap_or_default();
        let mut oldest: Option<i64> = None;
        let mut candidates = Vec::new();
        let judged = lease.continuation_token.is_some();
        let read = async {
            let mut items = self
                .monitored
                .query_items::<Value>(
                    query,
                    FeedScope::range(range),
                    // A lease's range may span many partitions before its split is handled.
                    Some(crate::cosmos::store::every_partition()),
                )
                .await
                .map_err(|e| CosmosStoreError::request(OPERATION, e))?;
            while let Some(item) = items.next().await {
                let doc = item.map_err(|e| CosmosStoreError::request(OPERATION, e))?;
                if !document::is_pending_outbox(&doc) || !self.passes_filter(&doc) {
                    continue;
                }
                let Some(written) = doc.get("_ts").and_then(Value::as_i64) else {
                    continue;
                };
                oldest = Some(oldest.map_or(written, |o| o.min(written)));
                let age = age_of(written, now);
                if judged
                    && age >= self.options.stranded_after
                    && candidates.len() < MAX_CANDIDATES_PER_LEASE
                {
                    candidates.push(Candidate {
                        id: text(&doc, ID_FIELD),
                        message_id: text(&doc, MESSAGE_ID_FIELD),
                        key: partition_key::read_back_or_null(&doc, self.partition_key_paths),
                        etag: doc.get("_etag").and_then(Value::as_str).map(str::to_owned),
                        age,
                    });
                }
            }
            Ok::<_, CosmosStoreError>(())
        };
        // The whole query is bounded: a large backlog is read page by page within it.
        bounded(OPERATION, timeout.saturating_mul(4), read).await?;
        Ok(Swept {
            lease_token: lease.lease_token.clone(),
            finding: SweepFinding {
                oldest_pending_age: oldest.map(|written| age_of(written, now)),
                stranded: 0,
            },
            candidates,
        })
    }

    /// Reads the change feed after every lease's checkpoint, and repairs each candidate it does
    /// not find there: its lease read past it.
    async fn judge(&self, estimator: &ChangeFeedEstimator, swept: &mut [Swept]) {
        let wanted: HashSet<String> = swept
            .iter()
            .flat_map(|s| s.candidates.iter().map(|c| identity(&c.id, &c.key)))
            .collect();
        let seen = Mutex::new(HashSet::new());
        let paths = self.partition_key_paths;
        let estimate = estimator
            .estimate(|doc| {
                let id = doc
                    .get(ID_FIELD)
                    .and_then(Value::as_str)
                    .unwrap_or_default();
                let key = identity(id, &partition_key::read_back_or_null(doc, paths));
                if wanted.contains(&key) {
                    seen.lock()
                        .unwrap_or_else(PoisonError::into_inner)
                        .insert(key);
                }
                false
            })
            .await;
        let backlogs = match estimate {
            Ok(backlogs) => backlogs,
            Err(error) => {
                diagnostics::sweep_failed(&self.processor_name, None, &SweepError::Feed(error));
                return;
            }
        };
        let seen = seen.into_inner().unwrap_or_else(PoisonError::into_inner);
        for lease in swept.iter_mut() {
            // Only a lease whose feed was surely read to its end is judged: otherwise a
            // document missing from the read may simply not have been reached (and rewriting
            // it would put it behind later documents of its key).
            let read = backlogs
                .iter()
                .find(|b| b.lease_token == lease.lease_token)
                .is_some_and(|b| b.pending.is_ok() && b.complete);
            if !read {
                continue;
            }
            for candidate in std::mem::take(&mut lease.candidates) {
                if seen.contains(&identity(&candidate.id, &candidate.key)) {
                    continue;
                }
                if self.repair(&lease.lease_token, &candidate).await {
                    lease.finding.stranded += 1;
                }
            }
        }
    }

    /// Puts one document judged stranded back on the change feed, and logs and counts it once
    /// that write confirms it was: the write is conditional on the ETag the query read, so it
    /// lands only where the version the change-feed read did not return is still the
    /// document's last write. A document stamped after the query (its stamp then read past by
    /// the lease before the change-feed read) fails the condition and was never stranded.
    /// Returns whether it was.
    async fn repair(&self, lease_token: &str, candidate: &Candidate) -> bool {
        let Some(etag) = &candidate.etag else {
            diagnostics::stranded_unconfirmed(
                &self.processor_name,
                lease_token,
                &candidate.id,
                &SweepError::NoEtag,
            );
            return false;
        };
        let written = async {
            let key = partition_key::sdk_key(&candidate.key)?;
            bounded(
                "patch_item",
                self.options.processor.store_timeout,
                patch_item_if_match(
                    &self.monitored,
                    key,
                    &candidate.id,
                    &[PatchOp::Set(
                        STATUS_PATH.to_owned(),
                        Value::from(STATUS_PENDING),
                    )],
                    etag,
                ),
            )
            .await
        }
        .await;
        match written {
            Ok(_) => {
                self.stranded(lease_token, candidate);
                true
            }
            // Changed or deleted since the query: not stranded (the change-feed read came after
            // its new write was read past), or gone.
            Err(error) if error.is_status(412) || error.is_status(404) => {
                tracing::debug!(
                    source_identity = self.processor_name,
                    lease_token,
                    id = candidate.id,
                    "a pending document missing from the change-feed read changed since the \
                     sweep's query: not stranded"
                );
                false
            }
            // Unconfirmed: the next sweep judges it again.
            Err(error) => {
                diagnostics::stranded_unconfirmed(
                    &self.processor_name,
                    lease_token,
                    &candidate.id,
                    &SweepError::Store(error),
                );
                false
            }
        }
    }

    fn stranded(&self, lease_token: &str, candidate: &Candidate) {
        diagnostics::stranded(
            self.metrics.as_deref(),
            &self.processor_name,
            lease_token,
            &candidate.id,
            &candidate.message_id,
            candidate.age,
        );
    }

    /// The standalone relay's pending filter, as the drain applies it; a filter that panics
    /// judges nothing (the drain does not publish such a document either).
    fn passes_filter(&self, doc: &Value) -> bool {
        let Some(filter) = &self.pending_filter else {
            return true;
        };
        catch_unwind(AssertUnwindSafe(|| filter(doc))).unwrap_or(false)
    }
}

/// A document's identity in its container: its id and partition-key values.
fn identity(id: &str, key: &[Value]) -> String {
    format!("{id}\u{0}{}", Value::from(key.to_vec()))
}

/// `now - written` (`_ts`, Unix seconds), at least zero.
fn age_of(written: i64, now: Duration) -> Duration {
    let written = Duration::from_secs(u64::try_from(written).unwrap_or(0));
    now.saturating_sub(written)
}

fn text(doc: &Value, field: &str) -> String {
    doc.get(field)
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_owned()
}

/// Why a sweep, or one repair, did not complete.
#[derive(Debug, thiserror::Error)]
pub(crate) enum SweepError {
    /// Listing the leases or reading the change feed failed.
    #[error(transparent)]
    Feed(#[from] cosmos_change_feed::StoreError),
    /// A query or a write of the monitored container failed.
    #[error(transparent)]
    Store(#[from] CosmosStoreError),
    /// A lease call did not answer in time.
    #[error("the lease container did not answer within {0:?}")]
    TimedOut(Duration),
    /// The document came without an `_etag`: it cannot be written conditionally.
    #[error("the document has no `_etag`, so it cannot be written back conditionally")]
    NoEtag,
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn the_age_of_a_document_is_never_negative() {
        assert_eq!(
            age_of(100, Duration::from_secs(160)),
            Duration::from_secs(60)
        );
        assert_eq!(age_of(200, Duration::from_secs(160)), Duration::ZERO);
    }

    #[test]
    fn one_id_under_two_keys_is_two_documents() {
        assert_ne!(
            identity("outbox:a", &[json!("k1")]),
            identity("outbox:a", &[json!("k2")])
        );
        assert_eq!(
            identity("outbox:a", &[json!("k1")]),
            identity("outbox:a", &[json!("k1")])
        );
    }
}
