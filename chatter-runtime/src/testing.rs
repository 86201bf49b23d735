//! Internals for chatter's own integration tests (feature `test-support`).
//!
//! The tests in `tests/` drive pieces of the relay and the document tier directly: a drain with
//! a manual clock, the Drain Suspension gate, the Monitored Container Contract on hand-made
//! settings, the store calls that plant documents. Nothing here is part of the public API and
//! nothing here is stable; an application never enables this feature.

pub use crate::cosmos::store::{
    BatchOperation, BatchOperationOutcome, BatchOutcome, ContainerSettings, WriteOutcome,
    create_item, execute_batch, patch_item, read_container_properties, upsert_item,
};
pub use crate::document::outbox::OutboxDocument;
pub use crate::document::outbox_contract::{
    VerifiedOutboxDocument, verify as verify_outbox_document,
};
pub use crate::registry::Registry;
pub use crate::relay::contract::{verify, verify_all};
pub use crate::relay::delivery::DeliverySettings;
pub use crate::relay::drain::{Drain, DrainReport};
pub use crate::relay::error::DrainError;
pub use crate::relay::identity::{RelaySource, SourceIdentity, distinct_sources};
pub use crate::relay::in_flight::InFlightLimit;
pub use crate::relay::suspension::{
    Admission, CONFIRMATION_FAILURE_THRESHOLD, ConfirmationReceipt, DrainGate, ManualClock,
    MonotonicClock, SUSPENSION_WINDOW,
};

/// `drain` recording its metrics on `meter` and starting its `send` spans on `tracer` (either
/// may be `None`: off), as the runtime builds it.
pub fn drain_with_telemetry(
    drain: Drain,
    meter: Option<opentelemetry::metrics::Meter>,
    tracer: Option<opentelemetry::global::BoxedTracer>,
) -> Drain {
    use crate::telemetry::{Source, Telemetry};
    let meter = meter.map_or(Source::Off, Source::Given);
    let tracer = tracer.map_or(Source::Off, Source::Given);
    drain.with_telemetry(&Telemetry::resolve(meter, tracer))
}

/// Calls every metric emit site of `drain` once, as the drain, the change-feed fault report and
/// the backlog estimate do; with metrics off each returns at its first check.
pub fn record_every_instrument(drain: &Drain, lease_token: &str, document: &serde_json::Value) {
    use crate::telemetry::metrics::DrainOutcome;
    let Some(metrics) = drain.metrics() else {
        return;
    };
    metrics.batch(lease_token, 3);
    metrics.document(DrainOutcome::Admitted);
    metrics.document(DrainOutcome::Skipped);
    metrics.lag(document);
    metrics.failure(lease_token, "chatter_runtime::error::DrainError::Publish");
    metrics.undeliverable();
    metrics.suspension(lease_token);
    metrics.id_mismatch();
    metrics.backlog(lease_token, 3);
}

/// `drain` on the standalone relay's resolver path: each admitted document's message built by a
/// resolver `factory` makes for it.
pub fn drain_with_resolver<F, R>(drain: Drain, factory: F) -> Drain
where
    F: Fn() -> R + Send + Sync + 'static,
    R: crate::relay::BodyResolver,
{
    drain.with_resolver(Some(crate::relay::resolver::factory(factory)))
}

/// `drain` admitting only the pending documents `filter` also accepts, as a standalone relay's
/// additional pending filter.
pub fn drain_with_pending_filter(
    drain: Drain,
    filter: impl Fn(&serde_json::Value) -> bool + Send + Sync + 'static,
) -> Drain {
    drain.with_pending_filter(Some(std::sync::Arc::new(filter)))
}

/// Every document the SQL query `sql` selects from `container`, across its partitions.
pub async fn query_all(
    container: &azure_data_cosmos::clients::ContainerClient,
    sql: &str,
) -> Result<Vec<serde_json::Value>, crate::cosmos::CosmosStoreError> {
    let mut found = Vec::new();
    crate::cosmos::store::query_each(container, azure_data_cosmos::Query::from(sql), |doc| {
        found.push(doc)
    })
    .await?;
    Ok(found)
}

/// The root fields chatter writes on the documents it puts in a command's container, at which
/// no partition-key path may be rooted: the Outbox Document's, the inbox marker's, and the
/// delivered stamp's. (`chatter-macros` cannot import them: its compile-fail case names each,
/// and a test holds the case to this list.)
pub fn reserved_root_fields() -> std::collections::BTreeSet<&'static str> {
    use crate::document::{inbox_marker, outbox};
    outbox::OUTBOX_RESERVED_ROOT_FIELDS
        .into_iter()
        .chain(inbox_marker::INBOX_MARKER_RESERVED_ROOT_FIELDS)
        .chain(outbox::RELAY_STAMPED_PATHS.map(|path| path.trim_start_matches('/')))
        .collect()
}

/// Skews the clock the calling thread reads by `millis` (negative: behind), as an instance
/// whose clock is off: the inbox's claims and markers, the sweep's ages, and the change-feed
/// processor's lease expiry and lease timestamps. The simulation runs each instance on a
/// thread of its own.
pub fn skew_clock(millis: i64) {
    cosmos_change_feed::testing::skew_clock(millis);
}
