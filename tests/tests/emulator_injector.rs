//! `chatter-emulator`'s injector, which the simulation drives from its seed: a fault decided per
//! request, through the real SDK over HTTP.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use chatter_emulator::Injection;
use chatter_runtime::cosmos::partition_key;
use chatter_runtime::testing::create_item;
use chatter_tests::store::{emulator_server, find_document, provisioned};
use serde_json::json;

/// An injector that answers the first document create with `injection`, then nothing.
fn once_on_create(injection: Injection) -> chatter_emulator::Injector {
    let armed = Arc::new(AtomicBool::new(true));
    Arc::new(move |method: &str, path: &str| {
        (method == "POST" && path.ends_with("/docs") && armed.swap(false, Ordering::SeqCst))
            .then(|| injection.clone())
    })
}

#[tokio::test]
async fn a_lost_answer_applies_the_write_and_the_client_hears_it_failed() {
    let (emulator, cosmos) = emulator_server().await;
    let docs = provisioned(&cosmos, "inject", "docs", &["/pk"]).await;
    emulator
        .faults()
        .inject_with(Some(once_on_create(Injection::LoseAnswer { status: 503 })));
    let doc = json!({ "id": "a", "pk": "p" });
    let key = partition_key(&[json!("p")]).unwrap();
    let error = create_item(&docs, key, &doc)
        .await
        .expect_err("the client hears a failure");
    // The SDK may retry the 503 itself: its retry meets the document the first attempt wrote.
    assert!(
        error.is_status(503) || error.is_status(409),
        "unexpected error: {error}"
    );
    assert!(
        find_document(&docs, &[json!("p")], "a").await.is_some(),
        "the write took effect"
    );
}

#[tokio::test]
async fn a_refusal_never_reaches_the_store() {
    let (emulator, cosmos) = emulator_server().await;
    let docs = provisioned(&cosmos, "inject", "docs", &["/pk"]).await;
    emulator
        .faults()
        .inject_with(Some(once_on_create(Injection::Refuse {
            status: 403,
            sub_status: None,
            retry_after: None,
        })));
    let doc = json!({ "id": "b", "pk": "p" });
    let key = partition_key(&[json!("p")]).unwrap();
    let error = create_item(&docs, key, &doc)
        .await
        .expect_err("the create is refused");
    assert!(error.is_status(403), "unexpected error: {error}");
    assert!(find_document(&docs, &[json!("p")], "b").await.is_none());
    // The injector let the next one through.
    let key = partition_key(&[json!("p")]).unwrap();
    create_item(&docs, key, &doc).await.unwrap();
}

#[tokio::test]
async fn a_delayed_write_applies_though_its_client_gave_up() {
    let (emulator, cosmos) = emulator_server().await;
    let docs = provisioned(&cosmos, "inject", "docs", &["/pk"]).await;
    let delay = std::time::Duration::from_millis(400);
    emulator
        .faults()
        .inject_with(Some(once_on_create(Injection::Delay(delay))));
    let doc = json!({ "id": "c", "pk": "p" });
    let key = partition_key(&[json!("p")]).unwrap();
    // The client gives up (its future is dropped) long before the store handles the write.
    let gave_up = tokio::time::timeout(delay / 4, create_item(&docs, key, &doc)).await;
    assert!(gave_up.is_err(), "the client gave up first");
    assert!(find_document(&docs, &[json!("p")], "c").await.is_none());
    tokio::time::sleep(delay * 2).await;
    assert!(
        find_document(&docs, &[json!("p")], "c").await.is_some(),
        "the write took effect after its client gave up, as one on its way to Cosmos does"
    );
}

