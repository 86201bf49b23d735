//! A relay over a monitored container and a lease container of more than 100 physical
//! partitions (the SDK's default cross-partition fan-out) starts, drains and stops gracefully.
//! The SDK refused its lease query at start (moving unscoped leases) and its idle count with
//! 400/20118 ClientCrossPartitionFanOutExceeded.
//!
//! The store is the SDK's in-memory emulator served by `chatter-emulator` in this process (its
//! store creates containers with as many partitions as asked). No timed assertions: every wait
//! is bounded by a generous timeout.

use std::time::Duration;

use chatter_runtime::Runtime;
use chatter_runtime::broker::InMemoryBroker;
use chatter_runtime::relay::RelayOptions;
use chatter_tests::broker::Received;
use chatter_tests::relay::owning;
use chatter_tests::store::emulator_server;
use chatter_tests::wait::eventually;

const DB: &str = "wide";
const EVENTS: &str = "order-events";
const COMMANDS: usize = 200;
/// Generous bound for anything the relay should do "soon" on a noisy shared machine.
const WAIT: Duration = Duration::from_secs(120);

chatter_tests::event_command! {
    /// Places an order: writes the order and sends one `OrderPlaced` event through the outbox.
    PlaceOrder { order_id as "orderId" }
    on ("wide", "orders", "orders-leases") at "/orderId",
    handled by place_order, sends "OrderPlaced" to EVENTS
}

/// A runtime relaying `DB/orders` of `partitions` partitions (its lease container as many),
/// publish after commit off so the relay publishes every event: it owns every lease, relays
/// [`COMMANDS`] commands' events, is idle, and shuts down.
async fn relays_and_stops(partitions: u32) {
    let (emulator, cosmos) = emulator_server().await;
    emulator
        .create_partitioned(
            DB,
            &[
                ("orders", &["/orderId"], partitions),
                ("orders-leases", &["/id"], partitions),
            ],
        )
        .unwrap();
    let broker = InMemoryBroker::new();
    let received = Received::on(&broker, EVENTS).await;
    let runtime = Runtime::builder()
        .cosmos(cosmos)
        .broker(broker)
        .consume(false)
        .relay_options(RelayOptions::default().poll_interval(Duration::from_millis(500)))
        .publish_after_commit(false)
        .without_metrics()
        .without_tracing()
        .start()
        .await
        .expect("the relay starts over a container past 100 partitions");
    tokio::time::timeout(WAIT, owning(&runtime, partitions as usize))
        .await
        .expect("the relay owns every lease");
    for n in 0..COMMANDS {
        let command = PlaceOrder {
            order_id: format!("order-{n}"),
        };
        runtime.dispatch(command, format!("m-{n}")).await.unwrap();
    }
    eventually(WAIT, Duration::from_millis(100), "every event", || {
        let received = received.clone();
        async move { received.distinct() == COMMANDS }
    })
    .await;
    runtime
        .relay_idle(WAIT)
        .await
        .expect("the relay is idle: nothing pending in any partition");
    tokio::time::timeout(WAIT, runtime.shutdown())
        .await
        .expect("the runtime shuts down");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_relay_over_128_partitions_starts_drains_and_stops() {
    relays_and_stops(128).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_relay_over_256_partitions_starts_drains_and_stops() {
    relays_and_stops(256).await;
}
