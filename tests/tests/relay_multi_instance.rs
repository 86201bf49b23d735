//! Several runtimes relaying one monitored container: they share one store (clones of one
//! embedded `CosmosConnection`), one broker (clones of one `InMemoryBroker`) and one lease
//! container. Together they publish every outbox message at least once, stamp every outbox
//! document delivered, split the leases between them without owning one twice, and hand a
//! stopped instance's leases to the others before those leases could expire.
//!
//! No timed assertions: every wait is a bounded poll with a generous timeout.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use chatter_runtime::Runtime;
use chatter_runtime::broker::InMemoryBroker;
use chatter_runtime::cosmos::{ContainerClient, CosmosConnection};
use chatter_tests::broker::Received;
use chatter_tests::relay::fast_relay;
use chatter_tests::store::{outbox_document, provisioned_with_leases};
use chatter_tests::wait::eventually;
use serde_json::json;

const DB: &str = "relay-multi";
const CONTAINER: &str = "orders";
const LEASES: &str = "orders-leases";
/// Where the handler sends its event; the relay publishes it there.
const EVENTS: &str = "order-events";
/// Generous bound for anything the relays should do "soon" on a noisy shared machine.
const WAIT: Duration = Duration::from_secs(120);
/// How often a wait checks its condition.
const POLL: Duration = Duration::from_millis(100);

chatter_tests::event_command! {
    /// Places an order: writes the order and sends one `OrderPlaced` event through the outbox.
    PlaceOrder { order_id as "orderId" }
    on ("relay-multi", "orders", "orders-leases") at "/orderId",
    handled by place_order, sends "OrderPlaced" to EVENTS
}

fn event_id(command_message_id: &str) -> String {
    format!("{command_message_id}:OrderPlaced")
}

/// The lease expiry: longer than [`WAIT`], so a hand-over seen within a wait happened before
/// the stopped instance's leases could expire (through its graceful release), and a slow
/// renewal on a loaded machine never makes a live instance lose a lease.
const LEASE_EXPIRY: Duration = Duration::from_secs(600);
const _: () = assert!(WAIT.as_secs() < LEASE_EXPIRY.as_secs());

struct Cluster {
    orders: Arc<ContainerClient>,
    runtimes: Vec<Runtime>,
    received: Received,
}

/// One embedded store and broker, and `instances` runtimes relaying through them.
async fn cluster(instances: usize) -> Cluster {
    let cosmos = CosmosConnection::embedded().await.unwrap();
    let orders = provisioned_with_leases(&cosmos, DB, CONTAINER, &["/orderId"], LEASES).await;
    let broker = InMemoryBroker::new();
    let received = Received::on(&broker, EVENTS).await;
    let mut runtimes = Vec::new();
    for _ in 0..instances {
        runtimes.push(
            Runtime::builder()
                .cosmos(cosmos.clone())
                .broker(broker.clone())
                .consume(false)
                // Short relay timings so balancing and hand-overs happen within seconds.
                .relay_options(fast_relay(LEASE_EXPIRY))
                .start()
                .await
                .unwrap(),
        );
    }
    Cluster {
        orders,
        runtimes,
        received,
    }
}

/// The lease tokens (`{min}-{max}`) of the monitored container's feed ranges.
async fn feed_ranges(orders: &ContainerClient) -> BTreeSet<String> {
    orders
        .read_feed_ranges(None)
        .await
        .unwrap()
        .iter()
        .map(|r| format!("{}-{}", r.min_inclusive(), r.max_exclusive()))
        .collect()
}

/// The lease tokens `runtime`'s relay drains now (it relays one source).
async fn leases_of(runtime: &Runtime) -> Vec<String> {
    let mut processors = runtime.relay_leases().await;
    assert_eq!(processors.len(), 1, "one relayed source: {processors:?}");
    processors.remove(0).1
}

/// Whether every runtime drains at least one lease, no lease is drained twice, and together
/// they drain every feed range.
async fn balanced(runtimes: &[Runtime], ranges: &BTreeSet<String>) -> bool {
    let mut union = BTreeSet::new();
    for runtime in runtimes {
        let owned = leases_of(runtime).await;
        if owned.is_empty() {
            return false;
        }
        for lease in owned {
            if !union.insert(lease) {
                return false;
            }
        }
    }
    union == *ranges
}

