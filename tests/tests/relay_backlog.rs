//! The backlog per lease (the `chatter.messaging.outbox.backlog` gauge and `LeaseHealth::backlog`):
//! the pending Outbox Documents after each owned lease's checkpoint, right before and after a
//! feed-range split.
//!
//! The relay's stamps are refused with a real HTTP 403 by the `chatter-emulator` server, so no
//! checkpoint advances and every document stays pending while the relay keeps trying. No timed
//! assertions: every wait is a bounded poll.

use std::collections::BTreeMap;
use std::time::Duration;

use chatter_runtime::broker::InMemoryBroker;
use chatter_runtime::{Runtime, error::StartError};
use chatter_tests::relay::fast_relay;
use chatter_tests::runtime::writer;
use chatter_tests::store::{embedded, emulator_server, provisioned_with_leases};
use chatter_tests::telemetry::Metrics;
use chatter_tests::wait::eventually;

const DB: &str = "relay-backlog";
const CONTAINER: &str = "orders";
const PENDING: usize = 24;
const WAIT: Duration = Duration::from_secs(120);
const POLL: Duration = Duration::from_millis(100);
const BACKLOG: &str = "chatter.messaging.outbox.backlog";
const LEASE_TOKEN: &str = "chatter.messaging.outbox.lease_token";

chatter_tests::event_command! {
    /// Places an order and emits one event.
    PlaceBackloggedOrder { order_id as "orderId" }
    on ("relay-backlog", "orders", "orders-leases") at "/orderId",
    handled by place, sends "placed" to "order-events"
}

/// Each owned lease's last backlog, as the health report and the gauge give it.
async fn backlogs(
    runtime: &Runtime,
    metrics: &Metrics,
) -> (BTreeMap<String, Option<u64>>, BTreeMap<String, f64>) {
    let health: BTreeMap<String, Option<u64>> = runtime
        .health()
        .await
        .leases
        .into_iter()
        .map(|lease| (lease.lease_token, lease.backlog))
        .collect();
    let gauge = metrics
        .of(BACKLOG)
        .into_iter()
        .filter_map(|point| {
            let lease = point.attributes.get(LEASE_TOKEN)?.clone();
            health.contains_key(&lease).then(|| (lease, point.number()))
        })
        .collect();
    (health, gauge)
}

fn settled(
    health: &BTreeMap<String, Option<u64>>,
    gauge: &BTreeMap<String, f64>,
    leases: usize,
) -> bool {
    health.len() == leases
        && health.values().all(Option::is_some)
        && health.values().map(|b| b.unwrap_or(0)).sum::<u64>() == PENDING as u64
        && gauge.len() == leases
        && gauge.values().sum::<f64>() == PENDING as f64
}

#[tokio::test]
async fn each_lease_reports_its_own_pending_documents_before_and_after_a_split() {
    let (emulator, cosmos) = emulator_server().await;
    provisioned_with_leases(&cosmos, DB, CONTAINER, &["/orderId"], "orders-leases").await;
    let broker = InMemoryBroker::new();
    let commands = writer(&cosmos, broker.clone()).await;
    for n in 0..PENDING {
        commands
            .dispatch(
                PlaceBackloggedOrder {
                    order_id: format!("o-{n}"),
                },
                format!("cmd-{n}"),
            )
            .await
            .unwrap();
    }
    // Stamps refused: the relay publishes but never confirms, so nothing is checkpointed.
    emulator
        .faults()
        .refuse("PATCH", 403, Duration::from_secs(3600));
    let metrics = Metrics::new();
    let relay = Runtime::builder()
        .cosmos(cosmos.clone())
        .broker(broker.clone())
        .consume(false)
        .relay_options(
            fast_relay(Duration::from_secs(5)).backlog_interval(Duration::from_millis(200)),
        )
        .meter(metrics.meter())
        .without_tracing()
        .start()
        .await
        .unwrap();

    eventually(WAIT, POLL, "every lease reports its backlog", || async {
        let (health, gauge) = backlogs(&relay, &metrics).await;
        !health.is_empty() && settled(&health, &gauge, health.len())
    })
    .await;
    let leases = backlogs(&relay, &metrics).await.0.len();

    emulator
        .store()
        .split_partition(DB, CONTAINER, 0, Duration::from_millis(10));
    eventually(
        WAIT,
        POLL,
        "the split lease's children report their own documents, none twice",
        || async {
            let (health, gauge) = backlogs(&relay, &metrics).await;
            settled(&health, &gauge, leases + 1)
        },
    )
    .await;
    let (health, _) = backlogs(&relay, &metrics).await;
    assert!(
        health.values().filter(|b| b.unwrap_or(0) > 0).count() >= 2,
        "the documents are spread over several leases: {health:?}"
    );
    relay.shutdown().await;
}

#[tokio::test]
async fn a_zero_backlog_interval_is_refused() {
    let cosmos = embedded().await;
    provisioned_with_leases(&cosmos, DB, CONTAINER, &["/orderId"], "orders-leases").await;
    let error = Runtime::builder()
        .cosmos(cosmos)
        .consume(false)
        .relay_options(fast_relay(Duration::from_secs(5)).backlog_interval(Duration::ZERO))
        .start()
        .await
        .unwrap_err();
    assert!(matches!(error, StartError::Relay(_)), "{error}");
    assert!(error.to_string().contains("backlog_interval"), "{error}");
}

#[tokio::test]
async fn with_metrics_off_no_backlog_is_estimated() {
    let cosmos = embedded().await;
    provisioned_with_leases(&cosmos, DB, CONTAINER, &["/orderId"], "orders-leases").await;
    let relay = Runtime::builder()
        .cosmos(cosmos)
        .consume(false)
        .relay_options(
            fast_relay(Duration::from_secs(5)).backlog_interval(Duration::from_millis(50)),
        )
        .without_metrics()
        .start()
        .await
        .unwrap();
    eventually(WAIT, POLL, "a lease is owned", || async {
        !relay.health().await.leases.is_empty()
    })
    .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        relay
            .health()
            .await
            .leases
            .iter()
            .all(|l| l.backlog.is_none())
    );
    relay.shutdown().await;
}
