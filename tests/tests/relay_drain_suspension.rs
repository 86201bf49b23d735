//! Drain Suspension (catalog area 6): the gate on a manual clock (6.2), and the drain's pages
//! against a `chatter-emulator` server that refuses every PATCH (the relay's stamps) with a real
//! HTTP 403, as for an identity that may read but not patch (6.1, 6.3).

use std::error::Error;
use std::sync::Arc;
use std::time::Duration;

use chatter_emulator::{Faults, RunningEmulator};
use chatter_runtime::BrokeredMessage;
use chatter_runtime::broker::{Broker, BrokerError, InMemoryBroker, Subscription};
use chatter_runtime::cosmos::{self, ContainerClient};
use chatter_runtime::registration::PartitionKeyPath;
use chatter_runtime::testing::DeliverySettings;
use chatter_runtime::testing::OutboxDocument;
use chatter_runtime::testing::{
    Admission, CONFIRMATION_FAILURE_THRESHOLD, ConfirmationReceipt, DrainGate, ManualClock,
    SUSPENSION_WINDOW,
};
use chatter_runtime::testing::{Drain, DrainError, DrainReport};
use chatter_tests::logs::capture;
use chatter_tests::store::{created, document, emulator_server, provisioned};
use futures::future::BoxFuture;
use serde_json::{Value, json};
use tracing::Level;

const PATHS: &[&str] = &["/tenantId"];
/// The same key as the registration of a command partitioned on `/tenantId` declares it.
const KEY: &[PartitionKeyPath] = &[PartitionKeyPath {
    path: "/tenantId",
    pointer: "/tenantId",
}];
const SOURCE: &str = "chatter-cosmos-outbox-relay:source-a";

fn fault() -> std::io::Error {
    std::io::Error::other("the stamp was refused")
}

fn gate() -> (DrainGate, Arc<ManualClock>) {
    let clock = Arc::new(ManualClock::new());
    (DrainGate::with_clock(SOURCE, clock.clone()), clock)
}

fn fail(gate: &DrainGate, lease: &str, times: u32) {
    for _ in 0..times {
        gate.record_confirmation_failure(lease, &fault());
    }
}

// ---- 6.2: the gate ----

// R6.29
#[test]
fn threshold_and_window_are_the_specified_constants() {
    assert_eq!(CONFIRMATION_FAILURE_THRESHOLD, 5);
    assert_eq!(SUSPENSION_WINDOW, Duration::from_secs(60));
}

// R6.10, R6.11, R6.12
#[test]
fn the_fifth_consecutive_confirmation_failure_suspends_the_lease() {
    let (gate, _) = gate();
    assert!(gate.permit_drain("lease-7"));
    fail(&gate, "lease-7", 4);
    assert!(gate.permit_drain("lease-7"));
    fail(&gate, "lease-7", 1);
    assert!(!gate.permit_drain("lease-7"));
    assert_eq!(gate.suspended_leases(), ["lease-7"]);
}

// R6.15
#[test]
fn opening_a_suspension_logs_one_error_with_the_lease_the_count_and_the_fault() {
    let (logs, _guard) = capture();
    let (gate, _) = gate();
    fail(&gate, "lease-7", 5);
    let entries = logs.entries();
    assert_eq!(entries.len(), 1, "{entries:?}");
    let entry = &entries[0];
    assert_eq!(entry.level, Level::ERROR);
    assert_eq!(
        entry.message,
        "The Cosmos Outbox Relay suspended draining lease lease-7 after 5 consecutive \
         confirmation failures. Its messages published but could not be marked delivered, so \
         every redrain republished them; draining resumes once a confirmation succeeds."
    );
    assert_eq!(entry.field("error"), Some("the stamp was refused"));
    assert_eq!(entry.field("source_identity"), Some(SOURCE));
}

// R6.16
#[test]
fn after_the_window_exactly_one_probe_is_let_through() {
    let (gate, clock) = gate();
    fail(&gate, "lease-7", 5);
    clock.advance(Duration::from_secs(59));
    assert!(!gate.permit_drain("lease-7"));
    clock.advance(Duration::from_secs(1));
    assert!(gate.permit_drain("lease-7"), "the probe");
    assert!(!gate.permit_drain("lease-7"), "only one probe");
}

