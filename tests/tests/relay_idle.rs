//! Waiting for the relay to catch up (`Runtime::relay_idle`, and the drain `Runtime::shutdown`
//! gives it): the pending Outbox Documents are counted with a query over every container the
//! relay drains, and not while this process's relay has documents in flight (they are pending
//! until their stamps land, so such a count could not come back zero).
//!
//! The queries are counted by the `chatter-emulator` server the runtime talks to over HTTP.

use std::sync::Arc;
use std::time::Duration;

use chatter_emulator::RunningEmulator;
use chatter_runtime::broker::InMemoryBroker;
use chatter_runtime::{Runtime, error::RelayNotIdle};
use chatter_tests::broker::Intercepted;
use chatter_tests::relay::fast_relay;
use chatter_tests::runtime::seed;
use chatter_tests::store::{emulator_server, provisioned_with_leases};
use tokio::sync::Notify;

const DB: &str = "relay-idle";
const CONTAINER: &str = "orders";
const DOCS: &str = "dbs/relay-idle/colls/orders/docs";
/// How late the broker confirms every publish: the documents stay in flight that long.
const HOLD: Duration = Duration::from_millis(1500);
const WAIT: Duration = Duration::from_secs(30);

chatter_tests::event_command! {
    /// Places an order and emits one event.
    PlaceWatchedOrder { order_id as "orderId" }
    on ("relay-idle", "orders", "orders-leases") at "/orderId",
    handled by place, sends "placed" to "order-events"
}

/// A served store with a chain of three pending documents, and a relay whose every publish is
/// confirmed `HOLD` late, once its first publish started.
async fn relay_holding_confirms() -> (RunningEmulator, Runtime) {
    let (emulator, cosmos) = emulator_server().await;
    provisioned_with_leases(&cosmos, DB, CONTAINER, &["/orderId"], "orders-leases").await;
    // One order: its three events are one chain on one lease, so from the first publish to the
    // last stamp some document is always in flight.
    let commands = (0..3).map(|n| {
        let order = PlaceWatchedOrder {
            order_id: "o-1".to_owned(),
        };
        (order, format!("cmd-{n}"))
    });
    seed(&cosmos, commands).await.unwrap();
    // Test double (a slow confirm at a known moment, which no real broker gives on demand):
    // every publish is confirmed `HOLD` late, and the first one says it started.
    let publishing = Arc::new(Notify::new());
    let broker = Intercepted::new(InMemoryBroker::new(), {
        let publishing = publishing.clone();
        move |_| {
            publishing.notify_one();
            Box::pin(async {
                tokio::time::sleep(HOLD).await;
                None
            })
        }
    });
    let relay = Runtime::builder()
        .cosmos(cosmos.clone())
        .broker(broker)
        .consume(false)
        .relay_options(fast_relay(Duration::from_secs(5)))
        .start()
        .await
        .unwrap();
    tokio::time::timeout(WAIT, publishing.notified())
        .await
        .expect("the relay publishes");
    (emulator, relay)
}

#[tokio::test]
async fn pending_documents_are_not_counted_while_the_relay_has_documents_in_flight() {
    let (emulator, relay) = relay_holding_confirms().await;
    let queries_before = emulator.feed_request_count("POST", DOCS);

    relay.relay_idle(WAIT).await.unwrap();

    let requests = emulator.feed_request_count("POST", DOCS) - queries_before;
    // What one count asks (a query per physical partition): the relay is idle now.
    let before = emulator.feed_request_count("POST", DOCS);
    relay.relay_idle(WAIT).await.unwrap();
    let per_count = emulator.feed_request_count("POST", DOCS) - before;
    assert!(per_count > 0, "a count is a query");
    // One count once the stamps landed (two if the first came between a stamp and the relay
    // letting go of its document); a count every 100 ms while the confirms were held would be
    // about fifteen.
    let counts = requests as f64 / per_count as f64;
    assert!(
        (1.0..=2.0).contains(&counts),
        "{counts} counts of the pending documents ({requests} query requests, {per_count} a count)"
    );
    relay.shutdown().await;
}

#[tokio::test]
async fn a_wait_that_ends_with_documents_in_flight_counts_them_still_pending() {
    let (_emulator, relay) = relay_holding_confirms().await;

    // Shorter than the chain's three held confirms: documents are still in flight at its end.
    let error = relay.relay_idle(Duration::from_secs(3)).await.unwrap_err();

    // Counted, not cut short: the chain's first confirm may have landed by then.
    assert!(
        matches!(error, RelayNotIdle::StillPending { pending: 1..=3, .. }),
        "{error}"
    );
    relay.shutdown().await;
}
