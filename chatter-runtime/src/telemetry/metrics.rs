//! The seven drain instruments, exactly as the .NET module publishes them (names, kinds, units,
//! descriptions and advised buckets), so one dashboard reads both; and chatter's own backlog
//! gauge, `drain.id_mismatches` counter (documents the pending gate turns away under an id that
//! is not their outbox id) and the stranded-document sweep's two instruments.
//!
//! Every emit site is a method of [`SourceMetrics`], reached through an
//! `Option<Arc<SourceMetrics>>`: `None` (metrics off) returns before anything is read or built.
//! With metrics on, a lease's attributes are built once and cloned after (their strings are
//! reference counted), so recording allocates nothing of ours, also when the meter is the
//! global no-op one.

use std::collections::HashMap;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{SystemTime, UNIX_EPOCH};

use opentelemetry::metrics::{Counter, Gauge, Histogram, Meter};
use opentelemetry::{KeyValue, StringValue};
use serde_json::Value;

/// The instrument names.
pub(crate) mod name {
    pub(crate) const LAG: &str = "chatter.messaging.outbox.drain.lag";
    pub(crate) const DOCUMENTS: &str = "chatter.messaging.outbox.drain.documents";
    pub(crate) const BATCH_SIZE: &str = "chatter.messaging.outbox.drain.batch.size";
    pub(crate) const BATCHES: &str = "chatter.messaging.outbox.drain.batches";
    pub(crate) const FAILURES: &str = "chatter.messaging.outbox.drain.failures";
    pub(crate) const UNDELIVERABLE: &str = "chatter.messaging.outbox.drain.undeliverable";
    pub(crate) const SUSPENSIONS: &str = "chatter.messaging.outbox.drain.suspensions";
    /// Beyond the .NET module: documents that look pending under an id that is not their
    /// outbox id, which the pending gate turns away.
    pub(crate) const ID_MISMATCHES: &str = "chatter.messaging.outbox.drain.id_mismatches";
    /// Beyond the .NET module: pending Outbox Documents behind each lease's checkpoint.
    pub(crate) const BACKLOG: &str = "chatter.messaging.outbox.backlog";
    /// Beyond the .NET module: pending Outbox Documents the sweep found behind a checkpoint.
    pub(crate) const STRANDED: &str = "chatter.messaging.outbox.stranded";
    /// Beyond the .NET module: the age of each owned lease's oldest pending Outbox Document.
    pub(crate) const PENDING_OLDEST_AGE: &str = "chatter.messaging.outbox.pending.oldest_age";
    /// Beyond the .NET module: what publish after commit did with each committed document.
    pub(crate) const AFTER_COMMIT: &str = "chatter.messaging.outbox.after_commit";
    /// Beyond the .NET module: from a batch's commit to the broker's confirm of its document,
    /// published after commit.
    pub(crate) const COMMIT_TO_PUBLISH: &str = "chatter.messaging.outbox.after_commit.duration";
}

/// The attribute keys.
pub(crate) mod attribute {
    pub(crate) const OUTCOME: &str = "chatter.messaging.outbox.drain.outcome";
    pub(crate) const SOURCE_IDENTITY: &str = "chatter.messaging.outbox.source_identity";
    pub(crate) const LEASE_TOKEN: &str = "chatter.messaging.outbox.lease_token";
    pub(crate) const ERROR_TYPE: &str = "error.type";
    pub(crate) const AFTER_COMMIT_OUTCOME: &str = "chatter.messaging.outbox.after_commit.outcome";
    pub(crate) const AFTER_COMMIT_REASON: &str = "chatter.messaging.outbox.after_commit.reason";
}

/// The advised bucket boundaries of `after_commit.duration`, in seconds.
const COMMIT_TO_PUBLISH_BUCKETS: [f64; 12] = [
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
];

