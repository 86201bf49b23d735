//! A feed-range split while the relay is draining loses and skips nothing: every outbox
//! message written before and after the split is published at least once and every outbox
//! document ends stamped delivered; the split lease is replaced by its children's leases.
//!
//! The store is the SDK's in-memory emulator served by `chatter-emulator` in this process (its
//! store has the split hook). The one test double is [`GatedBroker`], which holds publishes at
//! a chosen moment so the split happens while pages are in flight.
//!
//! No timed assertions: every wait is a bounded poll with a generous timeout.

use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use azure_data_cosmos::options::ReadFeedRangesOptions;
use chatter_runtime::broker::{Broker, BrokerError, InMemoryBroker, Subscription};
use chatter_runtime::cosmos::{self, ContainerClient, CosmosConnection, provision};
use chatter_runtime::message::BrokeredMessage;
use chatter_runtime::relay::change_feed::ChangeFeedProcessorOptions;
use chatter_runtime::relay::host::RelayOptions;
use chatter_runtime::{BoxError, DocumentReliable, HandlerContext, Runtime, handler};
use futures::FutureExt;
use futures::future::BoxFuture;
use serde::{Deserialize, Serialize};
use serde_json::json;
use tokio::sync::watch;

const DB: &str = "relay-split";
const CONTAINER: &str = "orders";
const LEASES: &str = "orders-leases";
const EVENTS: &str = "order-events";
/// Outbox documents written before the relay starts.
const BEFORE: usize = 60;
/// Outbox documents written after the split.
const AFTER: usize = 30;
/// Publishes let through before the gate holds the rest.
const OPEN_FOR: usize = 20;
/// Generous bound for anything the relay should do "soon" on a noisy shared machine.
const WAIT: Duration = Duration::from_secs(120);

/// Places an order: writes the order and sends one `OrderPlaced` event through the outbox.
#[derive(Debug, Clone, Serialize, Deserialize, DocumentReliable)]
#[cosmos(
    database = "relay-split",
    container = "orders",
    lease = "orders-leases"
)]
#[partition_key(path = "/orderId")]
#[serde(rename_all = "camelCase")]
pub struct PlaceOrder {
    pub order_id: String,
}

#[handler]
async fn place_order(command: PlaceOrder, ctx: &mut HandlerContext) -> Result<(), BoxError> {
    ctx.upsert(json!({ "id": command.order_id, "orderId": command.order_id }))?;
    ctx.send(BrokeredMessage::json(
        event_id(ctx.message_id()),
        EVENTS,
        json!({ "orderId": command.order_id }).to_string(),
    ))?;
    Ok(())
}

fn event_id(command_message_id: &str) -> String {
    format!("{command_message_id}:OrderPlaced")
}

fn command_id(i: usize) -> String {
    format!("order-{i}:place")
}

/// Test double (a moment the real parts cannot be stopped at): a decorator over the real
/// in-memory broker that lets the first [`OPEN_FOR`] publishes through and holds every later
/// one until the gate opens, so the split happens while the relay has pages in flight.
#[derive(Clone)]
struct GatedBroker {
    inner: InMemoryBroker,
    attempts: Arc<AtomicUsize>,
    gate: watch::Receiver<bool>,
}

impl Broker for GatedBroker {
    fn publish(&self, message: BrokeredMessage) -> BoxFuture<'_, Result<(), BrokerError>> {
        async move {
            if self.attempts.fetch_add(1, Ordering::SeqCst) >= OPEN_FOR {
                let mut gate = self.gate.clone();
                // The sender lives as long as the test; a closed gate counts as open.
                let _ = gate.wait_for(|open| *open).await;
            }
            self.inner.publish(message).await
        }
        .boxed()
    }

    fn subscribe<'a>(
        &'a self,
        destination: &'a str,
    ) -> BoxFuture<'a, Result<Subscription, BrokerError>> {
        self.inner.subscribe(destination)
    }
}

