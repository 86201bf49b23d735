//! A broker refusal that an operator can lift never gives a good document up. Through the
//! machine's RabbitMQ: the destination queue was declared non-durable earlier by another service
//! (406 PRECONDITION_FAILED on the relay's declaration), or the relay's user may not configure
//! queues (403 ACCESS_REFUSED). Either way the documents stay `pending`, the lease shows as
//! blocked in `Runtime::health` with the destination, the broker's reply and the fix, one Error
//! is logged, and once the operator fixes the broker the documents are delivered without a
//! restart.
#![cfg(feature = "rabbitmq")]

use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use chatter_emulator::RunningEmulator;
use chatter_runtime::Runtime;
use chatter_runtime::broker::RabbitMqBroker;
use chatter_runtime::cosmos::ContainerClient;
use chatter_tests::broker::Received;
use chatter_tests::logs::capture;
use chatter_tests::rabbitmq;
use chatter_tests::relay::fast_relay;
use chatter_tests::store::{emulator_server, outbox_document, provisioned_with_leases};
use chatter_tests::wait::eventually;
use lapin::options::{QueueDeclareOptions, QueueDeleteOptions};
use lapin::types::{FieldTable, ShortString};
use serde_json::json;
use tracing::Level;

const WAIT: Duration = Duration::from_secs(60);
const POLL: Duration = Duration::from_millis(50);
const ORDERS: usize = 3;

chatter_tests::event_command! {
    /// Ships an order; its handler sends `OrderShipped` to the queue the command names.
    ShipOrder { order_id as "orderId" }
    on ("refusal", "shipments", "shipments-leases") at "/orderId",
    handled by ship_order, sends "OrderShipped" to events
}

fn unique(what: &str) -> String {
    format!(
        "chatter-test-refusal-{what}-{}",
        uuid::Uuid::new_v4().simple()
    )
}

/// A runtime relaying through `broker`, with `ORDERS` orders dispatched whose events go to
/// `events`: the store (kept alive by the caller), the runtime and the monitored container.
async fn relaying(
    broker: RabbitMqBroker,
    events: &str,
) -> (RunningEmulator, Runtime, Arc<ContainerClient>) {
    let (emulator, cosmos) = emulator_server().await;
    let shipments = provisioned_with_leases(
        &cosmos,
        "refusal",
        "shipments",
        &["/orderId"],
        "shipments-leases",
    )
    .await;
    let runtime = Runtime::builder()
        .cosmos(cosmos)
        .broker(broker)
        .consume(false)
        .relay_options(fast_relay(Duration::from_secs(10)).max_backoff(Duration::from_millis(500)))
        .start()
        .await
        .unwrap();
    for n in 0..ORDERS {
        let command = ShipOrder {
            order_id: format!("o-{n}"),
            events: events.to_owned(),
        };
        runtime
            .dispatch(command, &format!("ship-{n}"))
            .await
            .unwrap();
    }
    (emulator, runtime, shipments)
}

async fn statuses(shipments: &ContainerClient) -> Vec<String> {
    let mut statuses = Vec::new();
    for n in 0..ORDERS {
        let key = json!(format!("o-{n}"));
        let doc = outbox_document(shipments, &[key], &format!("ship-{n}:OrderShipped")).await;
        statuses.push(doc["status"].as_str().unwrap_or_default().to_owned());
    }
    statuses
}

/// Waits until the lease shows as blocked, checks that nothing was given up meanwhile and what
/// health and the log say; returns the blocked reason.
async fn blocked(
    runtime: &Runtime,
    shipments: &ContainerClient,
    logs: &chatter_tests::logs::Captured,
) -> String {
    eventually(WAIT, POLL, "the lease shows as blocked", || async {
        runtime
            .health()
            .await
            .leases
            .iter()
            .any(|l| l.blocked.is_some())
    })
    .await;
    // Several refused pages later, the documents are still pending.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(statuses(shipments).await, ["pending"; ORDERS]);
    let health = runtime.health().await;
    assert!(!health.is_healthy(), "{health:?}");
    let reason = health
        .leases
        .iter()
        .find_map(|l| l.blocked.clone())
        .expect("still blocked");
    let refusals = logs.matching(Level::ERROR, "cannot publish the pending Outbox Documents");
    assert_eq!(
        refusals.len(),
        1,
        "logged once, when the block started: {refusals:?}"
    );
    assert!(
        logs.matching(Level::ERROR, "marked an Outbox Document undeliverable")
            .is_empty(),
        "nothing was given up"
    );
    assert!(
        !logs
            .entries()
            .iter()
            .any(|e| e.message.contains("own persisted fields prove")
                || e.fields
                    .values()
                    .any(|v| v.contains("own persisted fields prove"))),
        "no log claims the document proves anything"
    );
    reason
}

