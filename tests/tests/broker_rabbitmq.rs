//! The RabbitMQ broker against the real server at 127.0.0.1:5672 (guest/guest; start it with
//! `rabbitmq-server -detached`): the same delivery semantics as the in-memory broker, on a queue
//! of its own per test, deleted at the end.
#![cfg(feature = "rabbitmq")]

use std::time::Duration;

use chatter_runtime::BrokeredMessage;
use chatter_runtime::broker::{Broker, BrokerError, Delivery, RabbitMqBroker, Subscription};
use chatter_tests::broker::{assert_quiet_for, next_delivery};
use chatter_tests::rabbitmq;
use serde_json::json;
use tokio::time::timeout;

/// Long enough for any delivery that is coming; bounds every wait so no test hangs.
const DELIVERY_WAIT: Duration = Duration::from_secs(10);
/// How long "no further delivery" is watched for.
const QUIET_WAIT: Duration = Duration::from_millis(500);

async fn connect() -> RabbitMqBroker {
    rabbitmq::connect(DELIVERY_WAIT).await
}

fn queue() -> String {
    format!("chatter-test-{}", uuid::Uuid::new_v4())
}

fn message(id: &str, destination: &str) -> BrokeredMessage {
    let mut message = BrokeredMessage::json(id, destination, format!(r#"{{"id":"{id}"}}"#));
    message
        .context
        .insert("traceparent".into(), json!("00-abc-def-01"));
    message.context.insert(
        "nested".into(),
        json!({ "n": 1, "big": u64::MAX, "f": 1.5, "list": [true, null, "ü"] }),
    );
    message
}

async fn publish(broker: &RabbitMqBroker, message: BrokeredMessage) {
    timeout(DELIVERY_WAIT, broker.publish(message))
        .await
        .expect("the publisher confirm arrives in time")
        .expect("the broker confirms the message");
}

async fn subscribe(broker: &RabbitMqBroker, destination: &str) -> Subscription {
    rabbitmq::subscribe(broker, destination, DELIVERY_WAIT).await
}

async fn next(subscription: &mut Subscription) -> Delivery {
    next_delivery(subscription, DELIVERY_WAIT).await
}

async fn assert_quiet(subscription: &mut Subscription) {
    assert_quiet_for(subscription, QUIET_WAIT).await;
}

async fn settle(result: impl Future<Output = Result<(), BrokerError>>) {
    timeout(DELIVERY_WAIT, result)
        .await
        .expect("settling takes less than the bound")
        .expect("the broker takes the settlement");
}

/// Deletes the queue; returns how many messages were still in it.
async fn delete(broker: &RabbitMqBroker, destination: &str) -> u32 {
    rabbitmq::delete_queue(broker, destination, DELIVERY_WAIT).await
}

/// A fresh queue on `broker`, subscribed to, then the message `m-1` published to it: the
/// queue, the subscription and the message sent.
async fn subscribed_with_one_message(
    broker: &RabbitMqBroker,
) -> (String, Subscription, BrokeredMessage) {
    let destination = queue();
    let subscription = subscribe(broker, &destination).await;
    let sent = message("m-1", &destination);
    publish(broker, sent.clone()).await;
    (destination, subscription, sent)
}

/// The next delivery is `sent` again, marked redelivered; it is acked.
async fn redelivered(subscription: &mut Subscription, sent: &BrokeredMessage) {
    let again = next(subscription).await;
    assert!(again.redelivered);
    assert_eq!(again.message, *sent);
    settle(again.ack()).await;
}

/// Drops `subscriptions`, then deletes `destination`, which must be empty by then.
async fn delete_empty(broker: &RabbitMqBroker, destination: &str, subscriptions: impl Sized) {
    drop(subscriptions);
    assert_eq!(delete(broker, destination).await, 0);
}

#[tokio::test]
async fn rabbitmq_publish_then_subscribe_receives_the_message_verbatim() {
    let broker = connect().await;
    let destination = queue();
    let sent = message("m-1", &destination);
    publish(&broker, sent.clone()).await;

    let mut subscription = subscribe(&broker, &destination).await;
    let delivery = next(&mut subscription).await;
    assert_eq!(delivery.message, sent);
    assert!(!delivery.redelivered);
    settle(delivery.ack()).await;

    delete_empty(&broker, &destination, subscription).await;
}

#[tokio::test]
async fn rabbitmq_nack_redelivers_with_redelivered_true() {
    let broker = connect().await;
    let (destination, mut subscription, sent) = subscribed_with_one_message(&broker).await;

    let first = next(&mut subscription).await;
    assert!(!first.redelivered);
    settle(first.nack()).await;

    redelivered(&mut subscription, &sent).await;
    delete_empty(&broker, &destination, subscription).await;
}

#[tokio::test]
async fn rabbitmq_dropping_an_unsettled_delivery_redelivers_it() {
    let broker = connect().await;
    let (destination, mut subscription, sent) = subscribed_with_one_message(&broker).await;

    drop(next(&mut subscription).await);

    redelivered(&mut subscription, &sent).await;
    delete_empty(&broker, &destination, subscription).await;
}

#[tokio::test]
async fn rabbitmq_unsettled_deliveries_of_a_closed_connection_are_redelivered() {
    let destination = queue();
    let broker = connect().await;
    publish(&broker, message("m-1", &destination)).await;

    let gone = connect().await;
    let mut subscription = subscribe(&gone, &destination).await;
    let delivery = next(&mut subscription).await;
    timeout(DELIVERY_WAIT, gone.close())
        .await
        .unwrap()
        .expect("the connection closes");
    // The ack can no longer reach the server, and says so rather than pretending.
    let late_ack = timeout(DELIVERY_WAIT, delivery.ack()).await.unwrap();
    assert!(late_ack.is_err(), "{late_ack:?}");

    let mut subscription = subscribe(&broker, &destination).await;
    let again = next(&mut subscription).await;
    assert!(again.redelivered);
    assert_eq!(again.message.message_id, "m-1");
    settle(again.ack()).await;

    delete_empty(&broker, &destination, subscription).await;
}

#[tokio::test]
async fn rabbitmq_ack_removes_the_message_for_good() {
    let broker = connect().await;
    let (destination, mut subscription, _) = subscribed_with_one_message(&broker).await;

    settle(next(&mut subscription).await.ack()).await;

    assert_quiet(&mut subscription).await;
    let mut late = subscribe(&broker, &destination).await;
    assert_quiet(&mut late).await;

    delete_empty(&broker, &destination, (subscription, late)).await;
}

#[tokio::test]
async fn rabbitmq_two_competing_consumers_each_get_distinct_messages() {
    let broker = connect().await;
    let destination = queue();
    let mut first = subscribe(&broker, &destination).await;
    let mut second = subscribe(&broker, &destination).await;
    publish(&broker, message("m-1", &destination)).await;
    publish(&broker, message("m-2", &destination)).await;

    // Prefetch 1: neither consumer can hold both while it has not settled its first.
    let a = next(&mut first).await;
    let b = next(&mut second).await;
    let mut ids = [a.message.message_id.clone(), b.message.message_id.clone()];
    ids.sort();
    assert_eq!(ids, ["m-1", "m-2"]);
    assert!(!a.redelivered && !b.redelivered);
    settle(a.ack()).await;
    settle(b.ack()).await;

    assert_quiet(&mut first).await;
    assert_quiet(&mut second).await;
    delete_empty(&broker, &destination, (first, second)).await;
}

#[tokio::test]
async fn rabbitmq_messages_published_before_subscribe_are_delivered_in_order() {
    let broker = connect().await;
    let destination = queue();
    for i in 0..3 {
        publish(&broker, message(&format!("m-{i}"), &destination)).await;
    }

    let mut subscription = subscribe(&broker, &destination).await;
    for i in 0..3 {
        let delivery = next(&mut subscription).await;
        assert_eq!(delivery.message.message_id, format!("m-{i}"));
        settle(delivery.ack()).await;
    }

    delete_empty(&broker, &destination, subscription).await;
}

#[tokio::test]
async fn rabbitmq_publishing_to_a_queue_deleted_by_another_client_declares_it_again() {
    let broker = connect().await;
    let destination = queue();
    publish(&broker, message("m-1", &destination)).await;
    let other = connect().await;
    assert_eq!(delete(&other, &destination).await, 1);

    // `broker` still believes the queue exists: the message comes back unroutable, and must be
    // published again into a re-declared queue, not lost.
    publish(&broker, message("m-2", &destination)).await;

    let mut subscription = subscribe(&broker, &destination).await;
    let delivery = next(&mut subscription).await;
    assert_eq!(delivery.message.message_id, "m-2");
    settle(delivery.ack()).await;
    assert_quiet(&mut subscription).await;

    delete_empty(&broker, &destination, subscription).await;
}

#[tokio::test]
async fn rabbitmq_invalid_input_is_an_error_not_a_panic() {
    let broker = connect().await;
    let destination = queue();

    let error = broker.publish(message("m-1", "")).await.unwrap_err();
    assert!(
        matches!(error, BrokerError::InvalidDestination { .. }),
        "{error}"
    );
    let error = broker.subscribe(&"q".repeat(300)).await.unwrap_err();
    assert!(
        matches!(error, BrokerError::InvalidDestination { .. }),
        "{error}"
    );
    let error = broker
        .publish(message(&"i".repeat(300), &destination))
        .await
        .unwrap_err();
    assert!(
        matches!(error, BrokerError::InvalidMessage { .. }),
        "{error}"
    );

    let error = RabbitMqBroker::connect("amqp://guest:secret@127.0.0.1:1/%2f")
        .await
        .unwrap_err();
    assert!(matches!(error, BrokerError::Transport { .. }), "{error}");
    assert!(!error.to_string().contains("secret"), "{error}");
}

// A queue the server refuses (declared non-durable by another client: 406) fails only its own
// publishes, as a refusal an operator can lift; publishes to other queues waiting at the same
// moment are confirmed (the refusal closes a channel of its own, not the shared publisher).
#[tokio::test]
async fn a_refused_queue_fails_its_own_publishes_only() {
    let broker = connect().await;
    let refused = queue();
    let fine = queue();
    let foreign = lapin::Connection::connect(rabbitmq::URI, lapin::ConnectionProperties::default())
        .await
        .unwrap();
    let channel = foreign.create_channel().await.unwrap();
    let non_durable = lapin::options::QueueDeclareOptions::default();
    channel
        .queue_declare(
            lapin::types::ShortString::from(refused.as_str()),
            non_durable,
            lapin::types::FieldTable::default(),
        )
        .await
        .unwrap();
    for round in 0..5 {
        let others = (0..20).map(|n| broker.publish(message(&format!("m-{round}-{n}"), &fine)));
        let (refusal, others) = tokio::join!(
            broker.publish(message(&format!("r-{round}"), &refused)),
            futures::future::join_all(others)
        );
        let refusal = refusal.unwrap_err();
        assert!(
            matches!(
                refusal,
                BrokerError::Refused {
                    refusal: chatter_runtime::broker::Refusal::ConflictingDeclaration,
                    ..
                }
            ) && !refusal.is_permanent(),
            "{refusal}"
        );
        for other in others {
            other.expect("a publish to another queue is confirmed");
        }
    }
    rabbitmq::delete_queue(&broker, &fine, DELIVERY_WAIT).await;
    channel
        .queue_delete(
            lapin::types::ShortString::from(refused.as_str()),
            lapin::options::QueueDeleteOptions::default(),
        )
        .await
        .unwrap();
}

// `cancel` (the runtime's shutdown) stops the server's deliveries and hands back what the
// client had buffered but the subscription had not yielded, then the subscription ends; a
// message published after it stays in the queue.
#[tokio::test]
async fn cancel_hands_back_the_buffered_deliveries_and_ends_the_subscription() {
    let broker = connect().await;
    let destination = queue();
    let mut subscription = timeout(
        DELIVERY_WAIT,
        broker.subscribe_with_prefetch(&destination, 3),
    )
    .await
    .expect("subscribing takes less than the bound")
    .expect("the consumer starts");
    for i in 1..=3 {
        publish(&broker, message(&format!("m-{i}"), &destination)).await;
    }
    let first = next(&mut subscription).await;
    chatter_tests::wait::eventually(
        DELIVERY_WAIT,
        Duration::from_millis(50),
        "the client holds all three",
        || async { rabbitmq::unsettled(&destination) == Some(3) },
    )
    .await;

    let left = timeout(DELIVERY_WAIT, subscription.cancel())
        .await
        .expect("cancelling takes less than the bound");
    let left: Vec<Delivery> = left
        .into_iter()
        .map(|item| item.expect("a Brokered Message"))
        .collect();
    let ids: Vec<&str> = left.iter().map(|d| d.message.message_id.as_str()).collect();
    assert_eq!(ids, ["m-2", "m-3"]);
    assert!(
        timeout(DELIVERY_WAIT, subscription.next())
            .await
            .expect("the subscription ends")
            .is_none()
    );
    publish(&broker, message("m-4", &destination)).await;
    settle(first.ack()).await;
    for delivery in left {
        settle(delivery.ack()).await;
    }
    chatter_tests::wait::eventually(
        DELIVERY_WAIT,
        Duration::from_millis(50),
        "only the message published after the cancel is left, ready",
        || async {
            rabbitmq::messages(&destination) == Some(1)
                && rabbitmq::unsettled(&destination) == Some(0)
        },
    )
    .await;
    assert_eq!(delete(&broker, &destination).await, 1);
}