#[tokio::test]
async fn a_port_serves_the_same_store_and_meets_only_its_own_faults() {
    let (emulator, cosmos) = emulator_server().await;
    let docs = provisioned(&cosmos, "inject", "docs", &["/pk"]).await;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = emulator.port(listener).unwrap();
    let port_faults = port.faults();
    let port = port.spawn();
    let other = chatter_runtime::cosmos::CosmosConnection::connect(port.endpoint(), None)
        .await
        .unwrap();
    let other_docs = other.container("inject", "docs").await.unwrap();
    port_faults.inject_with(Some(Arc::new(|method: &str, _: &str| {
        (method == "POST").then_some(Injection::Refuse {
            status: 503,
            sub_status: None,
            retry_after: None,
        })
    })));
    let key = || partition_key(&[json!("p")]).unwrap();
    let error = create_item(&other_docs, key(), &json!({ "id": "d", "pk": "p" }))
        .await
        .expect_err("the port refuses its own client's writes");
    assert!(error.is_status(503), "unexpected error: {error}");
    assert!(
        port.request_count("POST") > 0,
        "the client dialled its port"
    );
    // The first port's clients meet none of it, and both see one store.
    create_item(&docs, key(), &json!({ "id": "e", "pk": "p" }))
        .await
        .unwrap();
    assert!(
        find_document(&other_docs, &[json!("p")], "e")
            .await
            .is_some()
    );
}

#[tokio::test]
async fn the_read_region_serves_older_data_until_a_write_replicates_under_eventual() {
    // The read region's first step comes 2 s after it starts: the write and the first read
    // below come well before it.
    let lag = std::time::Duration::from_millis(2_000);
    let (write, read, writer) =
        chatter_tests::store::two_regions(chatter_emulator::ConsistencyLevel::Eventual, lag).await;
    let docs = provisioned(&writer, "regions", "docs", &["/pk"]).await;
    let reader = chatter_tests::store::reading_in_read_region(write.endpoint())
        .await
        .unwrap();
    let stale = reader.container("regions", "docs").await.unwrap();
    create_item(
        &docs,
        partition_key(&[json!("p")]).unwrap(),
        &json!({ "id": "f", "pk": "p" }),
    )
    .await
    .unwrap();
    let reads_before = read.request_count("GET");
    assert!(
        find_document(&stale, &[json!("p")], "f").await.is_none(),
        "the read region has not received the write yet"
    );
    assert!(
        read.request_count("GET") > reads_before,
        "the read went to the read region"
    );
    assert!(find_document(&docs, &[json!("p")], "f").await.is_some());
    tokio::time::sleep(lag * 2).await;
    assert!(
        find_document(&stale, &[json!("p")], "f").await.is_some(),
        "replicated after the lag"
    );
}

/// A transactional batch commits at one LSN, and Cosmos replicates by LSN: a read region never
/// serves part of a batch. The SDK's emulator replicates each document on a timer of its own;
/// `chatter-emulator`'s read region catches up in steps, each applying whole batches. (Seed 6000156 of the
/// simulation read the change feed in the read region between two documents of one batch: the
/// relay's continuation, past their LSN, passed over the third, which the sweep then found
/// stranded.)
#[tokio::test]
async fn a_batch_reaches_the_read_region_whole() {
    use azure_data_cosmos::TransactionalBatch;
    let (write, _read, writer) = chatter_tests::store::two_regions(
        chatter_emulator::ConsistencyLevel::Session,
        std::time::Duration::from_millis(10),
    )
    .await;
    let docs = provisioned(&writer, "regions", "batches", &["/pk"]).await;
    let reader = chatter_tests::store::reading_in_read_region(write.endpoint())
        .await
        .unwrap();
    let replica = reader.container("regions", "batches").await.unwrap();
    for n in 0..20 {
        let mut batch = TransactionalBatch::new(partition_key(&[json!("p")]).unwrap());
        for part in 0..3 {
            batch = batch
                .create_item(json!({ "id": format!("{n}-{part}"), "pk": "p", "batch": n }))
                .unwrap();
        }
        docs.execute_transactional_batch(batch, None).await.unwrap();
        let sql = format!("SELECT * FROM c WHERE c.batch = {n}");
        let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(10);
        let first_seen = loop {
            let seen = chatter_runtime::testing::query_all(&replica, &sql)
                .await
                .unwrap();
            if !seen.is_empty() {
                break seen.len();
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "batch {n} never reached the read region"
            );
        };
        assert_eq!(
            first_seen, 3,
            "batch {n}: the read region first served {first_seen} of its 3 documents"
        );
    }
}
