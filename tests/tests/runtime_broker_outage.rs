//! A runtime (consumers and relay) rides out a broker outage: RabbitMQ reached through a TCP
//! proxy that drops every connection and, for 5 s, refuses new ones or accepts them and never
//! answers (a broker that hangs). The relay keeps draining and every outbox document is
//! delivered; the consumer receives the commands sent after the outage; `Runtime::health` shows
//! the consumer reconnecting during the outage and subscribed after it.
#![cfg(feature = "rabbitmq")]

use std::time::Duration;

use chatter_runtime::BrokeredMessage;
use chatter_runtime::broker::{Broker, BrokerError, RabbitMqBroker};
use chatter_runtime::{Runtime, health::ConsumerState};
use chatter_tests::broker::Received;
use chatter_tests::proxy::TcpProxy;
use chatter_tests::rabbitmq;
use chatter_tests::relay::fast_relay;
use chatter_tests::runtime::registry_at;
use chatter_tests::store::{emulator_server, outbox_document, provisioned_with_leases};
use chatter_tests::wait::eventually;
use serde_json::json;

const WAIT: Duration = Duration::from_secs(60);
const POLL: Duration = Duration::from_millis(50);
const OUTAGE: Duration = Duration::from_secs(5);
/// The proxied broker's bound of one publish, below the outage.
const PUBLISH_TIMEOUT: Duration = Duration::from_secs(2);

chatter_tests::event_command! {
    /// Books a ticket; its handler sends `TicketBooked` to the queue the command names.
    BookTicket { ticket_id as "ticketId" }
    on ("outage", "tickets", "tickets-leases") at "/ticketId",
    handled by book_ticket, sends "TicketBooked" to events
}

#[tokio::test]
async fn consumers_and_the_relay_carry_on_after_a_broker_outage() {
    ride_out(|proxy| proxy.cut_for(OUTAGE), |broker| broker).await;
}

// A broker that accepts connections and never answers: each connection attempt gives up after
// the connect timeout, no lock is held across one, a publish fails within its bound, and all
// recover once the broker answers (before, the first reconnect waited forever with the
// connection lock held, and nothing ever recovered).
#[tokio::test]
async fn consumers_and_the_relay_carry_on_after_a_broker_that_hangs() {
    ride_out(
        |proxy| proxy.cut_silently_for(OUTAGE),
        |broker| broker.with_connect_timeout(Duration::from_secs(1)),
    )
    .await;
}

/// Runs the runtime through the proxy, makes the outage with `cut`, and checks that everything
/// recovers.
async fn ride_out(cut: impl Fn(&TcpProxy), configure: impl Fn(RabbitMqBroker) -> RabbitMqBroker) {
    let (_emulator, cosmos) = emulator_server().await;
    let tickets = provisioned_with_leases(
        &cosmos,
        "outage",
        "tickets",
        &["/ticketId"],
        "tickets-leases",
    )
    .await;
    let events = format!(
        "chatter-test-outage-events-{}",
        uuid::Uuid::new_v4().simple()
    );
    let direct = rabbitmq::connect(WAIT).await;
    let commands = &format!(
        "chatter-test-outage-commands-{}",
        uuid::Uuid::new_v4().simple()
    );
    let received = Received::consume(rabbitmq::subscribe(&direct, &events, WAIT).await);

    let proxy = TcpProxy::start(rabbitmq::server_addr()).await;
    let broker = configure(
        RabbitMqBroker::connect(&rabbitmq::uri_through(&proxy))
            .await
            .unwrap()
            .with_publish_timeout(PUBLISH_TIMEOUT),
    );
    let proxied = broker.clone();
    let runtime = Runtime::builder()
        .registry(registry_at::<BookTicket>(commands))
        .cosmos(cosmos.clone())
        .broker(broker)
        .relay_options(fast_relay(Duration::from_secs(10)))
        .redelivery_delay(Duration::from_millis(50))
        .start()
        .await
        .unwrap();
    let send = |n: usize| {
        let direct = direct.clone();
        let events = events.clone();
        async move {
            let command = BookTicket {
                ticket_id: format!("t-{n}"),
                events,
            };
            let body = serde_json::to_string(&command).unwrap();
            direct
                .publish(BrokeredMessage::json(format!("cmd-{n}"), commands, body))
                .await
                .unwrap();
        }
    };
    for n in 0..5 {
        send(n).await;
    }
    eventually(WAIT, POLL, "the first events arrived", || {
        let done = (0..5).all(|n| received.count(&format!("cmd-{n}:TicketBooked")) >= 1);
        async move { done }
    })
    .await;
    assert!(
        runtime.health().await.is_healthy(),
        "{:?}",
        runtime.health().await
    );

    cut(&proxy);
    eventually(WAIT, POLL, "the consumer reports reconnecting", || async {
        runtime.health().await.consumers[0].state == ConsumerState::Reconnecting
    })
    .await;
    // A publish through the proxy fails within its bound instead of waiting for the broker.
    let during = BrokeredMessage::json("during-outage", events.clone(), "{}");
    let published = tokio::time::timeout(WAIT, proxied.publish(during))
        .await
        .expect("a publish during the outage ends within its bound");
    assert!(
        matches!(published, Err(BrokerError::Timeout { .. })),
        "{published:?}"
    );
    // Commands sent during the outage wait in RabbitMQ; the runtime cannot reach it yet.
    for n in 5..10 {
        send(n).await;
    }
    eventually(WAIT, POLL, "every event arrived after the outage", || {
        let done = (0..10).all(|n| received.count(&format!("cmd-{n}:TicketBooked")) >= 1);
        async move { done }
    })
    .await;
    for n in 0..10 {
        let id = format!("cmd-{n}:TicketBooked");
        let key = json!(format!("t-{n}"));
        eventually(
            WAIT,
            POLL,
            "the outbox document is stamped delivered",
            || async {
                outbox_document(&tickets, std::slice::from_ref(&key), &id).await["status"]
                    == "delivered"
            },
        )
        .await;
    }
    eventually(WAIT, POLL, "healthy again", || async {
        runtime.health().await.is_healthy()
    })
    .await;
    let health = runtime.health().await;
    assert_eq!(health.consumers[0].state, ConsumerState::Subscribed);
    assert!(
        !health.leases.is_empty(),
        "the relay owns leases: {health:?}"
    );
    runtime.shutdown().await;
    rabbitmq::delete_queue(&direct, &events, WAIT).await;
    // The commands' queue and, declared at start, its dead-letter queue.
    rabbitmq::delete_queue(&direct, commands, WAIT).await;
    let dead_letters = chatter_runtime::broker::dead_letter_destination(commands);
    rabbitmq::delete_queue(&direct, &dead_letters, WAIT).await;
}
