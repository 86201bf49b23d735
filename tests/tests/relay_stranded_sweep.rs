//! The stranded-document sweep (issue 31, item 6): a pending Outbox Document its lease has read
//! past is logged at Error, counted, shown in health and put back on the change feed, so it is
//! published; a document its lease has not read yet is never written, so its key's order holds;
//! each lease's oldest pending document's age is reported.
//!
//! The stranding is made on purpose with the relay itself: a first run's pending filter turns
//! the document away, so its lease checkpoints past it while it stays pending (what a filter
//! that panicked did before it failed the page, or a filter an operator later widened); a
//! second run without that filter never reads it again. Every wait is a bounded poll.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use chatter_runtime::broker::{BrokerError, InMemoryBroker, Refusal, Subscription};
use chatter_runtime::cosmos::{ContainerClient, CosmosConnection};
use chatter_runtime::provision;
use chatter_runtime::testing::OutboxDocument;
use chatter_runtime::{BrokeredMessage, Runtime, relay::StandaloneRelay};
use chatter_tests::broker::{Intercepted, next_delivery};
use chatter_tests::logs::capture;
use chatter_tests::relay::fast_relay;
use chatter_tests::store::{created, document, provisioned};
use chatter_tests::telemetry::Metrics;
use chatter_tests::wait::eventually;
use cosmos_change_feed::ChangeFeedEstimator;
use serde_json::{Value, json};
use tracing::Level;

const DB: &str = "relay-stranded";
const OUTBOX: &str = "outbox";
const LEASES: &str = "outbox-leases";
const PATHS: &[&str] = &["/tenantId"];
const DESTINATION: &str = "orders";
const WAIT: Duration = Duration::from_secs(60);
const POLL: Duration = Duration::from_millis(100);
const STRANDED: &str = "chatter.messaging.outbox.stranded";
const OLDEST_AGE: &str = "chatter.messaging.outbox.pending.oldest_age";

