//! The in-memory broker's delivery semantics: verbatim delivery, ack, nack and drop redelivery,
//! competing consumers, and messages that wait for their first subscriber.

use std::sync::Arc;
use std::time::Duration;

use chatter_runtime::BrokeredMessage;
use chatter_runtime::broker::{Broker, BrokerError, Delivery, InMemoryBroker, Subscription};
use chatter_tests::broker::{assert_quiet_for, next_delivery};
use serde_json::json;
use tokio::time::timeout;

/// Long enough for any delivery that is coming; bounds every wait so no test hangs.
const DELIVERY_WAIT: Duration = Duration::from_secs(5);
/// How long "no further delivery" is watched for.
const QUIET_WAIT: Duration = Duration::from_millis(200);

fn message(id: &str, destination: &str) -> BrokeredMessage {
    let mut message = BrokeredMessage::json(id, destination, format!(r#"{{"id":"{id}"}}"#));
    message
        .context
        .insert("traceparent".into(), json!("00-abc-def-01"));
    message
        .context
        .insert("nested".into(), json!({ "n": 1, "list": [true, null] }));
    message
}

async fn next(subscription: &mut Subscription) -> Delivery {
    next_delivery(subscription, DELIVERY_WAIT).await
}

async fn assert_quiet(subscription: &mut Subscription) {
    assert_quiet_for(subscription, QUIET_WAIT).await;
}

#[tokio::test]
async fn publish_then_subscribe_receives_the_message_verbatim() {
    let broker = InMemoryBroker::new();
    let sent = message("m-1", "orders");
    broker.publish(sent.clone()).await.unwrap();

    let mut subscription = broker.subscribe("orders").await.unwrap();
    assert_eq!(subscription.destination(), "orders");
    let delivery = next(&mut subscription).await;
    assert_eq!(delivery.message, sent);
    assert!(!delivery.redelivered);
    delivery.ack().await.unwrap();
}

#[tokio::test]
async fn nack_redelivers_with_redelivered_true() {
    let broker = InMemoryBroker::new();
    let mut subscription = broker.subscribe("orders").await.unwrap();
    let sent = message("m-1", "orders");
    broker.publish(sent.clone()).await.unwrap();

    let first = next(&mut subscription).await;
    assert!(!first.redelivered);
    first.nack().await.unwrap();

    let again = next(&mut subscription).await;
    assert!(again.redelivered);
    assert_eq!(again.message, sent);
    again.ack().await.unwrap();
    assert_eq!(broker.pending_count("orders"), 0);
}

#[tokio::test]
async fn dropping_an_unsettled_delivery_redelivers_it() {
    let broker = InMemoryBroker::new();
    let mut subscription = broker.subscribe("orders").await.unwrap();
    let sent = message("m-1", "orders");
    broker.publish(sent.clone()).await.unwrap();

    drop(next(&mut subscription).await);

    let again = next(&mut subscription).await;
    assert!(again.redelivered);
    assert_eq!(again.message, sent);
    again.ack().await.unwrap();
}

#[tokio::test]
async fn a_delivery_dropped_by_a_panicking_handler_is_redelivered() {
    let broker = InMemoryBroker::new();
    let mut subscription = broker.subscribe("orders").await.unwrap();
    broker.publish(message("m-1", "orders")).await.unwrap();

    let delivery = next(&mut subscription).await;
    let handler = tokio::spawn(async move {
        let _held = delivery;
        panic!("handler failed");
    });
    assert!(handler.await.unwrap_err().is_panic());

    let again = next(&mut subscription).await;
    assert!(again.redelivered);
    again.ack().await.unwrap();
}

#[tokio::test]
async fn ack_removes_the_message_for_good() {
    let broker = InMemoryBroker::new();
    let mut subscription = broker.subscribe("orders").await.unwrap();
    broker.publish(message("m-1", "orders")).await.unwrap();

    next(&mut subscription).await.ack().await.unwrap();

    assert_quiet(&mut subscription).await;
    let mut late = broker.subscribe("orders").await.unwrap();
    assert_quiet(&mut late).await;
    assert_eq!(broker.pending_count("orders"), 0);
    assert_eq!(broker.published_count("orders"), 1);
}

#[tokio::test]
async fn two_competing_consumers_each_get_distinct_messages() {
    let broker = InMemoryBroker::new();
    let mut first = broker.subscribe("orders").await.unwrap();
    let mut second = broker.subscribe("orders").await.unwrap();
    broker.publish(message("m-1", "orders")).await.unwrap();
    broker.publish(message("m-2", "orders")).await.unwrap();

    let a = next(&mut first).await;
    let b = next(&mut second).await;
    assert_ne!(a.message.message_id, b.message.message_id);
    let mut ids = [a.message.message_id.clone(), b.message.message_id.clone()];
    ids.sort();
    assert_eq!(ids, ["m-1", "m-2"]);
    assert!(!a.redelivered && !b.redelivered);
    a.ack().await.unwrap();
    b.ack().await.unwrap();

    assert_quiet(&mut first).await;
    assert_quiet(&mut second).await;
}

#[tokio::test]
async fn competing_consumers_waiting_concurrently_share_all_messages_exactly_once() {
    let broker = InMemoryBroker::new();
    let mut consumers = Vec::new();
    for _ in 0..3 {
        let mut subscription = broker.subscribe("orders").await.unwrap();
        consumers.push(tokio::spawn(async move {
            let mut ids = Vec::new();
            while let Ok(Some(item)) = timeout(QUIET_WAIT, subscription.next()).await {
                let delivery = item.unwrap();
                ids.push(delivery.message.message_id.clone());
                delivery.ack().await.unwrap();
            }
            ids
        }));
    }
    for i in 0..30 {
        broker
            .publish(message(&format!("m-{i}"), "orders"))
            .await
            .unwrap();
    }

    let mut received = Vec::new();
    for consumer in consumers {
        received.extend(timeout(DELIVERY_WAIT, consumer).await.unwrap().unwrap());
    }
    received.sort();
    let mut expected: Vec<String> = (0..30).map(|i| format!("m-{i}")).collect();
    expected.sort();
    assert_eq!(received, expected);
}

#[tokio::test]
async fn messages_published_before_subscribe_are_delivered_in_order() {
    let broker = InMemoryBroker::new();
    for i in 0..3 {
        broker
            .publish(message(&format!("m-{i}"), "orders"))
            .await
            .unwrap();
    }
    assert_eq!(broker.pending_count("orders"), 3);

    let mut subscription = broker.subscribe("orders").await.unwrap();
    for i in 0..3 {
        let delivery = next(&mut subscription).await;
        assert_eq!(delivery.message.message_id, format!("m-{i}"));
        delivery.ack().await.unwrap();
    }
}

#[tokio::test]
async fn destinations_are_separate_queues() {
    let broker = InMemoryBroker::new();
    let mut invoices = broker.subscribe("invoices").await.unwrap();
    broker.publish(message("m-1", "orders")).await.unwrap();

    assert_quiet(&mut invoices).await;
    assert_eq!(broker.pending_count("orders"), 1);
}

#[tokio::test]
async fn clones_and_arc_dyn_broker_share_the_same_queues() {
    let broker = InMemoryBroker::new();
    let shared: Arc<dyn Broker> = Arc::new(broker.clone());
    shared.publish(message("m-1", "orders")).await.unwrap();

    let mut subscription = broker.clone().subscribe("orders").await.unwrap();
    next(&mut subscription).await.ack().await.unwrap();
    assert_eq!(broker.published_count("orders"), 1);
}

#[tokio::test]
async fn an_empty_destination_is_an_error_not_a_panic() {
    let broker = InMemoryBroker::new();
    let error = broker.publish(message("m-1", "")).await.unwrap_err();
    assert!(
        matches!(error, BrokerError::InvalidDestination { .. }),
        "{error}"
    );
    let error = broker.subscribe("").await.unwrap_err();
    assert!(
        matches!(error, BrokerError::InvalidDestination { .. }),
        "{error}"
    );
}

// Deliveries returned together (a consumer's key lane dropped at shutdown returns them in
// order, each pushed back as it drops) come back in the order they were published.
#[tokio::test]
async fn deliveries_returned_together_come_back_in_publish_order() {
    let broker = InMemoryBroker::new();
    let mut subscription = broker.subscribe("orders").await.unwrap();
    for n in 1..=5 {
        broker
            .publish(message(&format!("d{n}"), "orders"))
            .await
            .unwrap();
    }
    let d1 = next(&mut subscription).await;
    let mut held = Vec::new();
    for _ in 2..=4 {
        held.push(next(&mut subscription).await);
    }
    // d2, d3, d4 returned in that order (and d1 after them, nacked), d5 not yet taken.
    for delivery in held {
        drop(delivery);
    }
    d1.nack().await.unwrap();
    let mut again = Vec::new();
    for _ in 1..=5 {
        let delivery = next(&mut subscription).await;
        again.push((delivery.message.message_id.clone(), delivery.redelivered));
        delivery.ack().await.unwrap();
    }
    assert_eq!(
        again,
        [
            ("d1".to_owned(), true),
            ("d2".to_owned(), true),
            ("d3".to_owned(), true),
            ("d4".to_owned(), true),
            ("d5".to_owned(), false),
        ]
    );
}
