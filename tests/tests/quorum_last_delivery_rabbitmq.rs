//! A RabbitMQ quorum queue drops a message whose delivery count passes its `x-delivery-limit`
//! when it is returned: the queue's last delivery of a message, held in a key lane behind a
//! slow delivery of the same key, is dead-lettered (not returned) at a shutdown and after a
//! channel loss, and one the server hands the runtime's client after shutdown began (the
//! prefetch a settled delivery frees) is never returned to be dropped, so it never vanishes.
#![cfg(feature = "rabbitmq")]

use std::time::Duration;

use chatter_runtime::broker::{Broker, RabbitMqBroker};
use chatter_runtime::{
    BoxError, BrokeredMessage, DocumentReliable, HandlerContext, Runtime,
    broker::dead_letter_destination, constants::DEAD_LETTER_REASON_CONTEXT_KEY, handler,
};
use chatter_tests::broker::acked;
use chatter_tests::proxy::TcpProxy;
use chatter_tests::rabbitmq;
use chatter_tests::runtime::registry_named;
use chatter_tests::store::{embedded, provisioned};
use chatter_tests::wait::eventually;
use serde::{Deserialize, Serialize};
use serde_json::json;
use tokio::sync::Notify;

const WAIT: Duration = Duration::from_secs(30);

/// The queues' delivery limit: above the commands' single attempt, as the start requires.
const DELIVERY_LIMIT: i32 = 2;

/// Signals of one test's slow delivery: it started, and it may finish.
struct Slow {
    started: Notify,
    release: Notify,
}

impl Slow {
    const fn new() -> Self {
        Self {
            started: Notify::const_new(),
            release: Notify::const_new(),
        }
    }

    /// Runs the slow delivery: says it started, then waits to be released.
    async fn run(&self) {
        self.started.notify_one();
        self.release.notified().await;
    }
}

static AT_SHUTDOWN: Slow = Slow::new();
static AT_CHANNEL_LOSS: Slow = Slow::new();
static AT_SHUTDOWN_PREFETCHED: Slow = Slow::new();

/// Packs an order; the step "slow" holds its key until the test releases it.
#[derive(Debug, Clone, Serialize, Deserialize, DocumentReliable)]
#[cosmos(database = "accounts", container = "users", lease = "users-leases")]
#[partition_key(path = "/userId")]
#[chatter(
    destination = "chatter-test-quorum-last-shutdown",
    max_delivery_attempts = 1
)]
#[serde(rename_all = "camelCase")]
pub struct PackOrder {
    pub user_id: String,
    pub step: String,
}

#[handler]
async fn pack_order(command: PackOrder, ctx: &mut HandlerContext) -> Result<(), BoxError> {
    if command.step == "slow" {
        AT_SHUTDOWN.run().await;
    }
    let id = format!("{}-{}", command.user_id, command.step);
    ctx.upsert(json!({ "id": id, "userId": command.user_id }))?;
    Ok(())
}

/// Labels an order; the step "slow" holds its key until the test releases it.
#[derive(Debug, Clone, Serialize, Deserialize, DocumentReliable)]
#[cosmos(database = "accounts", container = "users", lease = "users-leases")]
#[partition_key(path = "/userId")]
#[chatter(
    destination = "chatter-test-quorum-last-loss",
    max_delivery_attempts = 1
)]
#[serde(rename_all = "camelCase")]
pub struct LabelOrder {
    pub user_id: String,
    pub step: String,
}

#[handler]
async fn label_order(command: LabelOrder, ctx: &mut HandlerContext) -> Result<(), BoxError> {
    if command.step == "slow" {
        AT_CHANNEL_LOSS.run().await;
    }
    let id = format!("{}-{}", command.user_id, command.step);
    ctx.upsert(json!({ "id": id, "userId": command.user_id }))?;
    Ok(())
}