/// The advised bucket boundaries of `drain.lag`, in seconds.
const LAG_BUCKETS: [f64; 12] = [
    0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 600.0,
];
/// The advised bucket boundaries of `drain.batch.size`, in documents.
const BATCH_SIZE_BUCKETS: [f64; 10] =
    [1.0, 2.0, 5.0, 10.0, 25.0, 50.0, 100.0, 250.0, 500.0, 1000.0];

/// The representable `_ts` range, in Unix seconds: 0001-01-01 to 9999-12-31, as .NET's
/// `DateTimeOffset` has it. A `_ts` outside it records no lag.
const TS_RANGE: std::ops::RangeInclusive<i64> = -62_135_596_800..=253_402_300_799;

/// What happened after one commit, per document (the `after_commit` counter's attributes).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum AfterCommitOutcome {
    /// Published and stamped delivered.
    Published,
    /// Never publishable: stamped `undeliverable` (logged at Error), as the relay would.
    Undeliverable,
    /// Judged undeliverable, but another writer decided a newer version first (a requeue, a
    /// delivered stamp): that stands.
    Superseded,
    /// Left to the relay.
    Left(LeftBecause),
}

/// Why a committed document was left to the relay.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum LeftBecause {
    /// Another Outbox Document of its partition-key value was pending.
    EarlierPending,
    /// A lease of the container's processor is failing (or was, a moment ago, for this path).
    RelayFailing,
    /// The pending check could not be read.
    CheckFailed,
    /// Its publish failed (or was not tried, after an earlier document of the batch failed).
    PublishFailed,
    /// Published, but its stamp did not land: the relay here stamps it (another process's
    /// may publish it again).
    StampFailed,
    /// The pending check's reads never showed the batch's own documents (a stale replica).
    StaleRead,
    /// A document of the batch was stamped by another process's relay before the check.
    SettledElsewhere,
    /// Too many dispatches were running already (a slow broker, a burst).
    Busy,
}

impl AfterCommitOutcome {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Self::Published => "published",
            Self::Undeliverable => "undeliverable",
            Self::Superseded => "superseded",
            Self::Left(_) => "left_to_relay",
        }
    }

    pub(crate) fn reason(self) -> Option<&'static str> {
        match self {
            Self::Left(LeftBecause::EarlierPending) => Some("earlier_pending"),
            Self::Left(LeftBecause::RelayFailing) => Some("relay_failing"),
            Self::Left(LeftBecause::CheckFailed) => Some("check_failed"),
            Self::Left(LeftBecause::PublishFailed) => Some("publish_failed"),
            Self::Left(LeftBecause::StampFailed) => Some("stamp_failed"),
            Self::Left(LeftBecause::StaleRead) => Some("stale_read"),
            Self::Left(LeftBecause::SettledElsewhere) => Some("settled_elsewhere"),
            Self::Left(LeftBecause::Busy) => Some("busy"),
            _ => None,
        }
    }
}

/// How a document handed to the relay resolved (`drain.documents`' outcome). A failure is no
/// outcome: a publish that failed records none.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum DrainOutcome {
    /// A pending Outbox Document, published.
    Admitted,
    /// Not a pending Outbox Document: never drained.
    Skipped,
    /// A pending document a standalone relay's resolver built no message for: stamped
    /// delivered, nothing published.
    Dropped,
}

impl DrainOutcome {
    fn as_str(self) -> &'static str {
        match self {
            Self::Admitted => "admitted",
            Self::Skipped => "skipped",
            Self::Dropped => "dropped",
        }
    }
}

/// The instruments, built once per runtime from its meter.
#[derive(Debug)]
pub(crate) struct DrainInstruments {
    lag: Histogram<f64>,
    documents: Counter<u64>,
    batch_size: Histogram<u64>,
    batches: Counter<u64>,
    failures: Counter<u64>,
    undeliverable: Counter<u64>,
    suspensions: Counter<u64>,
    id_mismatches: Counter<u64>,
    backlog: Gauge<u64>,
    stranded: Counter<u64>,
    pending_oldest_age: Gauge<f64>,
    after_commit: Counter<u64>,
    commit_to_publish: Histogram<f64>,
}

