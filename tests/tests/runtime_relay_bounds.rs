//! Standalone relays inside a runtime are checked and bounded by their own options: the start
//! check of the broker's duplicate window takes the longest republish bound over every relay
//! of the runtime (not the pipeline relay's alone), and a standalone relay's `max_in_flight`
//! bounds its own publishes even beside a pipeline relay with a larger one.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use chatter_runtime::broker::{Broker, BrokerError, InMemoryBroker, Subscription};
use chatter_runtime::cosmos::{ContainerClient, CosmosConnection};
use chatter_runtime::provision;
use chatter_runtime::testing::OutboxDocument;
use chatter_runtime::{
    BoxError, BrokeredMessage, Runtime, relay::RelayOptions, relay::StandaloneRelay,
};
use chatter_tests::broker::next_delivery;
use chatter_tests::store::{created, provisioned};
use futures::FutureExt;
use futures::future::BoxFuture;
use serde_json::json;

const DB: &str = "legacy";
const TRIGGERS: &str = "triggers";
const LEASES: &str = "triggers-leases";
const PATHS: &[&str] = &["/tenantId"];
const WAIT: Duration = Duration::from_secs(30);

/// A command over `shop/orders`: its pipeline relay (default options, `max_in_flight` 32 and a
/// republish bound of 30 s + 60 s) runs beside the standalone relay under test.
#[derive(Debug, serde::Serialize, serde::Deserialize, chatter_runtime::DocumentReliable)]
#[cosmos(database = "shop", container = "orders", lease = "orders-leases")]
#[partition_key(path = "/orderId")]
#[serde(rename_all = "camelCase")]
pub struct PlaceOrder {
    pub order_id: String,
}

#[chatter_runtime::handler]
async fn place_order(
    _command: PlaceOrder,
    _ctx: &mut chatter_runtime::HandlerContext,
) -> Result<(), BoxError> {
    Ok(())
}

/// The store with the command's containers and the standalone relay's.
async fn store() -> (CosmosConnection, Arc<ContainerClient>) {
    let cosmos = CosmosConnection::embedded().await.unwrap();
    provision::ensure_for::<PlaceOrder>(&cosmos).await.unwrap();
    let triggers = provisioned(&cosmos, DB, TRIGGERS, PATHS).await;
    provision::ensure_lease_container(&cosmos, DB, LEASES)
        .await
        .unwrap();
    (cosmos, triggers)
}

fn standalone(cosmos: &CosmosConnection, options: RelayOptions) -> StandaloneRelay {
    StandaloneRelay::builder(cosmos, (DB, TRIGGERS), (DB, LEASES))
        .partition_key_paths(PATHS)
        .options(options)
        .build()
        .unwrap()
}

/// What [`Holding`] saw.
#[derive(Default)]
struct Seen {
    in_flight: usize,
    most_in_flight: usize,
}

/// Test double (an observer, not a fault): publishes through a real [`InMemoryBroker`], holding
/// each confirm until three publishes are in flight at once or [`HOLD`] passed, and records the
/// most publishes in flight at once. A relay bounded to two never reaches three, so its
/// publishes wait the hold; an unbounded one reaches three within it.
#[derive(Clone)]
struct Holding {
    inner: InMemoryBroker,
    seen: Arc<Mutex<Seen>>,
    more: Arc<tokio::sync::Notify>,
}

/// How long a publish is held when fewer than three are in flight.
const HOLD: Duration = Duration::from_secs(1);

impl Holding {
    async fn publish_held(&self, message: BrokeredMessage) -> Result<(), BrokerError> {
        {
            let mut seen = self.seen.lock().unwrap();
            seen.in_flight += 1;
            seen.most_in_flight = seen.most_in_flight.max(seen.in_flight);
        }
        self.more.notify_waiters();
        let _ = tokio::time::timeout(HOLD, async {
            loop {
                let notified = self.more.notified();
                if self.seen.lock().unwrap().in_flight >= 3 {
                    return;
                }
                notified.await;
            }
        })
        .await;
        let result = self.inner.publish(message).await;
        self.seen.lock().unwrap().in_flight -= 1;
        result
    }
}

impl Broker for Holding {
    fn publish(&self, message: BrokeredMessage) -> BoxFuture<'_, Result<(), BrokerError>> {
        self.publish_held(message).boxed()
    }

    fn subscribe<'a>(
        &'a self,
        destination: &'a str,
    ) -> BoxFuture<'a, Result<Subscription, BrokerError>> {
        self.inner.subscribe(destination)
    }
}

