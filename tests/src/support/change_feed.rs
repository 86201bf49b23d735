//! The change-feed processor's and estimator's tests' common parts: a monitored container with
//! its lease container, short timings, a handler that records what it is handed, and reads of
//! the leases and feed ranges.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use azure_data_cosmos::feed::FeedRange;
use chatter_runtime::cosmos::{ContainerClient, CosmosConnection, partition_key};
use chatter_runtime::testing::upsert_item;
use cosmos_change_feed::{
    BatchFuture, ChangeFeedBatch, ChangeFeedProcessor, ChangeFeedProcessorBuilder,
    ChangeFeedProcessorOptions, LeaseDocument, lease_id, lease_scope, read_leases,
};
use serde_json::json;

use crate::broker::Received;
use crate::store::provisioned_with_leases;

/// Short timings so hand-overs happen within seconds: poll every 50 ms, renew leases every
/// 300 ms, try to acquire leases every 200 ms, leases expire after 3 s.
pub fn fast_options() -> ChangeFeedProcessorOptions {
    ChangeFeedProcessorOptions::default()
        .with_poll_interval(Duration::from_millis(50))
        .with_lease_renew_interval(Duration::from_millis(300))
        .with_lease_expiry(Duration::from_secs(3))
        .with_lease_acquire_interval(Duration::from_millis(200))
}

/// A monitored container (partition key `/orderId`) and its lease container.
pub struct Store {
    /// The container whose change feed is read.
    pub monitored: Arc<ContainerClient>,
    /// Its lease container.
    pub leases: Arc<ContainerClient>,
}

impl Store {
    /// Ensures `database/monitored` (partition key `/orderId`) and `database/leases`.
    pub async fn on(
        connection: &CosmosConnection,
        database: &str,
        monitored: &str,
        leases: &str,
    ) -> Self {
        Self {
            monitored: provisioned_with_leases(
                connection,
                database,
                monitored,
                &["/orderId"],
                leases,
            )
            .await,
            leases: connection.container(database, leases).await.unwrap(),
        }
    }

    /// A builder of the processor `processor` (instance `instance`) on these containers, at the
    /// processor's default options.
    pub fn processor(&self, processor: &str, instance: &str) -> ChangeFeedProcessorBuilder {
        ChangeFeedProcessor::builder(
            processor,
            instance,
            Arc::clone(&self.monitored),
            Arc::clone(&self.leases),
        )
    }

    /// The lease documents of `processor`.
    pub async fn leases_of(&self, processor: &str) -> Vec<LeaseDocument> {
        read_leases(&self.leases, processor).await.unwrap()
    }

    /// The scope of leases on the monitored container (its resource id).
    pub async fn scope(&self) -> String {
        lease_scope(&self.monitored).await.unwrap()
    }

    /// Stores the lease of `processor` for `range` as another instance left it: `owner`
    /// (`None`: free), no checkpoint, and `timestamp` as the writer's clock read.
    pub async fn put_lease(
        &self,
        processor: &str,
        range: &FeedRange,
        owner: Option<&str>,
        timestamp: i64,
    ) {
        let scope = self.scope().await;
        let (min, max) = (range.min_inclusive(), range.max_exclusive());
        let token = format!("{min}-{max}");
        let id = lease_id(processor, &scope, &token);
        let lease = json!({
            "id": id,
            "processorName": processor,
            "monitoredContainer": scope,
            "leaseToken": token,
            "feedRange": { "min": min.to_string(), "max": max.to_string() },
            "feedRangeToken": range.to_string(),
            "owner": owner,
            "continuationToken": null,
            "timestamp": timestamp,
        });
        upsert_item(&self.leases, partition_key(&[json!(id)]).unwrap(), &lease)
            .await
            .unwrap();
    }

    /// The lease tokens of `processor`'s lease documents.
    pub async fn lease_tokens(&self, processor: &str) -> BTreeSet<String> {
        self.leases_of(processor)
            .await
            .into_iter()
            .map(|l| l.lease_token)
            .collect()
    }
}

/// `order-{i}` for every `i` of `range`.
pub fn order_ids(range: std::ops::Range<usize>) -> BTreeSet<String> {
    range.map(|i| format!("order-{i}")).collect()
}

/// A handler that records every handed-over document id in `seen` and succeeds.
pub fn recording(
    seen: &Received,
) -> impl Fn(ChangeFeedBatch) -> BatchFuture + Send + Sync + 'static {
    let seen = seen.clone();
    move |batch| {
        seen.record_all(batch.documents.iter().filter_map(|d| d["id"].as_str()));
        Box::pin(async { Ok(()) })
    }
}

/// The lease tokens (`{min}-{max}`) of `container`'s current feed ranges (the SDK's cache
/// bypassed, so splits are seen).
pub async fn feed_range_tokens(container: &ContainerClient) -> BTreeSet<String> {
    use azure_data_cosmos::options::ReadFeedRangesOptions;
    container
        .read_feed_ranges(Some(
            ReadFeedRangesOptions::default().with_force_refresh(true),
        ))
        .await
        .unwrap()
        .iter()
        .map(|r| format!("{}-{}", r.min_inclusive(), r.max_exclusive()))
        .collect()
}

/// The feed range `min..max` (hex effective-partition-key bounds).
pub fn feed_range(min: &str, max: &str) -> FeedRange {
    use azure_data_cosmos::models::EffectivePartitionKey;
    FeedRange::new(
        EffectivePartitionKey::try_from(min).unwrap(),
        EffectivePartitionKey::try_from(max).unwrap(),
    )
    .unwrap()
}

/// The hex effective-partition-key value halfway between `min` and `max` (as a split would
/// cut a range).
pub fn midpoint(min: &str, max: &str) -> String {
    let value = |hex: &str| {
        let padded = format!("{hex:0<32}");
        u128::from_str_radix(&padded[..32], 16).unwrap()
    };
    let mid = value(min) / 2 + value(max) / 2;
    format!("{mid:032X}")
}