/// Waits until every document is delivered and its event arrived.
async fn delivered(shipments: &ContainerClient, received: &Received, runtime: &Runtime) {
    eventually(WAIT, POLL, "every document is delivered", || async {
        statuses(shipments).await == ["delivered"; ORDERS]
    })
    .await;
    eventually(WAIT, POLL, "every event arrived", || {
        let done = (0..ORDERS).all(|n| received.count(&format!("ship-{n}:OrderShipped")) >= 1);
        async move { done }
    })
    .await;
    eventually(WAIT, POLL, "the lease is no longer blocked", || async {
        runtime.health().await.is_healthy()
    })
    .await;
}

#[tokio::test]
async fn a_queue_another_service_declared_otherwise_blocks_the_lease_until_it_is_fixed() {
    let (logs, _guard) = capture();
    let events = unique("events");
    // Another service declared the queue first, non-durable: RabbitMQ refuses chatter's durable
    // declaration with 406 PRECONDITION_FAILED.
    let foreign = rabbitmq::foreign_channel(WAIT).await;
    let non_durable = QueueDeclareOptions {
        durable: false,
        ..QueueDeclareOptions::default()
    };
    foreign
        .queue_declare(
            ShortString::from(events.as_str()),
            non_durable,
            FieldTable::default(),
        )
        .await
        .unwrap();
    let broker = rabbitmq::connect(WAIT).await;
    let (_store, runtime, shipments) = relaying(broker.clone(), &events).await;

    let reason = blocked(&runtime, &shipments, &logs).await;
    assert!(
        reason.contains(&events)
            && reason.contains("PRECONDITION_FAILED")
            && reason.contains("delete it or declare it so"),
        "the reason names the destination, the reply and the fix: {reason}"
    );

    // The operator deletes the conflicting queue: the relay declares its own and delivers.
    foreign
        .queue_delete(
            ShortString::from(events.as_str()),
            QueueDeleteOptions::default(),
        )
        .await
        .unwrap();
    let received = Received::consume(rabbitmq::subscribe(&broker, &events, WAIT).await);
    delivered(&shipments, &received, &runtime).await;
    assert_eq!(
        logs.matching(Level::INFO, "publishes lease").len(),
        1,
        "the end of the block is logged"
    );
    runtime.shutdown().await;
    rabbitmq::delete_queue(&broker, &events, WAIT).await;
}

/// `rabbitmqctl` with `args`; panics naming them if it fails.
fn rabbitmqctl(args: &[&str]) {
    let output = Command::new("rabbitmqctl")
        .args(args)
        .output()
        .expect("rabbitmqctl is on the PATH with the RabbitMQ server");
    assert!(
        output.status.success(),
        "rabbitmqctl {args:?}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
}

#[tokio::test]
async fn a_user_without_the_configure_permission_blocks_the_lease_until_it_is_granted() {
    let (logs, _guard) = capture();
    let events = unique("events");
    // A user of this test's own that may read and write but not configure (declare) queues.
    let user = unique("user");
    rabbitmqctl(&["add_user", &user, "secret"]);
    rabbitmqctl(&["set_permissions", "-p", "/", &user, "^$", ".*", ".*"]);
    let uri = format!("amqp://{user}:secret@127.0.0.1:5672/%2f");
    let broker = RabbitMqBroker::connect(&uri).await.unwrap();
    let (_store, runtime, shipments) = relaying(broker, &events).await;

    let reason = blocked(&runtime, &shipments, &logs).await;
    assert!(
        reason.contains(&events)
            && reason.contains("ACCESS_REFUSED")
            && reason.contains("grant the broker user"),
        "the reason names the destination, the reply and the fix: {reason}"
    );

    // The operator grants the permission: the documents are delivered without a restart.
    rabbitmqctl(&["set_permissions", "-p", "/", &user, ".*", ".*", ".*"]);
    let direct = rabbitmq::connect(WAIT).await;
    let received = Received::consume(rabbitmq::subscribe(&direct, &events, WAIT).await);
    delivered(&shipments, &received, &runtime).await;
    runtime.shutdown().await;
    rabbitmq::delete_queue(&direct, &events, WAIT).await;
    rabbitmqctl(&["delete_user", &user]);
}
