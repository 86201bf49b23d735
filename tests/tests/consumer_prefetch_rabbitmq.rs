//! Through the machine's RabbitMQ, a consumer asks the broker for a prefetch of its
//! concurrency: while its handlers block, exactly that many deliveries are held unacked and the
//! rest stay ready in the queue. Every queue is this run's own (other runs share the server).
#![cfg(feature = "rabbitmq")]

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use chatter_runtime::BrokeredMessage;
use chatter_runtime::broker::{Broker, RabbitMqBroker};
use chatter_runtime::{BoxError, DocumentReliable, HandlerContext, Runtime, handler};
use chatter_tests::broker::{assert_quiet_for, next_delivery};
use chatter_tests::rabbitmq;
use chatter_tests::runtime::registry_at;
use chatter_tests::store::{embedded, provisioned};
use chatter_tests::wait::eventually;
use lapin::options::QueueDeclareOptions;
use lapin::types::{FieldTable, ShortString};
use serde::{Deserialize, Serialize};
use serde_json::json;
use tokio::time::timeout;

const WAIT: Duration = Duration::from_secs(30);
const POLL: Duration = Duration::from_millis(20);

/// Places a hold; its handler blocks until the test opens [`OPEN`].
#[derive(Debug, Clone, Serialize, Deserialize, DocumentReliable)]
#[cosmos(database = "prefetch", container = "holds", lease = "holds-leases")]
#[partition_key(path = "/holdId")]
#[serde(rename_all = "camelCase")]
pub struct PlaceHold {
    pub hold_id: String,
}

static OPEN: AtomicBool = AtomicBool::new(false);
static STARTED: AtomicUsize = AtomicUsize::new(0);
static FINISHED: AtomicUsize = AtomicUsize::new(0);

#[handler]
async fn place_hold(command: PlaceHold, ctx: &mut HandlerContext) -> Result<(), BoxError> {
    STARTED.fetch_add(1, Ordering::SeqCst);
    while !OPEN.load(Ordering::SeqCst) {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    ctx.upsert(json!({ "id": command.hold_id, "holdId": command.hold_id }))?;
    FINISHED.fetch_add(1, Ordering::SeqCst);
    Ok(())
}

fn queue(what: &str) -> String {
    format!(
        "chatter-test-prefetch-{what}-{}",
        uuid::Uuid::new_v4().simple()
    )
}

/// How many messages of `queue` are ready (neither delivered nor unacked), as the server says.
async fn ready(channel: &lapin::Channel, queue: &str) -> u32 {
    let options = QueueDeclareOptions {
        passive: true,
        ..QueueDeclareOptions::default()
    };
    timeout(
        WAIT,
        channel.queue_declare(ShortString::from(queue), options, FieldTable::default()),
    )
    .await
    .expect("the server answers in time")
    .expect("the queue exists")
    .message_count()
}

async fn publish_all(broker: &RabbitMqBroker, queue: &str, count: usize) {
    for n in 0..count {
        let body = json!({ "holdId": format!("h-{n}") }).to_string();
        broker
            .publish(BrokeredMessage::json(format!("hold-{n}"), queue, body))
            .await
            .unwrap();
    }
}

/// Asserts for half a second that `queue` keeps `ready_count` messages ready and that `check`
/// holds.
async fn stays(channel: &lapin::Channel, queue: &str, ready_count: u32, check: impl Fn()) {
    for _ in 0..10 {
        assert_eq!(
            ready(channel, queue).await,
            ready_count,
            "ready in `{queue}`"
        );
        check();
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

// Ten commands of ten keys, a concurrency of 3, handlers that block: three start, the server
// holds back the other seven (prefetch 3); once the handlers go on, all ten commit.
#[tokio::test]
async fn a_consumer_holds_as_many_unacked_deliveries_as_its_concurrency() {
    const CONCURRENCY: usize = 3;
    const COMMANDS: usize = 10;
    let cosmos = embedded().await;
    provisioned(&cosmos, "prefetch", "holds", &["/holdId"]).await;
    let direct = rabbitmq::connect(WAIT).await;
    let commands = queue("holds");
    publish_all(&direct, &commands, COMMANDS).await;
    let runtime = Runtime::builder()
        .registry(registry_at::<PlaceHold>(&commands))
        .cosmos(cosmos)
        .broker(direct.clone())
        .without_relay()
        .consumer_concurrency(CONCURRENCY)
        .start()
        .await
        .unwrap();
    let channel = rabbitmq::foreign_channel(WAIT).await;
    eventually(
        WAIT,
        POLL,
        "as many handlers as the concurrency started",
        || {
            let started = STARTED.load(Ordering::SeqCst);
            async move { started == CONCURRENCY }
        },
    )
    .await;
    let held_back = u32::try_from(COMMANDS - CONCURRENCY).unwrap();
    eventually(WAIT, POLL, "the rest are ready in the queue", || async {
        ready(&channel, &commands).await == held_back
    })
    .await;
    stays(&channel, &commands, held_back, || {
        assert_eq!(STARTED.load(Ordering::SeqCst), CONCURRENCY);
    })
    .await;

    OPEN.store(true, Ordering::SeqCst);
    eventually(WAIT, POLL, "every command was handled", || {
        let finished = FINISHED.load(Ordering::SeqCst);
        async move { finished == COMMANDS }
    })
    .await;
    runtime.shutdown().await;
    assert_eq!(
        STARTED.load(Ordering::SeqCst),
        COMMANDS,
        "each handled once"
    );
    assert_eq!(rabbitmq::delete_queue(&direct, &commands, WAIT).await, 0);
    // The start declared its dead-letter queue too.
    let dead_letters = chatter_runtime::broker::dead_letter_destination(&commands);
    rabbitmq::delete_queue(&direct, &dead_letters, WAIT).await;
}

// The broker on its own: a subscription with a prefetch of 3 receives three deliveries and no
// fourth until one is acked, whatever `with_prefetch` says for plain subscriptions.
#[tokio::test]
async fn subscribe_with_prefetch_bounds_the_unacked_deliveries_of_that_subscription() {
    let broker = rabbitmq::connect(WAIT).await.with_prefetch(1);
    let destination = queue("broker");
    publish_all(&broker, &destination, 5).await;
    let mut subscription = timeout(WAIT, broker.subscribe_with_prefetch(&destination, 3))
        .await
        .expect("subscribes in time")
        .unwrap();
    let mut held = Vec::new();
    for _ in 0..3 {
        held.push(next_delivery(&mut subscription, WAIT).await);
    }
    assert_quiet_for(&mut subscription, Duration::from_millis(500)).await;
    let channel = rabbitmq::foreign_channel(WAIT).await;
    assert_eq!(ready(&channel, &destination).await, 2);
    held.pop().unwrap().ack().await.unwrap();
    held.push(next_delivery(&mut subscription, WAIT).await);
    assert_quiet_for(&mut subscription, Duration::from_millis(500)).await;
    for delivery in held {
        delivery.ack().await.unwrap();
    }
    drop(subscription);
    rabbitmq::delete_queue(&broker, &destination, WAIT).await;
}
