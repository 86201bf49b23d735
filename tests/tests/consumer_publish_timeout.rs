//! The consumers' own publishes (a failed delivery's retry copy, a dead letter) are bounded by
//! the publish timeout whatever the `Broker` implementation does: a broker that never answers
//! them fails the publish, and the delivery goes back to the broker instead of holding its
//! partition-key value's lane and a permit forever.

use std::time::Duration;

use chatter_runtime::broker::{Broker, BrokerError, InMemoryBroker, Subscription};
use chatter_runtime::cosmos::CosmosConnection;
use chatter_runtime::provision;
use chatter_runtime::{
    BoxError, BrokeredMessage, DocumentReliable, HandlerContext, Runtime,
    constants::ATTEMPTS_CONTEXT_KEY, handler, relay::RelayOptions,
};
use chatter_tests::broker::publish_command;
use chatter_tests::runtime::Attempts;
use chatter_tests::wait::eventually;
use futures::future::BoxFuture;
use serde::{Deserialize, Serialize};
use serde_json::json;

/// Books a room; its handler always fails, so every delivery is retried.
#[derive(Debug, Serialize, Deserialize, DocumentReliable)]
#[cosmos(database = "hotel", container = "rooms", lease = "rooms-leases")]
#[partition_key(path = "/room")]
pub struct BookRoom {
    pub room: String,
}

static ATTEMPTS: Attempts = Attempts::new();

#[handler]
async fn book(_command: BookRoom, ctx: &mut HandlerContext) -> Result<(), BoxError> {
    ATTEMPTS.record(ctx.message_id());
    Err("the room is not ready".into())
}

/// Test double: the in-memory broker, except that a publish carrying an attempt count (the
/// consumer's retry copy) never answers, as a broker implementation without a bound of its own
/// might. No real broker can be made to hang exactly that publish.
#[derive(Clone)]
struct SilentOnRetries(InMemoryBroker);

impl Broker for SilentOnRetries {
    fn publish(&self, message: BrokeredMessage) -> BoxFuture<'_, Result<(), BrokerError>> {
        if message.context.contains_key(ATTEMPTS_CONTEXT_KEY) {
            return Box::pin(std::future::pending());
        }
        self.0.publish(message)
    }

    fn subscribe<'a>(
        &'a self,
        destination: &'a str,
    ) -> BoxFuture<'a, Result<Subscription, BrokerError>> {
        self.0.subscribe(destination)
    }
}

#[tokio::test]
async fn a_retry_copy_the_broker_never_confirms_times_out_and_the_delivery_comes_back() {
    let cosmos = CosmosConnection::embedded().await.unwrap();
    provision::ensure_container(&cosmos, "hotel", "rooms", &["/room"])
        .await
        .unwrap();
    provision::ensure_lease_container(&cosmos, "hotel", "rooms-leases")
        .await
        .unwrap();
    let broker = InMemoryBroker::new();
    let runtime = Runtime::builder()
        .cosmos(cosmos)
        .broker(SilentOnRetries(broker.clone()))
        .redelivery_delay(Duration::from_millis(10))
        // The relay's publish timeout bounds the consumers' publishes too.
        .relay_options(RelayOptions::default().publish_timeout(Duration::from_millis(500)))
        .start()
        .await
        .unwrap();
    publish_command(&broker, "BookRoom", "m-1", &json!({ "room": "r-1" })).await;
    // The retry copy's publish times out, the delivery is nacked, and the broker delivers it
    // again (uncounted): the handler runs again instead of never.
    eventually(
        Duration::from_secs(20),
        Duration::from_millis(20),
        "the delivery is handled again after its retry copy timed out",
        || async { ATTEMPTS.of("m-1") >= 3 },
    )
    .await;
    runtime.shutdown().await;
}