/// Polls `condition` until it holds, panicking with `what` after [`WAIT`].
async fn eventually<F, Fut>(what: &str, mut condition: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + WAIT;
    while !condition().await {
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out after {WAIT:?} waiting until {what}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Every message id received on [`EVENTS`], with how often it arrived.
#[derive(Clone, Default)]
struct Received(Arc<Mutex<BTreeMap<String, usize>>>);

impl Received {
    async fn consume(broker: &InMemoryBroker) -> Self {
        let received = Self::default();
        let mut subscription = broker.subscribe(EVENTS).await.unwrap();
        let sink = received.clone();
        tokio::spawn(async move {
            while let Some(delivery) = subscription.next().await {
                let delivery = delivery.expect("the relay publishes Brokered Messages");
                *sink
                    .0
                    .lock()
                    .unwrap()
                    .entry(delivery.message.message_id.clone())
                    .or_default() += 1;
                delivery.ack().await.unwrap();
            }
        });
        received
    }

    fn ids(&self) -> BTreeSet<String> {
        self.0.lock().unwrap().keys().cloned().collect()
    }
}

/// The lease tokens (`{min}-{max}`) of the container's current feed ranges.
async fn feed_ranges(orders: &ContainerClient) -> BTreeSet<String> {
    orders
        .read_feed_ranges(Some(
            ReadFeedRangesOptions::default().with_force_refresh(true),
        ))
        .await
        .unwrap()
        .iter()
        .map(|r| format!("{}-{}", r.min_inclusive(), r.max_exclusive()))
        .collect()
}

async fn place_orders(writer: &Runtime, range: std::ops::Range<usize>) {
    for i in range {
        writer
            .dispatch(
                PlaceOrder {
                    order_id: format!("order-{i}"),
                },
                command_id(i),
            )
            .await
            .unwrap();
    }
}

/// The orders in `range` whose outbox document is not stamped delivered with the default ttl
/// yet; panics on any other stamp.
async fn undelivered(orders: &ContainerClient, range: std::ops::Range<usize>) -> Vec<usize> {
    let mut pending = Vec::new();
    for i in range {
        let id = chatter_runtime::document::outbox_id(&event_id(&command_id(i))).unwrap();
        let doc = cosmos::read_item(
            orders,
            cosmos::partition_key(&[json!(format!("order-{i}"))]).unwrap(),
            &id,
        )
        .await
        .unwrap()
        .into_document()
        .unwrap_or_else(|| panic!("outbox document {id} exists"));
        match doc["status"].as_str() {
            Some("pending") => pending.push(i),
            Some("delivered") => assert_eq!(doc["ttl"], json!(86400), "{doc}"),
            _ => panic!("unexpected outbox document state: {doc}"),
        }
    }
    pending
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_split_while_draining_loses_and_skips_no_outbox_message() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let emulator = chatter_emulator::EmulatorServer::from_listener(listener)
        .unwrap()
        .spawn();
    let cosmos = CosmosConnection::connect(emulator.endpoint(), None)
        .await
        .unwrap();
    provision::ensure_container(&cosmos, DB, CONTAINER, &["/orderId"])
        .await
        .unwrap();
    provision::ensure_lease_container(&cosmos, DB, LEASES)
        .await
        .unwrap();
    let orders = cosmos.container(DB, CONTAINER).await.unwrap();
    let ranges_before = feed_ranges(&orders).await;

    let broker = InMemoryBroker::new();
    let received = Received::consume(&broker).await;
    let (open_gate, gate) = watch::channel(false);
    let gated = GatedBroker {
        inner: broker.clone(),
        attempts: Arc::default(),
        gate,
    };

    // Outbox documents written before any relay runs.
    let writer = Runtime::builder()
        .cosmos(cosmos.clone())
        .broker(broker.clone())
        .consume(false)
        .without_relay()
        .start()
        .await
        .unwrap();
    place_orders(&writer, 0..BEFORE).await;

    // Small pages, so draining takes several pages per lease and checkpoints in between.
    let relay = Runtime::builder()
        .cosmos(cosmos.clone())
        .broker(gated.clone())
        .consume(false)
        .relay_options(RelayOptions {
            processor: ChangeFeedProcessorOptions::default()
                .with_poll_interval(Duration::from_millis(100))
                .with_max_items_per_page(5)
                .with_lease_expiry(Duration::from_secs(4))
                .with_lease_renew_interval(Duration::from_millis(400))
                .with_lease_acquire_interval(Duration::from_millis(250)),
            delivery: Default::default(),
        })
        .start()
        .await
        .unwrap();

    // The relay is mid-drain: some messages are out, a later publish is held at the gate.
    eventually("the relay is holding a publish mid-drain", || async {
        gated.attempts.load(Ordering::SeqCst) > OPEN_FOR
    })
    .await;
    assert!(
        received.ids().len() <= OPEN_FOR,
        "the gate holds every later publish"
    );

    // Split the first physical partition under the relay's feet.
    emulator
        .store()
        .split_partition(DB, CONTAINER, 0, Duration::from_millis(10));
    eventually("the split completed", || async {
        feed_ranges(&orders).await.len() == ranges_before.len() + 1
    })
    .await;
    // More documents, written after the split (into the child ranges too).
    place_orders(&writer, BEFORE..BEFORE + AFTER).await;

    open_gate.send(true).unwrap();
    let expected: BTreeSet<String> = (0..BEFORE + AFTER)
        .map(|i| event_id(&command_id(i)))
        .collect();
    eventually(
        "every outbox message was published at least once",
        || async { received.ids().is_superset(&expected) },
    )
    .await;
    eventually("every outbox document is stamped delivered", || async {
        undelivered(&orders, 0..BEFORE + AFTER).await.is_empty()
    })
    .await;

    // The split lease was replaced by its children: the relay drains exactly the new ranges.
    let ranges_after = feed_ranges(&orders).await;
    eventually("the relay drains the child ranges' leases", || async {
        let mut leases = relay.relay_leases().await;
        leases.len() == 1 && leases.remove(0).1.into_iter().collect::<BTreeSet<_>>() == ranges_after
    })
    .await;

    relay.shutdown().await;
    writer.shutdown().await;
}
