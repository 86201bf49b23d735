//! A relay process killed between the broker's confirm and the delivered stamp loses nothing:
//! the document stays pending, and a restarted relay takes the dead instance's lease once it
//! expires, publishes the message again and stamps the document delivered.
//!
//! Real parts: a `chatter-emulator` server in this process (port 0) is the store both
//! processes share, RabbitMQ at 127.0.0.1:5672 (guest/guest; `rabbitmq-server -detached`) is
//! the broker, and `relay_worker` (`tests/src/bin/relay_worker.rs`) is the relay process. Its
//! `CHATTER_TEST_HANG_AFTER_PUBLISH` mode is the one test double: it makes the process stop
//! exactly after the confirm, which no real part can do at that moment.
//!
//! No timed assertions: every wait is bounded with a generous timeout. Every spawned worker is
//! killed when its guard drops, also when the test fails.
#![cfg(feature = "rabbitmq")]

use std::process::{Command, Stdio};
use std::time::Duration;

use chatter_tests::broker::Received;
use chatter_tests::process::ChildProcess;
use chatter_tests::rabbitmq::{self, URI};
use chatter_tests::runtime::writer;
use chatter_tests::store::{emulator_server, outbox_document, provisioned_with_leases};
use serde_json::json;

const DB: &str = "relay-kill";
const CONTAINER: &str = "orders";
const LEASES: &str = "orders-leases";
/// The workers' lease expiry: the restarted worker takes the killed one's lease after it.
const LEASE_EXPIRY_MS: &str = "3000";
/// Generous bound for anything that should happen "soon" on a noisy shared machine (a worker
/// start included).
const WAIT: Duration = Duration::from_secs(120);

// The same `PlaceOrder` as `relay_worker`, so both register the same monitored container.
include!("../src/relay_commands/place_order.rs");

/// Starts a `relay_worker` on the store at `endpoint`; it is killed when the guard drops.
fn spawn_worker(endpoint: &str, hang_after_publish: bool) -> ChildProcess {
    let mut command = Command::new(env!("CARGO_BIN_EXE_relay_worker"));
    command
        .env("CHATTER_COSMOS_ENDPOINT", endpoint)
        .env("CHATTER_RABBITMQ_URI", URI)
        .env("CHATTER_TEST_LEASE_EXPIRY_MS", LEASE_EXPIRY_MS)
        .env_remove("CHATTER_COSMOS_KEY")
        .stdin(Stdio::piped())
        .stderr(Stdio::inherit());
    if hang_after_publish {
        command.env("CHATTER_TEST_HANG_AFTER_PUBLISH", "1");
    } else {
        command.env_remove("CHATTER_TEST_HANG_AFTER_PUBLISH");
    }
    ChildProcess::spawn("relay_worker", &mut command)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relay_killed_after_publishing_and_before_stamping_is_republished_by_its_successor() {
    let (emulator, cosmos) = emulator_server().await;
    let orders = provisioned_with_leases(&cosmos, DB, CONTAINER, &["/orderId"], LEASES).await;

    let broker = rabbitmq::connect(WAIT).await;
    let queue = format!("chatter-test-relay-kill-{}", uuid::Uuid::new_v4());
    // Every message id delivered on the queue, with how often (each delivery is acked).
    let deliveries = Received::consume(rabbitmq::subscribe(&broker, &queue, WAIT).await);

    // The outbox document, written by a process that does not relay.
    let writer = writer(&cosmos, broker.clone()).await;
    let order_id = "order-1";
    let command_id = format!("{order_id}:place");
    let event_id = format!("{command_id}:OrderPlaced");
    writer
        .dispatch(
            PlaceOrder {
                order_id: order_id.into(),
                events: queue.clone(),
            },
            command_id,
        )
        .await
        .unwrap();
    assert_eq!(
        outbox_document(&orders, &[json!(order_id)], &event_id).await["status"],
        "pending"
    );

    // The first relay publishes (RabbitMQ confirmed it) and dies before stamping.
    let mut first = spawn_worker(emulator.endpoint(), true);
    let published = first.line_starting_with("published ", WAIT).await;
    assert_eq!(published, format!("published {event_id}"));
    first.kill();
    let doc = outbox_document(&orders, &[json!(order_id)], &event_id).await;
    assert_eq!(
        doc["status"], "pending",
        "a relay killed before stamping leaves the document pending: {doc}"
    );
    assert!(doc.get("ttl").is_none(), "{doc}");

    // Its successor takes the expired lease, publishes again and stamps.
    let mut second = spawn_worker(emulator.endpoint(), false);
    second.line_starting_with("started", WAIT).await;
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let doc = outbox_document(&orders, &[json!(order_id)], &event_id).await;
        if doc["status"] == "delivered" && deliveries.count(&event_id) >= 2 {
            assert_eq!(doc["ttl"], json!(86400), "{doc}");
            break;
        }
        assert_eq!(doc["status"], "pending", "{doc}");
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out after {WAIT:?}: the message arrived {} times and the document is {doc}",
            deliveries.count(&event_id)
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        deliveries.count(&event_id) >= 2,
        "the message was published before the kill and again after the restart"
    );

    drop(second);
    writer.shutdown().await;
    rabbitmq::delete_queue(&broker, &queue, WAIT).await;
}
