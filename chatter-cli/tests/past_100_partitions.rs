//! Every `chatter` command that reads a container or a lease container answers when it has
//! more physical partitions than the SDK's default cross-partition fan-out (100): the SDK
//! refused those queries with 400/20118 ClientCrossPartitionFanOutExceeded: every test here
//! failed with it, at 128 partitions as at 256.

mod common;

use std::time::Duration;

use chatter_emulator::{EmulatorServer, RunningEmulator};
use chatter_runtime::BrokeredMessage;
use chatter_runtime::cosmos::{CosmosConnection, partition_key};
use chatter_runtime::testing::{OutboxDocument, create_item};
use common::{DB, chatter, stderr, stdout};
use cosmos_change_feed::{ChangeFeedBatch, ChangeFeedProcessor, ChangeFeedProcessorOptions};
use serde_json::json;

const AT: [&str; 4] = ["--database", DB, "--container", "orders"];
const LEASES: [&str; 5] = ["leases", "--database", DB, "--container", "orders-leases"];

/// A served emulator whose `shop/orders` and `shop/orders-leases` have `partitions` physical
/// partitions each, `orders` holding one pending document and one undeliverable one of
/// `order-events` (on two keys).
async fn served(partitions: u32) -> (RunningEmulator, CosmosConnection) {
    let emulator = EmulatorServer::bind("127.0.0.1:0".parse().unwrap())
        .await
        .unwrap()
        .spawn();
    emulator
        .create_partitioned(
            DB,
            &[
                ("orders", &["/orderId"], partitions),
                ("orders-leases", &["/id"], partitions),
            ],
        )
        .unwrap();
    let cosmos = CosmosConnection::connect(emulator.endpoint(), None)
        .await
        .unwrap();
    let orders = cosmos.container(DB, "orders").await.unwrap();
    for (message_id, key, status) in [("m-1", "o-1", "pending"), ("m-2", "o-2", "undeliverable")] {
        let message = BrokeredMessage::json(message_id, "order-events", r#"{"n":1}"#);
        let mut doc = OutboxDocument::build(&message, &["/orderId"], &[json!(key)]).unwrap();
        doc["status"] = json!(status);
        create_item(&orders, partition_key(&[json!(key)]).unwrap(), &doc)
            .await
            .unwrap();
    }
    (emulator, cosmos)
}

/// Runs `chatter` on `emulator` with `args`; its stdout, once it exited with `code`.
async fn answers(emulator: &RunningEmulator, args: &[&str], code: i32) -> String {
    let output = chatter(Some(emulator.endpoint()), None, args).await;
    assert_eq!(
        output.status.code(),
        Some(code),
        "chatter {args:?}: {}{}",
        stdout(&output),
        stderr(&output)
    );
    stdout(&output)
}

/// The outbox survey, requeue and give-up read the whole monitored container.
async fn the_outbox_commands_answer(partitions: u32) {
    let (emulator, _cosmos) = served(partitions).await;
    let all = |command: &[&'static str], more: &[&'static str]| -> Vec<&'static str> {
        command.iter().chain(&AT).chain(more).copied().collect()
    };

    let pending = answers(&emulator, &all(&["outbox", "pending"], &[]), 0).await;
    assert!(pending.contains("1 pending in all"), "{pending}");
    let undeliverable = answers(&emulator, &all(&["outbox", "undeliverable"], &[]), 1).await;
    assert!(undeliverable.contains("m-2"), "{undeliverable}");
    let requeue = all(
        &["outbox", "requeue"],
        &["--destination", "order-events", "--force", "--yes"],
    );
    let requeued = answers(&emulator, &requeue, 0).await;
    assert!(requeued.contains("m-2"), "{requeued}");
    let give_up = all(
        &["outbox", "give-up"],
        &[
            "--destination",
            "order-events",
            "--reason",
            "past 100 partitions",
            "--yes",
        ],
    );
    let given_up = answers(&emulator, &give_up, 0).await;
    assert!(
        given_up.contains("m-1") && given_up.contains("m-2"),
        "{given_up}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn the_outbox_commands_answer_on_a_container_of_128_partitions() {
    the_outbox_commands_answer(128).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn the_outbox_commands_answer_on_a_container_of_256_partitions() {
    the_outbox_commands_answer(256).await;
}

/// `chatter leases` lists every lease of a processor owning all of a container's partitions.
async fn leases_answers(partitions: u32) {
    let (emulator, cosmos) = served(partitions).await;
    let processor = ChangeFeedProcessor::builder(
        "orders-relay",
        "host-1",
        cosmos.container(DB, "orders").await.unwrap(),
        cosmos.container(DB, "orders-leases").await.unwrap(),
    )
    .options(ChangeFeedProcessorOptions::default().with_poll_interval(Duration::from_secs(5)))
    .start(|_batch: ChangeFeedBatch| Box::pin(async { Ok(()) }))
    .await
    .unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(120);
    while processor.owned_leases().len() < partitions as usize {
        assert!(
            tokio::time::Instant::now() < deadline,
            "{} of {partitions} leases taken",
            processor.owned_leases().len()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let leases = answers(&emulator, &LEASES, 0).await;
    assert!(
        leases.ends_with(&format!("{partitions} leases, 0 not served\n")),
        "{leases}"
    );
    processor.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn leases_answers_on_a_lease_container_of_128_partitions() {
    leases_answers(128).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn leases_answers_on_a_lease_container_of_256_partitions() {
    leases_answers(256).await;
}
