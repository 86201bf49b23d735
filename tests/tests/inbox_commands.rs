//! Standalone-inbox commands (`#[inbox(...)]`) through the runtime: deliveries through the
//! consumers handled at most once to completion per message id, a pending marker taken over,
//! a rejection dead-lettered at once, sent messages committed with the marker's completion and
//! published by the relay of the idempotency container, and `start()` checking that container.

use std::sync::Mutex;
use std::time::Duration;

use chatter_runtime::broker::{Broker, InMemoryBroker};
use chatter_runtime::cosmos::{CosmosConnection, inbox_id, partition_key};
use chatter_runtime::provision;
use chatter_runtime::testing::upsert_item;
use chatter_runtime::{
    BoxError, DocumentReliable, HandlerContext, Rejection, Runtime,
    broker::dead_letter_destination, constants::DEAD_LETTER_REASON_CONTEXT_KEY, error::StartError,
    handler,
};
use chatter_tests::broker::{next_delivery, publish_command, settled};
use chatter_tests::store::find_document;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

/// Sends a receipt email: a side effect outside Cosmos, so no batch; once per message id.
#[derive(Debug, Serialize, Deserialize, DocumentReliable)]
#[inbox(
    database = "mail",
    container = "idempotency",
    lease = "idempotency-leases"
)]
#[serde(rename_all = "camelCase")]
pub struct SendReceipt {
    pub order_id: String,
    pub reject: bool,
}

/// Every handler run, by message id.
static SENT: Mutex<Vec<String>> = Mutex::new(Vec::new());
/// The order "waits" is handled only once the order "signals" was: both must run at once.
static SIGNALLED: tokio::sync::Semaphore = tokio::sync::Semaphore::const_new(0);
/// Every attempt of the order "waits".
static WAITS_ATTEMPTS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

#[handler]
async fn send_receipt(command: SendReceipt, ctx: &mut HandlerContext) -> Result<(), BoxError> {
    if command.reject {
        return Err(
            Rejection::new(format!("order {} has no e-mail address", command.order_id)).into(),
        );
    }
    match command.order_id.as_str() {
        "waits" => {
            WAITS_ATTEMPTS.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            let signalled =
                tokio::time::timeout(Duration::from_secs(10), SIGNALLED.acquire()).await;
            signalled
                .map_err(|_| "the other delivery never ran beside this one")??
                .forget();
        }
        "signals" => SIGNALLED.add_permits(1),
        _ => {}
    }
    SENT.lock().unwrap().push(ctx.message_id().to_owned());
    ctx.send_json(
        &format!("{}:ReceiptSent", ctx.message_id()),
        "receipts",
        &json!({ "orderId": command.order_id }),
    )?;
    Ok(())
}

fn runs_of(message_id: &str) -> usize {
    SENT.lock()
        .unwrap()
        .iter()
        .filter(|id| *id == message_id)
        .count()
}

async fn store() -> CosmosConnection {
    let cosmos = CosmosConnection::embedded().await.unwrap();
    provision::ensure_for::<SendReceipt>(&cosmos).await.unwrap();
    cosmos
}

async fn marker(cosmos: &CosmosConnection, message_id: &str) -> Option<Value> {
    let c = cosmos.container("mail", "idempotency").await.unwrap();
    find_document(&c, &[json!(message_id)], &inbox_id(message_id).unwrap()).await
}

async fn runtime(cosmos: &CosmosConnection, broker: &InMemoryBroker) -> Runtime {
    Runtime::builder()
        .cosmos(cosmos.clone())
        .broker(broker.clone())
        .redelivery_delay(Duration::from_millis(10))
        .start()
        .await
        .unwrap()
}

fn body(order: &str, reject: bool) -> Value {
    json!({ "orderId": order, "reject": reject })
}

