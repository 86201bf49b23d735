//! The drain's metrics and `send` spans (catalog 8.1, 8.2, 8.4), on a drain of real documents in
//! a `chatter-emulator` server, measured with the OpenTelemetry SDK's in-memory exporters.
//!
//! The one test double is [`FailingBroker`], a broker whose every publish fails: the moment a
//! publish fails is what rows R8.07 and R8.46 are about.

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use chatter_emulator::RunningEmulator;
use chatter_runtime::BrokeredMessage;
use chatter_runtime::broker::{Broker, BrokerError, InMemoryBroker, Subscription};
use chatter_runtime::cosmos::{self, ContainerClient};
use chatter_runtime::registration::PartitionKeyPath;
use chatter_runtime::testing::{
    DeliverySettings, Drain, ManualClock, OutboxDocument, drain_with_telemetry,
};
use chatter_tests::broker::next_delivery;
use chatter_tests::store::{created, document, emulator_server, provisioned};
use chatter_tests::telemetry::{Metrics, Spans, Value as Measured};
use futures::FutureExt;
use futures::future::BoxFuture;
use opentelemetry::context::FutureExt as _;
use opentelemetry::trace::{
    Span as _, SpanKind, Status, TraceContextExt, Tracer, TracerProvider as _,
};
use opentelemetry_sdk::trace::Sampler;
use serde_json::{Value, json};

const PATHS: &[&str] = &["/tenantId"];
const KEY: &[PartitionKeyPath] = &[PartitionKeyPath {
    path: "/tenantId",
    pointer: "/tenantId",
}];
const SOURCE: &str = "chatter-cosmos-outbox-relay:source-a";
const PERSISTED: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

const LAG: &str = "chatter.messaging.outbox.drain.lag";
const DOCUMENTS: &str = "chatter.messaging.outbox.drain.documents";
const BATCH_SIZE: &str = "chatter.messaging.outbox.drain.batch.size";
const BATCHES: &str = "chatter.messaging.outbox.drain.batches";
const UNDELIVERABLE: &str = "chatter.messaging.outbox.drain.undeliverable";
const SUSPENSIONS: &str = "chatter.messaging.outbox.drain.suspensions";
const ID_MISMATCHES: &str = "chatter.messaging.outbox.drain.id_mismatches";
const OUTCOME: &str = "chatter.messaging.outbox.drain.outcome";
const SOURCE_IDENTITY: &str = "chatter.messaging.outbox.source_identity";
const LEASE_TOKEN: &str = "chatter.messaging.outbox.lease_token";

/// A broker that refuses every publish with a transient error (test double: a failed publish
/// at a chosen moment).
#[derive(Clone)]
struct FailingBroker;

impl Broker for FailingBroker {
    fn publish(&self, message: BrokeredMessage) -> BoxFuture<'_, Result<(), BrokerError>> {
        async move {
            Err(BrokerError::Timeout {
                operation: format!("publish `{}`", message.message_id),
                after: Duration::ZERO,
                source: None,
            })
        }
        .boxed()
    }

    fn subscribe<'a>(
        &'a self,
        destination: &'a str,
    ) -> BoxFuture<'a, Result<Subscription, BrokerError>> {
        async move {
            Err(BrokerError::Timeout {
                operation: format!("subscribe `{destination}`"),
                after: Duration::ZERO,
                source: None,
            })
        }
        .boxed()
    }
}

struct Fixture {
    emulator: RunningEmulator,
    container: Arc<ContainerClient>,
    broker: InMemoryBroker,
    metrics: Metrics,
    spans: Spans,
}

impl Fixture {
    async fn new() -> Self {
        Self::sampled(Sampler::AlwaysOn).await
    }

    async fn sampled(sampler: Sampler) -> Self {
        let (emulator, cosmos) = emulator_server().await;
        let container = provisioned(&cosmos, "shop", "orders", PATHS).await;
        Self {
            emulator,
            container,
            broker: InMemoryBroker::new(),
            metrics: Metrics::new(),
            spans: Spans::with_sampler(sampler),
        }
    }

