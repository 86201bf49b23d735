//! Deliveries through the in-memory broker: acked after commit or confirmed duplicate, delivered
//! again (counted) on failure, dead-lettered when they can never succeed or ran out of attempts,
//! nothing committed by a failed attempt.

use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use chatter_runtime::BrokeredMessage;
use chatter_runtime::broker::{Broker, InMemoryBroker};
use chatter_runtime::cosmos::CosmosConnection;
use chatter_runtime::provision;
use chatter_runtime::{
    BoxError, DocumentReliable, HandlerContext, Runtime, broker::dead_letter_destination,
    constants::ATTEMPTS_CONTEXT_KEY, constants::DEAD_LETTER_REASON_CONTEXT_KEY,
    constants::DEFAULT_MAX_DELIVERY_ATTEMPTS, handler,
};
use chatter_tests::broker::{next_delivery, publish_command};
use chatter_tests::runtime::consuming;
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
    let (runtime, broker) = consuming(&cosmos, |builder| builder).await;
    (runtime, broker, cosmos)
}

/// Publishes `ReserveStock` for `sku`, failing its first `fail_first_attempts` attempts.
async fn publish(broker: &InMemoryBroker, message_id: &str, sku: &str, fail_first_attempts: usize) {
    let body = json!({ "sku": sku, "fail_first_attempts": fail_first_attempts });
    publish_command(broker, "ReserveStock", message_id, &body).await;
}

async fn settled(broker: &InMemoryBroker) {
    chatter_tests::broker::settled(broker, "ReserveStock").await;
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
    publish(&broker, "m-fail-twice", "sku-1", 2).await;
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
            &chatter_runtime::cosmos::inbox_id("m-fail-twice").unwrap()
        )
        .await
        .is_some()
    );
    runtime.shutdown().await;
}

#[tokio::test]
async fn a_duplicate_delivery_is_acknowledged_without_committing_again() {
    let (runtime, broker, cosmos) = start().await;
    publish(&broker, "m-dup", "sku-2", 0).await;
    settled(&broker).await;
    let first = read(&cosmos, "sku-2", "reservation-m-dup").await.unwrap();
    publish(&broker, "m-dup", "sku-2", 0).await;
    settled(&broker).await;
    // The handler ran twice (at-least-once); the batch committed once.
    assert_eq!(attempts_of("m-dup").len(), 2);
    let after = read(&cosmos, "sku-2", "reservation-m-dup").await.unwrap();
    assert_eq!(after["attempt"], 1);
    assert_eq!(after["_etag"], first["_etag"]);
    assert_eq!(broker.published_count("ReserveStock"), 2);
    runtime.shutdown().await;
}

/// The dead letters of `ReserveStock`, received so far (waits up to 10 s for `count`).
async fn dead_letters(broker: &InMemoryBroker, count: usize) -> Vec<BrokeredMessage> {
    let mut subscription = broker
        .subscribe(&dead_letter_destination("ReserveStock"))
        .await
        .unwrap();
    let mut letters = Vec::new();
    while letters.len() < count {
        let delivery = next_delivery(&mut subscription, Duration::from_secs(10)).await;
        letters.push(delivery.message.clone());
        delivery.ack().await.unwrap();
    }
    letters
}

// A body that is not the command's JSON can never succeed: it is dead-lettered at once, with its
// reason, and never handled; nothing is dropped and nothing is redelivered forever.
#[tokio::test]
async fn an_undecodable_body_is_dead_lettered_at_once_with_its_reason() {
    let (runtime, broker, cosmos) = start().await;
    for (id, body) in [("m-garbage", "not json"), ("m-shape", r#"{"sku":7}"#)] {
        broker
            .publish(BrokeredMessage::json(id, "ReserveStock", body))
            .await
            .unwrap();
    }
    let mut letters = dead_letters(&broker, 2).await;
    // Different keys are handled concurrently: the dead letters may come in either order.
    letters.sort_by(|a, b| a.message_id.cmp(&b.message_id));
    for (letter, (id, body, reason)) in letters.iter().zip([
        ("m-garbage", "not json", "is not JSON"),
        ("m-shape", r#"{"sku":7}"#, "does not decode"),
    ]) {
        assert_eq!(letter.message_id, id);
        assert_eq!(letter.body, body, "the body is kept");
        let why = letter.context[DEAD_LETTER_REASON_CONTEXT_KEY]
            .as_str()
            .unwrap();
        assert!(why.contains(reason), "{why}");
        assert_eq!(
            letter.context[ATTEMPTS_CONTEXT_KEY], 1,
            "dead-lettered on the first attempt"
        );
        assert!(attempts_of(id).is_empty(), "the handler never saw {id}");
    }
    settled(&broker).await;
    assert!(
        read(&cosmos, "sku-1", "reservation-m-garbage")
            .await
            .is_none()
    );
    runtime.shutdown().await;
}

// R2.05: a participant without a message id never reaches its handler; it is dead-lettered
// (removed from the command's queue with its reason) instead of being redelivered forever.
#[tokio::test]
async fn a_participant_delivery_without_message_id_is_dead_lettered_and_never_handled() {
    let (runtime, broker, cosmos) = start().await;
    publish(&broker, "  ", "sku-3", 0).await;
    let letters = dead_letters(&broker, 1).await;
    let why = letters[0].context[DEAD_LETTER_REASON_CONTEXT_KEY]
        .as_str()
        .unwrap();
    assert!(why.contains("requires a non-empty MessageId"), "{why}");
    settled(&broker).await;
    assert!(attempts_of("  ").is_empty(), "the handler never ran");
    assert!(read(&cosmos, "sku-3", "reservation-  ").await.is_none());
    runtime.shutdown().await;
}

// A handler that keeps failing is dead-lettered after its command's delivery attempts (the
// default, 5), with the attempt count and the last error; a healthy command behind it is handled.
#[tokio::test]
async fn a_delivery_that_keeps_failing_is_dead_lettered_after_the_default_attempts() {
    let (runtime, broker, cosmos) = start().await;
    publish(&broker, "m-hopeless", "sku-4", 100).await;
    publish(&broker, "m-healthy", "sku-5", 0).await;
    let letters = dead_letters(&broker, 1).await;
    let letter = &letters[0];
    assert_eq!(letter.message_id, "m-hopeless");
    assert_eq!(
        letter.context[ATTEMPTS_CONTEXT_KEY],
        DEFAULT_MAX_DELIVERY_ATTEMPTS
    );
    let why = letter.context[DEAD_LETTER_REASON_CONTEXT_KEY]
        .as_str()
        .unwrap();
    assert!(why.contains("attempt 5 fails on purpose"), "{why}");
    let attempts = attempts_of("m-hopeless");
    assert_eq!(attempts.len(), 5, "tried exactly 5 times");
    assert!(
        !attempts[0] && attempts[1..].iter().all(|r| *r),
        "retries are marked redelivered: {attempts:?}"
    );
    settled(&broker).await;
    assert!(
        read(&cosmos, "sku-5", "reservation-m-healthy")
            .await
            .is_some()
    );
    assert!(
        read(&cosmos, "sku-4", "reservation-m-hopeless")
            .await
            .is_none()
    );
    runtime.shutdown().await;
}
