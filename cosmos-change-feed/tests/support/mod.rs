//! What the processor's and the estimator's tests share, on the SDK alone: a store (the SDK's
//! in-memory emulator in this process, or `chatter-emulator` serving it over HTTP for fault
//! injection), a monitored container with its lease container, short timings, a handler that
//! records what it is handed, bounded waits, and the processor's logs captured.

// Each test binary compiles this module and uses only its own part of it.
#![allow(dead_code)]

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use azure_data_cosmos::clients::ContainerClient;
use azure_data_cosmos::feed::FeedRange;
use azure_data_cosmos::models::{
    ContainerProperties, EffectivePartitionKey, PartitionKeyDefinition, TimeToLive,
};
use azure_data_cosmos::options::{ReadFeedRangesOptions, Region};
use azure_data_cosmos::{
    AccountEndpoint, AccountReference, CosmosClient, CosmosClientBuilder, CosmosError,
    CosmosRuntimeBuilder, RoutingStrategy,
};
use azure_data_cosmos_driver::in_memory_emulator::{
    ConsistencyLevel, InMemoryEmulatorHttpClient, VirtualAccountConfig, VirtualRegion,
};
use chatter_emulator::{EmulatorServer, RunningEmulator};
use cosmos_change_feed::{
    BatchFuture, ChangeFeedBatch, ChangeFeedProcessor, ChangeFeedProcessorBuilder,
    ChangeFeedProcessorOptions, LeaseDocument, lease_id, lease_scope, read_leases,
};
use serde_json::{Value, json};
use tracing::field::{Field, Visit};
use tracing::subscriber::DefaultGuard;
use tracing::{Event, Level, Subscriber};
use tracing_subscriber::layer::{Context, Layer, SubscriberExt};

/// The Azure Cosmos DB emulator's well-known account key: both emulators accept any key, and
/// the SDK signs every request with one.
const EMULATOR_KEY: &str =
    "C2y6yDjf5/R+ob0N8A7Cgv30VRDJIWEHLM+4QDU5DE2nQ9nDuVTqobD4b8mGGyPMbIZnqyMsEcaGQy67XIw/Jw==";

/// A client of a fresh, empty account in the SDK's in-memory emulator, in this process (the
/// whole SDK pipeline runs; only the HTTP I/O is replaced).
pub(crate) async fn embedded() -> CosmosClient {
    let endpoint: AccountEndpoint = "https://cfp-test.emulator.local/".parse().unwrap();
    let config =
        VirtualAccountConfig::new(vec![VirtualRegion::new("East US", endpoint.url().clone())])
            .unwrap()
            .with_consistency(ConsistencyLevel::Session);
    let emulator = Arc::new(InMemoryEmulatorHttpClient::try_new(config).unwrap());
    let runtime = CosmosRuntimeBuilder::from(emulator.runtime_builder())
        .build()
        .await
        .unwrap();
    CosmosClientBuilder::new()
        .with_runtime(runtime)
        .build(
            AccountReference::with_authentication_key(endpoint, EMULATOR_KEY),
            RoutingStrategy::ProximityTo(Region::EAST_US),
        )
        .await
        .unwrap()
}

/// A `chatter-emulator` server on a free port of 127.0.0.1 (served by this process until the
/// returned handle drops: its `faults()` refuse or delay requests), and a client of it over
/// HTTP. The SDK accepts plain `http://` for a loopback endpoint.
pub(crate) async fn served() -> (RunningEmulator, CosmosClient) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let emulator = EmulatorServer::from_listener(listener).unwrap().spawn();
    let client = client_of(&emulator).await;
    (emulator, client)
}

/// A new client of `emulator` over HTTP (with caches of its own: it sees the partitions as they
/// are now).
pub(crate) async fn client_of(emulator: &RunningEmulator) -> CosmosClient {
    client_at(emulator.endpoint()).await
}

/// A new client of the `chatter-emulator` server at `endpoint`, over HTTP.
pub(crate) async fn client_at(endpoint: &str) -> CosmosClient {
    let endpoint: AccountEndpoint = endpoint.parse().unwrap();
    CosmosClientBuilder::new()
        .build(
            AccountReference::with_authentication_key(endpoint, EMULATOR_KEY),
            RoutingStrategy::PreferredRegions(Vec::new()),
        )
        .await
        .unwrap()
}

fn is_conflict(error: &CosmosError) -> bool {
    u16::from(error.status().status_code()) == 409
}

