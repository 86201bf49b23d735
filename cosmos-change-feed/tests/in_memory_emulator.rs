//! The processor on its own (no chatter) against the SDK's in-memory emulator: it hands every
//! document over, checkpoints and releases its leases on shutdown, and refuses bad names and
//! options with typed errors. The full behaviour suite (balancing, expiry, splits, faults) is
//! `processor.rs` beside it, and the estimator's is `estimator.rs`.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use azure_data_cosmos::clients::ContainerClient;
use azure_data_cosmos::models::{ContainerProperties, PartitionKeyDefinition};
use cosmos_change_feed::{
    BatchFuture, ChangeFeedBatch, ChangeFeedError, ChangeFeedProcessor, ChangeFeedProcessorOptions,
    InvalidOptions, ProcessorOption, read_leases,
};
use futures::FutureExt;
use serde_json::json;

mod support;

/// A fresh in-memory account with database `db`, a monitored container `orders` (`/orderId`)
/// and a lease container `leases` (`/id`).
async fn containers() -> (Arc<ContainerClient>, Arc<ContainerClient>) {
    let client = support::embedded().await;
    client.create_database("db", None).await.unwrap();
    let database = client.database_client("db");
    let mut handles = Vec::new();
    for (name, path) in [("orders", "/orderId"), ("leases", "/id")] {
        let properties = ContainerProperties::new(
            name.to_owned(),
            PartitionKeyDefinition::new(vec![path.to_owned().into()]),
        );
        database.create_container(properties, None).await.unwrap();
        handles.push(Arc::new(
            database.container_client(name, None).await.unwrap(),
        ));
    }
    let leases = handles.pop().unwrap();
    (handles.pop().unwrap(), leases)
}

fn fast() -> ChangeFeedProcessorOptions {
    ChangeFeedProcessorOptions::default()
        .with_poll_interval(Duration::from_millis(50))
        .with_lease_acquire_interval(Duration::from_millis(200))
}

fn ignore(_: ChangeFeedBatch) -> BatchFuture {
    async { Ok(()) }.boxed()
}

#[tokio::test]
async fn every_document_is_handed_over_and_checkpointed_and_the_leases_released() {
    let (orders, leases) = containers().await;
    for i in 0..30 {
        let id = format!("order-{i}");
        orders
            .create_item(id.clone(), &id, &json!({ "id": id, "orderId": id }), None)
            .await
            .unwrap();
    }
    let seen = Arc::new(Mutex::new(BTreeSet::new()));
    let recorded = Arc::clone(&seen);
    let processor =
        ChangeFeedProcessor::builder("p", "host-1", Arc::clone(&orders), Arc::clone(&leases))
            .options(fast().with_max_items_per_page(7))
            .start(move |batch: ChangeFeedBatch| {
                let seen = Arc::clone(&recorded);
                async move {
                    assert!(!batch.documents.is_empty(), "batches are never empty");
                    let mut seen = seen.lock().unwrap();
                    for doc in &batch.documents {
                        seen.insert(doc["id"].as_str().unwrap().to_owned());
                    }
                    Ok(())
                }
                .boxed()
            })
            .await
            .unwrap();
    let expected: BTreeSet<String> = (0..30).map(|i| format!("order-{i}")).collect();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while *seen.lock().unwrap() != expected {
        assert!(
            tokio::time::Instant::now() < deadline,
            "not every document was handed over: {:?}",
            seen.lock().unwrap()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Wait until every owned lease confirmed its position (a checkpoint or an empty read).
    while processor
        .lease_statuses()
        .iter()
        .any(|s| s.last_checkpoint_age.is_none())
    {
        assert!(tokio::time::Instant::now() < deadline, "no checkpoint");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(!processor.owned_leases().is_empty());
    processor.shutdown().await;

    let stored = read_leases(&leases, "p").await.unwrap();
    assert!(!stored.is_empty());
    assert!(
        stored
            .iter()
            .all(|l| l.owner.is_none() && l.continuation_token.is_some()),
        "released with their checkpoints: {stored:?}"
    );
}

#[tokio::test]
async fn start_refuses_empty_names_and_invalid_options_with_typed_errors() {
    let (orders, leases) = containers().await;
    let builder = |processor: &str, instance: &str| {
        ChangeFeedProcessor::builder(
            processor,
            instance,
            Arc::clone(&orders),
            Arc::clone(&leases),
        )
    };
    assert!(matches!(
        builder(" ", "host-1").start(ignore).await.unwrap_err(),
        ChangeFeedError::EmptyProcessorName
    ));
    assert!(matches!(
        builder("p", "").start(ignore).await.unwrap_err(),
        ChangeFeedError::EmptyInstanceName
    ));
    let err = builder("p", "host-1")
        .options(fast().with_store_timeout(Duration::ZERO))
        .start(ignore)
        .await
        .unwrap_err();
    let ChangeFeedError::InvalidOptions(invalid) = &err else {
        panic!("{err:?}");
    };
    assert_eq!(
        *invalid,
        InvalidOptions::Zero {
            option: ProcessorOption::StoreTimeout
        }
    );
    // The rule is told by the source, not repeated in the outer message.
    let source = std::error::Error::source(&err).unwrap().to_string();
    assert_eq!(source, "`store_timeout` must be greater than zero");
    assert!(!err.to_string().contains("store_timeout"), "{err}");
    assert!(read_leases(&leases, "p").await.unwrap().is_empty());
}

/// Read until caught up: a page with documents, even a short one, is followed by the next read
/// at once; the poll interval (an hour here) applies only after an empty read. The handler of
/// the first page writes a second document to the same partition, so only a poller that reads
/// again at once sees it within the minute.
#[tokio::test]
async fn a_page_with_documents_is_followed_by_the_next_read_at_once_whatever_its_size() {
    let (orders, leases) = containers().await;
    let doc = |id: &str| json!({ "id": id, "orderId": "one-partition" });
    orders
        .create_item("one-partition", "first", &doc("first"), None)
        .await
        .unwrap();
    let seen = Arc::new(Mutex::new(Vec::<String>::new()));
    let recorded = Arc::clone(&seen);
    let writer = Arc::clone(&orders);
    let processor =
        ChangeFeedProcessor::builder("p", "host-1", Arc::clone(&orders), Arc::clone(&leases))
            .options(
                fast()
                    .with_poll_interval(Duration::from_secs(3600))
                    .with_max_backoff(Duration::from_secs(3600)),
            )
            .start(move |batch: ChangeFeedBatch| {
                let seen = Arc::clone(&recorded);
                let writer = Arc::clone(&writer);
                async move {
                    let ids: Vec<String> = batch
                        .documents
                        .iter()
                        .map(|d| d["id"].as_str().unwrap().to_owned())
                        .collect();
                    if ids == ["first"] {
                        writer
                            .create_item("one-partition", "second", &doc("second"), None)
                            .await?;
                    }
                    seen.lock().unwrap().extend(ids);
                    Ok(())
                }
                .boxed()
            })
            .await
            .unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while seen.lock().unwrap().len() < 2 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the document written after a one-document page was not read without waiting the \
             poll interval: {:?}",
            seen.lock().unwrap()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(*seen.lock().unwrap(), ["first", "second"]);
    processor.shutdown().await;
}
