//! `Duration::MAX` (or any huge value) for a duration option means "no bound": every deadline
//! chatter derives from one saturates (about 100 years) instead of overflowing an `Instant`,
//! so the runtime starts, relays, dead-letters and stops as with any other value.

use std::time::Duration;

use chatter_runtime::broker::{Broker, InMemoryBroker};
use chatter_runtime::cosmos::CosmosConnection;
use chatter_runtime::provision;
use chatter_runtime::{
    BoxError, DocumentReliable, HandlerContext, Runtime, broker::dead_letter_destination, handler,
    relay::RelayOptions,
};
use chatter_tests::broker::{next_delivery, publish_command};
use chatter_tests::runtime::consuming;
use chatter_tests::store::{document, emulator_server, provisioned_with_leases};
use chatter_tests::wait::eventually;
use serde::{Deserialize, Serialize};
use serde_json::json;

const DB: &str = "saturate";
const WAIT: Duration = Duration::from_secs(30);

chatter_tests::event_command! {
    /// Places an order and emits one event.
    PlaceOrder { order_id as "orderId" }
    on ("saturate", "orders", "orders-leases") at "/orderId",
    handled by place_order, sends "placed" to "order-events"
}

/// Charges a card; a single attempt, so its failure is dead-lettered at once.
#[derive(Debug, Serialize, Deserialize, DocumentReliable)]
#[cosmos(database = "saturate", container = "charges", lease = "charges-leases")]
#[partition_key(path = "/card")]
#[chatter(max_delivery_attempts = 1)]
pub struct ChargeCard {
    pub card: String,
}

#[handler]
async fn charge(command: ChargeCard, ctx: &mut HandlerContext) -> Result<(), BoxError> {
    ctx.upsert(json!({ "id": format!("charge-{}", ctx.message_id()), "card": command.card }))?;
    Ok(())
}

/// A store with both commands' containers.
async fn store() -> CosmosConnection {
    let cosmos = CosmosConnection::embedded().await.unwrap();
    provisioned_with_leases(&cosmos, DB, "orders", &["/orderId"], "orders-leases").await;
    provisioned_with_leases(&cosmos, DB, "charges", &["/card"], "charges-leases").await;
    cosmos
}

/// A runtime relaying on `cosmos` with `relay` options and `configure`d, that does not consume.
async fn relaying(
    cosmos: &CosmosConnection,
    broker: &InMemoryBroker,
    relay: RelayOptions,
) -> Runtime {
    Runtime::builder()
        .cosmos(cosmos.clone())
        .broker(broker.clone())
        .consume(false)
        .relay_options(relay.poll_interval(Duration::from_millis(100)))
        .shutdown_drain(Duration::MAX)
        .start()
        .await
        .unwrap()
}

async fn status(cosmos: &CosmosConnection, message_id: &str) -> String {
    let container = cosmos.container(DB, "orders").await.unwrap();
    let id = chatter_runtime::cosmos::outbox_id(&format!("{message_id}:placed")).unwrap();
    document(&container, &[json!("o-1")], &id).await["status"]
        .as_str()
        .unwrap()
        .to_owned()
}

fn order() -> PlaceOrder {
    PlaceOrder {
        order_id: "o-1".to_owned(),
    }
}

#[tokio::test]
async fn relay_idle_of_duration_max_returns_once_the_relay_caught_up() {
    let cosmos = store().await;
    let broker = InMemoryBroker::new();
    let runtime = relaying(&cosmos, &broker, RelayOptions::default()).await;
    runtime.dispatch(order(), "m-idle").await.unwrap();
    runtime.relay_idle(Duration::MAX).await.unwrap();
    assert_eq!(status(&cosmos, "m-idle").await, "delivered");
    runtime.shutdown().await;
}

#[tokio::test]
async fn a_shutdown_drain_of_duration_max_publishes_what_is_pending_then_stops() {
    let cosmos = store().await;
    let broker = InMemoryBroker::new();
    let runtime = relaying(&cosmos, &broker, RelayOptions::default()).await;
    runtime.dispatch(order(), "m-drain").await.unwrap();
    // `shutdown_drain(Duration::MAX)`: waits for the relay, however long, then stops.
    runtime.shutdown().await;
    assert_eq!(status(&cosmos, "m-drain").await, "delivered");
}

