//! Off means off (catalog 8.3): with metrics off every emit site returns before it allocates,
//! and with instruments from a meter nothing listens to (the global no-op provider, what
//! `start()` finds when the application installed none) recording allocates nothing either.
//!
//! One test in its own binary: the counting allocator counts every thread of the process.

use std::alloc::System;
use std::sync::Arc;

use chatter_runtime::broker::InMemoryBroker;
use chatter_runtime::registration::PartitionKeyPath;
use chatter_runtime::testing::{
    DeliverySettings, Drain, drain_with_telemetry, record_every_instrument,
};
use chatter_tests::store::{embedded, provisioned};
use serde_json::json;
use stats_alloc::{INSTRUMENTED_SYSTEM, Region, StatsAlloc};

#[global_allocator]
static GLOBAL: &StatsAlloc<System> = &INSTRUMENTED_SYSTEM;

const KEY: &[PartitionKeyPath] = &[PartitionKeyPath {
    path: "/tenantId",
    pointer: "/tenantId",
}];

// R8.30, R8.32, R8.63
#[test]
fn no_emit_site_allocates_with_metrics_off_or_with_nothing_listening() {
    let tokio = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let container = tokio.block_on(async {
        let cosmos = embedded().await;
        provisioned(&cosmos, "shop", "orders", &["/tenantId"]).await
    });
    let drain = || {
        Drain::new(
            "source-a",
            Arc::new(InMemoryBroker::new()),
            container.clone(),
            KEY,
            DeliverySettings::default(),
        )
    };
    let document = json!({ "id": "outbox:x", "_ts": 1_700_000_000 });

    let off = drain_with_telemetry(drain(), None, None);
    let region = Region::new(GLOBAL);
    for _ in 0..100 {
        record_every_instrument(&off, "lease-7", &document);
    }
    let change = region.change();
    assert_eq!(
        (change.allocations, change.bytes_allocated),
        (0, 0),
        "metrics off: {change:?}"
    );

    let unheard = drain_with_telemetry(
        drain(),
        Some(opentelemetry::global::meter("nothing listens")),
        None,
    );
    // A lease's attributes are built on its first measurement, then reused.
    record_every_instrument(&unheard, "lease-7", &document);
    let region = Region::new(GLOBAL);
    for _ in 0..100 {
        record_every_instrument(&unheard, "lease-7", &document);
    }
    let change = region.change();
    assert_eq!(
        (change.allocations, change.bytes_allocated),
        (0, 0),
        "no listener: {change:?}"
    );
}
