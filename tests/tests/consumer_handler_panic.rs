//! A handler that panics is a failed attempt like any other: nothing commits, the delivery is
//! retried with its attempt count and dead-lettered past its attempts, and the consumer keeps
//! serving the deliveries behind it. Before, the panic dropped the delivery unsettled, so the
//! broker handed it straight back and it panicked again without end, never dead-lettered.

use std::time::Duration;

use chatter_runtime::broker::{Broker, InMemoryBroker};
use chatter_runtime::cosmos::CosmosConnection;
use chatter_runtime::provision;
use chatter_runtime::{
    BoxError, DocumentReliable, HandlerContext, Outcome, Runtime, broker::dead_letter_destination,
    constants::ATTEMPTS_CONTEXT_KEY, constants::DEAD_LETTER_REASON_CONTEXT_KEY,
    error::DispatchError, error::PipelineError, handler,
};
use chatter_tests::broker::{next_delivery, publish_command, settled};
use chatter_tests::runtime::{Attempts, consuming};
use chatter_tests::store::find_document;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

/// Packs an order; its handler panics on the first `panic_first_attempts` attempts.
#[derive(Debug, Serialize, Deserialize, DocumentReliable)]
#[cosmos(database = "shop", container = "parcels", lease = "parcels-leases")]
#[partition_key(path = "/sku")]
#[chatter(max_delivery_attempts = 3)]
pub struct PackOrder {
    pub sku: String,
    pub panic_first_attempts: usize,
}

static ATTEMPTS: Attempts = Attempts::new();

#[handler]
async fn pack(command: PackOrder, ctx: &mut HandlerContext) -> Result<(), BoxError> {
    let attempt = ATTEMPTS.record(ctx.message_id());
    ctx.upsert(json!({ "id": format!("parcel-{}", ctx.message_id()), "sku": command.sku }))?;
    if attempt <= command.panic_first_attempts {
        panic!(
            "attempt {attempt} of {} panics on purpose",
            ctx.message_id()
        );
    }
    Ok(())
}

async fn start() -> (Runtime, InMemoryBroker, CosmosConnection) {
    let cosmos = CosmosConnection::embedded().await.unwrap();
    provision::ensure_container(&cosmos, "shop", "parcels", &["/sku"])
        .await
        .unwrap();
    let (runtime, broker) = consuming(&cosmos, |builder| builder).await;
    (runtime, broker, cosmos)
}

async fn publish(broker: &InMemoryBroker, message_id: &str, body: Value) {
    publish_command(broker, "PackOrder", message_id, &body).await;
}

async fn parcel(cosmos: &CosmosConnection, sku: &str, message_id: &str) -> Option<Value> {
    let container = cosmos.container("shop", "parcels").await.unwrap();
    find_document(&container, &[json!(sku)], &format!("parcel-{message_id}")).await
}

#[tokio::test]
async fn a_handler_that_always_panics_is_dead_lettered_after_its_attempts_and_the_consumer_carries_on()
 {
    let (runtime, broker, cosmos) = start().await;
    publish(
        &broker,
        "m-always-panics",
        json!({ "sku": "sku-1", "panic_first_attempts": 100 }),
    )
    .await;

    let mut dead_letters = broker
        .subscribe(&dead_letter_destination("PackOrder"))
        .await
        .unwrap();
    let delivery = next_delivery(&mut dead_letters, Duration::from_secs(20)).await;
    let letter = delivery.message.clone();
    delivery.ack().await.unwrap();
    assert_eq!(letter.message_id, "m-always-panics");
    assert_eq!(letter.context[ATTEMPTS_CONTEXT_KEY], 3);
    let why = letter.context[DEAD_LETTER_REASON_CONTEXT_KEY]
        .as_str()
        .unwrap();
    assert!(
        why.contains("panicked") && why.contains("attempt 3 of m-always-panics panics on purpose"),
        "{why}"
    );
    settled(&broker, "PackOrder").await;
    assert_eq!(ATTEMPTS.of("m-always-panics"), 3, "tried exactly 3 times");
    assert!(
        parcel(&cosmos, "sku-1", "m-always-panics").await.is_none(),
        "a panicking attempt commits nothing"
    );

    // The consumer still serves the deliveries behind it, with the same key and another.
    publish(
        &broker,
        "m-same-key",
        json!({ "sku": "sku-1", "panic_first_attempts": 0 }),
    )
    .await;
    publish(
        &broker,
        "m-other-key",
        json!({ "sku": "sku-2", "panic_first_attempts": 0 }),
    )
    .await;
    settled(&broker, "PackOrder").await;
    assert!(parcel(&cosmos, "sku-1", "m-same-key").await.is_some());
    assert!(parcel(&cosmos, "sku-2", "m-other-key").await.is_some());
    let health = runtime.health().await;
    assert!(health.is_healthy(), "{health:?}");
    runtime.shutdown().await;
}

#[tokio::test]
async fn a_handler_that_panics_once_commits_on_its_retry() {
    let (runtime, broker, cosmos) = start().await;
    publish(
        &broker,
        "m-panics-once",
        json!({ "sku": "sku-3", "panic_first_attempts": 1 }),
    )
    .await;
    tokio::time::timeout(Duration::from_secs(20), async {
        while parcel(&cosmos, "sku-3", "m-panics-once").await.is_none() {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .expect("the retry commits");
    settled(&broker, "PackOrder").await;
    assert_eq!(ATTEMPTS.of("m-panics-once"), 2);
    runtime.shutdown().await;
}

#[tokio::test]
async fn dispatch_returns_a_panicking_handler_as_an_error() {
    let (runtime, _broker, cosmos) = start().await;
    let result = runtime
        .dispatch(
            PackOrder {
                sku: "sku-4".into(),
                panic_first_attempts: 100,
            },
            "m-dispatched",
        )
        .await;
    match result {
        Err(DispatchError::Pipeline(PipelineError::HandlerPanicked { panic, .. })) => {
            assert_eq!(panic, "attempt 1 of m-dispatched panics on purpose");
        }
        other => panic!("expected HandlerPanicked, got {other:?}"),
    }
    assert!(parcel(&cosmos, "sku-4", "m-dispatched").await.is_none());
    let again = runtime
        .dispatch(
            PackOrder {
                sku: "sku-4".into(),
                panic_first_attempts: 0,
            },
            "m-dispatched-fine",
        )
        .await
        .unwrap();
    assert!(matches!(again, Outcome::Committed { .. }), "{again:?}");
    runtime.shutdown().await;
}