#[tokio::test]
async fn a_relay_lease_expiry_of_duration_max_starts_and_relays() {
    let cosmos = store().await;
    let broker = InMemoryBroker::new();
    let mut events = broker.subscribe("order-events").await.unwrap();
    let runtime = relaying(
        &cosmos,
        &broker,
        RelayOptions::default().lease_expiry(Duration::MAX),
    )
    .await;
    runtime.dispatch(order(), "m-expiry").await.unwrap();
    let delivery = next_delivery(&mut events, WAIT).await;
    assert_eq!(delivery.message.message_id, "m-expiry:placed");
    runtime.shutdown().await;
}

// The last attempt's batch fails in a way that may have committed (the store answers 503), so
// the consumer asks the inbox marker, bounded by the delivery timeout, before dead-lettering.
#[tokio::test]
async fn a_last_attempt_under_a_delivery_timeout_of_duration_max_asks_the_marker_then_dead_letters()
{
    let (emulator, cosmos) = emulator_server().await;
    provision::ensure_container(&cosmos, DB, "charges", &["/card"])
        .await
        .unwrap();
    provisioned_with_leases(&cosmos, DB, "orders", &["/orderId"], "orders-leases").await;
    let (runtime, broker) =
        consuming(&cosmos, |builder| builder.delivery_timeout(Duration::MAX)).await;
    // Every batch (POST) is refused with a real 503 until cleared; reads still answer.
    emulator
        .faults()
        .refuse("POST", 503, Duration::from_secs(600));
    publish_command(&broker, "ChargeCard", "m-charge", &json!({ "card": "c-1" })).await;
    let letters = dead_letter_destination("ChargeCard");
    eventually(WAIT, Duration::from_millis(20), "dead-lettered", || async {
        broker.pending_count(&letters) == 1
    })
    .await;
    emulator.faults().clear();
    runtime.shutdown().await;
}

#[cfg(feature = "rabbitmq")]
#[tokio::test]
async fn rabbitmq_connect_retrying_for_duration_max_connects() {
    use chatter_runtime::broker::RabbitMqBroker;
    let connecting = RabbitMqBroker::connect_retrying(chatter_tests::rabbitmq::URI, Duration::MAX);
    let broker = tokio::time::timeout(WAIT, connecting).await.unwrap();
    assert!(broker.is_ok(), "{broker:?}");
}

#[cfg(feature = "nats")]
#[tokio::test]
async fn nats_connect_retrying_for_duration_max_connects() {
    use chatter_runtime::broker::NatsBroker;
    let connecting = NatsBroker::connect_retrying(chatter_tests::nats::URL, Duration::MAX);
    let broker = tokio::time::timeout(WAIT, connecting).await.unwrap();
    assert!(broker.is_ok(), "{broker:?}");
}

// The server counts an ack wait in nanoseconds as an i64: `Duration::MAX` reached it wrapped.
#[cfg(feature = "nats")]
#[tokio::test]
async fn a_nats_ack_wait_of_duration_max_is_the_longest_the_server_holds() {
    use chatter_tests::nats::{self, TestStream};
    let broker = nats::connect(nats::URL).await.with_ack_wait(Duration::MAX);
    let stream = TestStream::create(&broker, Duration::from_secs(120)).await;
    let _subscription = nats::subscribe(&broker, &stream.subject("orders")).await;
    let raw = broker.jetstream().get_stream(&stream.name).await.unwrap();
    let names = nats::consumer_names(&raw).await;
    assert_eq!(names.len(), 1, "{names:?}");
    let info = raw.consumer_info(&names[0]).await.unwrap();
    stream.delete(&broker).await;
    assert!(
        info.config.ack_wait > Duration::from_secs(100 * 365 * 24 * 3600),
        "{:?}",
        info.config.ack_wait
    );
}
