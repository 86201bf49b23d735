//! Lease documents: one per (processor, feed range) in the lease container, and the
//! ETag-guarded operations on them.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use azure_data_cosmos::clients::ContainerClient;
use azure_data_cosmos::feed::{FeedRange, FeedScope, Query};
use azure_data_cosmos::options::{FeedOptions, QueryOptions};
use futures::StreamExt;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::error::ErrorChain;
use crate::store::{
    StoreError, bounded, create_item, delete_item, lease_key, read_item, replace_item,
};

/// Options of a query over every physical partition of the lease container, however many it
/// has: the SDK refuses a fresh cross-partition query past 100 (400/20118) unless told a higher
/// fan-out. A filter without `ORDER BY`, drained one partition after another: memory stays
/// flat, and it costs at least one request per physical partition.
fn every_partition() -> QueryOptions {
    QueryOptions::default().with_feed_options(FeedOptions::default().with_max_fan_out(u32::MAX))
}

/// The bounds of a lease's feed range: hex effective-partition-key values, `min` inclusive,
/// `max` exclusive (`""` and `"FF"` are the ends of the key space).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LeaseFeedRange {
    /// Inclusive lower bound.
    pub min: String,
    /// Exclusive upper bound.
    pub max: String,
}

/// A lease document, as stored in the lease container (partition key `/id`).
///
/// ```json
/// {
///   "id": "orders-sync..pJkRAJ5nIvc=..10000000000000000000000000000000-20000000000000000000000000000000",
///   "processorName": "orders-sync",
///   "monitoredContainer": "pJkRAJ5nIvc=",
///   "leaseToken": "10000000000000000000000000000000-20000000000000000000000000000000",
///   "feedRange": { "min": "1000…", "max": "2000…" },
///   "feedRangeToken": "eyJSYW5nZSI6…",
///   "owner": "host-1",
///   "continuationToken": "c1.eyJvcCI6…",
///   "timestamp": 1767225600000
/// }
/// ```
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
#[non_exhaustive]
pub struct LeaseDocument {
    /// `{processor name}..{monitored container}..{lease token}` (see [`lease_id`]).
    pub id: String,
    /// The processor this lease belongs to (a lease container may serve several).
    pub processor_name: String,
    /// The monitored container's resource id (`_rid`, see [`lease_scope`]): a processor name
    /// used on two containers, or on a container deleted and created again, has distinct
    /// leases for each. `None` on a lease written before leases were scoped (migrated when the
    /// processor starts).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub monitored_container: Option<String>,
    /// The feed range as `{min}-{max}`; handed to the batch handler.
    pub lease_token: String,
    /// The feed range's bounds.
    pub feed_range: LeaseFeedRange,
    /// The SDK's serialized form of the feed range (`FeedRange`'s `Display`/`FromStr`).
    pub feed_range_token: String,
    /// The instance owning the lease; `None` when free (released or never taken).
    #[serde(default)]
    pub owner: Option<String>,
    /// The SDK change-feed continuation to resume from; `None` before the first checkpoint.
    #[serde(default)]
    pub continuation_token: Option<String>,
    /// When the owner last wrote the lease (acquire, renew, checkpoint, release), in
    /// milliseconds since the Unix epoch by the writer's clock. For people reading the lease;
    /// expiry is judged by [`server_timestamp`](Self::server_timestamp) when the store gives it.
    #[serde(default)]
    pub timestamp: i64,
    /// When the store last wrote the lease (`_ts`, whole seconds since the Unix epoch, by the
    /// service's clock; read only). The basis of expiry, so a writer's clock never matters.
    #[serde(rename = "_ts", default, skip_serializing)]
    pub server_timestamp: Option<i64>,
    /// The stored document's ETag (read only; never written back).
    #[serde(rename = "_etag", default, skip_serializing)]
    pub etag: Option<String>,
}

