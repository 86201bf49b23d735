//! R8.62: a meter whose instruments panic when they record neither stops the relay nor silences
//! its always-on logs: metric and log sinks are isolated. The drain runs on real documents in a
//! `chatter-emulator` server, with stamps refused by its fault injection.
//!
//! The one test double is [`PanickingInstruments`], an OpenTelemetry instrument provider whose
//! every instrument panics on each measurement: no real meter fails on demand.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use chatter_runtime::BrokeredMessage;
use chatter_runtime::broker::InMemoryBroker;
use chatter_runtime::cosmos;
use chatter_runtime::registration::PartitionKeyPath;
use chatter_runtime::testing::{
    CONFIRMATION_FAILURE_THRESHOLD, DeliverySettings, Drain, ManualClock, OutboxDocument,
    drain_with_telemetry, record_every_instrument,
};
use chatter_tests::logs;
use chatter_tests::store::{created, document, emulator_server, provisioned};
use opentelemetry::KeyValue;
use opentelemetry::metrics::{
    Counter, Gauge, Histogram, HistogramBuilder, InstrumentBuilder, InstrumentProvider, Meter,
    SyncInstrument,
};
use serde_json::{Value, json};
use tracing::Level;

const PATHS: &[&str] = &["/tenantId"];
const KEY: &[PartitionKeyPath] = &[PartitionKeyPath {
    path: "/tenantId",
    pointer: "/tenantId",
}];

/// How many measurements the panicking instruments were asked for: proof the drain did record.
static MEASUREMENTS: AtomicUsize = AtomicUsize::new(0);

/// An instrument that panics on every measurement.
struct Panicking;

impl<T> SyncInstrument<T> for Panicking {
    fn measure(&self, _measurement: T, _attributes: &[KeyValue]) {
        MEASUREMENTS.fetch_add(1, Ordering::SeqCst);
        panic!("this meter panics on every measurement");
    }
}

/// Hands out only [`Panicking`] instruments (for the kinds the drain creates).
struct PanickingInstruments;

impl InstrumentProvider for PanickingInstruments {
    fn u64_counter(&self, _builder: InstrumentBuilder<'_, Counter<u64>>) -> Counter<u64> {
        Counter::new(Arc::new(Panicking))
    }

    fn u64_gauge(&self, _builder: InstrumentBuilder<'_, Gauge<u64>>) -> Gauge<u64> {
        Gauge::new(Arc::new(Panicking))
    }

    fn f64_histogram(&self, _builder: HistogramBuilder<'_, Histogram<f64>>) -> Histogram<f64> {
        Histogram::new(Arc::new(Panicking))
    }

    fn u64_histogram(&self, _builder: HistogramBuilder<'_, Histogram<u64>>) -> Histogram<u64> {
        Histogram::new(Arc::new(Panicking))
    }
}

fn panicking_meter() -> Meter {
    Meter::new(Arc::new(PanickingInstruments))
}

#[tokio::test]
async fn a_meter_that_panics_leaves_the_drain_publishing_stamping_and_logging() {
    let (logs, _guard) = logs::capture();
    let (emulator, cosmos) = emulator_server().await;
    let container = provisioned(&cosmos, "shop", "orders", PATHS).await;
    let broker = InMemoryBroker::new();
    let drain = drain_with_telemetry(
        Drain::new(
            "chatter-cosmos-outbox-relay:source-a",
            Arc::new(broker.clone()),
            container.clone(),
            KEY,
            DeliverySettings::default(),
        )
        .with_clock(Arc::new(ManualClock::new())),
        Some(panicking_meter()),
        None,
    );
    let stored = |doc: Value| {
        let container = container.clone();
        async move { created(&container, &[json!("t")], &doc).await }
    };
    let pending = |message_id: &str| {
        let message = BrokeredMessage::json(message_id, "orders", r#"{"orderId":7}"#);
        OutboxDocument::build(&message, PATHS, &[json!("t")]).unwrap()
    };

    // Every emit site, called directly: none lets the panic out.
    record_every_instrument(&drain, "0", &pending("msg-direct"));
    let direct = MEASUREMENTS.load(Ordering::SeqCst);
    assert!(direct > 0, "the emit sites measured on the panicking meter");

    // A good document is published and stamped delivered.
    let good = stored(pending("msg-good")).await;
    let report = drain.drain("0", &[good]).await.unwrap();
    assert_eq!(broker.pending_count("orders"), 1, "{report:?}");
    let id = cosmos::outbox_id("msg-good").unwrap();
    assert_eq!(
        document(&container, &[json!("t")], &id).await["status"],
        "delivered"
    );

    // A poison document is stamped undeliverable and still logged at Error.
    let mut poison = pending("msg-poison");
    poison["Destination"] = json!(" ");
    let poison = stored(poison).await;
    let report = drain.drain("0", &[poison]).await.unwrap();
    assert_eq!(report.undeliverable, 1);
    assert_eq!(
        logs.matching(Level::ERROR, "marked an Outbox Document undeliverable")
            .len(),
        1,
        "{:?}",
        logs.entries()
    );

    // Refused stamps open a suspension, which is still logged at Error.
    let refused = stored(pending("msg-refused")).await;
    emulator
        .faults()
        .refuse("PATCH", 403, Duration::from_secs(3600));
    for _ in 0..CONFIRMATION_FAILURE_THRESHOLD {
        assert!(
            drain
                .drain("lease-7", std::slice::from_ref(&refused))
                .await
                .is_err()
        );
    }
    assert_eq!(drain.gate().suspended_leases(), ["lease-7"]);
    assert_eq!(
        logs.matching(Level::ERROR, "suspended draining lease lease-7")
            .len(),
        1,
        "{:?}",
        logs.entries()
    );
    assert!(
        MEASUREMENTS.load(Ordering::SeqCst) > direct,
        "the drains recorded on the panicking meter too"
    );
}
