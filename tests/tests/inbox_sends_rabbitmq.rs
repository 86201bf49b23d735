//! A standalone-inbox command whose handler did its side effect and sent a message, when the
//! broker goes away right after: the handler is not run again, and the message it sent is not
//! lost. It committed with the marker's completion, and the relay of the idempotency container
//! publishes it once RabbitMQ is back.
//!
//! Real parts: the embedded store, RabbitMQ at 127.0.0.1:5672 reached through a `TcpProxy` that
//! the handler cuts (a real network fault, at the one moment that matters).
#![cfg(feature = "rabbitmq")]

use std::sync::OnceLock;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use chatter_runtime::broker::{Broker, RabbitMqBroker};
use chatter_runtime::cosmos::{CosmosConnection, inbox_id};
use chatter_runtime::provision;
use chatter_runtime::{
    BoxError, BrokeredMessage, DocumentReliable, HandlerContext, Runtime, handler,
};
use chatter_tests::broker::next_delivery;
use chatter_tests::proxy::TcpProxy;
use chatter_tests::rabbitmq;
use chatter_tests::runtime::registry_at;
use chatter_tests::store::find_document;
use chatter_tests::wait::eventually;
use serde::{Deserialize, Serialize};
use serde_json::json;

const WAIT: Duration = Duration::from_secs(120);

/// Charges a card, then tells the shop: a side effect outside Cosmos and a sent message.
#[derive(Debug, Serialize, Deserialize, DocumentReliable)]
#[inbox(database = "cards", container = "charges", lease = "charges-leases")]
pub struct ChargeCard {
    pub amount: u32,
}

/// How often the card was charged.
static CHARGES: AtomicUsize = AtomicUsize::new(0);
/// The proxy between chatter and RabbitMQ, cut by the first charge.
static PROXY: OnceLock<TcpProxy> = OnceLock::new();
/// Where the charge is announced.
static CHARGED: OnceLock<String> = OnceLock::new();

#[handler]
async fn charge_card(command: ChargeCard, ctx: &mut HandlerContext) -> Result<(), BoxError> {
    if CHARGES.fetch_add(1, Ordering::SeqCst) == 0 {
        // The card is charged; now the broker is unreachable for longer than a publish waits.
        PROXY
            .get()
            .expect("the proxy runs")
            .cut_for(Duration::from_secs(5));
    }
    ctx.send_json(
        &format!("{}:Charged", ctx.message_id()),
        CHARGED.get().expect("a destination"),
        &json!({ "amount": command.amount }),
    )?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broker_outage_after_the_side_effect_neither_runs_the_handler_again_nor_loses_its_send() {
    let cosmos = CosmosConnection::embedded().await.unwrap();
    provision::ensure_for::<ChargeCard>(&cosmos).await.unwrap();
    let suffix = uuid::Uuid::new_v4().simple().to_string();
    let queue = format!("charge-card-{suffix}");
    let charged = CHARGED.get_or_init(|| format!("card-charged-{suffix}"));
    PROXY
        .set(TcpProxy::start(rabbitmq::server_addr()).await)
        .expect("one test sets the proxy");
    let proxy = PROXY.get().expect("the proxy runs");
    let direct = rabbitmq::connect(WAIT).await;
    let mut announcements = rabbitmq::subscribe(&direct, charged, WAIT).await;
    let broker = RabbitMqBroker::connect_retrying(&rabbitmq::uri_through(proxy), WAIT)
        .await
        .unwrap()
        .with_publish_timeout(Duration::from_secs(1));
    let runtime = Runtime::builder()
        .cosmos(cosmos.clone())
        .broker(broker)
        .registry(registry_at::<ChargeCard>(&queue))
        .redelivery_delay(Duration::from_millis(50))
        .start()
        .await
        .unwrap();
    let body = json!({ "amount": 42 }).to_string();
    direct
        .publish(BrokeredMessage::json("charge-1", queue.clone(), body))
        .await
        .unwrap();

    let announcement = next_delivery(&mut announcements, WAIT).await;
    assert_eq!(announcement.message.message_id, "charge-1:Charged");
    announcement.ack().await.unwrap();
    let c = cosmos.container("cards", "charges").await.unwrap();
    let marker = find_document(&c, &[json!("charge-1")], &inbox_id("charge-1").unwrap()).await;
    assert_eq!(marker.unwrap()["Completed"], true);
    // The delivery that lost its channel comes back once RabbitMQ is reachable: a duplicate.
    eventually(
        WAIT,
        Duration::from_millis(200),
        "the command's queue is empty",
        || async { rabbitmq::messages(&queue) == Some(0) },
    )
    .await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(
        CHARGES.load(Ordering::SeqCst),
        1,
        "the card was charged once although publishing failed after it"
    );
    runtime.shutdown().await;
    rabbitmq::delete_emptied(&direct, &[queue.as_str(), charged.as_str()], WAIT).await;
}