impl LeaseDocument {
    /// A free lease (no owner, no checkpoint) of `processor` on the monitored container
    /// `scope` for `range`.
    pub(crate) fn new(processor: &str, scope: &str, range: &FeedRange) -> Self {
        let feed_range = LeaseFeedRange {
            min: range.min_inclusive().to_string(),
            max: range.max_exclusive().to_string(),
        };
        let lease_token = lease_token(&feed_range);
        Self {
            id: lease_id(processor, scope, &lease_token),
            processor_name: processor.to_owned(),
            monitored_container: Some(scope.to_owned()),
            lease_token,
            feed_range,
            feed_range_token: range.to_string(),
            owner: None,
            continuation_token: None,
            timestamp: now_millis(),
            server_timestamp: None,
            etag: None,
        }
    }

    /// The feed range, parsed back from its SDK form.
    pub(crate) fn range(&self) -> Option<FeedRange> {
        self.feed_range_token.parse().ok()
    }

    /// Whether the lease is free or its owner stopped renewing it more than `expiry` ago.
    pub(crate) fn is_expired(&self, expiry: Duration, now_ms: i64) -> bool {
        let expiry_ms = i64::try_from(expiry.as_millis()).unwrap_or(i64::MAX);
        self.owner.as_deref().is_none_or(str::is_empty)
            || self.last_written_ms().saturating_add(expiry_ms) < now_ms
    }

    /// The latest moment the lease can have been written, in milliseconds since the Unix epoch:
    /// the end of the second the store recorded (`_ts` is truncated to whole seconds, so the
    /// write may have come up to a second later), or the writer's `timestamp` when the store
    /// gave none. Judged against the reader's clock: the remaining assumption is that a reader's
    /// clock is within a small fraction of the expiry of the service's.
    pub(crate) fn last_written_ms(&self) -> i64 {
        match self.server_timestamp {
            Some(seconds) => seconds.saturating_mul(1000).saturating_add(999),
            None => self.timestamp,
        }
    }

    /// The owner, when the lease is owned and not expired.
    pub(crate) fn live_owner(&self, expiry: Duration, now_ms: i64) -> Option<&str> {
        if self.is_expired(expiry, now_ms) {
            None
        } else {
            self.owner.as_deref()
        }
    }
}

/// `{min}-{max}` of a feed range.
pub(crate) fn lease_token(range: &LeaseFeedRange) -> String {
    format!("{}-{}", range.min, range.max)
}

/// The lease document id of `processor`'s lease on the monitored container `scope` (its
/// [`lease_scope`]) for the feed range `lease_token`: `{processor}..{scope}..{lease token}`.
///
/// Cosmos ids may not contain `/`, `\`, `?` or `#` (and resource ids are base64, which has `/`);
/// those (and `%`) are %-escaped so distinct names never map to the same id.
pub fn lease_id(processor: &str, scope: &str, lease_token: &str) -> String {
    let mut id = String::with_capacity(processor.len() + scope.len() + lease_token.len() + 4);
    push_escaped(&mut id, processor);
    id.push_str("..");
    push_escaped(&mut id, scope);
    id.push_str("..");
    id.push_str(lease_token);
    id
}

fn push_escaped(id: &mut String, part: &str) {
    for c in part.chars() {
        match c {
            '/' | '\\' | '?' | '#' | '%' => id.push_str(&format!("%{:02X}", u32::from(c))),
            _ => id.push(c),
        }
    }
}

/// The scope of a processor's leases on `monitored`: the container's resource id (`_rid`),
/// which the service assigns when the container is created, so two containers of one name in
/// two databases or accounts, or a container deleted and created again, never share leases.
pub async fn lease_scope(monitored: &ContainerClient) -> Result<String, StoreError> {
    const OPERATION: &str = "read_container";
    let properties = monitored
        .read(None)
        .await
        .map_err(|e| StoreError::request(OPERATION, e))?
        .into_model()
        .map_err(|e| StoreError::codec(OPERATION, e))?;
    properties
        .system_properties
        .resource_id
        .filter(|rid| !rid.is_empty())
        .ok_or(StoreError::MissingResourceId)
}

