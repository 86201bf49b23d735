//! A feed-range split while the relay is draining loses and skips nothing: every outbox
//! message written before and after the split is published at least once and every outbox
//! document ends stamped delivered; the split lease is replaced by its children's leases.
//!
//! The store is the SDK's in-memory emulator served by `chatter-emulator` in this process (its
//! store has the split hook). The one test double is [`GatedBroker`], which holds publishes at
//! a chosen moment so the split happens while pages are in flight.
//!
//! No timed assertions: every wait is a bounded poll with a generous timeout.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use chatter_runtime::BrokeredMessage;
use chatter_runtime::Runtime;
use chatter_runtime::broker::{Broker, BrokerError, InMemoryBroker, Subscription};
use chatter_runtime::cosmos::ContainerClient;
use chatter_tests::broker::Received;
use chatter_tests::change_feed::feed_range_tokens;
use chatter_tests::relay::fast_relay;
use chatter_tests::runtime::writer;
use chatter_tests::store::{emulator_server, outbox_document, provisioned_with_leases};
use chatter_tests::wait::eventually;
use futures::FutureExt;
use futures::future::BoxFuture;
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
/// How often a wait checks its condition.
const POLL: Duration = Duration::from_millis(100);

chatter_tests::event_command! {
    /// Places an order: writes the order and sends one `OrderPlaced` event through the outbox.
    PlaceOrder { order_id as "orderId" }
    on ("relay-split", "orders", "orders-leases") at "/orderId",
    handled by place_order, sends "OrderPlaced" to EVENTS
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
        let doc = outbox_document(
            orders,
            &[json!(format!("order-{i}"))],
            &event_id(&command_id(i)),
        )
        .await;
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
    let (emulator, cosmos) = emulator_server().await;
    let orders = provisioned_with_leases(&cosmos, DB, CONTAINER, &["/orderId"], LEASES).await;
    let ranges_before = feed_range_tokens(&orders).await;

    let broker = InMemoryBroker::new();
    let received = Received::on(&broker, EVENTS).await;
    let (open_gate, gate) = watch::channel(false);
    let gated = GatedBroker {
        inner: broker.clone(),
        attempts: Arc::default(),
        gate,
    };

    // Outbox documents written before any relay runs.
    let writer = writer(&cosmos, broker.clone()).await;
    place_orders(&writer, 0..BEFORE).await;

    // Small pages, so draining takes several pages per lease and checkpoints in between.
    let options = fast_relay(Duration::from_secs(4)).max_items_per_page(5);
    let relay = Runtime::builder()
        .cosmos(cosmos.clone())
        .broker(gated.clone())
        .consume(false)
        .relay_options(options)
        .start()
        .await
        .unwrap();

    // The relay is mid-drain: some messages are out, a later publish is held at the gate.
    eventually(
        WAIT,
        POLL,
        "the relay is holding a publish mid-drain",
        || async { gated.attempts.load(Ordering::SeqCst) > OPEN_FOR },
    )
    .await;
    assert!(
        received.ids().len() <= OPEN_FOR,
        "the gate holds every later publish"
    );

    // Split the first physical partition under the relay's feet.
    emulator
        .store()
        .split_partition(DB, CONTAINER, 0, Duration::from_millis(10));
    eventually(WAIT, POLL, "the split completed", || async {
        feed_range_tokens(&orders).await.len() == ranges_before.len() + 1
    })
    .await;
    // More documents, written after the split (into the child ranges too).
    place_orders(&writer, BEFORE..BEFORE + AFTER).await;

    open_gate.send(true).unwrap();
    let expected: BTreeSet<String> = (0..BEFORE + AFTER)
        .map(|i| event_id(&command_id(i)))
        .collect();
    eventually(
        WAIT,
        POLL,
        "every outbox message was published at least once",
        || async { received.ids().is_superset(&expected) },
    )
    .await;
    eventually(
        WAIT,
        POLL,
        "every outbox document is stamped delivered",
        || async { undelivered(&orders, 0..BEFORE + AFTER).await.is_empty() },
    )
    .await;

    // The split lease was replaced by its children: the relay drains exactly the new ranges.
    let ranges_after = feed_range_tokens(&orders).await;
    eventually(
        WAIT,
        POLL,
        "the relay drains the child ranges' leases",
        || async {
            let mut leases = relay.relay_leases().await;
            leases.len() == 1
                && leases.remove(0).1.into_iter().collect::<BTreeSet<_>>() == ranges_after
        },
    )
    .await;

    relay.shutdown().await;
    writer.shutdown().await;
}