// R6.17
#[test]
fn a_failure_while_suspended_rearms_the_window_without_a_new_report() {
    let (logs, _guard) = capture();
    let (gate, clock) = gate();
    fail(&gate, "lease-7", 5);
    clock.advance(SUSPENSION_WINDOW);
    assert!(gate.permit_drain("lease-7"));
    fail(&gate, "lease-7", 1);
    clock.advance(Duration::from_secs(59));
    assert!(!gate.permit_drain("lease-7"));
    assert_eq!(logs.at(Level::ERROR).len(), 1, "reported once per opening");
}

// R6.18, R6.19
#[test]
fn a_receipt_resumes_a_suspended_lease_at_once_and_logs_the_resume() {
    let (logs, _guard) = capture();
    let (gate, _) = gate();
    fail(&gate, "lease-7", 5);
    gate.record_confirmation_success("lease-7", Some(ConfirmationReceipt));
    assert!(gate.permit_drain("lease-7"));
    assert!(gate.suspended_leases().is_empty());
    let entries = logs.entries();
    assert_eq!(entries.len(), 2, "{entries:?}");
    let resumed = &entries[1];
    assert_eq!(resumed.level, Level::INFO);
    assert_eq!(
        resumed.message,
        "The Cosmos Outbox Relay resumed draining lease lease-7: a confirmation succeeded, so \
         its documents are being marked delivered again."
    );
    assert_eq!(resumed.field("error"), None);
}

// R6.20, R6.21
#[test]
fn no_receipt_lifts_nothing_and_logs_nothing() {
    let (logs, _guard) = capture();
    let (gate, _) = gate();
    fail(&gate, "lease-7", 5);
    gate.record_confirmation_success("lease-7", None);
    assert!(!gate.permit_drain("lease-7"));
    assert_eq!(logs.entries().len(), 1, "only the suspension");
}

// R6.22
#[test]
fn no_receipt_does_not_reset_the_count() {
    let (gate, _) = gate();
    fail(&gate, "lease-7", 4);
    gate.record_confirmation_success("lease-7", None);
    fail(&gate, "lease-7", 1);
    assert!(!gate.permit_drain("lease-7"));
}

// R6.23, R6.24
#[test]
fn only_consecutive_failures_count_and_a_never_suspended_lease_logs_nothing() {
    let (logs, _guard) = capture();
    let (gate, _) = gate();
    fail(&gate, "lease-7", 4);
    gate.record_confirmation_success("lease-7", Some(ConfirmationReceipt));
    gate.record_confirmation_success("lease-7", Some(ConfirmationReceipt));
    assert!(logs.entries().is_empty());
    fail(&gate, "lease-7", 4);
    assert!(gate.permit_drain("lease-7"));
}

// R6.25
#[test]
fn suspension_is_per_lease() {
    let (gate, _) = gate();
    fail(&gate, "lease-7", 5);
    assert!(gate.permit_drain("lease-9"));
    assert!(gate.is_suspended("lease-7"));
    assert!(!gate.is_suspended("lease-9"));
}

// R6.14 (the identity part; the measurement comes with metrics)
#[test]
fn the_gate_carries_its_processors_source_identity() {
    let (gate, _) = gate();
    assert_eq!(gate.source_identity(), SOURCE);
}

/// A log sink that panics on every event (R8.61, R8.66).
struct PanickingSink;

impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for PanickingSink {
    fn on_event(&self, _: &tracing::Event<'_>, _: tracing_subscriber::layer::Context<'_, S>) {
        panic!("the log sink failed");
    }
}

// R8.61, R8.66: a panicking log sink never takes the gate (or the relay) down with it.
#[test]
fn a_panicking_log_sink_does_not_break_suspension_or_resume() {
    use tracing_subscriber::layer::SubscriberExt;
    let subscriber = tracing_subscriber::registry().with(PanickingSink);
    let _guard = tracing::subscriber::set_default(subscriber);
    let (gate, _) = gate();
    fail(&gate, "lease-7", 5);
    assert!(!gate.permit_drain("lease-7"));
    gate.record_confirmation_success("lease-7", Some(ConfirmationReceipt));
    assert!(gate.permit_drain("lease-7"));
}

// ---- 6.1 and 6.3: the drain's pages against refused stamps ----

struct Fixture {
    emulator: RunningEmulator,
    container: Arc<ContainerClient>,
    broker: InMemoryBroker,
    clock: Arc<ManualClock>,
    drain: Drain,
}