/// Milliseconds since the Unix epoch, now, by this instance's clock (with feature
/// `test-support`, shifted by the calling thread's skew: [`crate::testing::skew_clock`]).
pub(crate) fn now_millis() -> i64 {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
        .unwrap_or(0);
    #[cfg(feature = "test-support")]
    let now = now.saturating_add(crate::testing::CLOCK_SKEW_MS.with(std::cell::Cell::get));
    now
}

/// Every lease document of `processor_name` in the lease container `leases`, whichever
/// container it monitors (e.g. to see who owns what, or how far each feed range has been
/// checkpointed).
pub async fn read_leases(
    leases: &std::sync::Arc<ContainerClient>,
    processor_name: &str,
) -> Result<Vec<LeaseDocument>, StoreError> {
    LeaseStore::any_scope(leases, processor_name).list().await
}

/// Deletes every lease document of `processor_name` in `leases` (whichever container it
/// monitors, unscoped ones too) and returns how many were deleted: the processor's next start
/// begins afresh from its [`StartFrom`](crate::StartFrom), as if it had never run. Also the way
/// to remove the leases left behind by a monitored container that was deleted.
///
/// Run it while no instance of the processor runs: a running instance keeps serving the leases
/// it holds (its next write finds them gone and it stops them), and any instance that starts
/// afterwards creates new ones.
///
/// # Errors
///
/// Listing or deleting failing (a lease changed meanwhile is not deleted: a running instance
/// wrote it; the call fails naming it rather than racing it).
pub async fn reset_leases(
    leases: &std::sync::Arc<ContainerClient>,
    processor_name: &str,
) -> Result<usize, StoreError> {
    let store = LeaseStore::any_scope(leases, processor_name);
    let all = store.list().await?;
    for lease in &all {
        match store.delete(lease).await {
            LeaseWrite::Written(_) => {}
            LeaseWrite::Conflict => {
                return Err(StoreError::LeaseChanged {
                    id: lease.id.clone(),
                });
            }
            LeaseWrite::Failed(error) => return Err(error),
        }
    }
    Ok(all.len())
}

/// The outcome of an ETag-guarded lease write.
#[derive(Debug)]
pub(crate) enum LeaseWrite {
    /// Written; the new ETag.
    Written(Option<String>),
    /// 412 or 404: someone else wrote (or deleted) the lease since we read it.
    Conflict,
    /// Any other failure (the lease may or may not still be ours).
    Failed(StoreError),
}

/// The lease store of one processor: its documents in the lease container.
#[derive(Clone)]
pub(crate) struct LeaseStore {
    pub(crate) container: std::sync::Arc<ContainerClient>,
    pub(crate) processor: String,
    /// The monitored container's [`lease_scope`]; `None` lists the processor's leases of every
    /// monitored container (the public reads and the reset).
    pub(crate) scope: Option<String>,
    /// The bound of every call on the lease container.
    pub(crate) timeout: Duration,
}

impl LeaseStore {
    /// The leases of `processor` on any monitored container, at the default store timeout.
    fn any_scope(leases: &std::sync::Arc<ContainerClient>, processor: &str) -> Self {
        Self {
            container: std::sync::Arc::clone(leases),
            processor: processor.to_owned(),
            scope: None,
            timeout: crate::options::ChangeFeedProcessorOptions::default().store_timeout,
        }
    }

    /// The scope of this store's leases (empty for an any-scope store, which creates none).
    pub(crate) fn scope(&self) -> &str {
        self.scope.as_deref().unwrap_or_default()
    }