/// Ships an order; the step "slow" holds the consumer's only slot until the test releases it.
#[derive(Debug, Clone, Serialize, Deserialize, DocumentReliable)]
#[cosmos(database = "accounts", container = "users", lease = "users-leases")]
#[partition_key(path = "/userId")]
#[chatter(
    destination = "chatter-test-quorum-last-prefetched",
    max_delivery_attempts = 1
)]
#[serde(rename_all = "camelCase")]
pub struct ShipOrder {
    pub user_id: String,
    pub step: String,
}

#[handler]
async fn ship_order(command: ShipOrder, ctx: &mut HandlerContext) -> Result<(), BoxError> {
    if command.step == "slow" {
        AT_SHUTDOWN_PREFETCHED.run().await;
    }
    let id = format!("{}-{}", command.user_id, command.step);
    ctx.upsert(json!({ "id": id, "userId": command.user_id }))?;
    Ok(())
}

/// Declares `queue` afresh as a quorum queue with [`DELIVERY_LIMIT`], and empties its
/// dead-letter queue.
async fn declare_quorum(direct: &RabbitMqBroker, queue: &str) {
    use lapin::options::{QueueDeclareOptions, QueueDeleteOptions};
    use lapin::types::{AMQPValue, FieldTable, LongString, ShortString};

    rabbitmq::delete_queue(direct, &dead_letter_destination(queue), WAIT).await;
    let foreign = rabbitmq::foreign_channel(WAIT).await;
    foreign
        .queue_delete(ShortString::from(queue), QueueDeleteOptions::default())
        .await
        .unwrap();
    let mut arguments = FieldTable::default();
    arguments.insert(
        ShortString::from("x-queue-type"),
        AMQPValue::LongString(LongString::from("quorum")),
    );
    arguments.insert(
        ShortString::from("x-delivery-limit"),
        AMQPValue::LongInt(DELIVERY_LIMIT),
    );
    let durable = QueueDeclareOptions {
        durable: true,
        ..QueueDeclareOptions::default()
    };
    foreign
        .queue_declare(ShortString::from(queue), durable, arguments)
        .await
        .unwrap();
}

/// A consumer of `queue` that takes one message before the runtime's (a higher priority,
/// prefetch 1), on a channel of its own.
async fn priority_consumer(queue: &str) -> (lapin::Channel, lapin::Consumer) {
    use lapin::options::{BasicConsumeOptions, BasicQosOptions};
    use lapin::types::{AMQPValue, FieldTable, ShortString};

    let channel = rabbitmq::foreign_channel(WAIT).await;
    channel
        .basic_qos(1, BasicQosOptions::default())
        .await
        .unwrap();
    let mut arguments = FieldTable::default();
    arguments.insert(ShortString::from("x-priority"), AMQPValue::LongInt(10));
    let consumer = channel
        .basic_consume(
            ShortString::from(queue),
            ShortString::from("crashing"),
            BasicConsumeOptions::default(),
            arguments,
        )
        .await
        .unwrap();
    (channel, consumer)
}

/// Publishes `message` while the runtime consumes its queue, and has it reach the runtime as
/// the queue's last delivery: higher-priority consumers take it first and crash holding it
/// ([`DELIVERY_LIMIT`] times, each next one subscribed before the last crashes, so the runtime
/// never sees it in between).
async fn publish_as_last(direct: &RabbitMqBroker, message: BrokeredMessage) {
    use futures::StreamExt;
    use lapin::types::ShortString;

    let queue = message.destination.clone();
    let mut holding = priority_consumer(&queue).await;
    direct.publish(message).await.unwrap();
    for crash in 0..DELIVERY_LIMIT {
        let got = tokio::time::timeout(WAIT, holding.1.next())
            .await
            .expect("the crashing consumer gets the message")
            .expect("a delivery")
            .expect("no error");
        drop(got);
        let next = (crash + 1 < DELIVERY_LIMIT).then_some(());
        let after = match next {
            Some(()) => Some(priority_consumer(&queue).await),
            None => None,
        };
        holding
            .0
            .close(200, ShortString::from("crash"))
            .await
            .unwrap();
        match after {
            Some(consumer) => holding = consumer,
            None => break,
        }
    }
}

