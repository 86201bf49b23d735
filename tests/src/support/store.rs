//! The Cosmos side of a test: an embedded store or a `chatter-emulator` server, provisioned
//! containers, and point reads by id and partition-key value.

use std::sync::Arc;

use chatter_emulator::{EmulatorServer, RunningEmulator};
use chatter_runtime::cosmos::{self, ContainerClient, CosmosConnection};
use chatter_runtime::provision;
use serde_json::Value;

/// A connection to a fresh embedded store (the SDK's in-memory emulator in this process).
pub async fn embedded() -> CosmosConnection {
    CosmosConnection::embedded()
        .await
        .expect("the embedded store starts")
}

/// A `chatter-emulator` server on a free port of 127.0.0.1 (served by this process until the
/// returned handle drops), and a connection to it over HTTP.
pub async fn emulator_server() -> (RunningEmulator, CosmosConnection) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let emulator = EmulatorServer::from_listener(listener).unwrap().spawn();
    let cosmos = CosmosConnection::connect(emulator.endpoint(), None)
        .await
        .unwrap();
    (emulator, cosmos)
}

/// A `chatter-emulator` account of two regions at `consistency`, its read region catching up
/// every `lag` (a prefix of the write region's history each time): the write region's server,
/// the read region's, and a connection to the write region.
pub async fn two_regions(
    consistency: chatter_emulator::ConsistencyLevel,
    lag: std::time::Duration,
) -> (RunningEmulator, RunningEmulator, CosmosConnection) {
    let bind = || async { tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap() };
    let (write, read) =
        EmulatorServer::with_read_region(bind().await, bind().await, consistency, lag..=lag, 0)
            .unwrap();
    let (write, read) = (write.spawn(), read.spawn());
    let cosmos = CosmosConnection::connect(write.endpoint(), None)
        .await
        .unwrap();
    (write, read, cosmos)
}

/// A connection to the account at `endpoint` that reads in its read region first (the
/// emulator's [`READ_REGION_NAME`](chatter_emulator::READ_REGION_NAME), West US), as an
/// application in that region configures its client.
pub async fn reading_in_read_region(
    endpoint: &str,
) -> Result<CosmosConnection, chatter_runtime::BoxError> {
    connection_through(endpoint, endpoint, true).await
}

/// A connection that dials `url` (one port of a `chatter-emulator` account: its own faults)
/// and names the account `account`, as every process of a fleet names the one account it
/// shares (the relay's processors are named after it); it reads in the read region first when
/// `read_region`.
pub async fn connection_through(
    url: &str,
    account: &str,
    read_region: bool,
) -> Result<CosmosConnection, chatter_runtime::BoxError> {
    use azure_data_cosmos::options::Region;
    use azure_data_cosmos::{AccountReference, CosmosClientBuilder, RoutingStrategy};
    let reference = AccountReference::with_authentication_key(url.parse()?, cosmos::EMULATOR_KEY);
    let region = if read_region {
        Region::WEST_US
    } else {
        Region::EAST_US
    };
    let client = CosmosClientBuilder::new()
        .build(reference, RoutingStrategy::PreferredRegions(vec![region]))
        .await?;
    Ok(CosmosConnection::from_client(client, account))
}

/// Ensures `database/container` with partition-key `paths` and returns its handle.
pub async fn provisioned(
    cosmos: &CosmosConnection,
    database: &str,
    container: &str,
    paths: &[&str],
) -> Arc<ContainerClient> {
    provision::ensure_container(cosmos, database, container, paths)
        .await
        .unwrap();
    cosmos.container(database, container).await.unwrap()
}

/// Ensures a monitored container `database/container` with partition-key `paths` and its lease
/// container `database/leases`; returns the monitored container's handle.
pub async fn provisioned_with_leases(
    cosmos: &CosmosConnection,
    database: &str,
    container: &str,
    paths: &[&str],
    leases: &str,
) -> Arc<ContainerClient> {
    provision::ensure_container(cosmos, database, container, paths)
        .await
        .unwrap();
    provision::ensure_lease_container(cosmos, database, leases)
        .await
        .unwrap();
    cosmos.container(database, container).await.unwrap()
}

