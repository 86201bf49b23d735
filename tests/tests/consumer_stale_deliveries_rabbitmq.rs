//! After a channel loss, deliveries that were prefetched into a key lane before it are stale:
//! the server has requeued them and delivers them again. The consumer drops them without
//! running the handler and without publishing a retry copy, so each message is handled once
//! more at most (the one in flight at the cut), not twice. RabbitMQ through a TCP proxy that
//! cuts the connection.
#![cfg(feature = "rabbitmq")]

use std::time::Duration;

use chatter_runtime::BrokeredMessage;
use chatter_runtime::broker::{Broker, RabbitMqBroker};
use chatter_runtime::{BoxError, DocumentReliable, HandlerContext, Runtime, handler};
use chatter_tests::proxy::TcpProxy;
use chatter_tests::rabbitmq;
use chatter_tests::runtime::{Attempts, registry_at};
use chatter_tests::store::{embedded, find_document, provisioned};
use chatter_tests::wait::eventually;
use serde::{Deserialize, Serialize};
use serde_json::json;

const WAIT: Duration = Duration::from_secs(60);
const POLL: Duration = Duration::from_millis(20);
const MESSAGES: usize = 16;

/// Records a reading of one meter; every reading of the test is on one meter (one key), so they
/// are handled one after another.
#[derive(Debug, Clone, Serialize, Deserialize, DocumentReliable)]
#[cosmos(database = "stale", container = "readings", lease = "readings-leases")]
#[partition_key(path = "/meter")]
pub struct RecordReading {
    pub meter: String,
}

static CALLS: Attempts = Attempts::new();

#[handler]
async fn record(command: RecordReading, ctx: &mut HandlerContext) -> Result<(), BoxError> {
    CALLS.record(ctx.message_id());
    // Slow enough that the cut finds most readings waiting in the lane.
    tokio::time::sleep(Duration::from_millis(150)).await;
    ctx.upsert(json!({ "id": ctx.message_id(), "meter": command.meter }))?;
    Ok(())
}

fn total_calls() -> usize {
    (0..MESSAGES).map(|n| CALLS.of(&format!("r-{n}"))).sum()
}

#[tokio::test]
async fn deliveries_waiting_in_a_lane_when_the_channel_closes_are_not_handled() {
    let cosmos = embedded().await;
    let readings = provisioned(&cosmos, "stale", "readings", &["/meter"]).await;
    let direct = rabbitmq::connect(WAIT).await;
    let queue = format!("chatter-test-stale-{}", uuid::Uuid::new_v4().simple());
    for n in 0..MESSAGES {
        let body = json!({ "meter": "m-1" }).to_string();
        direct
            .publish(BrokeredMessage::json(format!("r-{n}"), &queue, body))
            .await
            .unwrap();
    }
    let proxy = TcpProxy::start(rabbitmq::server_addr()).await;
    let broker = RabbitMqBroker::connect(&rabbitmq::uri_through(&proxy))
        .await
        .unwrap();
    let runtime = Runtime::builder()
        .registry(registry_at::<RecordReading>(&queue))
        .cosmos(cosmos)
        .broker(broker)
        .without_relay()
        .consumer_concurrency(MESSAGES)
        .start()
        .await
        .unwrap();
    eventually(WAIT, POLL, "the first reading is being handled", || async {
        total_calls() >= 1
    })
    .await;
    // Every delivery is prefetched (prefetch 16) and all but the first wait in the key's lane.
    proxy.cut_for(Duration::from_secs(1));
    eventually(WAIT, POLL, "every reading committed", || async {
        for n in 0..MESSAGES {
            if find_document(&readings, &[json!("m-1")], &format!("r-{n}"))
                .await
                .is_none()
            {
                return false;
            }
        }
        true
    })
    .await;
    // Let redeliveries settle, then count.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let calls = total_calls();
    // Each message once, plus the ones in flight at the cut (one per key: at most two, if the
    // cut fell between two readings), handled again as duplicates after the server requeued them.
    assert!(
        (MESSAGES..=MESSAGES + 2).contains(&calls),
        "{calls} handler calls for {MESSAGES} messages"
    );
    runtime.shutdown().await;
    rabbitmq::delete_queue(&direct, &queue, WAIT).await;
    // The start declared its dead-letter queue too.
    let dead_letters = chatter_runtime::broker::dead_letter_destination(&queue);
    rabbitmq::delete_queue(&direct, &dead_letters, WAIT).await;
}

/// Charges a card; its first attempt fails, so a retry copy is due after the redelivery delay.
#[derive(Debug, Clone, Serialize, Deserialize, DocumentReliable)]
#[cosmos(database = "stale", container = "charges", lease = "charges-leases")]
#[partition_key(path = "/card")]
pub struct ChargeCard {
    pub card: String,
}

static CHARGES: Attempts = Attempts::new();

#[handler]
async fn charge(command: ChargeCard, ctx: &mut HandlerContext) -> Result<(), BoxError> {
    if CHARGES.record(ctx.message_id()) == 1 {
        return Err("the card network is busy".into());
    }
    ctx.upsert(json!({ "id": ctx.message_id(), "card": command.card }))?;
    Ok(())
}

#[tokio::test]
async fn a_retry_copy_is_not_published_when_the_channel_closed_during_its_delay() {
    const REDELIVERY_DELAY: Duration = Duration::from_secs(3);
    let cosmos = embedded().await;
    let charges = provisioned(&cosmos, "stale", "charges", &["/card"]).await;
    let direct = rabbitmq::connect(WAIT).await;
    let queue = format!("chatter-test-stale-retry-{}", uuid::Uuid::new_v4().simple());
    let body = json!({ "card": "c-1" }).to_string();
    direct
        .publish(BrokeredMessage::json("charge-1", &queue, body))
        .await
        .unwrap();
    let proxy = TcpProxy::start(rabbitmq::server_addr()).await;
    let broker = RabbitMqBroker::connect(&rabbitmq::uri_through(&proxy))
        .await
        .unwrap();
    let runtime = Runtime::builder()
        .registry(registry_at::<ChargeCard>(&queue))
        .cosmos(cosmos)
        .broker(broker)
        .without_relay()
        .redelivery_delay(REDELIVERY_DELAY)
        .start()
        .await
        .unwrap();
    eventually(WAIT, POLL, "the first attempt failed", || async {
        CHARGES.of("charge-1") >= 1
    })
    .await;
    // The retry copy waits for the redelivery delay; the channel closes meanwhile, so the server
    // requeues the original and delivers it again.
    proxy.cut_for(Duration::from_secs(1));
    eventually(WAIT, POLL, "the charge committed", || async {
        find_document(&charges, &[json!("c-1")], "charge-1")
            .await
            .is_some()
    })
    .await;
    // Past the delay, when a copy would have been published and handled.
    tokio::time::sleep(REDELIVERY_DELAY * 2).await;
    assert_eq!(
        CHARGES.of("charge-1"),
        2,
        "the failed attempt and the redelivered original; no retry copy besides"
    );
    runtime.shutdown().await;
    assert_eq!(rabbitmq::delete_queue(&direct, &queue, WAIT).await, 0);
    let dead_letters = chatter_runtime::broker::dead_letter_destination(&queue);
    rabbitmq::delete_queue(&direct, &dead_letters, WAIT).await;
}
