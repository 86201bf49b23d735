//! OpenTelemetry: the relay's drain metrics, and trace context through the outbox.
//!
//! # Turning it on
//!
//! [`start()`](crate::start) takes the global meter and tracer provider at that moment (set them
//! with `opentelemetry::global::set_meter_provider` / `set_tracer_provider` first), under the
//! scopes [`METER_NAME`] and [`TRACER_NAME`]. Or hand the builder your own:
//! [`RuntimeBuilder::meter`](crate::RuntimeBuilder::meter) and
//! [`RuntimeBuilder::tracer`](crate::RuntimeBuilder::tracer);
//! [`without_metrics`](crate::RuntimeBuilder::without_metrics) and
//! [`without_tracing`](crate::RuntimeBuilder::without_tracing) turn either off. Off means off:
//! no instrument exists and every emit site returns before it reads a clock or builds an
//! attribute. The always-on Error logs (a faulted lease, a suspension, an undeliverable
//! document) go through `tracing` whatever is chosen here.
//!
//! # Metrics
//!
//! | instrument | kind | unit | recorded | attributes |
//! | --- | --- | --- | --- | --- |
//! | `chatter.messaging.outbox.drain.lag` | histogram (f64) | `s` | per admitted document with a `_ts`, before it is published: its age (clamped at 0); for one published after commit, the time since its commit | none |
//! | `chatter.messaging.outbox.drain.documents` | counter | `{document}` | per document of a page, once it resolved | `chatter.messaging.outbox.drain.outcome`: `admitted` (the broker confirmed its publish; a failed publish records nothing) or `skipped` (not a pending Outbox Document) |
//! | `chatter.messaging.outbox.drain.batch.size` | histogram (u64) | `{document}` | per change-feed read of a lease, an empty one as 0 | source identity, lease token |
//! | `chatter.messaging.outbox.drain.batches` | counter | `{batch}` | with `batch.size` | source identity, lease token |
//! | `chatter.messaging.outbox.drain.failures` | counter | `{failure}` | per lease fault (a read, a page, a checkpoint or renewal) | source identity, lease token, `error.type` |
//! | `chatter.messaging.outbox.drain.undeliverable` | counter | `{document}` | per document stamped `undeliverable` | none |
//! | `chatter.messaging.outbox.drain.suspensions` | counter | `{suspension}` | per Drain Suspension opened | source identity, lease token |
//! | `chatter.messaging.outbox.drain.id_mismatches` | counter | `{document}` | per document that looks pending (`_chatterType` `outbox`, `status` `pending`) under an id that is not the outbox id of its `MessageId` (`outbox:` and the unpadded base64url of the `MessageId`, [`outbox_id`](crate::cosmos::outbox_id)): skipped and never published (beyond the .NET module; also logged at Warn, at most once a minute) | source identity |
//! | `chatter.messaging.outbox.backlog` | gauge (u64) | `{document}` | per owned lease, every [backlog interval](crate::relay::RelayOptions::backlog_interval): pending Outbox Documents after its checkpoint | source identity, lease token |
//! | `chatter.messaging.outbox.stranded` | counter | `{document}` | per pending document the [sweep](crate::relay::RelayOptions::sweep_interval) found behind its lease's checkpoint (logged at Error and written back so it is published) | source identity, lease token |
//! | `chatter.messaging.outbox.pending.oldest_age` | gauge (f64) | `s` | per owned lease, every [sweep interval](crate::relay::RelayOptions::sweep_interval): the age of the oldest pending Outbox Document of its feed range (by its `_ts`), 0 when none | source identity, lease token |
//! | `chatter.messaging.outbox.after_commit` | counter | `{document}` | per Outbox Document a command's batch committed, when publish after commit ([`RuntimeBuilder::publish_after_commit`](crate::RuntimeBuilder::publish_after_commit)) handled it | source identity, `chatter.messaging.outbox.after_commit.outcome` (`published`, `undeliverable`, `superseded`, `left_to_relay`), and when left `chatter.messaging.outbox.after_commit.reason` (`earlier_pending`, `relay_failing`, `check_failed`, `publish_failed`, `stamp_failed`, `stale_read`, `settled_elsewhere`, `busy`) |
//! | `chatter.messaging.outbox.after_commit.duration` | histogram (f64) | `s` | per document published after commit: from the batch's commit to the broker's confirm | source identity |
//!
//! The source identity (`chatter.messaging.outbox.source_identity`) is the relay processor's
//! name, the one its leases carry; the lease token (`chatter.messaging.outbox.lease_token`) is
//! the feed range. The histograms advise the .NET module's bucket boundaries, so a .NET and a
//! Rust relay of one container can share a dashboard.
//!
//! # Trace context
//!
//! - A delivered command is handled under a Consumer span `process {destination}`, child of the
//!   command's `traceparent`.
//! - [`HandlerContext::send`](crate::HandlerContext::send) persists the current trace context
//!   with the message (a `traceparent` in its context, see [`TRACEPARENT`]), so the outbox
//!   document remembers the trace that wrote it.
//! - The relay publishes each document under a Producer span `send {destination}` whose parent
//!   is that persisted context (a new root without one) and which links the context the drain
//!   runs in. The outgoing message carries the send span's `traceparent`; the stored document
//!   is never changed, so a document published twice gives two send spans under one parent.
//! - With tracing off, or when the span is sampled out, the persisted `traceparent` goes out as
//!   it is.
//!
#![doc = include_str!("../../docs/telemetry.md")]

pub(crate) mod metrics;
pub(crate) mod trace_context;

pub use trace_context::TRACEPARENT;

use std::sync::Arc;

use opentelemetry::InstrumentationScope;
use opentelemetry::global::{self, BoxedTracer};
use opentelemetry::metrics::Meter;

use metrics::DrainInstruments;
use trace_context::SharedTracer;

/// The instrumentation scope of chatter's metrics: the .NET module's meter name, so one
/// subscription reads both.
pub const METER_NAME: &str = "Chatter.MessageBrokers.Reliability.Cosmos";

/// The instrumentation scope of chatter's spans (`process` and `send`): the .NET broker layer's
/// source name, which owns those spans there too.
pub const TRACER_NAME: &str = "Chatter.MessageBrokers";

/// Where the runtime gets a meter or a tracer from.
#[derive(Debug, Default)]
pub(crate) enum Source<T> {
    /// The global provider, at `start()`.
    #[default]
    Global,
    /// The application's.
    Given(T),
    /// None: off.
    Off,
}

/// What the runtime records with: `None` is off.
#[derive(Debug, Clone, Default)]
pub(crate) struct Telemetry {
    pub(crate) metrics: Option<Arc<DrainInstruments>>,
    pub(crate) tracer: SharedTracer,
}

fn scope(name: &'static str) -> InstrumentationScope {
    InstrumentationScope::builder(name)
        .with_version(env!("CARGO_PKG_VERSION"))
        .build()
}

impl Telemetry {
    /// Resolves the builder's choices (the global providers are read now).
    pub(crate) fn resolve(meter: Source<Meter>, tracer: Source<BoxedTracer>) -> Self {
        let meter = match meter {
            Source::Global => Some(global::meter_with_scope(scope(METER_NAME))),
            Source::Given(meter) => Some(meter),
            Source::Off => None,
        };
        let tracer = match tracer {
            Source::Global => Some(global::tracer_with_scope(scope(TRACER_NAME))),
            Source::Given(tracer) => Some(tracer),
            Source::Off => None,
        };
        Self {
            metrics: meter.map(|meter| Arc::new(DrainInstruments::new(&meter))),
            tracer: tracer.map(Arc::new),
        }
    }
}