/// Ensures `database/container` with partition key `path` (TTL on without a default, as an
/// application's container would have) and returns its handle. Tests share a database and a
/// lease container between stores, so what exists already is kept.
async fn container(
    client: &CosmosClient,
    database: &str,
    container: &str,
    path: &str,
) -> Arc<ContainerClient> {
    match client.create_database(database, None).await {
        Err(e) if !is_conflict(&e) => panic!("database {database} is created: {e}"),
        _ => {}
    }
    let database = client.database_client(database);
    let properties = ContainerProperties::new(
        container.to_owned(),
        PartitionKeyDefinition::new(vec![path.to_owned().into()]),
    )
    .with_default_ttl(TimeToLive::NoDefault);
    match database.create_container(properties, None).await {
        Err(e) if !is_conflict(&e) => panic!("container {container} is created: {e}"),
        _ => {}
    }
    Arc::new(database.container_client(container, None).await.unwrap())
}

/// Creates or replaces `doc` (its `id` names it) under the partition-key value `key`, as any
/// writer of the container would: one that tries again while its partition is being split or
/// merged (410/1007, which a test that splits mid-write meets whenever a write falls inside
/// the split's short lock).
pub(crate) async fn upsert(container: &ContainerClient, key: &str, doc: &Value) {
    let id = doc["id"].as_str().expect("the document has an id");
    let mut attempts = 0;
    loop {
        match container.upsert_item(key.to_owned(), id, doc, None).await {
            Ok(_) => return,
            Err(e) if is_split_or_merge(&e) && attempts < 50 => {
                attempts += 1;
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            Err(e) => panic!("{id} is upserted: {e}"),
        }
    }
}

fn is_split_or_merge(error: &CosmosError) -> bool {
    let status = error.status();
    u16::from(status.status_code()) == 410 && status.sub_status().map(u16::from) == Some(1007)
}

/// Short timings so hand-overs happen within seconds: poll every 50 ms, renew leases every
/// 300 ms, try to acquire leases every 200 ms, leases expire after 3 s.
pub(crate) fn fast_options() -> ChangeFeedProcessorOptions {
    ChangeFeedProcessorOptions::default()
        .with_poll_interval(Duration::from_millis(50))
        .with_lease_renew_interval(Duration::from_millis(300))
        .with_lease_expiry(Duration::from_secs(3))
        .with_lease_acquire_interval(Duration::from_millis(200))
}

/// A monitored container (partition key `/orderId`) and its lease container.
pub(crate) struct Store {
    /// The container whose change feed is read.
    pub(crate) monitored: Arc<ContainerClient>,
    /// Its lease container.
    pub(crate) leases: Arc<ContainerClient>,
}

impl Store {
    /// Ensures `database/monitored` (partition key `/orderId`) and `database/leases`
    /// (partition key `/id`).
    pub(crate) async fn on(
        client: &CosmosClient,
        database: &str,
        monitored: &str,
        leases: &str,
    ) -> Self {
        Self {
            monitored: container(client, database, monitored, "/orderId").await,
            leases: container(client, database, leases, "/id").await,
        }
    }

    /// A builder of the processor `processor` (instance `instance`) on these containers, at the
    /// processor's default options.
    pub(crate) fn processor(&self, processor: &str, instance: &str) -> ChangeFeedProcessorBuilder {
        ChangeFeedProcessor::builder(
            processor,
            instance,
            Arc::clone(&self.monitored),
            Arc::clone(&self.leases),
        )
    }

    /// The lease documents of `processor`.
    pub(crate) async fn leases_of(&self, processor: &str) -> Vec<LeaseDocument> {
        read_leases(&self.leases, processor).await.unwrap()
    }

    /// The scope of leases on the monitored container (its resource id).
    pub(crate) async fn scope(&self) -> String {
        lease_scope(&self.monitored).await.unwrap()
    }

    /// Stores the lease of `processor` for `range` as another instance left it: `owner`
    /// (`None`: free), no checkpoint, and `timestamp` as the writer's clock read.
    pub(crate) async fn put_lease(
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
        upsert(&self.leases, &id, &lease).await;
    }

    /// The lease tokens of `processor`'s lease documents.
    pub(crate) async fn lease_tokens(&self, processor: &str) -> BTreeSet<String> {
        self.leases_of(processor)
            .await
            .into_iter()
            .map(|l| l.lease_token)
            .collect()
    }
}

/// `order-{i}` for every `i` of `range`.
pub(crate) fn order_ids(range: std::ops::Range<usize>) -> BTreeSet<String> {
    range.map(|i| format!("order-{i}")).collect()
}

/// Every handed-over document id, with how often it was handed over. Clones share the counts,
/// so one can be shared by several processors' handlers.
#[derive(Clone, Debug, Default)]
pub(crate) struct Seen(Arc<Mutex<BTreeMap<String, usize>>>);

impl Seen {
    /// Counts one more hand-over of each of `ids`, all at once: a reader sees either none or
    /// all of them (a batch is handed over whole).
    pub(crate) fn record_all<'a>(&self, ids: impl IntoIterator<Item = &'a str>) {
        let mut counts = self.0.lock().unwrap();
        for id in ids {
            *counts.entry(id.to_owned()).or_default() += 1;
        }
    }

    /// Every id handed over at least once.
    pub(crate) fn ids(&self) -> BTreeSet<String> {
        self.0.lock().unwrap().keys().cloned().collect()
    }

    /// How often `id` was handed over (0 if never).
    pub(crate) fn count(&self, id: &str) -> usize {
        self.0.lock().unwrap().get(id).copied().unwrap_or(0)
    }

    /// Every id with its count, read at one moment.
    pub(crate) fn snapshot(&self) -> BTreeMap<String, usize> {
        self.0.lock().unwrap().clone()
    }
}

