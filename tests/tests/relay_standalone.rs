//! The standalone outbox relay (catalog 3.3 to 3.6, 4.3; R1.80 to R1.84, R6.02, R6.33, R8.06):
//! a container chatter's commands do not write, its pending documents often thin triggers whose
//! message a body resolver builds; the builder's validation; identities refused at start; the
//! relay inside a runtime and on its own.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use chatter_runtime::broker::{Broker, InMemoryBroker, Subscription};
use chatter_runtime::cosmos::{ContainerClient, CosmosConnection, outbox_id};
use chatter_runtime::provision;
use chatter_runtime::registration::PartitionKeyPath;
use chatter_runtime::testing::{
    Admission, DeliverySettings, Drain, DrainError, OutboxDocument, drain_with_pending_filter,
    drain_with_resolver,
};
use chatter_runtime::{
    BoxError, BrokeredMessage, Runtime, error::StandaloneRelayError, error::StartError,
    relay::BodyResolver, relay::DrainContext, relay::RelayOptions, relay::StandaloneRelay,
};
use chatter_tests::broker::{assert_quiet_for, next_delivery};
use chatter_tests::logs::capture;
use chatter_tests::relay::fast_relay;
use chatter_tests::store::{created, document, embedded, emulator_server, provisioned};
use serde_json::{Value, json};
use tracing::Level;

const DB: &str = "legacy";
const TRIGGERS: &str = "triggers";
const LEASES: &str = "triggers-leases";
const PATHS: &[&str] = &["/tenantId"];
const KEY: &[PartitionKeyPath] = &[PartitionKeyPath {
    path: "/tenantId",
    pointer: "/tenantId",
}];
const LEASE: &str = "0";

/// A thin trigger: a pending Outbox Document with nothing but its identity and key, as another
/// service writes it when the body lives elsewhere.
fn thin(message_id: &str, tenant: &str) -> Value {
    json!({
        "id": outbox_id(message_id).unwrap(),
        "_chatterType": "outbox",
        "status": "pending",
        "MessageId": message_id,
        "tenantId": tenant,
    })
}

