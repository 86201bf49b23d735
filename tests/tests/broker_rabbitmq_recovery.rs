//! The RabbitMQ broker recovers by itself from a real network fault: a TCP proxy in front of the
//! machine's RabbitMQ drops every connection and refuses new ones for a few seconds (the shared
//! server itself is never touched, so other tests keep their broker).
#![cfg(feature = "rabbitmq")]

use std::time::Duration;

use chatter_runtime::BrokeredMessage;
use chatter_runtime::broker::{Broker, BrokerError, RabbitMqBroker};
use chatter_tests::broker::next_delivery;
use chatter_tests::logs::capture_process;
use chatter_tests::proxy::TcpProxy;
use chatter_tests::rabbitmq;
use chatter_tests::wait::eventually;
use tokio::time::timeout;
use tracing::Level;

const WAIT: Duration = Duration::from_secs(30);
const OUTAGE: Duration = Duration::from_secs(3);

fn queue() -> String {
    format!("chatter-test-recovery-{}", uuid::Uuid::new_v4().simple())
}

async fn through_proxy() -> (TcpProxy, RabbitMqBroker) {
    let proxy = TcpProxy::start(rabbitmq::server_addr()).await;
    let broker = timeout(
        WAIT,
        RabbitMqBroker::connect(&rabbitmq::uri_through(&proxy)),
    )
    .await
    .expect("connects in time")
    .expect("RabbitMQ runs at 127.0.0.1:5672");
    (proxy, broker)
}

async fn cleanup(queue: &str) {
    let direct = rabbitmq::connect(WAIT).await;
    rabbitmq::delete_queue(&direct, queue, WAIT).await;
}

#[tokio::test]
async fn a_publish_during_an_outage_waits_for_the_connection_and_is_confirmed() {
    // Process-wide: the outage's log is not tied to this thread's subscriber (a thread-local
    // capture missed it in two cold CI runs); this broker's own entries carry its proxy's port.
    let logs = capture_process();
    let (proxy, broker) = through_proxy().await;
    let this_broker = proxy.addr().to_string();
    let destination = queue();
    broker
        .publish(BrokeredMessage::json("before", &destination, "{}"))
        .await
        .unwrap();
    proxy.cut_for(OUTAGE);
    eventually(
        WAIT,
        Duration::from_millis(20),
        "the client saw the drop",
        || {
            let down = !broker.is_connected();
            async move { down }
        },
    )
    .await;
    timeout(
        WAIT,
        broker.publish(BrokeredMessage::json("during", &destination, "{}")),
    )
    .await
    .expect("the publish returns within its bound")
    .expect("confirmed once the connection is back");
    assert!(broker.is_connected());
    // The outage is logged at Error when it starts.
    assert!(
        logs.matching(Level::ERROR, "RabbitMQ connection lost")
            .iter()
            .any(|entry| entry
                .field("uri")
                .is_some_and(|uri| uri.contains(&this_broker))),
        "the outage of {this_broker} is logged at Error; chatter's RabbitMQ errors: {:?}",
        logs.matching(Level::ERROR, "RabbitMQ")
    );
    let mut subscription = broker.subscribe(&destination).await.unwrap();
    for id in ["before", "during"] {
        let delivery = next_delivery(&mut subscription, WAIT).await;
        assert_eq!(delivery.message.message_id, id);
        delivery.ack().await.unwrap();
    }
    drop(subscription);
    cleanup(&destination).await;
}

#[tokio::test]
async fn a_publish_past_its_timeout_fails_as_a_transient_timeout() {
    let (proxy, broker) = through_proxy().await;
    let broker = broker.with_publish_timeout(Duration::from_millis(500));
    proxy.cut_for(Duration::from_secs(60));
    let error = broker
        .publish(BrokeredMessage::json("m", queue(), "{}"))
        .await
        .unwrap_err();
    assert!(matches!(error, BrokerError::Timeout { .. }), "{error}");
    assert!(
        !error.is_permanent(),
        "a timeout is retried, never a verdict"
    );
}

#[tokio::test]
async fn a_subscription_resumes_after_an_outage_and_the_unacked_delivery_comes_again() {
    let (proxy, broker) = through_proxy().await;
    let destination = queue();
    let direct = rabbitmq::connect(WAIT).await;
    let mut subscription = broker.subscribe(&destination).await.unwrap();
    let liveness = subscription.liveness().clone();
    direct
        .publish(BrokeredMessage::json("in-flight", &destination, "{}"))
        .await
        .unwrap();
    let unacked = next_delivery(&mut subscription, WAIT).await;
    assert!(!unacked.redelivered);

    proxy.cut_for(OUTAGE);
    // The next delivery is the in-flight one again, on the resumed subscription: the server
    // requeued it when the channel died.
    let again = next_delivery(&mut subscription, WAIT).await;
    assert_eq!(again.message.message_id, "in-flight");
    assert!(again.redelivered, "marked redelivered");
    assert!(liveness.is_live(), "consuming again");
    // Settling the old delivery cannot reach the channel it came from: never acked twice.
    let stale = unacked.ack().await.unwrap_err();
    assert!(
        matches!(
            stale,
            BrokerError::SettlementLost { .. } | BrokerError::Transport { .. }
        ),
        "{stale}"
    );
    again.ack().await.unwrap();

    // Messages published after the outage arrive without subscribing again.
    direct
        .publish(BrokeredMessage::json("after", &destination, "{}"))
        .await
        .unwrap();
    let after = next_delivery(&mut subscription, WAIT).await;
    assert_eq!(after.message.message_id, "after");
    after.ack().await.unwrap();
    drop(subscription);
    assert_eq!(
        rabbitmq::delete_queue(&direct, &destination, WAIT).await,
        0,
        "nothing left unacked"
    );
}