impl Fixture {
    async fn new() -> Self {
        let (emulator, cosmos) = emulator_server().await;
        let container = provisioned(&cosmos, "shop", "orders", PATHS).await;
        let broker = InMemoryBroker::new();
        let clock = Arc::new(ManualClock::new());
        let drain = drain(SOURCE, &broker, &container, &clock);
        Self {
            emulator,
            container,
            broker,
            clock,
            drain,
        }
    }

    fn faults(&self) -> Faults {
        self.emulator.faults()
    }

    fn refuse_stamps(&self) {
        self.faults()
            .refuse("PATCH", 403, Duration::from_secs(3600));
    }

    /// A pending document stored in `tenant`, as the change feed hands it over.
    async fn pending(&self, message_id: &str, tenant: &str) -> Value {
        let message = BrokeredMessage::json(message_id, "orders", r#"{"orderId":7}"#);
        let doc = OutboxDocument::build(&message, PATHS, &[json!(tenant)]).unwrap();
        self.store(doc).await
    }

    async fn store(&self, doc: Value) -> Value {
        created(&self.container, &[doc["tenantId"].clone()], &doc).await
    }

    async fn read(&self, doc: &Value) -> Value {
        document(
            &self.container,
            &[doc["tenantId"].clone()],
            doc["id"].as_str().unwrap(),
        )
        .await
    }

    /// Drains `doc` on lease "0" `times` times, each a Confirmation Failure.
    async fn fail_confirmations(&self, doc: &Value, times: usize) {
        for _ in 0..times {
            confirmation_failure(&self.drain, "0", std::slice::from_ref(doc)).await;
        }
    }

    fn published(&self) -> usize {
        self.broker.published_count("orders")
    }

    /// `msg-1` pending in tenant `t`, its stamps refused, and `times` failed confirmations of it
    /// on lease "0" (see [`Fixture::fail_confirmations`]): the document.
    async fn failing_confirmations(&self, times: usize) -> Value {
        let doc = self.pending("msg-1", "t").await;
        self.refuse_stamps();
        self.fail_confirmations(&doc, times).await;
        doc
    }
}

fn drain(
    source: &str,
    broker: &InMemoryBroker,
    container: &Arc<ContainerClient>,
    clock: &Arc<ManualClock>,
) -> Drain {
    Drain::new(
        source,
        Arc::new(broker.clone()),
        container.clone(),
        KEY,
        DeliverySettings::default(),
    )
    .with_clock(clock.clone())
}

/// Drains `docs` on `lease` expecting a Confirmation Failure.
async fn confirmation_failure(drain: &Drain, lease: &str, docs: &[Value]) {
    let err = drain.drain(lease, docs).await.unwrap_err();
    assert!(
        matches!(err, DrainError::Confirmation { .. }),
        "expected a Confirmation Failure, got {err}"
    );
}

fn status_of(error: &DrainError) -> Option<u16> {
    let source = error.source()?;
    source
        .downcast_ref::<cosmos::CosmosStoreError>()
        .and_then(cosmos::CosmosStoreError::status)
}

// R6.01, R6.30, R6.08
#[tokio::test]
async fn a_refused_stamp_after_a_publish_is_a_confirmation_failure_carrying_the_store_error() {
    let f = Fixture::new().await;
    let doc = f.pending("msg-1", "t").await;
    f.refuse_stamps();
    let err = f
        .drain
        .drain("0", std::slice::from_ref(&doc))
        .await
        .unwrap_err();
    match &err {
        DrainError::Confirmation { message_id, .. } => assert_eq!(message_id, "msg-1"),
        other => panic!("expected a Confirmation Failure, got {other}"),
    }
    assert_eq!(status_of(&err), Some(403), "the store's own 403: {err}");
    assert_eq!(f.published(), 1, "published exactly once");
    assert_eq!(f.read(&doc).await["status"], "pending");
}

// R6.31, R6.12, R6.40
#[tokio::test]
async fn five_failed_confirmations_suspend_the_lease_and_the_sixth_page_publishes_nothing() {
    let f = Fixture::new().await;
    let doc = f.failing_confirmations(5).await;
    let err = f.drain.drain("0", &[doc]).await.unwrap_err();
    assert!(matches!(err, DrainError::Suspended { .. }), "{err}");
    assert_eq!(
        err.to_string(),
        "The Cosmos Outbox Relay has suspended draining lease '0': its documents published but \
         could not be marked delivered, so every redrain republished them. The batch is not \
         checkpointed and re-surfaces once draining resumes."
    );
    assert_eq!(f.published(), 5);
    assert_eq!(f.drain.gate().suspended_leases(), ["0"]);
}

// R6.32, R5.40, R6.44: the gate is consulted above the pending gate and the contract.
#[tokio::test]
async fn a_suspended_lease_refuses_a_page_of_domain_documents_or_poison_before_looking_at_them() {
    let f = Fixture::new().await;
    let doc = f.pending("msg-1", "t").await;
    let mut poison = f.pending("msg-poison", "t").await;
    poison["Destination"] = json!("");
    f.refuse_stamps();
    f.fail_confirmations(&doc, 5).await;
    f.faults().clear();
    let domain = json!({ "id": "order-1", "tenantId": "t" });
    for page in [vec![domain], vec![poison.clone()]] {
        let err = f.drain.drain("0", &page).await.unwrap_err();
        assert!(matches!(err, DrainError::Suspended { .. }), "{err}");
    }
    assert_eq!(
        f.read(&poison).await["status"],
        "pending",
        "the poison was not stamped"
    );
}

// R6.34, R6.25
#[tokio::test]
async fn another_lease_keeps_draining_while_one_is_suspended() {
    let f = Fixture::new().await;
    f.failing_confirmations(5).await;
    let other = f.pending("msg-2", "u").await;
    // Lease "1" publishes and its own refused stamp comes back as itself.
    confirmation_failure(&f.drain, "1", &[other]).await;
    assert_eq!(f.published(), 6);
}

// R6.35, R6.05
#[tokio::test]
async fn a_confirmed_page_between_failures_resets_the_count() {
    let f = Fixture::new().await;
    let doc = f.failing_confirmations(4).await;
    f.faults().clear();
    let good = f.pending("msg-2", "t").await;
    assert_eq!(f.drain.drain("0", &[good]).await.unwrap().published, 1);
    f.refuse_stamps();
    f.fail_confirmations(&doc, 5).await;
    assert!(
        f.drain.gate().is_suspended("0"),
        "the fifth after the reset suspends"
    );
    assert_eq!(f.published(), 10);
}

// R6.35 (the other side): 4 failures, a receipt, 4 failures: not suspended.
#[tokio::test]
async fn four_failures_after_a_confirmed_page_do_not_suspend() {
    let f = Fixture::new().await;
    let doc = f.failing_confirmations(4).await;
    f.faults().clear();
    let good = f.pending("msg-2", "t").await;
    f.drain.drain("0", &[good]).await.unwrap();
    f.refuse_stamps();
    f.fail_confirmations(&doc, 4).await;
    assert!(!f.drain.gate().is_suspended("0"));
}

// R6.36, R6.37, R6.07: a page that confirmed nothing is no evidence.
#[tokio::test]
async fn an_empty_page_or_a_page_of_domain_documents_neither_resets_nor_lifts() {
    for page in [vec![], vec![json!({ "id": "order-1", "tenantId": "t" })]] {
        let f = Fixture::new().await;
        let doc = f.failing_confirmations(4).await;
        let report = f.drain.drain("0", &page).await.unwrap();
        assert_eq!(report.published, 0);
        confirmation_failure(&f.drain, "0", std::slice::from_ref(&doc)).await;
        assert!(f.drain.gate().is_suspended("0"), "page {page:?}");
    }
}

// R6.38
#[tokio::test]
async fn an_empty_probe_consumes_the_probe_and_the_next_page_is_refused() {
    let f = Fixture::new().await;
    let doc = f.failing_confirmations(5).await;
    f.clock.advance(SUSPENSION_WINDOW);
    assert_eq!(
        f.drain.drain("0", &[]).await.unwrap(),
        DrainReport::default()
    );
    let err = f.drain.drain("0", &[doc]).await.unwrap_err();
    assert!(matches!(err, DrainError::Suspended { .. }), "{err}");
    assert_eq!(f.published(), 5);
}

// R6.16 end to end: a probe that confirms resumes the lease; R6.06: an undeliverable stamp's
// receipt lifts a suspension like a delivered one.
#[tokio::test]
async fn a_probe_whose_stamp_lands_resumes_the_lease_whether_delivered_or_undeliverable() {
    for poison_probe in [false, true] {
        let f = Fixture::new().await;
        let doc = f.failing_confirmations(5).await;
        f.faults().clear();
        f.clock.advance(SUSPENSION_WINDOW);
        let probe = if poison_probe {
            let mut poison = f.pending("msg-poison", "t").await;
            poison["Destination"] = json!(" ");
            poison
        } else {
            doc.clone()
        };
        let report = f.drain.drain("0", &[probe]).await.unwrap();
        assert_eq!(
            (report.published, report.undeliverable),
            if poison_probe { (0, 1) } else { (1, 0) }
        );
        assert!(!f.drain.gate().is_suspended("0"));
        assert!(
            f.drain.drain("0", &[]).await.is_ok(),
            "drains again at once"
        );
    }
}

// R6.16's other side: only a stamp that landed resumes the lease. A probe whose stamp meets
// another writer's verdict (its 412, read back) wrote nothing: the store has not shown it takes
// stamps again.
#[tokio::test]
async fn a_probe_whose_stamp_meets_another_writers_verdict_does_not_resume_the_lease() {
    let f = Fixture::new().await;
    let doc = f.failing_confirmations(5).await;
    f.faults().clear();
    // Another relay stamped it meanwhile (another ttl than this relay's).
    let mut delivered = doc.clone();
    delivered["status"] = json!("delivered");
    delivered["ttl"] = json!(60);
    chatter_runtime::testing::upsert_item(
        &f.container,
        chatter_runtime::cosmos::partition_key(&[json!("t")]).unwrap(),
        &delivered,
    )
    .await
    .unwrap();
    f.clock.advance(SUSPENSION_WINDOW);
    // The probe holds the version the change feed read before that stamp.
    let report = f
        .drain
        .drain("0", std::slice::from_ref(&doc))
        .await
        .unwrap();
    assert_eq!(report.published, 1);
    assert!(
        f.drain.gate().is_suspended("0"),
        "no stamp landed: still suspended"
    );
    assert_eq!(f.read(&doc).await["ttl"], 60, "the other verdict stands");
}

// R6.41: gates are per processor.
#[tokio::test]
async fn two_sources_on_the_same_lease_token_have_their_own_gates() {
    let f = Fixture::new().await;
    let b = drain(
        "chatter-cosmos-outbox-relay:source-b",
        &f.broker,
        &f.container,
        &f.clock,
    );
    let doc = f.failing_confirmations(4).await;
    f.faults().clear();
    let good = f.pending("msg-2", "t").await;
    b.drain("0", &[good]).await.unwrap();
    f.refuse_stamps();
    confirmation_failure(&f.drain, "0", std::slice::from_ref(&doc)).await;
    assert!(f.drain.gate().is_suspended("0"), "A reached its fifth");
    f.faults().clear();
    let another = f.pending("msg-3", "t").await;
    assert_eq!(b.drain("0", &[another]).await.unwrap().published, 1);
}

// R6.43: receipts are presented once, after the whole page.
#[tokio::test]
async fn a_page_whose_first_stamp_lands_and_second_fails_records_only_the_failure() {
    let f = Fixture::new().await;
    let wedged = f.pending("msg-1", "t").await;
    f.refuse_stamps();
    f.fail_confirmations(&wedged, 4).await;
    f.faults().clear();
    // The second document was deleted after the change feed read it: its stamp fails (404).
    let good = f.pending("msg-2", "t").await;
    let gone = f.pending("msg-3", "t").await;
    f.container
        .delete_item(
            cosmos::partition_key(&[json!("t")]).unwrap(),
            gone["id"].as_str().unwrap(),
            None,
        )
        .await
        .unwrap();
    let err = f.drain.drain("0", &[good.clone(), gone]).await.unwrap_err();
    assert_eq!(status_of(&err), Some(404), "{err}");
    assert_eq!(f.read(&good).await["status"], "delivered");
    assert!(
        f.drain.gate().is_suspended("0"),
        "the first document's receipt did not reset the count before the failure"
    );
}

// R6.02-like for our relay: an undeliverable stamp that fails is not a Confirmation Failure.
#[tokio::test]
async fn failed_undeliverable_stamps_never_count_towards_a_suspension() {
    let f = Fixture::new().await;
    let mut poison = f.pending("msg-poison", "t").await;
    poison["MessageBody"] = json!(7);
    f.refuse_stamps();
    for _ in 0..6 {
        let err = f
            .drain
            .drain("0", std::slice::from_ref(&poison))
            .await
            .unwrap_err();
        assert!(
            matches!(err, DrainError::UndeliverableStamp { .. }),
            "{err}"
        );
    }
    assert!(!f.drain.gate().is_suspended("0"));
    assert_eq!(f.published(), 0);
}

// ---- the bound holds for any page: a failing lease drains one document at a time ----

/// Drains `docs` on lease "0" once, expecting a failure; how many messages it published.
async fn publishes_of_a_failing_page(f: &Fixture, docs: &[Value]) -> usize {
    let before = f.published();
    f.drain.drain("0", docs).await.unwrap_err();
    f.published() - before
}

#[tokio::test]
async fn a_page_of_100_keys_whose_stamps_are_refused_publishes_one_document_per_page_once_failing()
{
    let f = Fixture::new().await;
    let mut docs = Vec::new();
    for n in 0..100 {
        docs.push(f.pending(&format!("msg-{n}"), &format!("t-{n}")).await);
    }
    f.refuse_stamps();
    // The first failure cannot be foreseen: the documents in flight when it comes (up to the
    // in-flight limit, 32) were published concurrently.
    let first = publishes_of_a_failing_page(&f, &docs).await;
    assert!((1..=32).contains(&first), "{first}");
    // From then on the lease is failing: each page publishes one document and fails on it.
    for page in 2..=CONFIRMATION_FAILURE_THRESHOLD {
        assert_eq!(
            publishes_of_a_failing_page(&f, &docs).await,
            1,
            "page {page}"
        );
    }
    assert!(f.drain.gate().is_suspended("0"));
    assert_eq!(publishes_of_a_failing_page(&f, &docs).await, 0, "suspended");
    // Every probe window: one probe, one publish.
    for _ in 0..3 {
        f.clock.advance(SUSPENSION_WINDOW);
        assert_eq!(publishes_of_a_failing_page(&f, &docs).await, 1, "the probe");
        assert_eq!(publishes_of_a_failing_page(&f, &docs).await, 0);
    }
    for doc in &docs {
        assert_eq!(f.read(doc).await["status"], "pending");
    }
}

#[tokio::test]
async fn a_probe_whose_stamp_lands_drains_the_rest_of_the_page_and_resumes_concurrency() {
    let f = Fixture::new().await;
    let mut docs = Vec::new();
    for n in 0..10 {
        docs.push(f.pending(&format!("msg-{n}"), &format!("t-{n}")).await);
    }
    f.refuse_stamps();
    for _ in 0..CONFIRMATION_FAILURE_THRESHOLD {
        publishes_of_a_failing_page(&f, &docs).await;
    }
    f.faults().clear();
    f.clock.advance(SUSPENSION_WINDOW);
    let report = f.drain.drain("0", &docs).await.unwrap();
    assert_eq!(report.published, 10);
    assert!(!f.drain.gate().is_suspended("0"));
    assert_eq!(f.drain.gate().admit("0"), Admission::Concurrent, "resumed");
    for doc in &docs {
        assert_eq!(f.read(doc).await["status"], "delivered");
    }
}

// ---- a page cancelled after it published still counts ----

#[tokio::test]
async fn a_page_cancelled_by_the_handler_timeout_after_publishing_is_a_confirmation_failure() {
    let f = Fixture::new().await;
    let doc = f.pending("msg-1", "t").await;
    // The stamp is applied but its answer never comes within the page's bound, as a store that
    // hangs does: the processor's handler timeout cancels the page after the publish.
    f.faults().answer_late("PATCH", Duration::from_secs(60));
    for n in 1..=CONFIRMATION_FAILURE_THRESHOLD {
        let page = f.drain.drain("0", std::slice::from_ref(&doc));
        assert!(
            tokio::time::timeout(Duration::from_millis(300), page)
                .await
                .is_err(),
            "page {n} is cancelled"
        );
    }
    assert!(
        f.drain.gate().is_suspended("0"),
        "five cancelled pages that published are five Confirmation Failures"
    );
    assert_eq!(f.published(), 5);
    let err = f.drain.drain("0", &[doc]).await.unwrap_err();
    assert!(matches!(err, DrainError::Suspended { .. }), "{err}");
}

/// Test double: a broker whose publish never confirms, so a page can be cancelled while its
/// publish is in flight (no real broker hangs exactly one publish on demand).
struct NeverConfirms;

impl Broker for NeverConfirms {
    fn publish(&self, _: BrokeredMessage) -> BoxFuture<'_, Result<(), BrokerError>> {
        Box::pin(std::future::pending())
    }