/// A complete pending Outbox Document for `message_id` to `orders`.
fn complete(message_id: &str, tenant: &str) -> Value {
    let message = BrokeredMessage::json(message_id, "orders", r#"{"OrderId":7}"#);
    OutboxDocument::build(&message, PATHS, &[json!(tenant)]).unwrap()
}

async fn stored(c: &ContainerClient, doc: Value) -> Value {
    created(c, &[doc["tenantId"].clone()], &doc).await
}

async fn read(c: &ContainerClient, doc: &Value) -> Value {
    document(
        c,
        std::slice::from_ref(&doc["tenantId"]),
        doc["id"].as_str().unwrap(),
    )
    .await
}

/// What the recording resolver answers.
#[derive(Clone, Copy)]
enum Answer {
    Message,
    Nothing,
    Fail,
    /// A message no broker can take (a blank destination).
    Unpublishable,
}

/// What each resolver saw: message id, partition key, the raw document.
type Seen = Arc<Mutex<Vec<(String, Vec<Value>, Value)>>>;

/// A resolver recording its context and answering as told; `built` counts the resolvers made.
#[derive(Clone)]
struct Recording {
    seen: Seen,
    answer: Answer,
}

impl BodyResolver for Recording {
    async fn resolve(
        &self,
        context: &DrainContext<'_>,
    ) -> Result<Option<BrokeredMessage>, BoxError> {
        self.seen.lock().unwrap().push((
            context.message_id.to_owned(),
            context.partition_key.to_vec(),
            context.document.clone(),
        ));
        assert_eq!(context.partition_key_paths, KEY);
        match self.answer {
            Answer::Message => Ok(Some(BrokeredMessage::json(
                format!("resolved-{}", context.message_id),
                "resolved-dest",
                r#"{"resolved":true}"#,
            ))),
            Answer::Nothing => Ok(None),
            Answer::Fail => Err("the body store is down".into()),
            Answer::Unpublishable => Ok(Some(BrokeredMessage::json(
                format!("resolved-{}", context.message_id),
                " ",
                r#"{"resolved":true}"#,
            ))),
        }
    }
}

/// A drain of `c` on the resolver path answering `answer`, and what it records: the contexts
/// and how many resolvers the factory built.
fn resolving(
    broker: &InMemoryBroker,
    c: &Arc<ContainerClient>,
    answer: Answer,
) -> (Drain, Seen, Arc<AtomicUsize>) {
    let seen: Seen = Arc::default();
    let built = Arc::new(AtomicUsize::new(0));
    let resolver = Recording {
        seen: Arc::clone(&seen),
        answer,
    };
    let counter = Arc::clone(&built);
    let drain = Drain::new(
        "chatter-cosmos-outbox-relay:standalone-test",
        Arc::new(broker.clone()),
        c.clone(),
        KEY,
        DeliverySettings::default(),
    );
    let drain = drain_with_resolver(drain, move || {
        counter.fetch_add(1, Ordering::SeqCst);
        resolver.clone()
    });
    (drain, seen, built)
}

async fn container() -> Arc<ContainerClient> {
    provisioned(&embedded().await, DB, TRIGGERS, PATHS).await
}

async fn subscribe(broker: &InMemoryBroker, destination: &str) -> Subscription {
    broker.subscribe(destination).await.unwrap()
}

// R3.40, R3.41, R3.47: a thin trigger's message is the resolver's (the Outbox Document Contract
// is not evaluated), the resolver is built once and sees the message id, the partition key, the
// declared paths and the raw document; the document is stamped delivered with its ttl.
#[tokio::test]
async fn a_thin_trigger_is_published_as_its_resolved_message_and_stamped_delivered() {
    let c = container().await;
    let broker = InMemoryBroker::new();
    let mut resolved = subscribe(&broker, "resolved-dest").await;
    let (drain, seen, built) = resolving(&broker, &c, Answer::Message);
    let doc = stored(&c, thin("msg-77", "tenant-9")).await;
    let report = drain
        .drain(LEASE, std::slice::from_ref(&doc))
        .await
        .unwrap();
    assert_eq!(report.published, 1);
    assert_eq!(built.load(Ordering::SeqCst), 1);
    let delivery = next_delivery(&mut resolved, Duration::from_secs(5)).await;
    assert_eq!(delivery.message.message_id, "resolved-msg-77");
    let seen = seen.lock().unwrap().clone();
    assert_eq!(seen.len(), 1);
    assert_eq!(seen[0].0, "msg-77");
    assert_eq!(seen[0].1, [json!("tenant-9")]);
    assert_eq!(seen[0].2["MessageId"], "msg-77");
    let after = read(&c, &doc).await;
    assert_eq!(
        (after["status"].clone(), after["ttl"].clone()),
        (json!("delivered"), json!(86400))
    );
}

// R3.42, R8.06: a resolver that builds no message: nothing is published, the document is stamped
// delivered (drop and acknowledge), the outcome is `dropped`.
#[tokio::test]
async fn a_document_the_resolver_builds_no_message_for_is_dropped_and_stamped() {
    let c = container().await;
    let broker = InMemoryBroker::new();
    let mut anything = subscribe(&broker, "resolved-dest").await;
    let (drain, _, _) = resolving(&broker, &c, Answer::Nothing);
    let doc = stored(&c, thin("msg-none", "t1")).await;
    let report = drain
        .drain(LEASE, std::slice::from_ref(&doc))
        .await
        .unwrap();
    assert_eq!((report.published, report.dropped), (0, 1));
    assert_eq!(read(&c, &doc).await["status"], "delivered");
    assert_quiet_for(&mut anything, Duration::from_millis(200)).await;
}

// R3.48: a resolver that fails: nothing is published or stamped, the page fails with its error.
#[tokio::test]
async fn a_failing_resolver_fails_the_page_and_leaves_the_document_pending() {
    let c = container().await;
    let broker = InMemoryBroker::new();
    let (drain, _, _) = resolving(&broker, &c, Answer::Fail);
    let doc = stored(&c, thin("msg-fail", "t1")).await;
    let error = drain
        .drain(LEASE, std::slice::from_ref(&doc))
        .await
        .unwrap_err();
    let DrainError::Resolver { message_id, source } = &error else {
        panic!("{error:?}");
    };
    assert_eq!(message_id, "msg-fail");
    assert_eq!(source.to_string(), "the body store is down");
    assert_eq!(read(&c, &doc).await["status"], "pending");
}

// Issue 31 item 10: a message the resolver built that the broker can never take (here a blank
// destination, which the in-memory broker refuses for good) is the resolver's fault, not the
// document's: nothing is stamped, the page fails and the lease is blocked (health shows it)
// until the resolver builds a message the broker takes, as for a broker setting that refuses.
#[tokio::test]
async fn a_resolved_message_the_broker_never_takes_blocks_the_lease_and_stamps_nothing() {
    let (logs, _guard) = capture();
    let c = container().await;
    let broker = InMemoryBroker::new();
    let (drain, _, _) = resolving(&broker, &c, Answer::Unpublishable);
    let doc = stored(&c, thin("msg-unpublishable", "t1")).await;

    let error = drain
        .drain(LEASE, std::slice::from_ref(&doc))
        .await
        .unwrap_err();

    let DrainError::ResolvedMessageRefused { id, message_id, .. } = &error else {
        panic!("{error:?}");
    };
    assert_eq!(id, doc["id"].as_str().unwrap());
    assert_eq!(message_id, "resolved-msg-unpublishable");
    assert_eq!(read(&c, &doc).await["status"], "pending", "not stamped");
    let blocked = drain.gate().blocked(LEASE).expect("the lease is blocked");
    assert!(blocked.contains("body resolver"), "{blocked}");
    // Logged once at Error, blaming the resolver, never the document's persisted fields.
    let errors = logs.at(Level::ERROR);
    assert_eq!(errors.len(), 1, "{errors:?}");
    assert!(
        errors[0].message.contains("the body resolver built"),
        "{}",
        errors[0].message
    );
    assert!(
        !errors[0].message.contains("persisted fields"),
        "{}",
        errors[0].message
    );
}

// R3.44, R3.45, R3.113, R6.33 (in part): the resolver factory is never called for a document
// the gate does not admit: not an Outbox Document, delivered, a foreign id, or narrowed out by
// the filter.
#[tokio::test]
async fn no_resolver_is_built_for_a_document_the_gate_does_not_admit() {
    let c = container().await;
    let broker = InMemoryBroker::new();
    let (drain, _, built) = resolving(&broker, &c, Answer::Message);
    let drain = drain_with_pending_filter(drain, |doc| doc["MessageId"] != "msg-filtered");
    let mut delivered = thin("msg-delivered", "t1");
    delivered["status"] = json!("delivered");
    let mut foreign = thin("msg-foreign", "t1");
    foreign["id"] = json!("outbox:y");
    let filtered = stored(&c, thin("msg-filtered", "t1")).await;
    let docs = [
        json!({ "id": "a", "tenantId": "t1" }),
        delivered,
        foreign,
        filtered.clone(),
    ];
    let report = drain.drain(LEASE, &docs).await.unwrap();
    assert_eq!(report.skipped, 4);
    assert_eq!(built.load(Ordering::SeqCst), 0);
    assert_eq!(
        read(&c, &filtered).await["status"],
        "pending",
        "not stamped"
    );
}

// R3.115, R3.116: the additional filter is evaluated exactly once per pending document, and
// only on pending documents.
#[tokio::test]
async fn the_pending_filter_runs_once_per_pending_document() {
    let c = container().await;
    let broker = InMemoryBroker::new();
    let calls = Arc::new(AtomicUsize::new(0));
    let counter = Arc::clone(&calls);
    let (drain, _, built) = resolving(&broker, &c, Answer::Message);
    let drain = drain_with_pending_filter(drain, move |doc| {
        counter.fetch_add(1, Ordering::SeqCst);
        doc["MessageId"] != "msg-narrowed"
    });
    let good = stored(&c, thin("msg-good", "t1")).await;
    let narrowed = stored(&c, thin("msg-narrowed", "t1")).await;
    let other = json!({ "id": "a", "tenantId": "t1" });
    let report = drain
        .drain(LEASE, &[good.clone(), narrowed.clone(), other])
        .await
        .unwrap();
    assert_eq!((report.published, report.skipped), (1, 2));
    assert_eq!(calls.load(Ordering::SeqCst), 2, "once per pending document");
    assert_eq!(built.load(Ordering::SeqCst), 1);
    assert_eq!(read(&c, &good).await["status"], "delivered");
    assert_eq!(read(&c, &narrowed).await["status"], "pending");
}

// Issue 31 item 5: as a filter that throws fails the .NET batch, a filter that panics fails the
// page (with the panic's message): nothing of it is published or stamped, so the processor does
// not checkpoint past the document and reads it again.
#[tokio::test]
async fn a_panicking_pending_filter_fails_the_page_and_leaves_its_documents_pending() {
    let c = container().await;
    let broker = InMemoryBroker::new();
    let (drain, _, built) = resolving(&broker, &c, Answer::Message);
    let drain = drain_with_pending_filter(drain, move |doc| {
        if doc["MessageId"] == "msg-panics" {
            panic!("the filter cannot read this one");
        }
        true
    });
    let good = stored(&c, thin("msg-good", "t1")).await;
    let bad = stored(&c, thin("msg-panics", "t1")).await;
    let error = drain
        .drain(LEASE, &[good.clone(), bad.clone()])
        .await
        .unwrap_err();
    let DrainError::PendingFilterPanicked { id, .. } = &error else {
        panic!("{error:?}");
    };
    assert_eq!(id, bad["id"].as_str().unwrap());
    assert!(
        error
            .to_string()
            .contains("the filter cannot read this one"),
        "{error}"
    );
    assert_eq!(
        built.load(Ordering::SeqCst),
        0,
        "nothing of the page is drained"
    );
    assert_eq!(read(&c, &good).await["status"], "pending");
    assert_eq!(read(&c, &bad).await["status"], "pending");
}

// Issue 31 item 5, end to end: a document the filter panicked on once is not checkpointed past:
// the page is read again and the document published.
#[tokio::test]
async fn a_document_the_pending_filter_panicked_on_is_read_again_and_published() {
    let cosmos = CosmosConnection::embedded().await.unwrap();
    let triggers = provisioned(&cosmos, DB, TRIGGERS, PATHS).await;
    provision::ensure_lease_container(&cosmos, DB, LEASES)
        .await
        .unwrap();
    provision::ensure_for::<PlaceOrder>(&cosmos).await.unwrap();
    stored(&triggers, complete("msg-flaky-filter", "t1")).await;
    let broker = InMemoryBroker::new();
    let mut orders = subscribe(&broker, "orders").await;
    let panicked = Arc::new(AtomicUsize::new(0));
    let once = Arc::clone(&panicked);
    let relay = StandaloneRelay::builder(&cosmos, (DB, TRIGGERS), (DB, LEASES))
        .partition_key_paths(PATHS)
        .options(fast_relay(Duration::from_secs(5)))
        .pending_filter(move |_| {
            if once.fetch_add(1, Ordering::SeqCst) == 0 {
                panic!("the filter fails on its first call");
            }
            true
        })
        .build()
        .unwrap();
    let runtime = Runtime::builder()
        .cosmos(cosmos.clone())
        .broker(broker.clone())
        .consume(false)
        .standalone_relay(relay)
        .start()
        .await
        .unwrap();
    let delivery = next_delivery(&mut orders, Duration::from_secs(30)).await;
    assert_eq!(delivery.message.message_id, "msg-flaky-filter");
    assert!(
        panicked.load(Ordering::SeqCst) >= 2,
        "read again after the panic"
    );
    runtime.shutdown().await;
}

/// A runtime relaying `triggers` through a standalone relay whose filter turns away
/// `msg-turned-away`, with a shutdown drain of `drain`; the documents `msg-published` and
/// `msg-turned-away` are pending there.
async fn relay_turning_one_away(drain: Duration) -> (Runtime, Arc<ContainerClient>, Subscription) {
    let cosmos = CosmosConnection::embedded().await.unwrap();
    let triggers = provisioned(&cosmos, DB, TRIGGERS, PATHS).await;
    provision::ensure_lease_container(&cosmos, DB, LEASES)
        .await
        .unwrap();
    provision::ensure_for::<PlaceOrder>(&cosmos).await.unwrap();
    stored(&triggers, complete("msg-published", "t1")).await;
    stored(&triggers, complete("msg-turned-away", "t1")).await;
    let broker = InMemoryBroker::new();
    let orders = subscribe(&broker, "orders").await;
    let relay = StandaloneRelay::builder(&cosmos, (DB, TRIGGERS), (DB, LEASES))
        .partition_key_paths(PATHS)
        .options(fast_relay(Duration::from_secs(5)))
        .pending_filter(|doc| doc["MessageId"] != "msg-turned-away")
        .build()
        .unwrap();
    let runtime = Runtime::builder()
        .cosmos(cosmos.clone())
        .broker(broker.clone())
        .consume(false)
        .shutdown_drain(drain)
        .standalone_relay(relay)
        .start()
        .await
        .unwrap();
    (runtime, triggers, orders)
}

// Issue 31 item 8: what the pending filter turns away is no backlog: `relay_idle` succeeds once
// the rest is published.
#[tokio::test]
async fn relay_idle_ignores_what_the_pending_filter_turns_away() {
    let (runtime, triggers, mut orders) = relay_turning_one_away(Duration::ZERO).await;
    let delivery = next_delivery(&mut orders, Duration::from_secs(30)).await;
    assert_eq!(delivery.message.message_id, "msg-published");

    runtime.relay_idle(Duration::from_secs(30)).await.unwrap();

    let turned_away = read(&triggers, &complete("msg-turned-away", "t1")).await;
    assert_eq!(turned_away["status"], "pending", "still there, not relayed");
    runtime.shutdown().await;
}

// Issue 31 item 8: the shutdown drain does not wait for what the filter turns away, so it ends
// without reporting documents still pending.
#[tokio::test]
async fn the_shutdown_drain_ignores_what_the_pending_filter_turns_away() {
    // Ample for the published document's stamp to land, however slow the machine.
    let (runtime, _triggers, mut orders) = relay_turning_one_away(Duration::from_secs(10)).await;
    let delivery = next_delivery(&mut orders, Duration::from_secs(30)).await;
    assert_eq!(delivery.message.message_id, "msg-published");
    let (logs, _guard) = capture();

    runtime.shutdown().await;

    let left = logs.matching(Level::WARN, "still pending");
    assert!(left.is_empty(), "{left:?}");
}

// R3.43: without a resolver a standalone drain takes the verbatim path.
#[tokio::test]
async fn without_a_resolver_the_document_is_the_message() {
    let c = container().await;
    let broker = InMemoryBroker::new();
    let mut orders = subscribe(&broker, "orders").await;
    let drain = Drain::new(
        "chatter-cosmos-outbox-relay:verbatim",
        Arc::new(broker.clone()),
        c.clone(),
        KEY,
        DeliverySettings::default(),
    );
    let doc = stored(&c, complete("msg-42", "t1")).await;
    drain
        .drain(LEASE, std::slice::from_ref(&doc))
        .await
        .unwrap();
    let delivery = next_delivery(&mut orders, Duration::from_secs(5)).await;
    assert_eq!(delivery.message.message_id, "msg-42");
}

// R3.49, R6.02: the resolver built no message and the stamp failed: the store error fails the
// page as itself (nothing was published, so it is no Confirmation Failure and the lease's gate
// counts nothing).
#[tokio::test]
async fn a_failed_stamp_after_no_message_is_the_store_error_not_a_confirmation_failure() {
    let (emulator, connection) = emulator_server().await;
    let c = provisioned(&connection, DB, TRIGGERS, PATHS).await;
    let broker = InMemoryBroker::new();
    let (drain, _, _) = resolving(&broker, &c, Answer::Nothing);
    let doc = stored(&c, thin("msg-stamp", "t1")).await;
    emulator
        .faults()
        .refuse("PATCH", 503, Duration::from_secs(3600));
    let error = drain
        .drain(LEASE, std::slice::from_ref(&doc))
        .await
        .unwrap_err();
    emulator.faults().clear();
    let DrainError::DroppedStamp { id, source } = &error else {
        panic!("{error:?}");
    };
    assert_eq!(id, doc["id"].as_str().unwrap());
    assert_eq!(source.status(), Some(503));
    assert!(!drain.gate().is_suspended(LEASE));
    // A lease with a Confirmation Failure would drain one document at a time.
    assert_eq!(drain.gate().admit(LEASE), Admission::Concurrent);
}

// R3.85 to R3.90: the builder refuses what cannot work, with the catalog's texts.
#[tokio::test]
async fn the_builder_refuses_what_cannot_work() {
    let cosmos = CosmosConnection::embedded().await.unwrap();
    let builder = || StandaloneRelay::builder(&cosmos, (DB, TRIGGERS), (DB, LEASES));
    let refused =
        |b: chatter_runtime::relay::StandaloneRelayBuilder| b.build().unwrap_err().to_string();
    assert_eq!(
        refused(builder()),
        "A container partition-key path is required."
    );
    assert_eq!(
        refused(builder().partition_key_paths(&["/tenantId", "  "])),
        "Every container partition-key path segment must be non-null and non-whitespace."
    );
    assert_eq!(
        refused(
            StandaloneRelay::builder(&cosmos, (DB, " "), (DB, LEASES)).partition_key_paths(PATHS)
        ),
        "A non-null, non-whitespace container is required."
    );
    let half = refused(
        builder()
            .partition_key_paths(PATHS)
            .source_identities("fin/ledger", "  "),
    );
    assert!(
        half.starts_with(
            "MonitoredSourceIdentity and LeaseSourceIdentity must be supplied together"
        ),
        "{half}"
    );
    let error = builder()
        .partition_key_paths(PATHS)
        .options(RelayOptions::default().delivered_status("pending"))
        .build()
        .unwrap_err();
    let StandaloneRelayError::Options(source) = &error else {
        panic!("{error:?}");
    };
    assert!(
        source
            .to_string()
            .contains("cannot equal the pending status"),
        "{source}"
    );
    assert!(
        builder().partition_key_paths(&["tenantId"]).build().is_ok(),
        "a path without its leading slash is canonicalized"
    );
}

// R1.75, R1.76, R1.81: a declared pair keys the processor (the containers are not read); the
// same pair over other containers has the same name, another pair another.
#[tokio::test]
async fn a_declared_identity_keys_the_processor_name() {
    let cosmos = CosmosConnection::embedded().await.unwrap();
    let relay = |container: &str, monitored: &str| {
        StandaloneRelay::builder(&cosmos, (DB, container), (DB, LEASES))
            .partition_key_paths(PATHS)
            .source_identities(monitored, "leases")
            .build()
            .unwrap()
    };
    let name = relay(TRIGGERS, "m").processor_name();
    assert!(name.starts_with("chatter-cosmos-outbox-relay:"), "{name}");
    assert_eq!(relay("elsewhere", "m").processor_name(), name);
    assert_ne!(relay(TRIGGERS, "other").processor_name(), name);
}

// R3.92: two relays declaring one pair are refused at start, naming it, before any container
// is read (these containers do not exist).
#[tokio::test]
async fn two_relays_declaring_one_identity_are_refused() {
    let cosmos = CosmosConnection::embedded().await.unwrap();
    let relay = || {
        StandaloneRelay::builder(&cosmos, ("nowhere", "none"), ("nowhere", "none-leases"))
            .partition_key_paths(PATHS)
            .source_identities("fin/ledger", "fin/leases")
            .build()
            .unwrap()
    };
    let error = StandaloneRelay::start_all(vec![relay(), relay()], InMemoryBroker::new())
        .await
        .unwrap_err();
    let text = error.to_string();
    assert!(error.is_identity_conflict(), "{error:?}");
    assert!(
        text.contains("DISTINCT") && text.contains("'fin/ledger'"),
        "{text}"
    );
}

// R3.94, R4.54: two undeclared relays over the same containers are refused at start naming the
// processor, before the container properties are read (these containers do not exist).
#[tokio::test]
async fn two_relays_over_the_same_containers_are_refused_naming_the_processor() {
    let cosmos = CosmosConnection::embedded().await.unwrap();
    let relay = || {
        StandaloneRelay::builder(&cosmos, ("nowhere", "none"), ("nowhere", "none-leases"))
            .partition_key_paths(PATHS)
            .build()
            .unwrap()
    };
    let name = relay().processor_name();
    let error = StandaloneRelay::start_all(vec![relay(), relay()], InMemoryBroker::new())
        .await
        .unwrap_err();
    assert!(error.is_identity_conflict(), "{error:?}");
    assert!(error.to_string().contains(&name), "{error}");
}

// R4.50, R4.51: the Monitored Container Contract is checked at start: a partition-key path the
// container does not have, or a default ttl that would delete pending documents, fails it.
#[tokio::test]
async fn a_container_that_breaks_the_contract_fails_the_start() {
    let cosmos = CosmosConnection::embedded().await.unwrap();
    provision::ensure_container(&cosmos, DB, TRIGGERS, PATHS)
        .await
        .unwrap();
    provision::ensure_lease_container(&cosmos, DB, LEASES)
        .await
        .unwrap();
    let relay = StandaloneRelay::builder(&cosmos, (DB, TRIGGERS), (DB, LEASES))
        .partition_key_paths(&["/customerId"])
        .build()
        .unwrap();
    let error = StandaloneRelay::start_all(vec![relay], InMemoryBroker::new())
        .await
        .unwrap_err();
    let text = error.to_string();
    assert!(
        text.contains("/customerId") && text.contains("/tenantId"),
        "{text}"
    );
}

/// A resolver reading each trigger's body from the `bodies` container (same partition key,
/// id = the message id), as a service that keeps large payloads apart.
struct FromBodies {
    bodies: Arc<ContainerClient>,
}

impl BodyResolver for FromBodies {
    async fn resolve(
        &self,
        context: &DrainContext<'_>,
    ) -> Result<Option<BrokeredMessage>, BoxError> {
        let key = chatter_runtime::cosmos::partition_key(context.partition_key)?;
        let read =
            chatter_runtime::cosmos::read_item(&self.bodies, key, context.message_id).await?;
        Ok(read.into_document().map(|body| {
            BrokeredMessage::json(context.message_id, "invoices", body["payload"].to_string())
        }))
    }
}

// R3.123, R1.82: thin triggers written by a plain SDK client are published with the body a
// resolver reads from a second container, by a standalone relay inside a runtime beside the
// commands' own relay; it is a distinct processor and shows in health().
#[tokio::test]
async fn thin_triggers_are_relayed_by_a_standalone_relay_inside_a_runtime() {
    let cosmos = CosmosConnection::embedded().await.unwrap();
    let triggers = provisioned(&cosmos, DB, TRIGGERS, PATHS).await;
    let bodies = provisioned(&cosmos, DB, "bodies", PATHS).await;
    provision::ensure_lease_container(&cosmos, DB, LEASES)
        .await
        .unwrap();
    // The binary's command, whose pipeline relay runs beside the standalone one.
    provision::ensure_for::<PlaceOrder>(&cosmos).await.unwrap();
    for i in 0..5 {
        let message_id = format!("inv-{i}");
        stored(
            &bodies,
            json!({ "id": message_id, "tenantId": "acme", "payload": { "n": i } }),
        )
        .await;
        stored(&triggers, thin(&message_id, "acme")).await;
    }
    let broker = InMemoryBroker::new();
    let mut invoices = subscribe(&broker, "invoices").await;
    let reader = Arc::clone(&bodies);
    let relay = StandaloneRelay::builder(&cosmos, (DB, TRIGGERS), (DB, LEASES))
        .partition_key_paths(PATHS)
        .body_resolver(move || FromBodies {
            bodies: Arc::clone(&reader),
        })
        .build()
        .unwrap();
    let name = relay.processor_name();
    let runtime = Runtime::builder()
        .cosmos(cosmos.clone())
        .broker(broker.clone())
        .consume(false)
        .standalone_relay(relay)
        .start()
        .await
        .unwrap();
    let mut received = Vec::new();
    for _ in 0..5 {
        let delivery = next_delivery(&mut invoices, Duration::from_secs(30)).await;
        received.push((
            delivery.message.message_id.clone(),
            delivery.message.body.clone(),
        ));
        delivery.ack().await.unwrap();
    }
    received.sort();
    assert_eq!(received[0], ("inv-0".to_owned(), r#"{"n":0}"#.to_owned()));
    assert_eq!(received.len(), 5);
    let leases = runtime.relay_leases().await;
    assert_eq!(
        leases.len(),
        2,
        "the pipeline's processor and the standalone one: {leases:?}"
    );
    assert!(
        leases.iter().any(|(processor, _)| *processor == name),
        "{leases:?}"
    );
    let health = runtime.health().await;
    assert!(
        health.leases.iter().any(|l| l.processor == name),
        "{health:?}"
    );
    runtime.shutdown().await;
    let after = read(&triggers, &thin("inv-0", "acme")).await;
    assert_eq!(after["status"], "delivered");
}

// R3.82, R3.83: on its own (no commands, no registry), two standalone relays over two
// containers are two processors, each relaying its own documents.
#[tokio::test]
async fn standalone_relays_run_on_their_own() {
    let cosmos = CosmosConnection::embedded().await.unwrap();
    let first = provisioned(&cosmos, DB, "first", PATHS).await;
    let second = provisioned(&cosmos, DB, "second", PATHS).await;
    provision::ensure_lease_container(&cosmos, DB, LEASES)
        .await
        .unwrap();
    stored(&first, complete("m-first", "t1")).await;
    stored(&second, complete("m-second", "t1")).await;
    let relay = |container: &str| {
        StandaloneRelay::builder(&cosmos, (DB, container), (DB, LEASES))
            .partition_key_paths(PATHS)
            .build()
            .unwrap()
    };
    let broker = InMemoryBroker::new();
    let mut orders = subscribe(&broker, "orders").await;
    let running = StandaloneRelay::start_all(vec![relay("first"), relay("second")], broker.clone())
        .await
        .unwrap();
    let mut ids = Vec::new();
    for _ in 0..2 {
        let delivery = next_delivery(&mut orders, Duration::from_secs(30)).await;
        ids.push(delivery.message.message_id.clone());
        delivery.ack().await.unwrap();
    }
    ids.sort();
    assert_eq!(ids, ["m-first", "m-second"]);
    let processors = running.owned_leases();
    assert_eq!(processors.len(), 2);
    assert_ne!(processors[0].0, processors[1].0);
    running.shutdown().await;
}

// R1.82: a standalone relay over a command's own containers, without a declared identity, is
// the pipeline relay's processor: refused at start.
#[tokio::test]
async fn a_standalone_relay_over_a_pipeline_source_is_refused() {
    let cosmos = CosmosConnection::embedded().await.unwrap();
    let relay = StandaloneRelay::builder(&cosmos, ("shop", "orders"), ("shop", "orders-leases"))
        .partition_key_paths(&["/orderId"])
        .build()
        .unwrap();
    let error = Runtime::builder()
        .cosmos(cosmos.clone())
        .registry(chatter_tests::runtime::registry_at::<PlaceOrder>(
            "place-order",
        ))
        .consume(false)
        .standalone_relay(relay)
        .start()
        .await
        .unwrap_err();
    let StartError::Relay(relay) = &error else {
        panic!("{error:?}");
    };
    assert!(relay.is_identity_conflict(), "{relay:?}");
}

/// A command over `shop/orders`, whose pipeline relay the standalone relay above would share.
#[derive(Debug, serde::Serialize, serde::Deserialize, chatter_runtime::DocumentReliable)]
#[cosmos(database = "shop", container = "orders", lease = "orders-leases")]
#[partition_key(path = "/orderId")]
#[serde(rename_all = "camelCase")]
pub struct PlaceOrder {
    pub order_id: String,
}

#[chatter_runtime::handler]
async fn place_order(
    _command: PlaceOrder,
    _ctx: &mut chatter_runtime::HandlerContext,
) -> Result<(), BoxError> {
    Ok(())
}

// R6.33: a suspended lease's page is refused before any document is looked at: no resolver is
// built for it.
#[tokio::test]
async fn a_suspended_lease_builds_no_resolver() {
    let c = container().await;
    let broker = InMemoryBroker::new();
    let (drain, _, built) = resolving(&broker, &c, Answer::Message);
    let fault = std::io::Error::other("the stamp was refused");
    for _ in 0..chatter_runtime::testing::CONFIRMATION_FAILURE_THRESHOLD {
        drain.gate().record_confirmation_failure(LEASE, &fault);
    }
    assert!(drain.gate().is_suspended(LEASE));
    let doc = stored(&c, thin("msg-suspended", "t1")).await;
    let error = drain
        .drain(LEASE, std::slice::from_ref(&doc))
        .await
        .unwrap_err();
    assert!(matches!(error, DrainError::Suspended { .. }), "{error:?}");
    assert_eq!(built.load(Ordering::SeqCst), 0);
    assert_eq!(read(&c, &doc).await["status"], "pending");
}