/// A complete pending Outbox Document of `message_id` under tenant `tenant`.
fn pending(message_id: &str, tenant: &str) -> Value {
    let message = BrokeredMessage::json(message_id, DESTINATION, r#"{"n":1}"#);
    OutboxDocument::build(&message, PATHS, &[json!(tenant)]).unwrap()
}

async fn stored(outbox: &ContainerClient, doc: Value) -> Value {
    created(outbox, &[doc["tenantId"].clone()], &doc).await
}

async fn reread(outbox: &ContainerClient, doc: &Value) -> Value {
    document(
        outbox,
        std::slice::from_ref(&doc["tenantId"]),
        doc["id"].as_str().unwrap(),
    )
    .await
}

async fn setup() -> (CosmosConnection, Arc<ContainerClient>) {
    let cosmos = CosmosConnection::embedded().await.unwrap();
    let outbox = provisioned(&cosmos, DB, OUTBOX, PATHS).await;
    provision::ensure_lease_container(&cosmos, DB, LEASES)
        .await
        .unwrap();
    (cosmos, outbox)
}

/// The standalone relay over the outbox, with `filter` as its pending filter when given.
fn relay(cosmos: &CosmosConnection, filter: Option<fn(&Value) -> bool>) -> StandaloneRelay {
    let builder = StandaloneRelay::builder(cosmos, (DB, OUTBOX), (DB, LEASES))
        .partition_key_paths(PATHS)
        .options(
            fast_relay(Duration::from_secs(5))
                .sweep_interval(Duration::from_millis(200))
                .stranded_after(Duration::ZERO),
        );
    match filter {
        Some(filter) => builder.pending_filter(filter),
        None => builder,
    }
    .build()
    .unwrap()
}

async fn subscribe(broker: &InMemoryBroker) -> Subscription {
    chatter_runtime::broker::Broker::subscribe(broker, DESTINATION)
        .await
        .unwrap()
}

/// How many pending documents of `message_id` the change feed holds after the checkpoints of
/// `processor`'s leases (the estimator reads exactly what a lease has still to read).
async fn unread(
    cosmos: &CosmosConnection,
    outbox: &Arc<ContainerClient>,
    processor: &str,
    message_id: &str,
) -> u64 {
    let leases = cosmos.container(DB, LEASES).await.unwrap();
    let estimate = ChangeFeedEstimator::new(processor, Arc::clone(outbox), leases)
        .estimate(|doc| doc["MessageId"] == message_id && doc["status"] == "pending")
        .await
        .unwrap();
    assert!(!estimate.is_empty(), "the processor has leases");
    estimate
        .into_iter()
        .map(|lease| lease.pending.unwrap())
        .sum()
}

fn not_stranded_document(doc: &Value) -> bool {
    doc["MessageId"] != "m-stranded"
}

#[tokio::test]
async fn a_pending_document_behind_its_checkpoint_is_logged_counted_shown_and_published() {
    let (logs, _guard) = capture();
    let (cosmos, outbox) = setup().await;
    let stranded = stored(&outbox, pending("m-stranded", "t1")).await;
    stored(&outbox, pending("m-after", "t1")).await;
    let broker = InMemoryBroker::new();
    let mut orders = subscribe(&broker).await;

    // First run: the filter turns m-stranded away; the page is drained (m-after published) and
    // checkpointed past it.
    let first = relay(&cosmos, Some(not_stranded_document));
    let processor = first.processor_name();
    let runtime = Runtime::builder()
        .cosmos(cosmos.clone())
        .broker(broker.clone())
        .consume(false)
        .without_metrics()
        .standalone_relay(first)
        .start()
        .await
        .unwrap();
    let after = next_delivery(&mut orders, WAIT).await;
    assert_eq!(after.message.message_id, "m-after");
    after.ack().await.unwrap();
    eventually(
        WAIT,
        POLL,
        "the lease's checkpoint is past m-stranded",
        || {
            let (cosmos, outbox, processor) = (&cosmos, &outbox, &processor);
            async move { unread(cosmos, outbox, processor, "m-stranded").await == 0 }
        },
    )
    .await;
    runtime.shutdown().await;
    assert_eq!(reread(&outbox, &stranded).await["status"], "pending");

    // Second run, no filter: nothing would ever read m-stranded again but the sweep.
    let metrics = Metrics::new();
    let runtime = Runtime::builder()
        .cosmos(cosmos.clone())
        .broker(broker.clone())
        .consume(false)
        .meter(metrics.meter())
        .without_tracing()
        .standalone_relay(relay(&cosmos, None))
        .start()
        .await
        .unwrap();
    let delivery = next_delivery(&mut orders, WAIT).await;
    assert_eq!(delivery.message.message_id, "m-stranded");
    delivery.ack().await.unwrap();
    eventually(WAIT, POLL, "m-stranded is stamped delivered", || async {
        reread(&outbox, &stranded).await["status"] == "delivered"
    })
    .await;

    let errors = logs.matching(Level::ERROR, "behind the checkpoint");
    assert_eq!(errors.len(), 1, "one Error log: {errors:#?}");
    assert_eq!(errors[0].field("document_id"), stranded["id"].as_str());
    assert_eq!(errors[0].field("message_id"), Some("m-stranded"));
    assert_eq!(errors[0].field("source_identity"), Some(processor.as_str()));
    let lease = errors[0].field("lease_token").unwrap().to_owned();

    let counted: f64 = metrics
        .of(STRANDED)
        .iter()
        .filter(|p| p.attributes.get("chatter.messaging.outbox.lease_token") == Some(&lease))
        .map(|p| p.number())
        .sum();
    assert_eq!(counted, 1.0, "{:?}", metrics.of(STRANDED));

    let health = runtime.health().await;
    let shown = health
        .leases
        .iter()
        .find(|l| l.processor == processor && l.lease_token == lease)
        .unwrap_or_else(|| panic!("the lease is in health: {health:?}"));
    assert_eq!(shown.stranded, 1, "{shown:?}");
    eventually(WAIT, POLL, "nothing is pending any more", || async {
        let health = runtime.health().await;
        let lease = health.leases.iter().find(|l| l.processor == processor);
        lease.is_some_and(|l| l.oldest_pending_age.is_none())
    })
    .await;
    runtime.shutdown().await;
}

#[tokio::test]
async fn a_document_its_lease_has_not_read_is_never_written_and_its_order_holds() {
    let (logs, _guard) = capture();
    let (cosmos, outbox) = setup().await;
    stored(&outbox, pending("m-warm", "t1")).await;
    // Test double: the in-memory broker refusing m-first by a broker setting (the shape of a
    // real refusal, `BrokerError::Refused`) until `lifted`: the lease is blocked on it, and
    // m-second waits behind it, unread past, for as long as the test needs.
    let lifted = Arc::new(AtomicBool::new(false));
    let inner = InMemoryBroker::new();
    let mut orders = subscribe(&inner).await;
    let refusing = Arc::clone(&lifted);
    let broker = Intercepted::new(inner.clone(), move |message: &BrokeredMessage| {
        let refused = (message.message_id == "m-first" && !refusing.load(Ordering::SeqCst))
            .then(|| message.destination.clone());
        Box::pin(async move {
            Some(Err(BrokerError::Refused {
                destination: refused?,
                refusal: Refusal::AccessRefused,
                reply: "403 ACCESS_REFUSED (the test double)".to_owned(),
            }))
        })
    });
    let standalone = relay(&cosmos, None);
    let processor = standalone.processor_name();
    let metrics = Metrics::new();
    let runtime = Runtime::builder()
        .cosmos(cosmos.clone())
        .broker(broker)
        .consume(false)
        .meter(metrics.meter())
        .without_tracing()
        .standalone_relay(standalone)
        .start()
        .await
        .unwrap();
    // The lease has a checkpoint (past m-warm) before the two documents come: the sweep judges
    // the documents of a lease with a checkpoint only.
    let warm = next_delivery(&mut orders, WAIT).await;
    assert_eq!(warm.message.message_id, "m-warm");
    warm.ack().await.unwrap();
    eventually(WAIT, POLL, "the lease's checkpoint is past m-warm", || {
        let (cosmos, outbox, processor) = (&cosmos, &outbox, &processor);
        async move { unread(cosmos, outbox, processor, "m-warm").await == 0 }
    })
    .await;
    let first = stored(&outbox, pending("m-first", "t1")).await;
    let second = stored(&outbox, pending("m-second", "t1")).await;

    // Blocked, and swept for a while: the oldest pending age grows past 2 s, some ten sweeps.
    eventually(
        WAIT,
        POLL,
        "the lease is blocked and its oldest pending document is 2 s old",
        || async {
            runtime.health().await.leases.iter().any(|l| {
                l.processor == processor
                    && l.blocked.is_some()
                    && l.oldest_pending_age
                        .is_some_and(|age| age >= Duration::from_secs(2))
            })
        },
    )
    .await;
    let health = runtime.health().await;
    let lease = health
        .leases
        .iter()
        .find(|l| l.processor == processor && l.blocked.is_some())
        .unwrap();
    assert_eq!(lease.stranded, 0, "{lease:?}");
    assert!(!health.is_healthy());
    let oldest: Vec<f64> = metrics
        .of(OLDEST_AGE)
        .iter()
        .filter(|p| {
            p.attributes.get("chatter.messaging.outbox.lease_token") == Some(&lease.lease_token)
        })
        .map(|p| p.number())
        .collect();
    assert!(
        oldest.len() == 1 && oldest[0] >= 1.0,
        "the gauge shows the stall: {oldest:?}"
    );
    // Neither document was written: both keep the ETag they were created with.
    assert_eq!(reread(&outbox, &first).await["_etag"], first["_etag"]);
    assert_eq!(reread(&outbox, &second).await["_etag"], second["_etag"]);
    assert!(
        logs.matching(Level::ERROR, "behind the checkpoint")
            .is_empty()
    );
    assert!(
        metrics.of(STRANDED).is_empty(),
        "{:?}",
        metrics.of(STRANDED)
    );

    lifted.store(true, Ordering::SeqCst);
    let mut order = Vec::new();
    for _ in 0..2 {
        let delivery = next_delivery(&mut orders, WAIT).await;
        order.push(delivery.message.message_id.clone());
        delivery.ack().await.unwrap();
    }
    assert_eq!(order, ["m-first", "m-second"], "the key's order holds");
    runtime.shutdown().await;
}

#[tokio::test]
async fn a_zero_sweep_interval_is_refused() {
    let (cosmos, _) = setup().await;
    let relay = StandaloneRelay::builder(&cosmos, (DB, OUTBOX), (DB, LEASES))
        .partition_key_paths(PATHS)
        .options(fast_relay(Duration::from_secs(5)).sweep_interval(Duration::ZERO))
        .build();
    let error = match relay {
        // The builder refuses it, with the option named in its cause.
        Err(error) => {
            let cause = std::error::Error::source(&error).map(ToString::to_string);
            format!("{error}: {}", cause.unwrap_or_default())
        }
        Ok(relay) => Runtime::builder()
            .cosmos(cosmos)
            .consume(false)
            .standalone_relay(relay)
            .start()
            .await
            .unwrap_err()
            .to_string(),
    };
    assert!(error.contains("sweep_interval"), "{error}");
}