async fn describe(runtimes: &[Runtime]) -> Vec<Vec<String>> {
    let mut leases = Vec::new();
    for runtime in runtimes {
        leases.push(leases_of(runtime).await);
    }
    leases
}

/// Dispatches orders `range` through `runtime`; returns the event message ids they send.
async fn place_orders(runtime: &Runtime, range: std::ops::Range<usize>) -> BTreeSet<String> {
    let mut events = BTreeSet::new();
    for i in range {
        let order_id = format!("order-{i}");
        let message_id = format!("{order_id}:place");
        runtime
            .dispatch(
                PlaceOrder {
                    order_id: order_id.clone(),
                },
                message_id.clone(),
            )
            .await
            .unwrap();
        events.insert(event_id(&message_id));
    }
    events
}

/// How many of orders `range`'s outbox documents are stamped delivered with the default ttl;
/// panics on any other stamp.
async fn delivered_count(orders: &ContainerClient, range: std::ops::Range<usize>) -> usize {
    let mut delivered = 0;
    for i in range {
        let order_id = format!("order-{i}");
        let doc = outbox_document(
            orders,
            &[json!(order_id)],
            &event_id(&format!("{order_id}:place")),
        )
        .await;
        match doc["status"].as_str() {
            Some("pending") => {}
            Some("delivered") => {
                assert_eq!(doc["ttl"], json!(86400), "{doc}");
                delivered += 1;
            }
            _ => panic!("unexpected outbox document state: {doc}"),
        }
    }
    delivered
}

async fn all_published_and_delivered(
    cluster: &Cluster,
    events: &BTreeSet<String>,
    orders: std::ops::Range<usize>,
) {
    eventually(
        WAIT,
        POLL,
        "every outbox message was published at least once",
        || async { cluster.received.ids().is_superset(events) },
    )
    .await;
    let total = orders.len();
    eventually(
        WAIT,
        POLL,
        "every outbox document is stamped delivered",
        || {
            let orders = orders.clone();
            async move { delivered_count(&cluster.orders, orders).await == total }
        },
    )
    .await;
}

/// Runs the whole scenario with `instances` runtimes.
async fn runtimes_share_the_relay_work(instances: usize) {
    let mut cluster = cluster(instances).await;
    let ranges = feed_ranges(&cluster.orders).await;
    assert!(
        ranges.len() >= instances,
        "the emulator gives the container at least one feed range per instance: {ranges:?}"
    );
    eventually(
        WAIT,
        POLL,
        "the leases are split between every runtime",
        || async { balanced(&cluster.runtimes, &ranges).await },
    )
    .await;

    // 40 commands through one runtime; every runtime relays the ranges it owns.
    let events = place_orders(&cluster.runtimes[0], 0..40).await;
    all_published_and_delivered(&cluster, &events, 0..40).await;
    eventually(
        WAIT,
        POLL,
        "the leases are still split after draining",
        || async { balanced(&cluster.runtimes, &ranges).await },
    )
    .await;

    // Stop the runtime the commands went through: it releases its leases and the others take
    // them over within the wait, so well within the lease expiry.
    let stopped = cluster.runtimes.remove(0);
    let handed_over = leases_of(&stopped).await;
    assert!(!handed_over.is_empty());
    stopped.shutdown().await;
    eventually(
        WAIT,
        POLL,
        "the stopped runtime's leases are drained by the others",
        || async {
            let owned: BTreeSet<String> = describe(&cluster.runtimes)
                .await
                .into_iter()
                .flatten()
                .collect();
            balanced(&cluster.runtimes, &ranges).await
                && handed_over.iter().all(|l| owned.contains(l))
        },
    )
    .await;

    // Documents written after the hand-over are still published, through every range.
    let later = place_orders(&cluster.runtimes[0], 40..60).await;
    all_published_and_delivered(&cluster, &later, 40..60).await;
    assert!(
        cluster.received.ids().is_superset(&events),
        "nothing published earlier went missing"
    );
    for runtime in cluster.runtimes {
        runtime.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_runtimes_split_the_leases_publish_every_outbox_message_and_hand_over_on_shutdown() {
    runtimes_share_the_relay_work(2).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_runtimes_split_the_leases_publish_every_outbox_message_and_hand_over_on_shutdown() {
    runtimes_share_the_relay_work(3).await;
}
