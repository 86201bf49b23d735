//! The relay under the two faults that used to stall it, end to end through a `chatter-emulator`
//! server (in this process, over HTTP) and the machine's RabbitMQ (127.0.0.1:5672):
//!
//! - poison Outbox Documents written by another writer, each ahead of good documents in its
//!   partition: every poison becomes `undeliverable` and every good document is delivered;
//! - the store refusing every stamp (a real HTTP 403 on PATCH): a document is published 5 times,
//!   then once per 60 s suspension window (stepped on a manual clock), and stamped delivered by
//!   the first probe after the fault clears.
//!
//! No timed assertions: every wait is bounded generously; the bounds that are asserted are the
//! specification's (publish counts, one probe per window).
#![cfg(feature = "rabbitmq")]

use std::sync::Arc;
use std::time::Duration;

use chatter_runtime::BrokeredMessage;
use chatter_runtime::broker::{Broker, BrokerError};
use chatter_runtime::cosmos::{self, ContainerClient};
use chatter_runtime::testing::{ManualClock, MonotonicClock, OutboxDocument};
use chatter_runtime::{
    BoxError, DocumentReliable, HandlerContext, Runtime, error::ErrorChain, handler,
};
use chatter_tests::broker::Received;
use chatter_tests::logs::capture;
use chatter_tests::rabbitmq;
use chatter_tests::relay::fast_relay;
use chatter_tests::store::{emulator_server, find_document, provisioned_with_leases};
use chatter_tests::wait::eventually;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use tracing::Level;

const DB: &str = "relay-faults";
const PATHS: &[&str] = &["/orderId"];
const BROKER_WAIT: Duration = Duration::from_secs(10);

/// Ships an order; its handler sends `OrderShipped` under the message id it is given.
#[derive(Debug, Clone, Serialize, Deserialize, DocumentReliable)]
#[cosmos(
    database = "relay-faults",
    container = "orders",
    lease = "orders-leases"
)]
#[partition_key(path = "/orderId")]
#[serde(rename_all = "camelCase")]
pub struct ShipOrder {
    pub order_id: String,
    pub event_id: String,
    pub events: String,
}

#[handler]
async fn ship_order(command: ShipOrder, ctx: &mut HandlerContext) -> Result<(), BoxError> {
    ctx.upsert(json!({ "id": command.order_id, "orderId": command.order_id }))?;
    ctx.send(BrokeredMessage::json(
        command.event_id,
        command.events,
        json!({ "orderId": command.order_id }).to_string(),
    ))?;
    Ok(())
}

/// A unique queue name per test run, so runs beside each other never share messages.
fn queue(test: &str) -> String {
    format!("chatter-test-{test}-{}", uuid::Uuid::new_v4().simple())
}

async fn relay(cosmos: &cosmos::CosmosConnection, broker: impl Broker) -> Runtime {
    Runtime::builder()
        .cosmos(cosmos.clone())
        .broker(broker)
        .consume(false)
        .relay_options(fast_relay(Duration::from_secs(10)))
        .start()
        .await
        .unwrap()
}

fn pending(message_id: &str, order: &str, destination: &str) -> Value {
    let message = BrokeredMessage::json(
        message_id,
        destination,
        json!({ "orderId": order }).to_string(),
    );
    OutboxDocument::build(&message, PATHS, &[json!(order)]).unwrap()
}

async fn write(container: &ContainerClient, doc: &Value) {
    let key = cosmos::partition_key(&[doc["orderId"].clone()]).unwrap();
    chatter_runtime::testing::create_item(container, key, doc)
        .await
        .unwrap();
}

async fn status(container: &ContainerClient, doc: &Value) -> Option<String> {
    let found = find_document(container, &[doc["orderId"].clone()], doc["id"].as_str()?).await?;
    found["status"].as_str().map(str::to_owned)
}