// R7.39 through the consumers: a message id delivered twice runs the handler once; the marker
// is completed; the message it sent committed with it as an Outbox Document of the message
// id's partition, which the relay of the idempotency container publishes and stamps.
#[tokio::test]
async fn a_redelivered_message_id_runs_the_handler_once() {
    let cosmos = store().await;
    let broker = InMemoryBroker::new();
    let mut receipts = broker.subscribe("receipts").await.unwrap();
    let runtime = runtime(&cosmos, &broker).await;
    for _ in 0..2 {
        publish_command(&broker, "SendReceipt", "m-twice", &body("o-1", false)).await;
        settled(&broker, "SendReceipt").await;
    }
    assert_eq!(runs_of("m-twice"), 1);
    assert_eq!(marker(&cosmos, "m-twice").await.unwrap()["Completed"], true);
    let receipt = next_delivery(&mut receipts, Duration::from_secs(5)).await;
    assert_eq!(receipt.message.message_id, "m-twice:ReceiptSent");
    let c = cosmos.container("mail", "idempotency").await.unwrap();
    let outbox_id = chatter_runtime::cosmos::outbox_id("m-twice:ReceiptSent").unwrap();
    chatter_tests::wait::eventually(
        Duration::from_secs(30),
        Duration::from_millis(50),
        "the receipt's Outbox Document is stamped delivered",
        || {
            let (c, outbox_id) = (c.clone(), outbox_id.clone());
            async move {
                find_document(&c, &[json!("m-twice")], &outbox_id)
                    .await
                    .is_some_and(|doc| doc["status"] != "pending")
            }
        },
    )
    .await;
    assert_eq!(
        runtime.relay_leases().await.len(),
        1,
        "one relay, over the idempotency container"
    );
    runtime.shutdown().await;
}

// R7.41 through the consumers: a pending marker (an attempt that died mid-handler) is taken over.
#[tokio::test]
async fn a_pending_marker_is_taken_over_by_the_next_delivery() {
    let cosmos = store().await;
    let c = cosmos.container("mail", "idempotency").await.unwrap();
    let pending = json!({
        "id": inbox_id("m-crashed").unwrap(), "_chatterType": "inbox", "MessageId": "m-crashed",
        "ReceivedAtUtc": "2026-12-01T10:00:00Z", "Completed": false, "idempotencyKey": "m-crashed",
    });
    upsert_item(&c, partition_key(&[json!("m-crashed")]).unwrap(), &pending)
        .await
        .unwrap();
    let broker = InMemoryBroker::new();
    let runtime = runtime(&cosmos, &broker).await;
    publish_command(&broker, "SendReceipt", "m-crashed", &body("o-2", false)).await;
    settled(&broker, "SendReceipt").await;
    assert_eq!(runs_of("m-crashed"), 1);
    assert_eq!(
        marker(&cosmos, "m-crashed").await.unwrap()["Completed"],
        true
    );
    runtime.shutdown().await;
}

// A rejection keeps its meaning through the gate: dead-lettered at once, not retried, and its
// marker stays pending (never deleted).
#[tokio::test]
async fn a_rejected_inbox_command_is_dead_lettered_at_once() {
    let cosmos = store().await;
    let broker = InMemoryBroker::new();
    let mut dead = broker
        .subscribe(&dead_letter_destination("SendReceipt"))
        .await
        .unwrap();
    let runtime = runtime(&cosmos, &broker).await;
    publish_command(&broker, "SendReceipt", "m-reject", &body("o-3", true)).await;
    let letter = next_delivery(&mut dead, Duration::from_secs(30)).await;
    let reason = letter.message.context[DEAD_LETTER_REASON_CONTEXT_KEY]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(
        reason.contains("order o-3 has no e-mail address"),
        "{reason}"
    );
    // Its side effects, if any, happened: the reason must not say nothing was committed.
    assert!(!reason.contains("nothing was committed"), "{reason}");
    assert!(reason.contains("outside Cosmos is not undone"), "{reason}");
    assert_eq!(
        letter.message.context.get("Chatter.Delivery.Attempts"),
        Some(&json!(1))
    );
    assert_eq!(
        marker(&cosmos, "m-reject").await.unwrap()["Completed"],
        false
    );
    runtime.shutdown().await;
}