    /// Moves the processor's leases written before leases were scoped (no
    /// `monitoredContainer`) to this store's scope: each is created under its scoped id with
    /// its owner, range and checkpoint, then the old document is deleted. Returns how many
    /// moved. An old document changed meanwhile (an instance of an earlier version still
    /// serves it) is left in place and reported: both serve that range until the old instance
    /// stops, which may hand documents over twice, never loses one.
    pub(crate) async fn migrate_unscoped(&self) -> Result<usize, StoreError> {
        let Some(scope) = self.scope.as_deref() else {
            return Ok(0);
        };
        let unscoped = self
            .list_where("NOT IS_DEFINED(c.monitoredContainer)", None)
            .await?;
        let mut moved = 0;
        for old in unscoped {
            let mut scoped = old.clone();
            scoped.monitored_container = Some(scope.to_owned());
            scoped.id = lease_id(&self.processor, scope, &old.lease_token);
            scoped.etag = None;
            // Exists already: an earlier start moved it and could not delete the old one.
            self.create(&scoped).await?;
            match self.delete(&old).await {
                LeaseWrite::Written(_) => moved += 1,
                LeaseWrite::Conflict => tracing::warn!(
                    processor = %self.processor, lease = %old.id,
                    "an unscoped lease changed or went while it was moved to its scoped id: another instance moved it first, or an instance of an earlier version still serves it (then its range may be handed over twice until that instance stops)"
                ),
                LeaseWrite::Failed(error) => return Err(error),
            }
        }
        if moved > 0 {
            tracing::info!(processor = %self.processor, scope, moved, "unscoped leases moved to the monitored container's scope");
        }
        Ok(moved)
    }
    /// Every lease document of this processor (a malformed one is reported at Error).
    pub(crate) async fn list(&self) -> Result<Vec<LeaseDocument>, StoreError> {
        bounded("query_leases", self.timeout, self.list_unbounded()).await
    }

    /// See `repair_unbounded`, bounded by the store timeout.
    pub(crate) async fn repair(&self, lease: &LeaseDocument) -> Result<bool, StoreError> {
        bounded("repair_lease", self.timeout, self.repair_unbounded(lease)).await
    }

    /// The lease document `id` as stored now (`None` when it is gone or not a readable lease),
    /// bounded by the store timeout.
    pub(crate) async fn read(&self, id: &str) -> Result<Option<LeaseDocument>, StoreError> {
        bounded("read_lease", self.timeout, async {
            let doc = read_item(&self.container, lease_key(id), id).await?;
            Ok(doc.and_then(|doc| serde_json::from_value::<LeaseDocument>(doc).ok()))
        })
        .await
    }

    /// See `create_unbounded`, bounded by the store timeout.
    pub(crate) async fn create(&self, lease: &LeaseDocument) -> Result<bool, StoreError> {
        bounded("create_lease", self.timeout, self.create_unbounded(lease)).await
    }

    /// See `replace_unbounded`, bounded by the store timeout (a timeout is a failed write).
    pub(crate) async fn replace(&self, lease: &LeaseDocument) -> LeaseWrite {
        tokio::time::timeout(self.timeout, self.replace_unbounded(lease))
            .await
            .unwrap_or_else(|_| {
                LeaseWrite::Failed(StoreError::timeout("replace_lease", self.timeout))
            })
    }

    /// See `delete_unbounded`, bounded by the store timeout (a timeout is a failed write).
    pub(crate) async fn delete(&self, lease: &LeaseDocument) -> LeaseWrite {
        tokio::time::timeout(self.timeout, self.delete_unbounded(lease))
            .await
            .unwrap_or_else(|_| {
                LeaseWrite::Failed(StoreError::timeout("delete_lease", self.timeout))
            })
    }

    /// Every lease document of this processor (of its scope, when it has one).
    async fn list_unbounded(&self) -> Result<Vec<LeaseDocument>, StoreError> {
        match self.scope.as_deref() {
            Some(scope) => {
                self.list_unbounded_where("c.monitoredContainer = @scope", Some(scope))
                    .await
            }
            None => self.list_unbounded_where("true", None).await,
        }
    }

