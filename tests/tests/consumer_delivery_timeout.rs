//! A delivery attempt that does not finish (a handler that hangs, a store that does not answer)
//! fails after the consumer's delivery timeout and is retried, instead of holding its
//! partition-key value's lane, and a permit, forever without a word.

use std::time::Duration;

use chatter_runtime::broker::InMemoryBroker;
use chatter_runtime::cosmos::CosmosConnection;
use chatter_runtime::provision;
use chatter_runtime::{
    BoxError, DocumentReliable, HandlerContext, Runtime, broker::dead_letter_destination,
    error::StartError, handler,
};
use chatter_tests::broker::{publish_command, settled};
use chatter_tests::runtime::{Attempts, consuming};
use chatter_tests::store::{emulator_server, find_document};
use chatter_tests::wait::eventually;
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

static ATTEMPTS: Attempts = Attempts::new();

#[handler]
async fn ship(command: ShipOrder, ctx: &mut HandlerContext) -> Result<(), BoxError> {
    let attempt = ATTEMPTS.record(ctx.message_id());
    if attempt <= command.hang_first_attempts {
        std::future::pending::<()>().await;
    }
    ctx.upsert(json!({ "id": format!("shipment-{}", ctx.message_id()), "sku": command.sku }))?;
    Ok(())
}

/// Charges a card; it has a single attempt, so a failed one is dead-lettered at once.
#[derive(Debug, Serialize, Deserialize, DocumentReliable)]
#[cosmos(database = "shop", container = "charges", lease = "charges-leases")]
#[partition_key(path = "/card")]
#[chatter(max_delivery_attempts = 1)]
pub struct ChargeCard {
    pub card: String,
}

static CHARGES: Attempts = Attempts::new();

#[handler]
async fn charge(command: ChargeCard, ctx: &mut HandlerContext) -> Result<(), BoxError> {
    CHARGES.record(ctx.message_id());
    ctx.upsert(json!({ "id": format!("charge-{}", ctx.message_id()), "card": command.card }))?;
    Ok(())
}

async fn start(cosmos: &CosmosConnection, timeout: Duration) -> (Runtime, InMemoryBroker) {
    provision::ensure_container(cosmos, "shop", "shipments", &["/sku"])
        .await
        .unwrap();
    provision::ensure_container(cosmos, "shop", "charges", &["/card"])
        .await
        .unwrap();
    consuming(cosmos, |builder| builder.delivery_timeout(timeout)).await
}

async fn publish(broker: &InMemoryBroker, message_id: &str, body: Value) {
    publish_command(broker, "ShipOrder", message_id, &body).await;
}

async fn shipment(cosmos: &CosmosConnection, sku: &str, message_id: &str) -> Option<Value> {
    let container = cosmos.container("shop", "shipments").await.unwrap();
    find_document(&container, &[json!(sku)], &format!("shipment-{message_id}")).await
}

/// Polls `done` every 20 ms for up to 30 s; panics naming `what` if it never holds.
async fn until<F: Future<Output = bool>>(what: &str, done: impl FnMut() -> F) {
    eventually(
        Duration::from_secs(30),
        Duration::from_millis(20),
        what,
        done,
    )
    .await;
}

#[tokio::test]
async fn a_handler_that_hangs_fails_its_attempt_at_the_timeout_and_its_key_moves_on() {
    let cosmos = CosmosConnection::embedded().await.unwrap();
    let (runtime, broker) = start(&cosmos, Duration::from_secs(2)).await;
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
    until("the retry commits", || async {
        shipment(&cosmos, "sku-1", "m-hangs-once").await.is_some()
    })
    .await;
    until("the delivery behind it commits", || async {
        shipment(&cosmos, "sku-1", "m-behind").await.is_some()
    })
    .await;
    assert_eq!(ATTEMPTS.of("m-hangs-once"), 2);
    assert_eq!(ATTEMPTS.of("m-behind"), 1);
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
    until("the attempt whose batch hangs is retried", || async {
        ATTEMPTS.of("m-store-hangs") >= 2
    })
    .await;
    emulator.faults().clear();
    until("a retry commits once the store answers", || async {
        shipment(&cosmos, "sku-2", "m-store-hangs").await.is_some()
    })
    .await;
    settled(&broker, "ShipOrder").await;
    runtime.shutdown().await;
}

// An attempt that timed out may have committed. On its last attempt the consumer asks the
// inbox marker before dead-lettering: a batch the store committed but answered too late is
// acknowledged as handled, not dead-lettered.
#[tokio::test]
async fn a_last_attempt_that_committed_but_heard_so_too_late_is_acknowledged_not_dead_lettered() {
    let (emulator, cosmos) = emulator_server().await;
    let (runtime, broker) = start(&cosmos, Duration::from_secs(1)).await;
    // Batches (POST) commit at once, but their answers come 60 s late; reads answer at once.
    emulator
        .faults()
        .answer_late("POST", Duration::from_secs(60));
    publish_command(
        &broker,
        "ChargeCard",
        "m-charged",
        &json!({ "card": "c-1" }),
    )
    .await;
    settled(&broker, "ChargeCard").await;
    emulator.faults().clear();
    assert_eq!(CHARGES.of("m-charged"), 1, "one attempt");
    let container = cosmos.container("shop", "charges").await.unwrap();
    assert!(
        find_document(&container, &[json!("c-1")], "charge-m-charged")
            .await
            .is_some(),
        "the attempt committed"
    );
    assert_eq!(
        broker.pending_count(&dead_letter_destination("ChargeCard")),
        0,
        "a committed delivery is not dead-lettered"
    );
    runtime.shutdown().await;
}

// A redelivered duplicate on its last attempt: the batch conflicts on the inbox marker and the
// read that would confirm it fails (the store answers 503 for a while). That attempt may have
// committed before: the consumer asks the marker again, with backoff, and acknowledges it
// instead of dead-lettering a handled command.
#[tokio::test]
async fn a_last_attempt_whose_duplicate_confirmation_fails_asks_the_marker_again_not_dead_lettered()
{
    let (emulator, cosmos) = emulator_server().await;
    let (runtime, broker) = start(&cosmos, Duration::from_secs(20)).await;
    let body = json!({ "card": "c-2" });
    publish_command(&broker, "ChargeCard", "m-twice", &body).await;
    settled(&broker, "ChargeCard").await;
    // Every read is refused with a real 503 for 4 s; batches still answer (409 on the marker).
    emulator.faults().refuse("GET", 503, Duration::from_secs(4));
    publish_command(&broker, "ChargeCard", "m-twice", &body).await;
    settled(&broker, "ChargeCard").await;
    assert_eq!(
        CHARGES.of("m-twice"),
        2,
        "the duplicate ran its one attempt"
    );
    assert_eq!(
        broker.pending_count(&dead_letter_destination("ChargeCard")),
        0,
        "a handled command is not dead-lettered"
    );
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