/// A handler that records every handed-over document id in `seen` and succeeds.
pub(crate) fn recording(
    seen: &Seen,
) -> impl Fn(ChangeFeedBatch) -> BatchFuture + Send + Sync + 'static {
    let seen = seen.clone();
    move |batch| {
        seen.record_all(batch.documents.iter().filter_map(|d| d["id"].as_str()));
        Box::pin(async { Ok(()) })
    }
}

/// The lease tokens (`{min}-{max}`) of `container`'s current feed ranges (the SDK's cache
/// bypassed, so splits are seen).
pub(crate) async fn feed_range_tokens(container: &ContainerClient) -> BTreeSet<String> {
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
pub(crate) fn feed_range(min: &str, max: &str) -> FeedRange {
    FeedRange::new(
        EffectivePartitionKey::try_from(min).unwrap(),
        EffectivePartitionKey::try_from(max).unwrap(),
    )
    .unwrap()
}

/// The hex effective-partition-key value halfway between `min` and `max` (as a split would
/// cut a range).
pub(crate) fn midpoint(min: &str, max: &str) -> String {
    let value = |hex: &str| {
        let padded = format!("{hex:0<32}");
        u128::from_str_radix(&padded[..32], 16).unwrap()
    };
    let mid = value(min) / 2 + value(max) / 2;
    format!("{mid:032X}")
}

/// Polls `condition` every `every` until it holds; panics naming `what` once `within` has passed
/// without it holding: no timed assertions, every wait is bounded.
///
/// The condition is checked first, so a condition that already holds returns at once.
pub(crate) async fn eventually<F, Fut>(
    within: Duration,
    every: Duration,
    what: &str,
    mut condition: F,
) where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + within;
    while !condition().await {
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out after {within:?} waiting until {what}"
        );
        tokio::time::sleep(every).await;
    }
}

/// One event the processor logged through `tracing`: its level and formatted message.
#[derive(Debug, Clone)]
pub(crate) struct LogEntry {
    /// Its level.
    pub(crate) level: Level,
    /// The formatted message.
    pub(crate) message: String,
}

/// Every event logged on this thread while the guard of [`capture`] lives. Clones share them.
#[derive(Debug, Clone, Default)]
pub(crate) struct Captured(Arc<Mutex<Vec<LogEntry>>>);

impl Captured {
    /// The entries at `level` whose message contains `text`.
    pub(crate) fn matching(&self, level: Level, text: &str) -> Vec<LogEntry> {
        self.0
            .lock()
            .unwrap()
            .iter()
            .filter(|e| e.level == level && e.message.contains(text))
            .cloned()
            .collect()
    }
}

/// Captures every event of this thread (a `#[tokio::test]` runs its tasks on it) until the
/// guard drops, to assert what the processor logs when it has no `on_fault` to report to.
pub(crate) fn capture() -> (Captured, DefaultGuard) {
    let captured = Captured::default();
    let subscriber = tracing_subscriber::registry().with(Capture(captured.clone()));
    (captured, tracing::subscriber::set_default(subscriber))
}

struct Capture(Captured);

impl<S: Subscriber> Layer<S> for Capture {
    fn on_event(&self, event: &Event<'_>, _ctx: Context<'_, S>) {
        let mut message = Message::default();
        event.record(&mut message);
        self.0.0.lock().unwrap().push(LogEntry {
            level: *event.metadata().level(),
            message: message.0,
        });
    }
}

/// The `message` field of an event; the others are not asserted on.
#[derive(Default)]
struct Message(String);

impl Visit for Message {
    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        if field.name() == "message" {
            self.0 = format!("{value:?}");
        }
    }

    fn record_str(&mut self, field: &Field, value: &str) {
        if field.name() == "message" {
            self.0 = value.to_owned();
        }
    }
}