    fn subscribe<'a>(
        &'a self,
        destination: &'a str,
    ) -> BoxFuture<'a, Result<Subscription, BrokerError>> {
        Box::pin(async move {
            Err(BrokerError::InvalidDestination {
                destination: destination.to_owned(),
                reason: "the test double only publishes".into(),
            })
        })
    }
}

#[tokio::test]
async fn a_page_cancelled_before_the_broker_confirmed_counts_nothing() {
    let f = Fixture::new().await;
    let doc = f.pending("msg-1", "t").await;
    let hanging = Drain::new(
        SOURCE,
        Arc::new(NeverConfirms),
        f.container.clone(),
        KEY,
        DeliverySettings::default(),
    )
    .with_clock(f.clock.clone());
    for _ in 0..CONFIRMATION_FAILURE_THRESHOLD {
        let page = hanging.drain("0", std::slice::from_ref(&doc));
        assert!(
            tokio::time::timeout(Duration::from_millis(100), page)
                .await
                .is_err(),
            "cancelled while publishing"
        );
    }
    assert!(!hanging.gate().is_suspended("0"));
    assert_eq!(
        hanging.gate().admit("0"),
        Admission::Concurrent,
        "no record"
    );
}

/// Test double around the in-memory broker: confirming a `msg-2..` makes the store answer every
/// later stamp 60 s late, so within one page the first stamp lands and the second hangs (the
/// store's fault is real; only its moment is chosen here).
struct SlowStampsFromTheSecond {
    broker: InMemoryBroker,
    faults: Faults,
}

