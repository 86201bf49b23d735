//! Telemetry through a started runtime: one trace from a delivered command through its handler
//! and the outbox to the relayed event (8.4, end to end), the failure counter fed by the
//! change feed's fault reports (R8.18, R8.60), and empty reads counted as batches (R8.13).

use std::time::Duration;

use chatter_runtime::broker::{Broker, InMemoryBroker};
use chatter_runtime::cosmos::CosmosConnection;
use chatter_runtime::{BrokeredMessage, DocumentReliable, Runtime, RuntimeBuilder};
use chatter_tests::broker::next_delivery;
use chatter_tests::relay::fast_relay;
use chatter_tests::store::{embedded, emulator_server, provisioned_with_leases};
use chatter_tests::telemetry::{Metrics, Spans};
use chatter_tests::wait::eventually;
use opentelemetry::trace::SpanKind;
use serde_json::json;

const COMMAND_TRACE: &str = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
const BATCHES: &str = "chatter.messaging.outbox.drain.batches";
const BATCH_SIZE: &str = "chatter.messaging.outbox.drain.batch.size";
const FAILURES: &str = "chatter.messaging.outbox.drain.failures";
const WAIT: Duration = Duration::from_secs(30);
const POLL: Duration = Duration::from_millis(50);

chatter_tests::event_command! {
    /// Places an order and emits `placed`.
    PlaceTracedOrder { order_id as "orderId" }
    on ("shop", "orders", "orders-leases") at "/orderId",
    handled by place, sends "placed" to "order-events"
}

fn id_of(span: &opentelemetry_sdk::trace::SpanData) -> String {
    format!("{:016x}", span.span_context.span_id())
}

// 8.4 end to end: command delivery -> `process` span -> handler -> outbox -> relay `send` span
// parented to it -> the event on the broker carrying the send span's context.
#[tokio::test]
async fn one_trace_runs_from_the_delivered_command_through_the_outbox_to_the_relayed_event() {
    let cosmos = embedded().await;
    provisioned_with_leases(&cosmos, "shop", "orders", &["/orderId"], "orders-leases").await;
    let broker = InMemoryBroker::new();
    let spans = Spans::new();
    let metrics = Metrics::new();
    let mut events = broker.subscribe("order-events").await.unwrap();
    let runtime = Runtime::builder()
        .cosmos(cosmos.clone())
        .broker(broker.clone())
        .relay_options(fast_relay(Duration::from_secs(5)))
        .tracer(spans.tracer())
        .meter(metrics.meter())
        .start()
        .await
        .unwrap();
    let destination = PlaceTracedOrder::registration().destination;
    let mut command = BrokeredMessage::json("cmd-1", destination, r#"{"orderId":"o-1"}"#);
    command
        .context
        .insert("traceparent".into(), json!(COMMAND_TRACE));
    broker.publish(command).await.unwrap();

    let event = next_delivery(&mut events, WAIT).await;
    let outgoing = event.message.context["traceparent"]
        .as_str()
        .unwrap()
        .to_owned();
    eventually(WAIT, POLL, "the process span ended", || async {
        !spans.named(&format!("process {destination}")).is_empty()
    })
    .await;
    let process = spans.named(&format!("process {destination}")).remove(0);
    let send = spans.named("send order-events").remove(0);

    assert_eq!(process.span_kind, SpanKind::Consumer);
    assert_eq!(
        format!("{:032x}", process.span_context.trace_id()),
        "0af7651916cd43dd8448eb211c80319c",
        "the handler continues the command's trace"
    );
    assert_eq!(
        format!("{:016x}", process.parent_span_id),
        "b7ad6b7169203331"
    );
    assert_eq!(
        send.span_context.trace_id(),
        process.span_context.trace_id()
    );
    assert_eq!(
        format!("{:016x}", send.parent_span_id),
        id_of(&process),
        "the send span is a child of the handler's span, through the persisted traceparent"
    );
    assert_eq!(
        outgoing,
        format!("00-0af7651916cd43dd8448eb211c80319c-{}-01", id_of(&send)),
        "the event carries the send span's context"
    );
    runtime.shutdown().await;
}

/// `shop/orders` and its leases provisioned on `cosmos`, and a runtime on it that only relays
/// (short timings), metered into `metrics`.
async fn metered_relay(cosmos: &CosmosConnection, metrics: &Metrics) -> RuntimeBuilder {
    provisioned_with_leases(cosmos, "shop", "orders", &["/orderId"], "orders-leases").await;
    Runtime::builder()
        .cosmos(cosmos.clone())
        .consume(false)
        .relay_options(fast_relay(Duration::from_secs(5)))
        .meter(metrics.meter())
}

// R8.13: an idle lease's empty reads are batches of size 0, so idle is told from stalled.
#[tokio::test]
async fn an_idle_lease_records_empty_reads_as_batches_of_size_zero() {
    let cosmos = embedded().await;
    let metrics = Metrics::new();
    let runtime = metered_relay(&cosmos, &metrics)
        .await
        .without_tracing()
        .start()
        .await
        .unwrap();
    eventually(WAIT, POLL, "two empty reads were counted", || async {
        metrics.of(BATCHES).iter().map(|p| p.number()).sum::<f64>() >= 2.0
    })
    .await;
    let sizes = metrics.of(BATCH_SIZE);
    assert!(!sizes.is_empty());
    for point in sizes {
        let chatter_tests::telemetry::Value::Histogram { sum, .. } = point.value else {
            panic!("{point:?}")
        };
        assert_eq!(sum, 0.0, "nothing was pending: {point:?}");
        assert!(
            point
                .attributes
                .contains_key("chatter.messaging.outbox.lease_token")
        );
    }
    runtime.shutdown().await;
}

// R8.18, R8.60: a change-feed fault is counted by lease and error type, beside its Error log.
#[tokio::test]
async fn a_change_feed_fault_is_counted_by_source_lease_and_error_type() {
    let (emulator, cosmos) = emulator_server().await;
    let metrics = Metrics::new();
    let runtime = metered_relay(&cosmos, &metrics)
        .await
        .start()
        .await
        .unwrap();
    // Every stamp refused: each page of the event fails as a Confirmation Failure.
    emulator
        .faults()
        .refuse("PATCH", 403, Duration::from_secs(3600));
    runtime
        .dispatch(
            PlaceTracedOrder {
                order_id: "o-2".into(),
            },
            "cmd-2",
        )
        .await
        .unwrap();
    eventually(WAIT, POLL, "the failed page was counted", || async {
        !metrics.of(FAILURES).is_empty()
    })
    .await;
    let failure = metrics.of(FAILURES).remove(0);
    assert_eq!(
        failure.attributes.get("error.type").map(String::as_str),
        Some("chatter_runtime::error::DrainError::Confirmation")
    );
    let processor = eventually_leases(&runtime).await;
    assert_eq!(
        failure
            .attributes
            .get("chatter.messaging.outbox.source_identity"),
        Some(&processor)
    );
    assert!(
        failure
            .attributes
            .contains_key("chatter.messaging.outbox.lease_token")
    );
    runtime.shutdown().await;
}

/// The relay processor's name, once the runtime's health lists a lease of it.
async fn eventually_leases(runtime: &Runtime) -> String {
    eventually(WAIT, POLL, "a lease is owned", || async {
        !runtime.health().await.leases.is_empty()
    })
    .await;
    runtime.health().await.leases[0].processor.clone()
}
