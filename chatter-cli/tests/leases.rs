//! `chatter leases` against `chatter-emulator` served over HTTP, with a real change-feed
//! processor owning the leases: each lease's owner and state, and exit code 1 once the
//! processor released them (no relay serves their ranges).

mod common;

use std::time::Duration;

use chatter_runtime::cosmos::provision;
use common::{DB, chatter, served_store, stdout};
use cosmos_change_feed::{ChangeFeedBatch, ChangeFeedProcessor, ChangeFeedProcessorOptions};
use serde_json::Value;

const LEASES: [&str; 5] = ["leases", "--database", DB, "--container", "orders-leases"];

#[tokio::test(flavor = "multi_thread")]
async fn each_lease_shows_its_owner_and_a_released_one_is_reported_free() {
    let (emulator, cosmos) = served_store("orders").await;
    provision::ensure_lease_container(&cosmos, DB, "orders-leases")
        .await
        .unwrap();
    let processor = ChangeFeedProcessor::builder(
        "orders-relay",
        "host-1",
        cosmos.container(DB, "orders").await.unwrap(),
        cosmos.container(DB, "orders-leases").await.unwrap(),
    )
    .options(ChangeFeedProcessorOptions::default().with_poll_interval(Duration::from_millis(100)))
    .start(|_batch: ChangeFeedBatch| Box::pin(async { Ok(()) }))
    .await
    .unwrap();
    // The emulator's container has four physical partitions: four leases.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while processor.owned_leases().len() < 4 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the leases are taken"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    let owned = chatter(Some(emulator.endpoint()), None, &LEASES).await;
    let text = stdout(&owned);
    assert_eq!(owned.status.code(), Some(0), "{text}");
    assert_eq!(text.matches("host-1").count(), 4, "{text}");
    assert!(text.ends_with("4 leases, 0 not served\n"), "{text}");

    processor.shutdown().await;
    let released = chatter(
        Some(emulator.endpoint()),
        None,
        &[&LEASES[..], &["--json"]].concat(),
    )
    .await;
    assert_eq!(released.status.code(), Some(1), "nobody serves them now");
    let leases: Value = serde_json::from_slice(&released.stdout).unwrap();
    let leases = leases.as_array().unwrap();
    assert_eq!(leases.len(), 4);
    for lease in leases {
        assert_eq!(lease["processor"], "orders-relay");
        assert_eq!(lease["state"], "free", "{lease}");
        assert!(lease["owner"].is_null(), "{lease}");
    }
}