impl DrainInstruments {
    pub(crate) fn new(meter: &Meter) -> Self {
        Self {
            lag: meter
                .f64_histogram(name::LAG)
                .with_unit("s")
                .with_description("Age of an Outbox Document when the Outbox Relay admitted it.")
                .with_boundaries(LAG_BUCKETS.to_vec())
                .build(),
            documents: meter
                .u64_counter(name::DOCUMENTS)
                .with_unit("{document}")
                .with_description(
                    "Number of Outbox Documents the Outbox Relay resolved, by outcome.",
                )
                .build(),
            batch_size: meter
                .u64_histogram(name::BATCH_SIZE)
                .with_unit("{document}")
                .with_description(
                    "Number of documents in one change-feed batch handed to the Outbox Relay.",
                )
                .with_boundaries(BATCH_SIZE_BUCKETS.to_vec())
                .build(),
            batches: meter
                .u64_counter(name::BATCHES)
                .with_unit("{batch}")
                .with_description(
                    "Number of change-feed batches the Outbox Relay handled, by lease.",
                )
                .build(),
            failures: meter
                .u64_counter(name::FAILURES)
                .with_unit("{failure}")
                .with_description("Number of drain attempts that faulted, by lease and error type.")
                .build(),
            undeliverable: meter
                .u64_counter(name::UNDELIVERABLE)
                .with_unit("{document}")
                .with_description(
                    "Number of Outbox Documents the Outbox Relay marked undeliverable.",
                )
                .build(),
            suspensions: meter
                .u64_counter(name::SUSPENSIONS)
                .with_unit("{suspension}")
                .with_description("Number of times the Outbox Relay suspended draining, by lease.")
                .build(),
            id_mismatches: meter
                .u64_counter(name::ID_MISMATCHES)
                .with_unit("{document}")
                .with_description(
                    "Number of documents that look like pending Outbox Documents under an id that \
                     is not the outbox id of their MessageId, which the Outbox Relay skips.",
                )
                .build(),
            backlog: meter
                .u64_gauge(name::BACKLOG)
                .with_unit("{document}")
                .with_description(
                    "Pending Outbox Documents after the checkpoint of a lease, as last estimated.",
                )
                .build(),
            stranded: meter
                .u64_counter(name::STRANDED)
                .with_unit("{document}")
                .with_description(
                    "Number of pending Outbox Documents found behind their lease's checkpoint and \
                     put back on the change feed.",
                )
                .build(),
            pending_oldest_age: meter
                .f64_gauge(name::PENDING_OLDEST_AGE)
                .with_unit("s")
                .with_description(
                    "Age of the oldest pending Outbox Document of a lease's feed range, as last \
                     swept (0 when none is pending).",
                )
                .build(),
            after_commit: meter
                .u64_counter(name::AFTER_COMMIT)
                .with_unit("{document}")
                .with_description(
                    "Number of committed Outbox Documents publish after commit handled, by \
                     outcome (published, undeliverable, superseded, left_to_relay) and why it left one to \
                     the relay.",
                )
                .build(),
            commit_to_publish: meter
                .f64_histogram(name::COMMIT_TO_PUBLISH)
                .with_unit("s")
                .with_description(
                    "Time from a batch's commit to the broker's confirm of an Outbox Document \
                     published after commit.",
                )
                .with_boundaries(COMMIT_TO_PUBLISH_BUCKETS.to_vec())
                .build(),
        }
    }
}

/// The instruments as one change-feed source (one relay processor) records them: its
/// `source_identity` attribute and each lease's attributes, built once.
#[derive(Debug)]
pub(crate) struct SourceMetrics {
    instruments: Arc<DrainInstruments>,
    source_identity: StringValue,
    leases: Mutex<HashMap<String, [KeyValue; 2]>>,
}

impl SourceMetrics {
    pub(crate) fn new(instruments: Arc<DrainInstruments>, source_identity: &str) -> Self {
        Self {
            instruments,
            source_identity: StringValue::from(Arc::<str>::from(source_identity)),
            leases: Mutex::default(),
        }
    }