#[tokio::test]
async fn poison_documents_become_undeliverable_and_every_good_document_behind_them_is_delivered() {
    let (logs, _guard) = capture();
    let (_emulator, cosmos) = emulator_server().await;
    let container = provisioned_with_leases(&cosmos, DB, "orders", PATHS, "orders-leases").await;
    let events = queue("poison");
    let broker = rabbitmq::connect(BROKER_WAIT).await;
    let received = Received::consume(rabbitmq::subscribe(&broker, &events, BROKER_WAIT).await);

    // (poison, why) pairs; each goes first in its own partition, three good documents after it.
    let long_id = "x".repeat(700);
    let mut poisons: Vec<(Value, &str)> = Vec::new();
    let mut doc = pending("empty-destination", "p-1", &events);
    doc["Destination"] = json!("");
    poisons.push((doc, "'Destination'"));
    let mut doc = pending("blank-destination", "p-2", &events);
    doc["Destination"] = json!("   ");
    poisons.push((doc, "'Destination'"));
    poisons.push((
        pending(&long_id, "p-3", &events),
        "message id is not an AMQP short string",
    ));
    let mut doc = pending("infra-7", "p-4", &events);
    doc["MessageContext"] = json!(r#"{"Chatter.Infrastructure.Type":7}"#);
    poisons.push((doc, "'Chatter.Infrastructure.Type'"));
    poisons.push((
        pending("reserved-queue", "p-5", "amq.chatter"),
        "reserved by RabbitMQ",
    ));
    poisons.push((
        pending("long-queue", "p-6", &"q".repeat(300)),
        "not an AMQP queue name",
    ));
    let mut doc = pending("no-body", "p-7", &events);
    doc.as_object_mut().unwrap().shift_remove("MessageBody");
    poisons.push((doc, "'MessageBody'"));

    let mut good = Vec::new();
    for (poison, _) in &poisons {
        write(&container, poison).await;
        let order = poison["orderId"].as_str().unwrap();
        for n in 0..3 {
            let doc = pending(&format!("{order}-good-{n}"), order, &events);
            write(&container, &doc).await;
            good.push(doc);
        }
    }

    let runtime = relay(&cosmos, broker.clone()).await;
    let expected: std::collections::BTreeSet<String> = good
        .iter()
        .map(|d| d["MessageId"].as_str().unwrap().to_owned())
        .collect();
    eventually(
        Duration::from_secs(120),
        Duration::from_millis(200),
        "every good document arrived",
        || {
            let ids = received.ids();
            let done = expected.is_subset(&ids);
            async move { done }
        },
    )
    .await;
    for doc in &good {
        eventually(
            Duration::from_secs(30),
            Duration::from_millis(200),
            "a good document is stamped delivered",
            || async { status(&container, doc).await.as_deref() == Some("delivered") },
        )
        .await;
    }
    for (poison, why) in &poisons {
        assert_eq!(
            status(&container, poison).await.as_deref(),
            Some("undeliverable"),
            "{}",
            poison["MessageId"]
        );
        let message_id = poison["MessageId"].as_str().unwrap();
        let entries = logs.matching(Level::ERROR, &format!("'{message_id}'"));
        assert_eq!(
            entries.len(),
            1,
            "one undeliverable log for {message_id}: {entries:?}"
        );
        assert!(
            entries[0]
                .message
                .contains("marked an Outbox Document undeliverable"),
            "{}",
            entries[0].message
        );
        assert!(entries[0].message.contains(why), "{}", entries[0].message);
    }
    assert!(
        received.ids().is_subset(&expected),
        "no poison was published"
    );
    runtime.shutdown().await;
}

#[tokio::test]
async fn refused_stamps_publish_a_document_at_most_five_times_plus_one_probe_per_minute() {
    let (logs, _guard) = capture();
    let (emulator, cosmos) = emulator_server().await;
    let container = provisioned_with_leases(&cosmos, DB, "orders", PATHS, "orders-leases").await;
    let events = queue("stamps");
    let broker = rabbitmq::connect(BROKER_WAIT).await;
    let received = Received::consume(rabbitmq::subscribe(&broker, &events, BROKER_WAIT).await);
    let doc = pending("wedged", "o-1", &events);
    write(&container, &doc).await;

    // The store refuses every stamp until the test clears it; the suspension window (60 s) runs
    // on a manual clock the test steps, so nothing waits it out in real time.
    emulator
        .faults()
        .refuse("PATCH", 403, Duration::from_secs(3600));
    let clock = Arc::new(ManualClock::new());
    let options = fast_relay(Duration::from_secs(10))
        .suspension_clock(Arc::clone(&clock) as Arc<dyn MonotonicClock>);
    let runtime = Runtime::builder()
        .cosmos(cosmos.clone())
        .broker(broker.clone())
        .consume(false)
        .relay_options(options)
        .start()
        .await
        .unwrap();

    // Five confirmation failures come quickly (poll interval 100 ms); then the lease is suspended.
    eventually(
        Duration::from_secs(60),
        Duration::from_millis(100),
        "the lease is suspended",
        || async { !runtime.relay_suspended_leases().await.is_empty() },
    )
    .await;
    assert_eq!(
        received.count("wedged"),
        5,
        "published exactly 5 times before the suspension"
    );
    let suspended = logs.matching(Level::ERROR, "suspended draining lease");
    assert_eq!(suspended.len(), 1, "{suspended:?}");
    assert!(
        suspended[0]
            .message
            .contains("after 5 consecutive confirmation failures")
    );
    assert!(
        suspended[0]
            .field("error")
            .is_some_and(|e| e.contains("403")),
        "{:?}",
        suspended[0]
    );
    // Every confirmation failure was a change-feed fault on the lease, logged at Error.
    assert_eq!(
        logs.matching(Level::ERROR, "change feed faulted on lease")
            .len(),
        5,
        "one R8.60 log per failed page, none for refused pages"
    );

    // Many refused pages later (real time, the window not elapsed): still 5, no probe.
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(
        received.count("wedged"),
        5,
        "no probe before the window elapsed"
    );
    // 59 s of the window: still none.
    clock.advance(Duration::from_secs(59));
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(
        received.count("wedged"),
        5,
        "no probe before the window elapsed"
    );
    // The window elapsed: one probe, still refused.
    clock.advance(Duration::from_secs(1));
    eventually(
        Duration::from_secs(30),
        Duration::from_millis(100),
        "one probe",
        || async { received.count("wedged") == 6 },
    )
    .await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(received.count("wedged"), 6, "one probe per window");

    // The fault clears; the next window's probe lands and the lease resumes.
    emulator.faults().clear();
    clock.advance(Duration::from_secs(60));
    eventually(
        Duration::from_secs(60),
        Duration::from_millis(200),
        "the document is stamped delivered",
        || async { status(&container, &doc).await.as_deref() == Some("delivered") },
    )
    .await;
    assert_eq!(
        received.count("wedged"),
        7,
        "5, a refused probe, the probe that landed"
    );
    assert!(runtime.relay_suspended_leases().await.is_empty(), "resumed");
    assert_eq!(
        logs.matching(Level::INFO, "resumed draining lease").len(),
        1
    );
    runtime.shutdown().await;
}

// The document tier refuses what the configured broker could never carry, so our own handlers
// never write a poison.
#[tokio::test]
async fn a_handler_cannot_send_a_message_rabbitmq_would_refuse_every_time() {
    let (_emulator, cosmos) = emulator_server().await;
    let container = provisioned_with_leases(&cosmos, DB, "orders", PATHS, "orders-leases").await;
    let broker = rabbitmq::connect(BROKER_WAIT).await;
    let runtime = Runtime::builder()
        .cosmos(cosmos.clone())
        .broker(broker.clone())
        .consume(false)
        .without_relay()
        .start()
        .await
        .unwrap();
    for (event_id, events) in [
        ("x".repeat(300), queue("ok")),
        ("e-1".to_owned(), "amq.orders".to_owned()),
    ] {
        let command = ShipOrder {
            order_id: "o-9".into(),
            event_id,
            events,
        };
        let err = runtime.dispatch(command, "msg-9").await.unwrap_err();
        let err = ErrorChain(&err).to_string();
        assert!(
            err.contains("the broker would refuse it every time"),
            "{err}"
        );
    }
    assert!(
        find_document(&container, &[json!("o-9")], "o-9")
            .await
            .is_none(),
        "nothing committed"
    );
    let long = BrokeredMessage::json("x".repeat(256), "orders", "{}");
    assert!(
        matches!(broker.check(&long), Err(e @ BrokerError::InvalidMessage { .. }) if e.is_permanent())
    );
    runtime.shutdown().await;
}