fn command(queue: &str, id: &str, step: &str) -> BrokeredMessage {
    BrokeredMessage::json(
        id,
        queue,
        json!({ "userId": "u-last", "step": step }).to_string(),
    )
}

// A slow delivery holds its key; the queue's last delivery of another message of the same key
// waits behind it when the runtime shuts down. Returned, the queue would drop it (its count
// would pass the limit): it is dead-lettered instead.
#[tokio::test]
async fn a_last_delivery_waiting_behind_its_key_at_shutdown_is_dead_lettered_not_returned() {
    let cosmos = embedded().await;
    provisioned(&cosmos, "accounts", "users", &["/userId"]).await;
    let queue = PackOrder::DOCUMENT_RELIABILITY.destination;
    let dead_letters = dead_letter_destination(queue);
    let direct = rabbitmq::connect(WAIT).await;
    declare_quorum(&direct, queue).await;
    let runtime = Runtime::builder()
        .registry(registry_named("PackOrder"))
        .cosmos(cosmos)
        .broker(direct.clone())
        .without_relay()
        .start()
        .await
        .unwrap();
    direct
        .publish(command(queue, "slow", "slow"))
        .await
        .unwrap();
    AT_SHUTDOWN.started.notified().await;
    publish_as_last(&direct, command(queue, "last", "last")).await;
    eventually(
        WAIT,
        Duration::from_millis(50),
        "the runtime holds both",
        || async { rabbitmq::unsettled(queue) == Some(2) },
    )
    .await;

    // Shutdown is requested (the spawned task cancels at its first poll, on this test's single
    // thread) before the slow delivery ends, so the last one is still waiting then.
    let stopping = tokio::spawn(runtime.shutdown());
    tokio::task::yield_now().await;
    AT_SHUTDOWN.release.notify_one();
    stopping.await.unwrap();

    let mut letters = rabbitmq::subscribe(&direct, &dead_letters, WAIT).await;
    let found = acked(&mut letters, 1, WAIT).await;
    assert_eq!(found[0].message_id, "last");
    assert!(
        found[0].context[DEAD_LETTER_REASON_CONTEXT_KEY]
            .as_str()
            .is_some_and(|why| why.contains("drops it unless this delivery settles it")),
        "{:?}",
        found[0].context
    );
    drop(letters);
    rabbitmq::delete_emptied(&direct, &[queue, dead_letters.as_str()], WAIT).await;
}

// The runtime's connection is cut while a slow delivery holds its key and the queue's last
// delivery of another message of the same key waits behind it. The server requeues both, and
// the last one's count passes the limit: RabbitMQ 3.10 drops it (the queue shows only the slow
// one). The runtime's copy is all that remains, so it is dead-lettered, not discarded.
#[tokio::test]
async fn a_last_delivery_waiting_behind_its_key_at_a_channel_loss_is_dead_lettered_not_discarded() {
    let cosmos = embedded().await;
    provisioned(&cosmos, "accounts", "users", &["/userId"]).await;
    let queue = LabelOrder::DOCUMENT_RELIABILITY.destination;
    let dead_letters = dead_letter_destination(queue);
    let direct = rabbitmq::connect(WAIT).await;
    declare_quorum(&direct, queue).await;
    let proxy = TcpProxy::start(rabbitmq::server_addr()).await;
    let through = RabbitMqBroker::connect(&rabbitmq::uri_through(&proxy))
        .await
        .unwrap();
    let runtime = Runtime::builder()
        .registry(registry_named("LabelOrder"))
        .cosmos(cosmos)
        .broker(through)
        .without_relay()
        .start()
        .await
        .unwrap();
    direct
        .publish(command(queue, "slow", "slow"))
        .await
        .unwrap();
    AT_CHANNEL_LOSS.started.notified().await;
    publish_as_last(&direct, command(queue, "last", "last")).await;
    eventually(
        WAIT,
        Duration::from_millis(50),
        "the runtime holds both",
        || async { rabbitmq::unsettled(queue) == Some(2) },
    )
    .await;

    proxy.cut_for(Duration::from_millis(200));
    eventually(
        WAIT,
        Duration::from_millis(50),
        "the queue requeued the slow delivery and dropped the last one",
        || async { rabbitmq::messages(queue) == Some(1) && rabbitmq::unsettled(queue) != Some(2) },
    )
    .await;
    AT_CHANNEL_LOSS.release.notify_one();

    let mut letters = rabbitmq::subscribe(&direct, &dead_letters, WAIT).await;
    let found = acked(&mut letters, 1, WAIT).await;
    assert_eq!(found[0].message_id, "last");
    // The slow one's redelivery (not the last: its count is 1) holds its key again.
    AT_CHANNEL_LOSS.release.notify_one();
    eventually(
        WAIT,
        Duration::from_millis(100),
        "the slow one, delivered again, is settled",
        || async { rabbitmq::messages(queue) == Some(0) },
    )
    .await;
    runtime.shutdown().await;
    drop(letters);
    rabbitmq::delete_emptied(&direct, &[queue, dead_letters.as_str()], WAIT).await;
}

