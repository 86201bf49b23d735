//! A delivery attempt that does not finish (a handler that hangs, a store that does not answer)
//! fails after the consumer's delivery timeout and is retried, instead of holding its
//! partition-key value's lane, and a permit, forever without a word.

use std::sync::Mutex;
use std::time::Duration;

use chatter_runtime::broker::{Broker, InMemoryBroker};
use chatter_runtime::cosmos::{CosmosConnection, provision};
use chatter_runtime::{
    BoxError, BrokeredMessage, DocumentReliable, HandlerContext, Runtime, StartError, handler,
};
use chatter_tests::store::{emulator_server, find_document};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

/// Ships an order; its handler never finishes its first `hang_first_attempts` attempts.
#[derive(Debug, Serialize, Deserialize, DocumentReliable)]
#[cosmos(database = "shop", container = "shipments", lease = "shipments-leases")]
#[partition_key(path = "/sku")]
pub struct ShipOrder {
    pub sku: String,
    pub hang_first_attempts: usize,
}

static ATTEMPTS: Mutex<Vec<String>> = Mutex::new(Vec::new());

#[handler]
async fn ship(command: ShipOrder, ctx: &mut HandlerContext) -> Result<(), BoxError> {
    let attempt = {
        let mut attempts = ATTEMPTS.lock().unwrap();
        attempts.push(ctx.message_id().to_owned());
        attempts.iter().filter(|id| *id == ctx.message_id()).count()
    };
    if attempt <= command.hang_first_attempts {
        std::future::pending::<()>().await;
    }
    ctx.upsert(json!({ "id": format!("shipment-{}", ctx.message_id()), "sku": command.sku }))?;
    Ok(())
}

fn attempts_of(message_id: &str) -> usize {
    ATTEMPTS
        .lock()
        .unwrap()
        .iter()
        .filter(|id| *id == message_id)
        .count()
}

async fn start(cosmos: &CosmosConnection, timeout: Duration) -> (Runtime, InMemoryBroker) {
    provision::ensure_container(cosmos, "shop", "shipments", &["/sku"])
        .await
        .unwrap();
    let broker = InMemoryBroker::new();
    let runtime = Runtime::builder()
        .cosmos(cosmos.clone())
        .without_relay()
        .broker(broker.clone())
        .redelivery_delay(Duration::from_millis(10))
        .delivery_timeout(timeout)
        .start()
        .await
        .unwrap();
    (runtime, broker)
}

async fn publish(broker: &InMemoryBroker, message_id: &str, body: Value) {
    broker
        .publish(BrokeredMessage::json(
            message_id,
            "ShipOrder",
            body.to_string(),
        ))
        .await
        .unwrap();
}

async fn shipment(cosmos: &CosmosConnection, sku: &str, message_id: &str) -> Option<Value> {
    let container = cosmos.container("shop", "shipments").await.unwrap();
    find_document(&container, &[json!(sku)], &format!("shipment-{message_id}")).await
}

async fn until(what: &str, mut done: impl AsyncFnMut() -> bool) {
    tokio::time::timeout(Duration::from_secs(30), async {
        while !done().await {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .unwrap_or_else(|_| panic!("{what}"));
}

#[tokio::test]
async fn a_handler_that_hangs_fails_its_attempt_at_the_timeout_and_its_key_moves_on() {
    let cosmos = CosmosConnection::embedded().await.unwrap();
    let (runtime, broker) = start(&cosmos, Duration::from_millis(300)).await;
    publish(
        &broker,
        "m-hangs-once",
        json!({ "sku": "sku-1", "hang_first_attempts": 1 }),
    )
    .await;
    // Same key, behind it: it waits for the hung attempt, at most the timeout.
    publish(
        &broker,
        "m-behind",
        json!({ "sku": "sku-1", "hang_first_attempts": 0 }),
    )
    .await;
    until("the retry commits", async || {
        shipment(&cosmos, "sku-1", "m-hangs-once").await.is_some()
    })
    .await;
    until("the delivery behind it commits", async || {
        shipment(&cosmos, "sku-1", "m-behind").await.is_some()
    })
    .await;
    assert_eq!(attempts_of("m-hangs-once"), 2);
    assert_eq!(attempts_of("m-behind"), 1);
    runtime.shutdown().await;
}

#[tokio::test]
async fn a_batch_the_store_does_not_answer_fails_its_attempt_and_the_retry_commits_it() {
    let (emulator, cosmos) = emulator_server().await;
    let (runtime, broker) = start(&cosmos, Duration::from_secs(1)).await;
    // Every answer of the store now comes 60 s late (chatter-emulator's fault injection).
    emulator.faults().set_latency(Duration::from_secs(60));
    publish(
        &broker,
        "m-store-hangs",
        json!({ "sku": "sku-2", "hang_first_attempts": 0 }),
    )
    .await;
    until("the attempt whose batch hangs is retried", async || {
        attempts_of("m-store-hangs") >= 2
    })
    .await;
    emulator.faults().clear();
    until("a retry commits once the store answers", async || {
        shipment(&cosmos, "sku-2", "m-store-hangs").await.is_some()
    })
    .await;
    until("the delivery settles", async || {
        broker.pending_count("ShipOrder") == 0
    })
    .await;
    runtime.shutdown().await;
}

#[tokio::test]
async fn a_zero_delivery_timeout_is_refused_at_start() {
    let cosmos = CosmosConnection::embedded().await.unwrap();
    provision::ensure_container(&cosmos, "shop", "shipments", &["/sku"])
        .await
        .unwrap();
    let refused = Runtime::builder()
        .cosmos(cosmos)
        .without_relay()
        .delivery_timeout(Duration::ZERO)
        .start()
        .await;
    assert!(
        matches!(refused, Err(StartError::ZeroDeliveryTimeout)),
        "{refused:?}"
    );
}