impl Broker for SlowStampsFromTheSecond {
    fn publish(&self, message: BrokeredMessage) -> BoxFuture<'_, Result<(), BrokerError>> {
        if message.message_id.starts_with("msg-2") {
            self.faults.answer_late("PATCH", Duration::from_secs(60));
        }
        self.broker.publish(message)
    }

    fn subscribe<'a>(
        &'a self,
        destination: &'a str,
    ) -> BoxFuture<'a, Result<Subscription, BrokerError>> {
        self.broker.subscribe(destination)
    }
}

#[tokio::test]
async fn a_cancelled_page_one_of_whose_stamps_landed_counts_nothing() {
    let f = Fixture::new().await;
    let broker = SlowStampsFromTheSecond {
        broker: f.broker.clone(),
        faults: f.faults(),
    };
    let drain = Drain::new(
        SOURCE,
        Arc::new(broker),
        f.container.clone(),
        KEY,
        DeliverySettings::default(),
    )
    .with_clock(f.clock.clone());
    for n in 0..CONFIRMATION_FAILURE_THRESHOLD {
        // Two documents of one key: the first is stamped, the second's stamp hangs and the page
        // is cancelled. The store takes stamps, it is slow: no Confirmation Failure.
        let first = f.pending(&format!("msg-1-{n}"), "t").await;
        let second = f.pending(&format!("msg-2-{n}"), "t").await;
        let docs = [first.clone(), second];
        let page = drain.drain("0", &docs);
        assert!(
            tokio::time::timeout(Duration::from_millis(1500), page)
                .await
                .is_err(),
            "cancelled on its second stamp"
        );
        f.faults().clear();
        assert_eq!(f.read(&first).await["status"], "delivered");
    }
    assert!(!drain.gate().is_suspended("0"));
}

// ---- suspension state follows lease ownership ----

#[test]
fn a_forgotten_lease_that_fails_again_logs_and_counts_its_suspension_again() {
    let (logs, _guard) = capture();
    let (gate, _) = gate();
    fail(&gate, "lease-7", 5);
    assert!(gate.is_suspended("lease-7"));
    // The lease left this instance (lost, released, split).
    gate.forget("lease-7");
    assert!(gate.suspended_leases().is_empty());
    assert!(gate.permit_drain("lease-7"));
    // It came back and fails again: a fresh count, a new suspension, a new report.
    fail(&gate, "lease-7", 4);
    assert!(!gate.is_suspended("lease-7"));
    fail(&gate, "lease-7", 1);
    assert!(gate.is_suspended("lease-7"));
    assert_eq!(logs.at(Level::ERROR).len(), 2, "reported at each opening");
}
