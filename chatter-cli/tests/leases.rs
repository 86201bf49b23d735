//! `chatter leases` against `chatter-emulator` served over HTTP, with a real change-feed
//! processor owning the leases: each lease's owner and state, and exit code 1 once the
//! processor released them (no relay serves their ranges).

mod common;

use std::time::Duration;

use common::{DB, chatter, served_store_with_leases, stdout};
use cosmos_change_feed::{ChangeFeedBatch, ChangeFeedProcessor, ChangeFeedProcessorOptions};
use serde_json::Value;

const LEASES: [&str; 5] = ["leases", "--database", DB, "--container", "orders-leases"];

/// A change-feed processor `orders-relay` of `DB/orders` (instance `host-1`) once it owns the
/// emulator's four leases (one per physical partition); its handler succeeds, or, when
/// `handles` is false, always fails (so it never checkpoints).
async fn owning_every_lease(
    cosmos: &chatter_runtime::cosmos::CosmosConnection,
    handles: bool,
) -> cosmos_change_feed::RunningProcessor {
    let processor = ChangeFeedProcessor::builder(
        "orders-relay",
        "host-1",
        cosmos.container(DB, "orders").await.unwrap(),
        cosmos.container(DB, "orders-leases").await.unwrap(),
    )
    .options(ChangeFeedProcessorOptions::default().with_poll_interval(Duration::from_millis(100)))
    .start(move |_batch: ChangeFeedBatch| {
        Box::pin(async move {
            if handles {
                Ok(())
            } else {
                Err("never handled".into())
            }
        })
    })
    .await
    .unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while processor.owned_leases().len() < 4 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the leases are taken"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    processor
}