    /// `source_identity` and `lease_token`, built on a lease's first measurement.
    fn lease(&self, lease_token: &str) -> [KeyValue; 2] {
        let mut leases = self.leases.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(attributes) = leases.get(lease_token) {
            return attributes.clone();
        }
        let attributes = [
            KeyValue::new(attribute::SOURCE_IDENTITY, self.source_identity.clone()),
            KeyValue::new(
                attribute::LEASE_TOKEN,
                StringValue::from(Arc::<str>::from(lease_token)),
            ),
        ];
        leases.insert(lease_token.to_owned(), attributes.clone());
        attributes
    }

    /// One change-feed page of `size` documents handed to the relay for `lease_token` (empty
    /// reads included, as size 0): `batch.size` and `batches` over one attribute set.
    pub(crate) fn batch(&self, lease_token: &str, size: usize) {
        guarded(|| {
            let attributes = self.lease(lease_token);
            let size = u64::try_from(size).unwrap_or(u64::MAX);
            self.instruments.batch_size.record(size, &attributes);
            self.instruments.batches.add(1, &attributes);
        });
    }

    /// The age of a document publish after commit admitted, from its batch's commit (it has
    /// no `_ts` of its own in this process: it was never read back).
    pub(crate) fn lag_since_commit(&self, age: std::time::Duration) {
        guarded(|| self.instruments.lag.record(age.as_secs_f64(), &[]));
    }

    /// What publish after commit did with one committed document.
    pub(crate) fn after_commit(&self, outcome: AfterCommitOutcome) {
        guarded(|| {
            let mut attributes = vec![
                KeyValue::new(attribute::SOURCE_IDENTITY, self.source_identity.clone()),
                KeyValue::new(attribute::AFTER_COMMIT_OUTCOME, outcome.as_str()),
            ];
            if let Some(reason) = outcome.reason() {
                attributes.push(KeyValue::new(attribute::AFTER_COMMIT_REASON, reason));
            }
            self.instruments.after_commit.add(1, &attributes);
        });
    }

    /// From a batch's commit to its document's confirm, published after commit.
    pub(crate) fn commit_to_publish(&self, took: std::time::Duration) {
        guarded(|| {
            self.instruments.commit_to_publish.record(
                took.as_secs_f64(),
                &[KeyValue::new(
                    attribute::SOURCE_IDENTITY,
                    self.source_identity.clone(),
                )],
            );
        });
    }

    /// One document resolved with `outcome`.
    pub(crate) fn document(&self, outcome: DrainOutcome) {
        guarded(|| {
            self.instruments
                .documents
                .add(1, &[KeyValue::new(attribute::OUTCOME, outcome.as_str())]);
        });
    }

    /// The age of an admitted document from its `_ts` (Cosmos' write time, in seconds), clamped
    /// at 0 (the host's clock may run behind the account's). Nothing without a `_ts` in range.
    pub(crate) fn lag(&self, document: &Value) {
        let Some(lag) = lag_seconds(document, SystemTime::now()) else {
            return;
        };
        guarded(|| self.instruments.lag.record(lag, &[]));
    }

    /// One change-feed fault of `lease_token` (a read, a page, a checkpoint), by error type.
    pub(crate) fn failure(&self, lease_token: &str, error_type: &'static str) {
        guarded(|| {
            let [source, lease] = self.lease(lease_token);
            self.instruments.failures.add(
                1,
                &[
                    source,
                    lease,
                    KeyValue::new(attribute::ERROR_TYPE, error_type),
                ],
            );
        });
    }

    /// One document stamped `undeliverable` (no attributes: one document may break several
    /// rules, and one value could not name them all; the log carries them).
    pub(crate) fn undeliverable(&self) {
        guarded(|| self.instruments.undeliverable.add(1, &[]));
    }