    fn drain_on(&self, broker: Arc<dyn Broker>) -> Drain {
        let drain = Drain::new(
            SOURCE,
            broker,
            self.container.clone(),
            KEY,
            DeliverySettings::default(),
        )
        .with_clock(Arc::new(ManualClock::new()));
        drain_with_telemetry(drain, Some(self.metrics.meter()), Some(self.spans.tracer()))
    }

    fn drain(&self) -> Drain {
        self.drain_on(Arc::new(self.broker.clone()))
    }

    /// A pending document stored in tenant `t`, as the change feed hands it over; its message
    /// context carries `traceparent` when given.
    async fn pending(&self, message_id: &str, traceparent: Option<&str>) -> Value {
        let mut message = BrokeredMessage::json(message_id, "orders", r#"{"orderId":7}"#);
        if let Some(traceparent) = traceparent {
            message
                .context
                .insert("traceparent".into(), json!(traceparent));
        }
        let doc = OutboxDocument::build(&message, PATHS, &[json!("t")]).unwrap();
        self.store(doc).await
    }

    async fn store(&self, doc: Value) -> Value {
        created(&self.container, &[doc["tenantId"].clone()], &doc).await
    }

    fn sum(&self, name: &str, attribute: Option<(&str, &str)>) -> f64 {
        self.metrics
            .of(name)
            .iter()
            .filter(|p| {
                attribute.is_none_or(|(k, v)| p.attributes.get(k).map(String::as_str) == Some(v))
            })
            .map(|p| p.number())
            .sum()
    }
}

fn now_seconds() -> i64 {
    i64::try_from(
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_secs(),
    )
    .unwrap()
}

// R8.01, R8.02, R8.05, R8.12: one admitted document, its lag from `_ts`, and the skipped ones.
#[tokio::test]
async fn a_page_records_its_size_its_outcomes_and_the_lag_of_what_it_admitted() {
    let f = Fixture::new().await;
    let mut aged = f.pending("msg-aged", None).await;
    aged["_ts"] = json!(now_seconds() - 300);
    let mut untimed = f.pending("msg-untimed", None).await;
    untimed.as_object_mut().unwrap().remove("_ts");
    let domain = json!({ "id": "order-1", "tenantId": "t", "status": "placed" });
    f.drain()
        .drain("lease-3", &[aged, domain, untimed])
        .await
        .unwrap();

    assert_eq!(f.sum(DOCUMENTS, Some((OUTCOME, "admitted"))), 2.0);
    assert_eq!(f.sum(DOCUMENTS, Some((OUTCOME, "skipped"))), 1.0);
    let lag = f.metrics.of(LAG);
    assert_eq!(lag.len(), 1, "{lag:?}");
    assert!(
        lag[0].attributes.is_empty(),
        "the lag carries no attributes"
    );
    let Measured::Histogram { count, sum, .. } = &lag[0].value else {
        panic!("{lag:?}")
    };
    assert_eq!(*count, 1, "only the document with a `_ts` records a lag");
    assert!((299.0..=330.0).contains(sum), "lag {sum}");

    let size = f.metrics.of(BATCH_SIZE);
    assert_eq!(size.len(), 1);
    assert_eq!(size[0].attributes.get(LEASE_TOKEN).unwrap(), "lease-3");
    assert_eq!(size[0].attributes.get(SOURCE_IDENTITY).unwrap(), SOURCE);
    let Measured::Histogram { count, sum, .. } = size[0].value else {
        panic!()
    };
    assert_eq!((count, sum), (1, 3.0));
    let batches = f.metrics.of(BATCHES);
    assert_eq!(batches.len(), 1);
    assert_eq!(
        batches[0].attributes, size[0].attributes,
        "one attribute set for both"
    );
    assert_eq!(batches[0].number(), 1.0);
}

// R8.37: the instruments' metadata, as the .NET module publishes it.
#[tokio::test]
async fn the_instruments_carry_the_specified_units_descriptions_and_buckets() {
    let f = Fixture::new().await;
    let doc = f.pending("msg-1", None).await;
    f.drain().drain("0", &[doc]).await.unwrap();
    let points = f.metrics.points();
    let find = |name: &str| points.iter().find(|p| p.name == name).unwrap().clone();
    let lag = find(LAG);
    assert_eq!(lag.unit, "s");
    assert_eq!(
        lag.description,
        "Age of an Outbox Document when the Outbox Relay admitted it."
    );
    let Measured::Histogram { bounds, .. } = &lag.value else {
        panic!()
    };
    assert_eq!(
        bounds,
        &[
            0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 600.0
        ]
    );
    let size = find(BATCH_SIZE);
    assert_eq!(size.unit, "{document}");
    assert_eq!(
        size.description,
        "Number of documents in one change-feed batch handed to the Outbox Relay."
    );
    let Measured::Histogram { bounds, .. } = &size.value else {
        panic!()
    };
    assert_eq!(
        bounds,
        &[1.0, 2.0, 5.0, 10.0, 25.0, 50.0, 100.0, 250.0, 500.0, 1000.0]
    );
    let documents = find(DOCUMENTS);
    assert_eq!(documents.unit, "{document}");
    assert_eq!(
        documents.description,
        "Number of Outbox Documents the Outbox Relay resolved, by outcome."
    );
    let batches = find(BATCHES);
    assert_eq!(batches.unit, "{batch}");
    assert_eq!(
        batches.description,
        "Number of change-feed batches the Outbox Relay handled, by lease."
    );
}

// R8.07, R8.46: a failed publish reports the lag, no outcome, and an Error `send` span.
#[tokio::test]
async fn a_failed_publish_records_the_lag_no_outcome_and_an_error_span() {
    let f = Fixture::new().await;
    let doc = f.pending("msg-1", Some(PERSISTED)).await;
    let err = f
        .drain_on(Arc::new(FailingBroker))
        .drain("0", std::slice::from_ref(&doc))
        .await
        .unwrap_err();
    assert!(err.to_string().contains("msg-1"), "{err}");
    assert_eq!(f.metrics.of(LAG).len(), 1, "the lag is taken at admission");
    assert!(
        f.metrics.of(DOCUMENTS).is_empty(),
        "no outcome for a failed publish"
    );
    let spans = f.spans.named("send orders");
    assert_eq!(spans.len(), 1);
    assert!(
        matches!(spans[0].status, Status::Error { .. }),
        "{:?}",
        spans[0].status
    );
    assert!(
        spans[0]
            .attributes
            .iter()
            .any(|kv| kv.key.as_str() == "error.type"
                && kv.value.as_str() == "chatter_runtime::error::BrokerError::Timeout"),
        "{:?}",
        spans[0].attributes
    );
    let stored = document(&f.container, &[json!("t")], doc["id"].as_str().unwrap()).await;
    assert_eq!(stored["status"], "pending", "no stamp");
}

// R5.32, R8.08, R8.19: an undeliverable document counts once, with no attributes, and no outcome.
#[tokio::test]
async fn an_undeliverable_document_is_counted_without_attributes_or_outcome() {
    let f = Fixture::new().await;
    let mut poison = f.pending("msg-poison", None).await;
    poison["Destination"] = json!("  ");
    let key = cosmos::partition_key(&[json!("t")]).unwrap();
    chatter_runtime::testing::upsert_item(&f.container, key, &poison)
        .await
        .unwrap();
    // The page holds the version written last (its `_etag`), as a change-feed read would.
    let poison = document(&f.container, &[json!("t")], poison["id"].as_str().unwrap()).await;
    let report = f.drain().drain("0", &[poison]).await.unwrap();
    assert_eq!(report.undeliverable, 1);
    let undeliverable = f.metrics.of(UNDELIVERABLE);
    assert_eq!(undeliverable.len(), 1);
    assert!(undeliverable[0].attributes.is_empty());
    assert_eq!(undeliverable[0].number(), 1.0);
    assert!(
        f.metrics.of(DOCUMENTS).is_empty(),
        "{:?}",
        f.metrics.of(DOCUMENTS)
    );
}

// Issue 31 item 7: every document that looks pending under an id that is not the outbox id of
// its MessageId is counted (the warning is rate-limited, the count is not), by source; it is
// skipped as before.
#[tokio::test]
async fn a_pending_document_under_a_foreign_id_is_counted_as_an_id_mismatch() {
    let f = Fixture::new().await;
    let mut docs = Vec::new();
    for n in 0..3 {
        let mut doc = f.pending(&format!("msg-foreign-{n}"), None).await;
        doc["id"] = json!(format!("foreign-{n}"));
        docs.push(f.store(doc).await);
    }
    let genuine = f.pending("msg-genuine", None).await;
    docs.push(genuine);

    let report = f.drain().drain("0", &docs).await.unwrap();

    assert_eq!((report.published, report.skipped), (1, 3));
    assert_eq!(
        f.sum(ID_MISMATCHES, Some((SOURCE_IDENTITY, SOURCE))),
        3.0,
        "{:?}",
        f.metrics.of(ID_MISMATCHES)
    );
    assert_eq!(f.sum(DOCUMENTS, Some((OUTCOME, "skipped"))), 3.0);
}

// R8.02 (the catalog's order): the lag is recorded for every admitted document before the
// contract is verified, so an undeliverable document reports its age too.
#[tokio::test]
async fn an_undeliverable_document_records_its_drain_lag_at_admission() {
    let f = Fixture::new().await;
    let mut poison = f.pending("msg-poison", None).await;
    poison["MessageBody"] = json!(7);
    poison["_ts"] = json!(now_seconds() - 120);
    let report = f.drain().drain("0", &[poison]).await.unwrap();
    assert_eq!(report.undeliverable, 1);
    let lag = f.metrics.of(LAG);
    assert_eq!(lag.len(), 1, "{lag:?}");
    let Measured::Histogram { count, sum, .. } = &lag[0].value else {
        panic!("{lag:?}")
    };
    assert_eq!(*count, 1);
    assert!((119.0..=150.0).contains(sum), "lag {sum}");
}

// R6.13, R8.15, R8.20, R8.22: five failed confirmations open one suspension, counted once;
// a refused page of the suspended lease still counts as a batch.
#[tokio::test]
async fn a_suspension_is_counted_once_on_opening_and_its_refused_pages_still_count_as_batches() {
    let f = Fixture::new().await;
    let doc = f.pending("msg-1", None).await;
    f.emulator
        .faults()
        .refuse("PATCH", 403, Duration::from_secs(3600));
    let drain = f.drain();
    for _ in 0..7 {
        let _ = drain.drain("lease-7", std::slice::from_ref(&doc)).await;
    }
    assert_eq!(drain.gate().suspended_leases(), ["lease-7"]);
    let suspensions = f.metrics.of(SUSPENSIONS);
    assert_eq!(suspensions.len(), 1);
    assert_eq!(suspensions[0].number(), 1.0, "only the opening is counted");
    assert_eq!(
        suspensions[0].attributes.get(LEASE_TOKEN).unwrap(),
        "lease-7"
    );
    assert_eq!(
        suspensions[0].attributes.get(SOURCE_IDENTITY).unwrap(),
        SOURCE
    );
    assert_eq!(
        f.sum(BATCHES, None),
        7.0,
        "the two refused pages are batches too"
    );
}

fn attribute(span: &opentelemetry_sdk::trace::SpanData, key: &str) -> Option<String> {
    span.attributes
        .iter()
        .find(|kv| kv.key.as_str() == key)
        .map(|kv| kv.value.to_string())
}

// R8.40, R8.42, R8.44: the send span's parent is the persisted context, it links the ambient
// one, and the outgoing message carries the span's own context; the document is unchanged.
#[tokio::test]
async fn the_send_span_continues_the_persisted_trace_and_links_the_ambient_one() {
    let f = Fixture::new().await;
    let doc = f.pending("msg-1", Some(PERSISTED)).await;
    let mut events = f.broker.subscribe("orders").await.unwrap();
    let ambient_tracer = f.spans.provider().tracer("the application");
    let ambient = ambient_tracer.start("change feed pump");
    let ambient_context = ambient.span_context().clone();
    let cx = opentelemetry::Context::current_with_span(ambient);
    f.drain()
        .drain("0", std::slice::from_ref(&doc))
        .with_context(cx)
        .await
        .unwrap();

    let spans = f.spans.named("send orders");
    assert_eq!(spans.len(), 1);
    let span = &spans[0];
    assert_eq!(span.span_kind, SpanKind::Producer);
    assert_eq!(
        format!("{:032x}", span.span_context.trace_id()),
        "4bf92f3577b34da6a3ce929d0e0e4736"
    );
    assert_eq!(format!("{:016x}", span.parent_span_id), "00f067aa0ba902b7");
    assert!(span.parent_span_is_remote, "no in-process parent");
    assert_ne!(span.span_context.trace_id(), ambient_context.trace_id());
    assert_eq!(span.links.links.len(), 1);
    assert_eq!(span.links.links[0].span_context, ambient_context);
    assert_eq!(
        attribute(span, "messaging.system").as_deref(),
        Some("in_memory")
    );
    assert_eq!(
        attribute(span, "messaging.destination.name").as_deref(),
        Some("orders")
    );
    assert_eq!(
        attribute(span, "messaging.operation.type").as_deref(),
        Some("send")
    );
    assert_eq!(
        attribute(span, "messaging.batch.message_count").as_deref(),
        Some("1")
    );

    let delivery = next_delivery(&mut events, Duration::from_secs(10)).await;
    let outgoing = delivery.message.context["traceparent"]
        .as_str()
        .unwrap()
        .to_owned();
    assert_eq!(
        outgoing,
        format!(
            "00-{:032x}-{:016x}-01",
            span.span_context.trace_id(),
            span.span_context.span_id()
        )
    );
    let stored = document(&f.container, &[json!("t")], "outbox:bXNnLTE").await;
    assert!(
        stored["MessageContext"]
            .as_str()
            .unwrap()
            .contains(PERSISTED),
        "the persisted context is untouched: {stored}"
    );
}

// R8.41: no persisted context starts a fresh root, still linked to the ambient context.
#[tokio::test]
async fn without_a_persisted_context_the_send_span_is_a_new_root() {
    let f = Fixture::new().await;
    let doc = f.pending("msg-1", None).await;
    let ambient = f.spans.provider().tracer("the application").start("pump");
    let ambient_context = ambient.span_context().clone();
    let cx = opentelemetry::Context::current_with_span(ambient);
    f.drain().drain("0", &[doc]).with_context(cx).await.unwrap();
    let spans = f.spans.named("send orders");
    assert_eq!(spans.len(), 1);
    assert_eq!(
        spans[0].parent_span_id,
        opentelemetry::trace::SpanId::INVALID
    );
    assert_ne!(spans[0].span_context.trace_id(), ambient_context.trace_id());
    assert_eq!(spans[0].links.links.len(), 1);
}

// R8.45: a span sampled out leaves the persisted traceparent on the wire.
#[tokio::test]
async fn a_sampled_out_send_span_leaves_the_persisted_traceparent_as_it_is() {
    let f = Fixture::sampled(Sampler::AlwaysOff).await;
    let doc = f.pending("msg-1", Some(PERSISTED)).await;
    let mut events = f.broker.subscribe("orders").await.unwrap();
    f.drain().drain("0", &[doc]).await.unwrap();
    assert!(f.spans.finished().is_empty());
    let delivery = next_delivery(&mut events, Duration::from_secs(10)).await;
    assert_eq!(delivery.message.context["traceparent"], PERSISTED);
}

// R8.48: tracing off publishes the persisted traceparent unchanged.
#[tokio::test]
async fn with_tracing_off_the_persisted_traceparent_goes_out_unchanged() {
    let f = Fixture::new().await;
    let doc = f.pending("msg-1", Some(PERSISTED)).await;
    let mut events = f.broker.subscribe("orders").await.unwrap();
    let drain = Drain::new(
        SOURCE,
        Arc::new(f.broker.clone()),
        f.container.clone(),
        KEY,
        DeliverySettings::default(),
    );
    drain_with_telemetry(drain, None, None)
        .drain("0", &[doc])
        .await
        .unwrap();
    let delivery = next_delivery(&mut events, Duration::from_secs(10)).await;
    assert_eq!(delivery.message.context["traceparent"], PERSISTED);
    assert!(f.metrics.points().is_empty(), "metrics off records nothing");
}

// R8.49: one document drained twice gives two send spans under the same persisted parent.
#[tokio::test]
async fn a_document_drained_twice_gives_two_send_spans_under_the_persisted_parent() {
    let f = Fixture::new().await;
    let doc = f.pending("msg-1", Some(PERSISTED)).await;
    let drain = f.drain();
    drain.drain("0", std::slice::from_ref(&doc)).await.unwrap();
    // The change feed hands the same pending version over again (e.g. after a lost checkpoint).
    drain.drain("0", std::slice::from_ref(&doc)).await.unwrap();
    let spans = f.spans.named("send orders");
    assert_eq!(spans.len(), 2);
    assert!(
        spans
            .iter()
            .all(|s| format!("{:016x}", s.parent_span_id) == "00f067aa0ba902b7")
    );
    assert_ne!(
        spans[0].span_context.span_id(),
        spans[1].span_context.span_id()
    );
}

/// A body resolver that builds no message for `msg-none` and one for any other document.
struct DropsNone;

impl chatter_runtime::relay::BodyResolver for DropsNone {
    async fn resolve(
        &self,
        context: &chatter_runtime::relay::DrainContext<'_>,
    ) -> Result<Option<BrokeredMessage>, chatter_runtime::BoxError> {
        Ok((context.message_id != "msg-none")
            .then(|| BrokeredMessage::json(context.message_id, "orders", "{}")))
    }
}

// R8.06, R8.10, R8.11: on the standalone relay's resolver path, a document the resolver builds no
// message for counts once as `dropped`, a published one once as `admitted` with one lag each, and
// a document that is no Outbox Document once as `skipped`.
#[tokio::test]
async fn the_resolver_path_counts_dropped_admitted_and_skipped_once_each() {
    let f = Fixture::new().await;
    let drain = chatter_runtime::testing::drain_with_resolver(f.drain(), || DropsNone);
    let dropped = f.pending("msg-none", None).await;
    let published = f.pending("msg-some", None).await;
    let domain = json!({ "id": "order-1", "tenantId": "t", "status": "placed" });
    let report = drain
        .drain("lease-r", &[dropped, published, domain])
        .await
        .unwrap();
    assert_eq!(
        (report.published, report.dropped, report.skipped),
        (1, 1, 1)
    );
    assert_eq!(f.sum(DOCUMENTS, Some((OUTCOME, "dropped"))), 1.0);
    assert_eq!(f.sum(DOCUMENTS, Some((OUTCOME, "admitted"))), 1.0);
    assert_eq!(f.sum(DOCUMENTS, Some((OUTCOME, "skipped"))), 1.0);
    let lag = f.metrics.of(LAG);
    let Measured::Histogram { count, .. } = &lag[0].value else {
        panic!("{lag:?}")
    };
    assert_eq!(
        *count, 2,
        "one lag per admitted document, published or dropped"
    );
}