// One delivery at a time (prefetch 1): a slow delivery is in progress when shutdown is
// requested, and the queue's last delivery of another message waits in the queue. Settling the
// slow one frees the prefetch; the server hands the last one to a consumer that takes nothing
// any more, and the channel's close would return it to a queue that drops it. The runtime
// cancels its consumer first and dead-letters a last delivery its client still holds, so the
// message ends in its queue or in its dead letters, never nowhere.
#[tokio::test]
async fn a_last_delivery_prefetched_after_shutdown_began_is_kept_not_returned_to_be_dropped() {
    let cosmos = embedded().await;
    provisioned(&cosmos, "accounts", "users", &["/userId"]).await;
    let queue = ShipOrder::DOCUMENT_RELIABILITY.destination;
    let dead_letters = dead_letter_destination(queue);
    let direct = rabbitmq::connect(WAIT).await;
    declare_quorum(&direct, queue).await;
    // The runtime's own connection, closed after its shutdown so nothing it still holds stays
    // unsettled on a channel the test's connection keeps open.
    let own = rabbitmq::connect(WAIT).await;
    let runtime = Runtime::builder()
        .registry(registry_named("ShipOrder"))
        .cosmos(cosmos)
        .broker(own.clone())
        .without_relay()
        .consumer_concurrency(1)
        .start()
        .await
        .unwrap();
    direct
        .publish(command(queue, "slow", "slow"))
        .await
        .unwrap();
    AT_SHUTDOWN_PREFETCHED.started.notified().await;
    publish_as_last(&direct, command(queue, "last", "last")).await;
    eventually(
        WAIT,
        Duration::from_millis(50),
        "the runtime holds the slow one and the last one waits in the queue",
        || async { rabbitmq::unsettled(queue) == Some(1) && rabbitmq::messages(queue) == Some(2) },
    )
    .await;

    let stopping = tokio::spawn(runtime.shutdown());
    tokio::task::yield_now().await;
    AT_SHUTDOWN_PREFETCHED.release.notify_one();
    stopping.await.unwrap();
    own.close().await.unwrap();
    eventually(
        WAIT,
        Duration::from_millis(50),
        "nothing is held unsettled any more",
        || async { rabbitmq::unsettled(queue) == Some(0) },
    )
    .await;

    let in_queue = rabbitmq::delete_queue(&direct, queue, WAIT).await;
    let dead_lettered = rabbitmq::delete_queue(&direct, &dead_letters, WAIT).await;
    assert_eq!(
        (in_queue, dead_lettered),
        if in_queue == 1 { (1, 0) } else { (0, 1) },
        "the last delivery is kept: in its queue or dead-lettered"
    );
}