    /// The processor's lease documents matching `condition` (which may use `@scope`).
    async fn list_where(
        &self,
        condition: &str,
        scope: Option<&str>,
    ) -> Result<Vec<LeaseDocument>, StoreError> {
        bounded(
            "query_leases",
            self.timeout,
            self.list_unbounded_where(condition, scope),
        )
        .await
    }

    async fn list_unbounded_where(
        &self,
        condition: &str,
        scope: Option<&str>,
    ) -> Result<Vec<LeaseDocument>, StoreError> {
        const OPERATION: &str = "query_leases";
        let mut query = Query::from(format!(
            "SELECT * FROM c WHERE c.processorName = @processor AND {condition}"
        ))
        .with_parameter("@processor", &self.processor)
        .map_err(|e| StoreError::codec(OPERATION, e))?;
        if let Some(scope) = scope {
            query = query
                .with_parameter("@scope", scope)
                .map_err(|e| StoreError::codec(OPERATION, e))?;
        }
        let mut items = self
            .container
            .query_items::<Value>(query, FeedScope::full_container(), Some(every_partition()))
            .await
            .map_err(|e| StoreError::request(OPERATION, e))?;
        let mut leases = Vec::new();
        while let Some(item) = items.next().await {
            let item = item.map_err(|e| StoreError::request(OPERATION, e))?;
            match serde_json::from_value::<LeaseDocument>(item.clone()) {
                Ok(lease) if lease.processor_name == self.processor => leases.push(lease),
                Ok(_) => {}
                // Reported every cycle while it stays malformed; `repair` serves its range.
                Err(error) => tracing::error!(
                    processor = %self.processor,
                    id = item.get("id").and_then(serde_json::Value::as_str).unwrap_or("?"),
                    error = %ErrorChain(&error),
                    "a lease document of this processor cannot be read; its feed range gets a new lease"
                ),
            }
        }
        Ok(leases)
    }