#[tokio::test(flavor = "multi_thread")]
async fn each_lease_shows_its_owner_and_a_released_one_is_reported_free() {
    let (emulator, cosmos) = served_store_with_leases("orders", "orders-leases").await;
    let processor = owning_every_lease(&cosmos, true).await;

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

// With `--backlog-of`, each lease shows the pending Outbox Documents after its checkpoint: here
// a processor that never checkpoints (its handler always fails), so all three are behind.
#[tokio::test(flavor = "multi_thread")]
async fn backlog_of_counts_the_pending_outbox_documents_behind_each_lease() {
    use chatter_runtime::BrokeredMessage;
    use chatter_runtime::cosmos::partition_key;
    use chatter_runtime::testing::{OutboxDocument, create_item};
    use serde_json::json;

    let (emulator, cosmos) = served_store_with_leases("orders", "orders-leases").await;
    let orders = cosmos.container(DB, "orders").await.unwrap();
    for n in 0..3 {
        let key = format!("o-{n}");
        let message = BrokeredMessage::json(format!("m-{n}"), "order-events", "{}");
        let doc = OutboxDocument::build(&message, &["/orderId"], &[json!(key)]).unwrap();
        create_item(&orders, partition_key(&[json!(key)]).unwrap(), &doc)
            .await
            .unwrap();
    }
    // Not an Outbox Document: not counted.
    create_item(
        &orders,
        partition_key(&[json!("o-9")]).unwrap(),
        &json!({ "id": "order-9", "orderId": "o-9" }),
    )
    .await
    .unwrap();
    let processor = owning_every_lease(&cosmos, false).await;

    let estimated = chatter(
        Some(emulator.endpoint()),
        None,
        &[
            &LEASES[..],
            &[
                "--backlog-of",
                "orders",
                "--processor",
                "orders-relay",
                "--json",
            ],
        ]
        .concat(),
    )
    .await;
    assert_eq!(estimated.status.code(), Some(0), "{}", stdout(&estimated));
    let leases: Value = serde_json::from_slice(&estimated.stdout).unwrap();
    let total: u64 = leases
        .as_array()
        .unwrap()
        .iter()
        .map(|lease| lease["backlog"].as_u64().expect("every lease estimated"))
        .sum();
    assert_eq!(total, 3, "{leases}");

    // Without --processor, the name a relay of these containers has: none here.
    let unknown = chatter(
        Some(emulator.endpoint()),
        None,
        &[&LEASES[..], &["--backlog-of", "orders"]].concat(),
    )
    .await;
    assert_eq!(unknown.status.code(), Some(2));
    assert!(
        common::stderr(&unknown).contains("pass --processor"),
        "{}",
        common::stderr(&unknown)
    );
    processor.shutdown().await;
}

/// The ids of the relay state documents in the lease container (the suspended leases a relay
/// records for `chatter leases`).
async fn state_documents(cosmos: &chatter_runtime::cosmos::CosmosConnection) -> Vec<String> {
    let leases = cosmos.container(DB, "orders-leases").await.unwrap();
    chatter_runtime::testing::query_all(&leases, "SELECT c.id FROM c")
        .await
        .unwrap()
        .iter()
        .filter_map(|doc| doc["id"].as_str())
        .filter(|id| id.starts_with("chatter-relay-state:"))
        .map(str::to_owned)
        .collect()
}

/// A standalone relay of `DB/orders` whose stamps are all refused, once `chatter leases` reports
/// its one lease `SUSPENDED` (exit 1); with the served emulator and the relay's suspension
/// clock.
async fn suspended_relay() -> (
    chatter_emulator::RunningEmulator,
    chatter_runtime::cosmos::CosmosConnection,
    chatter_runtime::relay::RunningRelays,
    std::sync::Arc<chatter_runtime::testing::ManualClock>,
) {
    use chatter_runtime::broker::InMemoryBroker;
    use chatter_runtime::cosmos::partition_key;
    use chatter_runtime::testing::{OutboxDocument, create_item};
    use chatter_runtime::{BrokeredMessage, relay::RelayOptions, relay::StandaloneRelay};
    use serde_json::json;

    let (emulator, cosmos) = served_store_with_leases("orders", "orders-leases").await;
    let orders = cosmos.container(DB, "orders").await.unwrap();
    let message = BrokeredMessage::json("m-1", "order-events", "{}");
    let doc = OutboxDocument::build(&message, &["/orderId"], &[json!("o-1")]).unwrap();
    create_item(&orders, partition_key(&[json!("o-1")]).unwrap(), &doc)
        .await
        .unwrap();
    // Every stamp is refused: five Confirmation Failures suspend the lease.
    emulator
        .faults()
        .refuse("PATCH", 403, Duration::from_secs(3600));
    let clock = std::sync::Arc::new(chatter_runtime::testing::ManualClock::new());
    let options = RelayOptions::default()
        .suspension_clock(clock.clone())
        .poll_interval(Duration::from_millis(100))
        .lease_expiry(Duration::from_secs(3))
        .lease_renew_interval(Duration::from_millis(400))
        .lease_acquire_interval(Duration::from_millis(250))
        .max_backoff(Duration::from_millis(300));
    let relay = StandaloneRelay::builder(&cosmos, (DB, "orders"), (DB, "orders-leases"))
        .partition_key_paths(&["/orderId"])
        .options(options)
        .build()
        .unwrap();
    let running = StandaloneRelay::start_all(vec![relay], InMemoryBroker::new())
        .await
        .unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        let listed = chatter(
            Some(emulator.endpoint()),
            None,
            &[&LEASES[..], &["--expiry-seconds", "3"]].concat(),
        )
        .await;
        let text = stdout(&listed);
        if text.contains("SUSPENDED") {
            assert_eq!(listed.status.code(), Some(1), "{text}");
            assert_eq!(
                text.lines().filter(|l| l.contains(" SUSPENDED ")).count(),
                1,
                "one lease holds the document: {text}"
            );
            // A relay's processor and instance names are some 70 characters each: the table
            // shows the processor once, above its leases, and the owner shortened (it was 250
            // columns wide).
            let widest = text.lines().map(|l| l.chars().count()).max().unwrap_or(0);
            assert!(widest <= 150, "{widest} columns wide:\n{text}");
            assert!(
                text.contains("SUSPENDED: its owner holds it under a Drain Suspension"),
                "the state is explained below the table: {text}"
            );
            assert!(!running.suspended_leases().is_empty());
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the suspension is never reported: {text}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    (emulator, cosmos, running, clock)
}

// A relay whose stamps keep failing suspends draining its lease; `chatter leases`, another
// process, sees it from the state the relay keeps beside the leases, and exits 1. Once the
// suspension ends, the report and the state document go.
#[tokio::test(flavor = "multi_thread")]
async fn a_lease_under_a_drain_suspension_is_reported_suspended() {
    let (emulator, cosmos, running, clock) = suspended_relay().await;
    assert_eq!(state_documents(&cosmos).await.len(), 1);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);

    // The stamps work again and the suspension window passes: the probe page lands, the lease
    // drains again, and the CLI no longer reports it.
    emulator.faults().clear();
    clock.advance(chatter_runtime::testing::SUSPENSION_WINDOW);
    loop {
        let listed = chatter(
            Some(emulator.endpoint()),
            None,
            &[&LEASES[..], &["--expiry-seconds", "3"]].concat(),
        )
        .await;
        let text = stdout(&listed);
        if !text.contains("SUSPENDED") {
            assert_eq!(listed.status.code(), Some(0), "{text}");
            assert!(running.suspended_leases().is_empty());
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the suspension stays reported after it ended: {text}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // Nothing is suspended: the relay keeps no state document.
    while !state_documents(&cosmos).await.is_empty() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the state document outlives the suspension"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    running.shutdown().await;
}

// A relay that stops while a lease is suspended removes its state document: nothing of a relay
// that is gone is left for `chatter leases` to read.
#[tokio::test(flavor = "multi_thread")]
async fn a_relay_that_stops_under_a_suspension_removes_its_state() {
    let (_emulator, cosmos, running, _clock) = suspended_relay().await;
    assert_eq!(state_documents(&cosmos).await.len(), 1);
    running.shutdown().await;
    assert_eq!(state_documents(&cosmos).await, Vec::<String>::new());
}

#[tokio::test(flavor = "multi_thread")]
async fn a_container_without_lease_documents_is_said_so_and_exits_1() {
    let (emulator, _cosmos) = served_store_with_leases("orders", "orders-leases").await;
    // The monitored container named instead of its lease container: it holds no leases.
    let mistaken = chatter(
        Some(emulator.endpoint()),
        None,
        &["leases", "--database", DB, "--container", "orders"],
    )
    .await;
    let said = String::from_utf8_lossy(&mistaken.stderr);
    assert_eq!(mistaken.status.code(), Some(1), "{said}");
    // One sentence, as written (a broken line continuation once printed runs of spaces).
    assert!(
        said.contains(
            "shop/orders holds no lease documents: no relay has started against it yet, or it is \
             not a lease container (a relay's lease container is its `lease` name, e.g. \
             `orders-leases`)"
        ),
        "{said}"
    );
    // A container that does not exist fails as such.
    let missing = chatter(
        Some(emulator.endpoint()),
        None,
        &["leases", "--database", DB, "--container", "orders-lease"],
    )
    .await;
    let said = String::from_utf8_lossy(&missing.stderr);
    assert!(missing.status.code().is_some_and(|code| code > 1), "{said}");
    assert!(said.contains("orders-lease"), "{said}");
}
