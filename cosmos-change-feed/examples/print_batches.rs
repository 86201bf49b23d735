//! Run with `cargo run -p cosmos-change-feed --example print_batches`.
//!
//! A change-feed processor end to end against the Azure SDK's in-memory emulator (in process,
//! nothing persisted, no network): creates a monitored container and a lease container, writes
//! some documents, runs a processor that prints every batch it is handed, and shuts it down
//! once every document has been seen.

use std::collections::BTreeSet;
use std::process::ExitCode;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use azure_data_cosmos::clients::ContainerClient;
use azure_data_cosmos::models::{ContainerProperties, PartitionKeyDefinition};
use azure_data_cosmos::options::Region;
use azure_data_cosmos::{
    AccountEndpoint, AccountReference, CosmosClient, CosmosClientBuilder, CosmosRuntimeBuilder,
    RoutingStrategy,
};
use azure_data_cosmos_driver::in_memory_emulator::{
    ConsistencyLevel, InMemoryEmulatorHttpClient, VirtualAccountConfig, VirtualRegion,
};
use cosmos_change_feed::{
    BoxError, ChangeFeedBatch, ChangeFeedProcessor, ChangeFeedProcessorOptions,
};
use futures::FutureExt;
use serde_json::json;

/// The emulator's endpoint: never dialled, the emulator answers in process.
const ENDPOINT: &str = "https://example.emulator.local/";
/// The Cosmos DB emulator's well-known account key.
const KEY: &str =
    "C2y6yDjf5/R+ob0N8A7Cgv30VRDJIWEHLM+4QDU5DE2nQ9nDuVTqobD4b8mGGyPMbIZnqyMsEcaGQy67XIw/Jw==";
const DOCUMENTS: usize = 25;

#[tokio::main]
async fn main() -> ExitCode {
    match run().await {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            // A sentence with its causes, not a `Debug` dump.
            eprintln!("print_batches: {}", chain(&*error));
            ExitCode::FAILURE
        }
    }
}

/// `error` and its sources, joined by `": "`.
fn chain(error: &(dyn std::error::Error + 'static)) -> String {
    let mut text = error.to_string();
    let mut cause = error.source();
    while let Some(next) = cause {
        text.push_str(": ");
        text.push_str(&next.to_string());
        cause = next.source();
    }
    text
}

async fn run() -> Result<(), BoxError> {
    let client = in_memory_client().await?;
    client.create_database("shop", None).await?;
    let orders = container(&client, "orders", "/orderId").await?;
    let leases = container(&client, "orders-leases", "/id").await?;

    for i in 0..DOCUMENTS {
        let id = format!("order-{i}");
        let order = json!({ "id": id, "orderId": id, "quantity": i });
        orders.create_item(id.clone(), &id, &order, None).await?;
    }

    let seen = Arc::new(Mutex::new(BTreeSet::new()));
    let recorded = Arc::clone(&seen);
    let options = ChangeFeedProcessorOptions::default()
        .with_poll_interval(Duration::from_millis(100))
        .with_max_items_per_page(10);
    let processor = ChangeFeedProcessor::builder("orders-printer", "host-1", orders, leases)
        .options(options)
        .on_fault(|fault| {
            eprintln!(
                "lease {} faulted: {}",
                fault.lease_token,
                chain(fault.error)
            )
        })
        .start(move |batch: ChangeFeedBatch| {
            let seen = Arc::clone(&recorded);
            async move {
                let ids: Vec<&str> = batch
                    .documents
                    .iter()
                    .filter_map(|doc| doc["id"].as_str())
                    .collect();
                println!(
                    "lease {}: {} documents {ids:?}",
                    batch.lease_token,
                    ids.len()
                );
                let mut seen = seen.lock().unwrap_or_else(|p| p.into_inner());
                seen.extend(ids.into_iter().map(str::to_owned));
                Ok(())
            }
            .boxed()
        })
        .await?;
    println!(
        "processor '{}' started as '{}'",
        processor.processor_name(),
        processor.instance_name()
    );

    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while seen.lock().unwrap_or_else(|p| p.into_inner()).len() < DOCUMENTS {
        if tokio::time::Instant::now() > deadline {
            return Err("not every document was handed over within 30 s".into());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    for status in processor.lease_statuses() {
        let age = status
            .last_checkpoint_age
            .map_or("none yet".to_owned(), |age| format!("{age:?} ago"));
        println!("lease {}: last checkpoint {age}", status.lease_token);
    }
    processor.shutdown().await;
    println!("all {DOCUMENTS} documents handed over; processor stopped, leases released");
    Ok(())
}

/// A real SDK client whose HTTP layer is the SDK's in-memory emulator.
async fn in_memory_client() -> Result<CosmosClient, BoxError> {
    let endpoint: AccountEndpoint = ENDPOINT.parse()?;
    let config =
        VirtualAccountConfig::new(vec![VirtualRegion::new("East US", endpoint.url().clone())])?
            .with_consistency(ConsistencyLevel::Session);
    let emulator = Arc::new(InMemoryEmulatorHttpClient::try_new(config)?);
    let runtime = CosmosRuntimeBuilder::from(emulator.runtime_builder())
        .build()
        .await?;
    let client = CosmosClientBuilder::new()
        .with_runtime(runtime)
        .build(
            AccountReference::with_authentication_key(endpoint, KEY),
            RoutingStrategy::ProximityTo(Region::EAST_US),
        )
        .await?;
    Ok(client)
}

/// Creates container `name` of database `shop` with partition key `path`, and its handle.
async fn container(
    client: &CosmosClient,
    name: &str,
    path: &str,
) -> Result<Arc<ContainerClient>, BoxError> {
    let database = client.database_client("shop");
    let properties = ContainerProperties::new(
        name.to_owned(),
        PartitionKeyDefinition::new(vec![path.to_owned().into()]),
    );
    database.create_container(properties, None).await?;
    Ok(Arc::new(database.container_client(name, None).await?))
}