/// An Outbox Document's keys in the order catalog section 0.2 gives them, before its
/// partition-key fields (and the `ttl` a delivered stamp adds): what [`wire_keys`] of a stored
/// one starts with.
pub const OUTBOX_WIRE_KEYS: [&str; 8] = [
    "id",
    "_chatterType",
    "status",
    "MessageId",
    "Destination",
    "MessageBody",
    "MessageContentType",
    "MessageContext",
];

/// A batch's inbox marker's keys in the order catalog section 0.3 gives them, before its
/// partition-key fields.
pub const INBOX_MARKER_WIRE_KEYS: [&str; 4] = ["id", "_chatterType", "MessageId", "ReceivedAtUtc"];

/// `keys` followed by `more`: a wire shape with the partition-key fields (or a stamp) after it.
pub fn keys_then<'a>(keys: &[&'a str], more: &[&'a str]) -> Vec<&'a str> {
    [keys, more].concat()
}

/// The top-level keys of a stored document in their order, without the system properties
/// (`_rid`, `_etag`, ...) except `_chatterType`: what a wire-shape assertion compares.
pub fn wire_keys(doc: &Value) -> Vec<&str> {
    doc.as_object()
        .expect("a stored document is a JSON object")
        .keys()
        .map(String::as_str)
        .filter(|k| !k.starts_with('_') || *k == "_chatterType")
        .collect()
}

/// The document `id` under the partition-key values `key`, or `None` if there is none; panics
/// if the read itself fails.
pub async fn find_document(container: &ContainerClient, key: &[Value], id: &str) -> Option<Value> {
    cosmos::read_item(container, cosmos::partition_key(key).unwrap(), id)
        .await
        .unwrap()
        .into_document()
}

/// The document `id` under the partition-key values `key`; panics if it does not exist.
pub async fn document(container: &ContainerClient, key: &[Value], id: &str) -> Value {
    find_document(container, key, id)
        .await
        .unwrap_or_else(|| panic!("document {id} exists"))
}

/// Creates `doc` under the partition-key values `key` (as another writer would: no contract
/// checked) and returns it as stored, system properties included.
pub async fn created(container: &ContainerClient, key: &[Value], doc: &Value) -> Value {
    chatter_runtime::testing::create_item(container, cosmos::partition_key(key).unwrap(), doc)
        .await
        .unwrap();
    document(container, key, doc["id"].as_str().unwrap()).await
}

/// The outbox document of the message `message_id` under the partition-key values `key`;
/// panics if it does not exist.
pub async fn outbox_document(
    container: &ContainerClient,
    key: &[Value],
    message_id: &str,
) -> Value {
    let id = chatter_runtime::cosmos::outbox_id(message_id).unwrap();
    find_document(container, key, &id)
        .await
        .unwrap_or_else(|| panic!("outbox document {id} exists"))
}

/// Reads every feed range of `container`'s change feed from the beginning to its current end
/// (the first empty page), in pages of at most `page` documents (the SDK's default without),
/// and hands each document to `visit`: how a test or bench reads back what the relay left,
/// without a processor.
pub async fn for_each_change(
    container: &ContainerClient,
    page: Option<u32>,
    mut visit: impl FnMut(&Value),
) -> Result<(), chatter_runtime::BoxError> {
    use azure_data_cosmos::feed::FeedScope;
    use azure_data_cosmos::options::{ChangeFeedOptions, ChangeFeedStartFrom, MaxItemCountHint};
    use futures::StreamExt;

    for range in container.read_feed_ranges(None).await? {
        let options = match page {
            Some(page) => Some(
                ChangeFeedOptions::default()
                    .with_max_item_count(MaxItemCountHint::Limit(page.try_into()?)),
            ),
            None => None,
        };
        let mut pages = container
            .query_change_feed::<Value>(
                FeedScope::range(range),
                ChangeFeedStartFrom::Beginning,
                options,
            )
            .await?;
        while let Some(page) = pages.next().await {
            let page = page?;
            if page.items().is_empty() {
                break;
            }
            page.items()
                .iter()
                .filter_map(|item| item.current())
                .for_each(&mut visit);
        }
    }
    Ok(())
}
