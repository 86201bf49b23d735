//! `NatsBroker` against real NATS servers: the machine's shared one (127.0.0.1:4222, streams
//! of each test's own) and `nats-server` processes of a test's own where a server setting
//! matters. Publish acks and `Nats-Msg-Id` deduplication, delayed redelivery counted by the
//! server, dead-lettering what is no Brokered Message, the refusals an operator lifts, the
//! start-time checks, and an outage through a TCP proxy.
#![cfg(feature = "nats")]

use std::time::Duration;

use async_nats::jetstream::stream::Config;
use chatter_runtime::BrokeredMessage;
use chatter_runtime::broker::dead_letter_destination;
use chatter_runtime::broker::{
    Broker, BrokerContract, BrokerError, DeadLetterAction, DeadLetters,
    NATS_DEAD_LETTER_REASON_HEADER, Refusal,
};
use chatter_tests::broker::{assert_quiet_for, next_delivery};
use chatter_tests::nats::{self, NatsServer, TestStream};
use chatter_tests::proxy::TcpProxy;
use serde_json::json;

const WAIT: Duration = Duration::from_secs(30);
const WINDOW: Duration = Duration::from_secs(120);

fn message(id: &str, destination: &str) -> BrokeredMessage {
    let mut message = BrokeredMessage::json(id, destination, r#"{"orderId":"o-1"}"#);
    message
        .context
        .insert("Chatter.Nested".into(), json!({ "a": [1, null, "x\ny"] }));
    message
}

fn contract(destinations: &[&str], republish_within: Duration) -> BrokerContract {
    let mut contract = BrokerContract::default();
    contract.destinations = destinations.iter().map(|d| (*d).to_owned()).collect();
    contract.republish_within = republish_within;
    contract
}

#[tokio::test]
async fn a_message_comes_back_as_published_and_an_acked_one_never_again() {
    let broker = nats::connect(nats::URL).await;
    let stream = TestStream::create(&broker, WINDOW).await;
    let orders = stream.subject("orders");
    let mut subscription = nats::subscribe(&broker, &orders).await;
    let sent = message("m-1", &orders);
    broker.publish(sent.clone()).await.unwrap();

    let delivery = next_delivery(&mut subscription, WAIT).await;
    assert_eq!(delivery.message, sent);
    assert!(!delivery.redelivered);
    assert_eq!(delivery.delivery_count(), Some(1));
    delivery.ack().await.unwrap();
    assert_quiet_for(&mut subscription, Duration::from_secs(1)).await;
    stream.delete(&broker).await;
}

// The relay publishes a message again after a crash or a lease takeover: JetStream drops the
// copy by its `Nats-Msg-Id` (the message id), and the publish still succeeds.
#[tokio::test]
async fn a_republish_within_the_duplicate_window_is_stored_once() {
    let broker = nats::connect(nats::URL).await;
    let stream = TestStream::create(&broker, WINDOW).await;
    let orders = stream.subject("orders");
    for _ in 0..3 {
        broker.publish(message("m-1", &orders)).await.unwrap();
    }
    broker.publish(message("m-2", &orders)).await.unwrap();
    // The same message id for another subject of the stream is another message.
    let payments = stream.subject("payments");
    broker.publish(message("m-1", &payments)).await.unwrap();
    let mut other = nats::subscribe(&broker, &payments).await;
    let delivery = next_delivery(&mut other, WAIT).await;
    assert_eq!(delivery.message.message_id, "m-1");
    delivery.ack().await.unwrap();

    let mut subscription = nats::subscribe(&broker, &orders).await;
    let mut ids = Vec::new();
    for _ in 0..2 {
        let delivery = next_delivery(&mut subscription, WAIT).await;
        ids.push(delivery.message.message_id.clone());
        delivery.ack().await.unwrap();
    }
    assert_eq!(ids, ["m-1", "m-2"]);
    assert_quiet_for(&mut subscription, Duration::from_secs(1)).await;
    stream.delete(&broker).await;
}

// A failed attempt is delivered again by the server after the delay, counted; a delivery
// dropped unsettled comes back too.
#[tokio::test]
async fn a_delayed_nack_and_a_dropped_delivery_are_delivered_again_counted() {
    let broker = nats::connect(nats::URL).await;
    let stream = TestStream::create(&broker, WINDOW).await;
    let orders = stream.subject("orders");
    let mut subscription = nats::subscribe(&broker, &orders).await;
    broker.publish(message("m-1", &orders)).await.unwrap();

    let first = next_delivery(&mut subscription, WAIT).await;
    let nacked_at = tokio::time::Instant::now();
    first.nack_after(Duration::from_millis(700)).await.unwrap();
    let second = next_delivery(&mut subscription, WAIT).await;
    assert!(
        nacked_at.elapsed() >= Duration::from_millis(600),
        "the delay held"
    );
    assert!(second.redelivered);
    assert_eq!(second.delivery_count(), Some(2));
    drop(second);
    let third = next_delivery(&mut subscription, WAIT).await;
    assert_eq!(third.delivery_count(), Some(3));
    third.term().await.unwrap();
    assert_quiet_for(&mut subscription, Duration::from_secs(1)).await;
    stream.delete(&broker).await;
}

// A subject no stream stores, and a message over the server's `max_payload`: refusals an
// operator lifts (the relay keeps such documents pending), never permanent.
#[tokio::test]
async fn a_subject_without_a_stream_and_an_oversized_message_are_refused_not_undeliverable() {
    let broker = nats::connect(nats::URL).await;
    let nowhere = format!("chatter-test-nowhere-{}", uuid::Uuid::new_v4().simple());
    let error = broker.publish(message("m-1", &nowhere)).await.unwrap_err();
    assert_eq!(error.refusal(), Some(Refusal::NoStream), "{error}");
    assert!(!error.is_permanent());
    assert!(
        error.to_string().contains("--subjects"),
        "names the fix: {error}"
    );

    let stream = TestStream::create(&broker, WINDOW).await;
    let mut large = message("m-2", &stream.subject("orders"));
    large.body = format!("\"{}\"", "x".repeat(1_100_000));
    let error = broker.publish(large).await.unwrap_err();
    assert_eq!(error.refusal(), Some(Refusal::TooLarge), "{error}");
    assert!(!error.is_permanent());
    stream.delete(&broker).await;
}

// While JetStream recovers after a server restart it does not answer a publish ("no
// responders"), which the client reports as a subject no stream stores. A server without
// JetStream answers the same, for as long as the test needs: the publish is retried as the
// transport failure it is, never refused as a missing stream (which would block a lease and
// send an operator looking for a stream that is there).
#[tokio::test]
async fn a_publish_jetstream_does_not_answer_is_retried_not_refused_as_a_missing_stream() {
    let server = NatsServer::without_jetstream().await;
    let broker = nats::connect(&server.url())
        .await
        .with_publish_timeout(Duration::from_secs(2));
    let error = broker.publish(message("m-1", "orders")).await.unwrap_err();
    assert_eq!(error.refusal(), None, "{error}");
    assert!(!error.is_permanent(), "{error}");
}

// A foreign client's message without a message id is no Brokered Message: it is moved as it is
// to `<subject>.dead-letter` with its reason, and not delivered again.
#[tokio::test]
async fn a_message_that_is_no_brokered_message_is_dead_lettered_verbatim() {
    let broker = nats::connect(nats::URL).await;
    let stream = TestStream::create(&broker, WINDOW).await;
    let orders = stream.subject("orders");
    let dead_letters = dead_letter_destination(&orders);
    let mut subscription = nats::subscribe(&broker, &orders).await;
    broker
        .jetstream()
        .publish(orders.clone(), "foreign".into())
        .await
        .unwrap()
        .await
        .unwrap();

    let item = tokio::time::timeout(WAIT, subscription.next())
        .await
        .unwrap()
        .unwrap();
    assert!(
        matches!(item, Err(BrokerError::Undecodable { .. })),
        "{item:?}"
    );
    let raw = broker.jetstream().get_stream(&stream.name).await.unwrap();
    let letter = tokio::time::timeout(WAIT, async {
        loop {
            if let Ok(letter) = raw.get_last_raw_message_by_subject(&dead_letters).await {
                return letter;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await
    .unwrap();
    assert_eq!(letter.payload.as_ref(), b"foreign", "the payload is kept");
    let reason = letter
        .headers
        .get(NATS_DEAD_LETTER_REASON_HEADER)
        .expect("a reason header")
        .as_str()
        .to_owned();
    assert!(reason.contains("Nats-Msg-Id"), "{reason}");
    assert_quiet_for(&mut subscription, Duration::from_secs(1)).await;
    stream.delete(&broker).await;
}

// The dead letter of a foreign message (no message id) carries the `Nats-Msg-Id` chatter gave
// it: it still lists as no Brokered Message, and a replay refuses it (discard is all it takes).
#[tokio::test]
async fn a_foreign_message_s_dead_letter_can_only_be_discarded() {
    let broker = nats::connect(nats::URL).await;
    let stream = TestStream::create(&broker, WINDOW).await;
    let orders = stream.subject("orders");
    let mut subscription = nats::subscribe(&broker, &orders).await;
    broker
        .jetstream()
        .publish(orders.clone(), "foreign".into())
        .await
        .unwrap()
        .await
        .unwrap();
    let item = tokio::time::timeout(WAIT, subscription.next())
        .await
        .unwrap()
        .unwrap();
    assert!(
        matches!(item, Err(BrokerError::Undecodable { .. })),
        "{item:?}"
    );

    let letters = broker.list(&orders, 10).await.unwrap();
    assert_eq!(letters.len(), 1, "{letters:?}");
    assert!(!letters[0].replayable, "{:?}", letters[0]);
    assert_eq!(letters[0].message_id, "<none>", "the id it came with");
    let outcome = broker
        .settle(&orders, &letters, DeadLetterAction::Replay)
        .await
        .unwrap();
    assert!(outcome.done.is_empty(), "{outcome:?}");
    assert_eq!(outcome.refused.len(), 1, "{outcome:?}");
    assert_quiet_for(&mut subscription, Duration::from_secs(1)).await;
    let outcome = broker
        .settle(&orders, &letters, DeadLetterAction::Discard)
        .await
        .unwrap();
    assert_eq!(outcome.done.len(), 1, "{outcome:?}");
    assert!(broker.list(&orders, 10).await.unwrap().is_empty());
    stream.delete(&broker).await;
}

// What `start()` checks, on servers of the test's own: each refusal names the setting.
#[tokio::test]
async fn verify_refuses_each_setting_chatter_cannot_rely_on_naming_it() {
    let small = NatsServer::with_max_payload("1MB").await;
    let broker = nats::connect(&small.url()).await;
    let error = broker.verify(&contract(&[], WINDOW)).await.unwrap_err();
    assert!(error.to_string().contains("`max_payload`"), "{error}");
    assert!(error.to_string().contains("max_payload: 2MB"), "{error}");

    let server = NatsServer::start().await;
    let broker = nats::connect(&server.url()).await;
    let republish_within = Duration::from_secs(80);
    let good = TestStream::create(&broker, Duration::from_secs(300)).await;
    let orders = good.subject("orders");
    let orders_letters = dead_letter_destination(&orders);
    broker
        .verify(&contract(&[&orders, &orders_letters], republish_within))
        .await
        .expect("a stream covering both subjects with a long enough window passes");

    let error = broker
        .verify(&contract(&["elsewhere.orders"], republish_within))
        .await
        .unwrap_err();
    assert!(
        matches!(error, BrokerError::Misconfigured { .. }),
        "{error}"
    );
    assert!(error.to_string().contains("`elsewhere.orders`"), "{error}");
    assert!(error.to_string().contains("`subjects`"), "{error}");

    let short = TestStream::create(&broker, Duration::from_secs(60)).await;
    let error = broker
        .verify(&contract(&[&short.subject("orders")], republish_within))
        .await
        .unwrap_err();
    let text = error.to_string();
    assert!(
        text.contains(&format!("`duplicate_window` of stream `{}`", short.name)),
        "{text}"
    );
    assert!(text.contains("--dupe-window"), "{text}");

    let capped = format!("CAPPED_{}", uuid::Uuid::new_v4().simple());
    broker
        .jetstream()
        .create_stream(Config {
            name: capped.clone(),
            subjects: vec!["capped.>".into()],
            duplicate_window: Duration::from_secs(300),
            max_message_size: 1024 * 1024,
            ..Config::default()
        })
        .await
        .unwrap();
    let error = broker
        .verify(&contract(&["capped.orders"], republish_within))
        .await
        .unwrap_err();
    assert!(
        error
            .to_string()
            .contains(&format!("`max_msg_size` of stream `{capped}`")),
        "{error}"
    );

    for (prefix, config) in [
        (
            "interest",
            Config {
                retention: async_nats::jetstream::stream::RetentionPolicy::Interest,
                ..Config::default()
            },
        ),
        (
            "memory",
            Config {
                storage: async_nats::jetstream::stream::StorageType::Memory,
                ..Config::default()
            },
        ),
    ] {
        let name = format!(
            "{}_{}",
            prefix.to_uppercase(),
            uuid::Uuid::new_v4().simple()
        );
        broker
            .jetstream()
            .create_stream(Config {
                name: name.clone(),
                subjects: vec![format!("{prefix}.>")],
                duplicate_window: Duration::from_secs(300),
                ..config
            })
            .await
            .unwrap();
        let error = broker
            .verify(&contract(&[&format!("{prefix}.orders")], republish_within))
            .await
            .unwrap_err();
        let text = error.to_string();
        assert!(
            text.contains(&format!("of stream `{name}`")) && text.contains(prefix),
            "{text}"
        );
    }
}

// A durable consumer made before with a delivery limit of its own would stop delivering a
// message chatter has not dead-lettered: subscribing refuses it, naming the fix.
#[tokio::test]
async fn a_durable_consumer_with_its_own_delivery_limit_is_refused() {
    let broker = nats::connect(nats::URL).await;
    let stream = TestStream::create(&broker, WINDOW).await;
    let orders = stream.subject("orders");
    drop(nats::subscribe(&broker, &orders).await);
    let raw = broker.jetstream().get_stream(&stream.name).await.unwrap();
    let names = nats::consumer_names(&raw).await;
    assert_eq!(names.len(), 1, "{names:?}");
    raw.delete_consumer(&names[0]).await.unwrap();
    raw.create_consumer(async_nats::jetstream::consumer::pull::Config {
        durable_name: Some(names[0].clone()),
        filter_subject: orders.clone(),
        max_deliver: 3,
        ..Default::default()
    })
    .await
    .unwrap();
    let error = broker.subscribe(&orders).await.unwrap_err();
    let text = error.to_string();
    assert!(
        text.contains(&format!("durable consumer `{}`", names[0])),
        "{text}"
    );
    assert!(
        text.contains("after 3 deliveries") && text.contains("nats consumer rm"),
        "{text}"
    );
    // Nothing was acked: made again by hand, it starts at the stream's first message.
    assert!(
        text.contains(&format!("nats consumer add {} {}", stream.name, names[0]))
            && text.contains("--deliver 1 "),
        "{text}"
    );
    stream.delete(&broker).await;
}

// The network to the server is cut for 15 s, past the pull's missed-heartbeat limit: the
// subscription shows it is not consuming, a publish made meanwhile waits and succeeds once the
// server is back, and the subscription consumes again by itself.
#[tokio::test]
async fn a_publish_during_an_outage_succeeds_after_it_and_the_subscription_resumes() {
    let admin = nats::connect(nats::URL).await;
    let stream = TestStream::create(&admin, WINDOW).await;
    let orders = stream.subject("orders");
    let proxy = TcpProxy::start(std::net::SocketAddr::from(([127, 0, 0, 1], 4222))).await;
    let broker = nats::connect(&format!("nats://{}", proxy.addr())).await;
    let mut subscription = nats::subscribe(&broker, &orders).await;
    let liveness = subscription.liveness().clone();

    proxy.cut_for(Duration::from_secs(15));
    let publishing = tokio::spawn({
        let broker = broker.clone();
        let orders = orders.clone();
        async move { broker.publish(message("during", &orders)).await }
    });
    // Polled while the subscription waits for its next message.
    let receiving = tokio::spawn(async move {
        let delivery = next_delivery(&mut subscription, Duration::from_secs(45)).await;
        (delivery, subscription)
    });
    chatter_tests::wait::eventually(
        Duration::from_secs(15),
        Duration::from_millis(100),
        "the subscription reports the outage",
        || async { !liveness.is_live() },
    )
    .await;
    tokio::time::timeout(WAIT, publishing)
        .await
        .expect("the publish ends within its timeout")
        .unwrap()
        .expect("the publish succeeds once the server is back");
    let (delivery, _subscription) = receiving.await.unwrap();
    assert_eq!(delivery.message.message_id, "during");
    delivery.ack().await.unwrap();
    assert!(liveness.is_live());
    stream.delete(&admin).await;
}

// An operator deletes the durable consumer while chatter consumes through it: chatter makes it
// again from the first message it has not settled, so what was acked is not delivered again
// (made with the default start, it would deliver the stream's whole history once more).
#[tokio::test]
async fn a_durable_consumer_an_operator_deleted_is_made_again_after_what_was_settled() {
    let broker = nats::connect(nats::URL).await;
    let stream = TestStream::create(&broker, WINDOW).await;
    let orders = stream.subject("orders");
    let mut subscription = nats::subscribe(&broker, &orders).await;
    for i in 1..=3 {
        broker
            .publish(message(&format!("m-{i}"), &orders))
            .await
            .unwrap();
    }
    for i in 1..=3 {
        let delivery = next_delivery(&mut subscription, WAIT).await;
        assert_eq!(delivery.message.message_id, format!("m-{i}"));
        delivery.ack().await.unwrap();
    }

    // The operator, on a connection of its own.
    let operator = async_nats::jetstream::new(async_nats::connect(nats::URL).await.unwrap());
    let raw = operator.get_stream(&stream.name).await.unwrap();
    let names = nats::consumer_names(&raw).await;
    assert_eq!(names.len(), 1, "{names:?}");
    raw.delete_consumer(&names[0]).await.unwrap();
    broker.publish(message("m-4", &orders)).await.unwrap();

    let delivery = next_delivery(&mut subscription, Duration::from_secs(60)).await;
    assert_eq!(
        delivery.message.message_id, "m-4",
        "only the message published after the deletion is delivered"
    );
    delivery.ack().await.unwrap();
    assert_quiet_for(&mut subscription, Duration::from_secs(1)).await;
    assert_eq!(nats::consumer_names(&raw).await, names, "made again");
    stream.delete(&broker).await;
}