    /// One Drain Suspension opened on `lease_token` (only the opening: a further failure while
    /// it is open re-arms it and is not a new suspension).
    pub(crate) fn suspension(&self, lease_token: &str) {
        guarded(|| {
            let attributes = self.lease(lease_token);
            self.instruments.suspensions.add(1, &attributes);
        });
    }

    /// One document that looks pending under an id that is not the outbox id of its
    /// `MessageId`, skipped (by source: a writer's mistake shows where it writes).
    pub(crate) fn id_mismatch(&self) {
        guarded(|| {
            self.instruments.id_mismatches.add(
                1,
                &[KeyValue::new(
                    attribute::SOURCE_IDENTITY,
                    self.source_identity.clone(),
                )],
            );
        });
    }

    /// The last backlog estimate of `lease_token`.
    pub(crate) fn backlog(&self, lease_token: &str, pending: u64) {
        guarded(|| {
            let attributes = self.lease(lease_token);
            self.instruments.backlog.record(pending, &attributes);
        });
    }
}

impl SourceMetrics {
    /// One pending document found behind `lease_token`'s checkpoint.
    pub(crate) fn stranded(&self, lease_token: &str) {
        guarded(|| {
            let attributes = self.lease(lease_token);
            self.instruments.stranded.add(1, &attributes);
        });
    }

    /// The age (seconds) of `lease_token`'s oldest pending document at the last sweep.
    pub(crate) fn oldest_pending_age(&self, lease_token: &str, seconds: f64) {
        guarded(|| {
            let attributes = self.lease(lease_token);
            self.instruments
                .pending_oldest_age
                .record(seconds, &attributes);
        });
    }
}

/// Runs one measurement; a meter that panics never takes the relay (or a log beside it) down.
fn guarded(measure: impl FnOnce()) {
    let _ = catch_unwind(AssertUnwindSafe(measure));
}

/// `now - _ts` in seconds, at least 0; `None` without an integer `_ts` in [`TS_RANGE`].
fn lag_seconds(document: &Value, now: SystemTime) -> Option<f64> {
    let ts = document
        .get("_ts")?
        .as_i64()
        .filter(|ts| TS_RANGE.contains(ts))?;
    let now = match now.duration_since(UNIX_EPOCH) {
        Ok(since) => since.as_secs_f64(),
        Err(before) => -before.duration().as_secs_f64(),
    };
    // i64 seconds within the range convert to f64 exactly.
    #[allow(clippy::cast_precision_loss)]
    let written = ts as f64;
    Some((now - written).max(0.0))
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use serde_json::json;

    use super::*;

    fn at(seconds: u64) -> SystemTime {
        UNIX_EPOCH + Duration::from_secs(seconds)
    }

    // R8.02
    #[test]
    fn lag_is_the_age_of_the_document_from_its_ts() {
        let lag = lag_seconds(&json!({ "_ts": 1_000 }), at(1_300)).unwrap();
        assert!((lag - 300.0).abs() < 1e-9, "{lag}");
    }

    // R8.03
    #[test]
    fn a_ts_in_the_future_records_zero_never_a_negative_lag() {
        assert_eq!(lag_seconds(&json!({ "_ts": 5_000 }), at(1_400)), Some(0.0));
    }

    // R8.04
    #[test]
    fn a_ts_outside_the_representable_dates_records_nothing() {
        assert_eq!(
            lag_seconds(&json!({ "_ts": 253_402_300_800_i64 }), at(1)),
            None
        );
        assert_eq!(
            lag_seconds(&json!({ "_ts": -62_135_596_801_i64 }), at(1)),
            None
        );
        assert_eq!(lag_seconds(&json!({ "_ts": u64::MAX }), at(1)), None);
    }

    // R8.05
    #[test]
    fn a_document_without_an_integer_ts_records_no_lag() {
        assert_eq!(lag_seconds(&json!({ "id": "x" }), at(1)), None);
        assert_eq!(lag_seconds(&json!({ "_ts": "1000" }), at(2_000)), None);
    }
}