    /// Replaces the document at `lease.id`, which exists but is not a readable lease, by
    /// `lease` (keeping a string `continuationToken` it still carries), guarded by its ETag.
    /// `Ok(true)` when replaced; `Ok(false)` when it is a readable lease after all.
    async fn repair_unbounded(&self, lease: &LeaseDocument) -> Result<bool, StoreError> {
        let key = lease_key(&lease.id);
        let Some(existing) = read_item(&self.container, key.clone(), &lease.id).await? else {
            return Ok(false);
        };
        // Readable, with a usable range: a real lease (another instance made it first).
        if serde_json::from_value::<LeaseDocument>(existing.clone())
            .is_ok_and(|lease| lease.range().is_some())
        {
            return Ok(false);
        }
        let mut fresh = lease.clone();
        fresh.continuation_token = existing
            .get("continuationToken")
            .and_then(Value::as_str)
            .map(str::to_owned);
        let doc =
            serde_json::to_value(&fresh).map_err(|e| StoreError::encode("repair_lease", e))?;
        let etag = existing.get("_etag").and_then(Value::as_str);
        match replace_item(&self.container, key, &lease.id, &doc, etag).await {
            Ok(_) => Ok(true),
            Err(e) if e.is_status(412) || e.is_status(404) => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Creates `lease` unless a document with its id exists. `Ok(true)` when created.
    async fn create_unbounded(&self, lease: &LeaseDocument) -> Result<bool, StoreError> {
        let doc = serde_json::to_value(lease).map_err(|e| StoreError::encode("create_lease", e))?;
        match create_item(&self.container, lease_key(&lease.id), &lease.id, &doc).await {
            Ok(_) => Ok(true),
            Err(e) if e.is_status(409) => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Replaces the lease while its ETag is still `lease.etag`. A lease without an ETag is never
    /// written: an unguarded write could overwrite another instance's (the guard fails closed).
    async fn replace_unbounded(&self, lease: &LeaseDocument) -> LeaseWrite {
        let Some(etag) = lease.etag.as_deref() else {
            return LeaseWrite::Failed(StoreError::MissingEtag {
                operation: "replace_lease",
            });
        };
        let doc = match serde_json::to_value(lease) {
            Ok(doc) => doc,
            Err(e) => return LeaseWrite::Failed(StoreError::encode("replace_lease", e)),
        };
        match replace_item(
            &self.container,
            lease_key(&lease.id),
            &lease.id,
            &doc,
            Some(etag),
        )
        .await
        {
            Ok(etag) => LeaseWrite::Written(etag),
            Err(e) if e.is_status(412) || e.is_status(404) => LeaseWrite::Conflict,
            Err(e) => LeaseWrite::Failed(e),
        }
    }

    /// Deletes the lease while its ETag is still `lease.etag` (never without one).
    async fn delete_unbounded(&self, lease: &LeaseDocument) -> LeaseWrite {
        let Some(etag) = lease.etag.as_deref() else {
            return LeaseWrite::Failed(StoreError::MissingEtag {
                operation: "delete_lease",
            });
        };
        match delete_item(&self.container, lease_key(&lease.id), &lease.id, etag).await {
            Ok(()) => LeaseWrite::Written(None),
            Err(e) if e.is_status(412) || e.is_status(404) => LeaseWrite::Conflict,
            Err(e) => LeaseWrite::Failed(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lease_ids_escape_characters_cosmos_forbids() {
        assert_eq!(
            lease_id("a/b?c#d\\e%f", "r/d+=", "-FF"),
            "a%2Fb%3Fc%23d%5Ce%25f..r%2Fd+=..-FF"
        );
        assert_ne!(lease_id("a/b", "s", "x"), lease_id("a%2Fb", "s", "x"));
        assert_ne!(lease_id("p", "s1", "x"), lease_id("p", "s2", "x"));
    }

    #[test]
    fn a_lease_is_expired_when_free_or_not_renewed_within_the_expiry() {
        let mut lease = LeaseDocument::new("p", "s", &FeedRange::full());
        let expiry = Duration::from_secs(30);
        assert!(lease.is_expired(expiry, lease.timestamp), "a free lease");
        lease.owner = Some("a".into());
        assert!(!lease.is_expired(expiry, lease.timestamp + 30_000));
        assert!(lease.is_expired(expiry, lease.timestamp + 30_001));
        lease.owner = Some(String::new());
        assert!(lease.is_expired(expiry, lease.timestamp));
    }

    #[test]
    fn expiry_is_judged_by_the_stores_timestamp_not_the_writers_clock() {
        let mut lease = LeaseDocument::new("p", "s", &FeedRange::full());
        lease.owner = Some("a".into());
        // The writer's clock is an hour behind; the store wrote the lease at second 1000.
        lease.timestamp = 1_000_000 - 3_600_000;
        lease.server_timestamp = Some(1000);
        let expiry = Duration::from_secs(30);
        // The write may have come up to the end of second 1000.
        assert!(!lease.is_expired(expiry, 1_000_999 + 30_000));
        assert!(lease.is_expired(expiry, 1_000_999 + 30_001));
    }

    #[test]
    fn the_lease_document_round_trips_its_feed_range() {
        let lease = LeaseDocument::new("p", "s", &FeedRange::full());
        assert_eq!(lease.lease_token, "-FF");
        assert_eq!(lease.id, "p..s..-FF");
        assert_eq!(lease.monitored_container.as_deref(), Some("s"));
        let json = serde_json::to_value(&lease).unwrap();
        assert!(json.get("_etag").is_none());
        assert!(json.get("_ts").is_none());
        assert_eq!(json["processorName"], "p");
        let back: LeaseDocument = serde_json::from_value(json).unwrap();
        assert_eq!(
            back.range().map(|r| r.to_string()),
            Some(FeedRange::full().to_string())
        );
    }
}
