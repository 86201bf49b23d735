//! Deliveries through the in-memory broker: acked after commit or confirmed duplicate, nacked and
//! redelivered on failure, nothing committed by a failed attempt.

use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use chatter_runtime::broker::{Broker, InMemoryBroker};
use chatter_runtime::cosmos::{CosmosConnection, provision};
use chatter_runtime::message::BrokeredMessage;
use chatter_runtime::{BoxError, DocumentReliable, HandlerContext, Runtime, handler};
use chatter_tests::store::find_document;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

/// Reserves stock; fails while `failures_left` says so.
#[derive(Debug, Serialize, Deserialize, DocumentReliable)]
#[cosmos(database = "shop", container = "stock", lease = "stock-leases")]
#[partition_key(path = "/sku")]
pub struct ReserveStock {
    pub sku: String,
    pub fail_first_attempts: usize,
}

static ATTEMPTS: Mutex<Vec<(String, bool)>> = Mutex::new(Vec::new());
static FAILURES: AtomicUsize = AtomicUsize::new(0);

#[handler]
async fn reserve(command: ReserveStock, ctx: &mut HandlerContext) -> Result<(), BoxError> {
    let attempt = {
        let mut attempts = ATTEMPTS.lock().unwrap();
        attempts.push((ctx.message_id().to_owned(), ctx.redelivered()));
        attempts
            .iter()
            .filter(|(id, _)| id == ctx.message_id())
            .count()
    };
    ctx.upsert(json!({ "id": format!("reservation-{}", ctx.message_id()), "sku": command.sku, "attempt": attempt }))?;
    if attempt <= command.fail_first_attempts {
        FAILURES.fetch_add(1, Ordering::SeqCst);
        return Err(format!("attempt {attempt} fails on purpose").into());
    }
    Ok(())
}

async fn start() -> (Runtime, InMemoryBroker, CosmosConnection) {
    let cosmos = CosmosConnection::embedded().await.unwrap();
    provision::ensure_container(&cosmos, "shop", "stock", &["/sku"])
        .await
        .unwrap();
    let broker = InMemoryBroker::new();
    let runtime = Runtime::builder()
        .cosmos(cosmos.clone())
        .without_relay()
        .broker(broker.clone())
        .redelivery_delay(Duration::from_millis(10))
        .start()
        .await
        .unwrap();
    (runtime, broker, cosmos)
}

async fn publish(broker: &InMemoryBroker, message_id: &str, body: Value) {
    broker
        .publish(BrokeredMessage::json(
            message_id,
            "ReserveStock",
            body.to_string(),
        ))
        .await
        .unwrap();
}

async fn settled(broker: &InMemoryBroker) {
    tokio::time::timeout(Duration::from_secs(30), async {
        while broker.pending_count("ReserveStock") > 0 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await
    .expect("every delivery settles");
}

async fn read(cosmos: &CosmosConnection, sku: &str, id: &str) -> Option<Value> {
    let c = cosmos.container("shop", "stock").await.unwrap();
    find_document(&c, &[json!(sku)], id).await
}

fn attempts_of(message_id: &str) -> Vec<bool> {
    ATTEMPTS
        .lock()
        .unwrap()
        .iter()
        .filter(|(id, _)| id == message_id)
        .map(|(_, r)| *r)
        .collect()
}

#[tokio::test]
async fn a_failed_attempt_commits_nothing_and_is_redelivered_until_it_succeeds() {
    let (runtime, broker, cosmos) = start().await;
    publish(
        &broker,
        "m-fail-twice",
        json!({ "sku": "sku-1", "fail_first_attempts": 2 }),
    )
    .await;
    settled(&broker).await;
    // Two nacked attempts, then a redelivered one that commits.
    assert_eq!(attempts_of("m-fail-twice"), [false, true, true]);
    let reservation = read(&cosmos, "sku-1", "reservation-m-fail-twice")
        .await
        .unwrap();
    assert_eq!(
        reservation["attempt"], 3,
        "only the successful attempt's write committed"
    );
    assert!(
        read(
            &cosmos,
            "sku-1",
            &chatter_runtime::document::inbox_id("m-fail-twice").unwrap()
        )
        .await
        .is_some()
    );
    runtime.shutdown().await;
}

#[tokio::test]
async fn a_duplicate_delivery_is_acknowledged_without_committing_again() {
    let (runtime, broker, cosmos) = start().await;
    publish(
        &broker,
        "m-dup",
        json!({ "sku": "sku-2", "fail_first_attempts": 0 }),
    )
    .await;
    settled(&broker).await;
    let first = read(&cosmos, "sku-2", "reservation-m-dup").await.unwrap();
    publish(
        &broker,
        "m-dup",
        json!({ "sku": "sku-2", "fail_first_attempts": 0 }),
    )
    .await;
    settled(&broker).await;
    // The handler ran twice (at-least-once); the batch committed once.
    assert_eq!(attempts_of("m-dup").len(), 2);
    let after = read(&cosmos, "sku-2", "reservation-m-dup").await.unwrap();
    assert_eq!(after["attempt"], 1);
    assert_eq!(after["_etag"], first["_etag"]);
    assert_eq!(broker.published_count("ReserveStock"), 2);
    runtime.shutdown().await;
}

#[tokio::test]
async fn an_undecodable_body_is_never_acknowledged() {
    let (runtime, broker, cosmos) = start().await;
    broker
        .publish(BrokeredMessage::json(
            "m-garbage",
            "ReserveStock",
            "not json",
        ))
        .await
        .unwrap();
    // Give the consumer time for several attempts; the message stays with the broker.
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(
        broker.pending_count("ReserveStock") >= 1,
        "a poison message is not dropped"
    );
    assert!(
        attempts_of("m-garbage").is_empty(),
        "the handler never saw it"
    );
    assert!(
        read(&cosmos, "sku-1", "reservation-m-garbage")
            .await
            .is_none()
    );
    runtime.shutdown().await;
}

#[tokio::test]
async fn a_participant_delivery_without_message_id_is_not_acknowledged() {
    let (runtime, broker, cosmos) = start().await;
    publish(
        &broker,
        "  ",
        json!({ "sku": "sku-3", "fail_first_attempts": 0 }),
    )
    .await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(
        broker.pending_count("ReserveStock"),
        1,
        "R2.05: never acked"
    );
    assert!(attempts_of("  ").is_empty(), "the handler never ran");
    assert!(read(&cosmos, "sku-3", "reservation-  ").await.is_none());
    runtime.shutdown().await;
}