// Before, every processor of a runtime shared one limit sized by the largest `max_in_flight`
// of its relays: the standalone relay's 2 became the pipeline relay's 32.
#[tokio::test]
async fn a_standalone_relays_max_in_flight_bounds_its_own_publishes_beside_a_pipeline_relay() {
    let (cosmos, triggers) = store().await;
    // Eight tenants: eight partition-key values the drain may publish concurrently.
    for n in 0..8 {
        let tenant = format!("t{n}");
        let message = BrokeredMessage::json(format!("m-{n}"), "orders", r#"{"n":1}"#);
        let doc = OutboxDocument::build(&message, PATHS, &[json!(tenant)]).unwrap();
        created(&triggers, &[json!(tenant)], &doc).await;
    }
    let broker = Holding {
        inner: InMemoryBroker::new(),
        seen: Arc::default(),
        more: Arc::default(),
    };
    let mut orders = broker.inner.subscribe("orders").await.unwrap();
    let runtime = Runtime::builder()
        .cosmos(cosmos.clone())
        .registry(chatter_tests::runtime::registry_at::<PlaceOrder>(
            "place-order",
        ))
        .broker(broker.clone())
        .consume(false)
        .standalone_relay(standalone(
            &cosmos,
            RelayOptions::default().max_in_flight(2),
        ))
        .start()
        .await
        .unwrap();
    for _ in 0..8 {
        next_delivery(&mut orders, WAIT).await.ack().await.unwrap();
    }
    runtime.shutdown().await;
    let most = broker.seen.lock().unwrap().most_in_flight;
    assert!(
        most <= 2,
        "the standalone relay had {most} publishes in flight at once; its max_in_flight is 2"
    );
}

// Before, the start check of a NATS stream's duplicate window took the pipeline relay's bound
// alone (30 s lease expiry + 60 s = 90 s): a stream deduplicating for 150 s passed, although
// the standalone relay (120 s + 60 s = 180 s) may publish a message again after 150 s.
#[cfg(feature = "nats")]
#[tokio::test]
async fn the_start_check_of_the_nats_duplicate_window_uses_the_longest_republish_bound_of_every_relay()
 {
    use chatter_runtime::error::StartError;
    use chatter_tests::nats::{self, NatsServer, TestStream};

    let server = NatsServer::start().await;
    let broker = nats::connect(&server.url()).await;
    let stream = TestStream::create(&broker, Duration::from_secs(150)).await;
    let (cosmos, _) = store().await;
    let start = |options: RelayOptions| {
        Runtime::builder()
            .cosmos(cosmos.clone())
            .registry(chatter_tests::runtime::registry_at::<PlaceOrder>(
                &stream.subject("orders"),
            ))
            .broker(broker.clone())
            .standalone_relay(standalone(&cosmos, options))
            .start()
    };
    // Both relays republish within 90 s: the stream's 150 s cover them.
    start(RelayOptions::default())
        .await
        .expect("a window longer than every relay's bound passes")
        .shutdown()
        .await;
    let error = start(RelayOptions::default().lease_expiry(Duration::from_secs(120)))
        .await
        .expect_err("the standalone relay may republish after 180 s, past the 150 s window");
    let StartError::Broker { source } = &error else {
        panic!("{error:?}");
    };
    let text = source.to_string();
    assert!(
        text.contains(&format!("`duplicate_window` of stream `{}`", stream.name)),
        "{text}"
    );
    assert!(
        text.contains("180s"),
        "names the standalone relay's bound: {text}"
    );
}

#[tokio::test]
async fn a_standalone_relay_over_a_container_the_pipeline_relay_relays_is_refused_at_start() {
    let (cosmos, _) = store().await;
    provision::ensure_lease_container(&cosmos, "shop", "other-leases")
        .await
        .unwrap();
    let over_orders =
        StandaloneRelay::builder(&cosmos, ("shop", "orders"), ("shop", "other-leases"))
            .partition_key_paths(&["/orderId"])
            .build()
            .unwrap();
    let error = Runtime::builder()
        .cosmos(cosmos.clone())
        .consume(false)
        .standalone_relay(over_orders)
        .without_metrics()
        .start()
        .await
        .expect_err("two relays over shop/orders");
    let text = error.to_string();
    assert!(
        text.contains("`shop/orders`") && text.contains("publish each of its documents twice"),
        "{text}"
    );
}