// start() checks the idempotency container: missing, it refuses to start, naming the command.
#[tokio::test]
async fn start_refuses_a_missing_idempotency_container() {
    let cosmos = CosmosConnection::embedded().await.unwrap();
    let error = Runtime::builder().cosmos(cosmos).start().await.unwrap_err();
    let StartError::Inbox { command, .. } = &error else {
        panic!("{error:?}");
    };
    assert_eq!(*command, "SendReceipt");
}

// The builder's claim settings reach the inbox of every standalone-inbox command: a renewal
// interval over half the claim period is refused at start, naming the command.
#[tokio::test]
async fn start_refuses_a_claim_its_renewals_cannot_keep() {
    let cosmos = store().await;
    let error = Runtime::builder()
        .cosmos(cosmos.clone())
        .inbox_claim_period(Duration::from_secs(4))
        .inbox_renewal_interval(Duration::from_secs(3))
        .start()
        .await
        .unwrap_err();
    let StartError::Inbox { command, source } = &error else {
        panic!("{error:?}");
    };
    assert_eq!(*command, "SendReceipt");
    assert!(
        source.to_string().contains("renewal interval (3s)"),
        "{source}"
    );
    Runtime::builder()
        .cosmos(cosmos)
        .inbox_claim_period(Duration::from_secs(4))
        .inbox_renewal_interval(Duration::from_secs(2))
        .start()
        .await
        .unwrap()
        .shutdown()
        .await;
}

// Deliveries of different message ids run concurrently (an inbox command has no partition key;
// its deliveries are ordered by message id only): one waiting for another does not block it.
#[tokio::test]
async fn deliveries_of_different_message_ids_run_concurrently() {
    let cosmos = store().await;
    let broker = InMemoryBroker::new();
    let runtime = runtime(&cosmos, &broker).await;
    publish_command(&broker, "SendReceipt", "m-waits", &body("waits", false)).await;
    publish_command(&broker, "SendReceipt", "m-signals", &body("signals", false)).await;
    settled(&broker, "SendReceipt").await;
    assert_eq!(
        WAITS_ATTEMPTS.load(std::sync::atomic::Ordering::SeqCst),
        1,
        "the waiting delivery completed on its first attempt, beside the other"
    );
    assert_eq!(runs_of("m-waits"), 1);
    assert_eq!(runs_of("m-signals"), 1);
    runtime.shutdown().await;
}

// A sent message commits with the marker's completion, as an Outbox Document of the message
// id's partition, and nothing is published before that: a broker outage after the handler's
// side effect cannot fail the attempt and run the handler again. With no relay running, the
// document waits, pending, for one.
#[tokio::test]
async fn a_sent_message_commits_with_the_marker_completion_and_waits_for_the_relay() {
    let cosmos = store().await;
    let broker = InMemoryBroker::new();
    let runtime = Runtime::builder()
        .cosmos(cosmos.clone())
        .broker(broker.clone())
        .without_relay()
        .start()
        .await
        .unwrap();
    publish_command(&broker, "SendReceipt", "m-outbox", &body("o-5", false)).await;
    settled(&broker, "SendReceipt").await;
    assert_eq!(runs_of("m-outbox"), 1);
    assert_eq!(
        marker(&cosmos, "m-outbox").await.unwrap()["Completed"],
        true
    );
    assert_eq!(
        broker.published_count("receipts"),
        0,
        "nothing is published by the handler's attempt"
    );
    let c = cosmos.container("mail", "idempotency").await.unwrap();
    let outbox_id = chatter_runtime::cosmos::outbox_id("m-outbox:ReceiptSent").unwrap();
    let document = find_document(&c, &[json!("m-outbox")], &outbox_id)
        .await
        .expect("the receipt's Outbox Document committed with the marker");
    assert_eq!(document["status"], "pending");
    assert_eq!(document["idempotencyKey"], "m-outbox");
    assert_eq!(document["Destination"], "receipts");
    runtime.shutdown().await;
}
