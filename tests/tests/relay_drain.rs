//! The relay's drain against the in-memory emulator (catalog 3.1-3.2): only genuine pending Outbox
//! Documents are published, verbatim; each is stamped delivered + ttl in one patch after the broker
//! confirmed; a failed publish stamps nothing.

use std::sync::Arc;

use chatter_runtime::BrokeredMessage;
use chatter_runtime::broker::{Broker, BrokerError, InMemoryBroker, Subscription};
use chatter_runtime::cosmos::ContainerClient;
use chatter_runtime::registration::PartitionKeyPath;
use chatter_runtime::testing::DeliverySettings;
use chatter_runtime::testing::OutboxDocument;
use chatter_runtime::testing::{Drain, DrainError, DrainReport};
use chatter_tests::broker::{Intercepted, next_delivery};
use chatter_tests::store::{created, document, embedded, provisioned};
use futures::future::BoxFuture;
use serde_json::{Value, json};

const PATHS: &[&str] = &["/tenantId"];
/// The same key as the registration of a command partitioned on `/tenantId` declares it.
const KEY: &[PartitionKeyPath] = &[PartitionKeyPath {
    path: "/tenantId",
    pointer: "/tenantId",
}];
const SOURCE: &str = "chatter-cosmos-outbox-relay:test";
const LEASE: &str = "0";

async fn container() -> Arc<ContainerClient> {
    provisioned(&embedded().await, "shop", "orders", PATHS).await
}

fn message(id: &str) -> BrokeredMessage {
    BrokeredMessage {
        message_id: id.into(),
        destination: "orders".into(),
        body: r#"{"OrderId":7,"Sku":"abc"}"#.into(),
        content_type: "application/json".into(),
        context: serde_json::Map::from_iter([(
            "Chatter.Infrastructure.Type".to_owned(),
            json!("test-infra"),
        )]),
    }
}

/// Writes `doc` and returns it as the change feed would hand it over.
async fn stored(c: &ContainerClient, doc: Value) -> Value {
    created(c, &[doc["tenantId"].clone()], &doc).await
}

async fn read(c: &ContainerClient, id: &str, tenant: &Value) -> Value {
    document(c, std::slice::from_ref(tenant), id).await
}

fn pending(id: &str, tenant: &str) -> Value {
    OutboxDocument::build(&message(id), PATHS, &[json!(tenant)]).unwrap()
}

/// A drain of `c` on lease source [`SOURCE`] publishing to `broker`, with the default delivery
/// settings.
fn default_drain(broker: impl Broker + 'static, c: &Arc<ContainerClient>) -> Drain {
    Drain::new(
        SOURCE,
        Arc::new(broker),
        c.clone(),
        KEY,
        DeliverySettings::default(),
    )
}

async fn next(sub: &mut Subscription) -> BrokeredMessage {
    let delivery = next_delivery(sub, std::time::Duration::from_secs(10)).await;
    let message = delivery.message.clone();
    delivery.ack().await.unwrap();
    message
}

#[tokio::test]
async fn a_genuine_pending_document_is_published_verbatim_and_stamped_delivered_with_ttl() {
    let c = container().await;
    let broker = InMemoryBroker::new();
    let mut sub = broker.subscribe("orders").await.unwrap();
    let doc = stored(&c, pending("msg-42", "tenant-1")).await;
    let drain = default_drain(broker.clone(), &c);

    // R3.20: exactly one publish, one stamp.
    let report = drain
        .drain(LEASE, std::slice::from_ref(&doc))
        .await
        .unwrap();
    assert_eq!(
        report,
        DrainReport {
            published: 1,
            skipped: 0,
            undeliverable: 0,
            dropped: 0,
        }
    );
    // R3.23: the message reconstructed verbatim.
    assert_eq!(next(&mut sub).await, message("msg-42"));
    assert_eq!(broker.published_count("orders"), 1);
    // R3.25/R3.26: status delivered and ttl 86400 (an int), keyed by the recovered partition key.
    let after = read(&c, doc["id"].as_str().unwrap(), &json!("tenant-1")).await;
    assert_eq!(after["status"], "delivered");
    assert_eq!(after["ttl"], json!(86400));
    // R3.33: the stamped document coming back through the change feed is not published again.
    assert_eq!(
        drain.drain(LEASE, &[after]).await.unwrap(),
        DrainReport {
            published: 0,
            skipped: 1,
            undeliverable: 0,
            dropped: 0,
        }
    );
    assert_eq!(broker.published_count("orders"), 1);
}

#[tokio::test]
async fn custom_delivery_settings_are_stamped() {
    let c = container().await;
    let broker = InMemoryBroker::new();
    let doc = stored(&c, pending("msg-43", "tenant-1")).await;
    let settings = DeliverySettings {
        delivered_status: "done".into(),
        delivered_ttl_seconds: 999,
    };
    // R3.27.
    Drain::new(SOURCE, Arc::new(broker), c.clone(), KEY, settings)
        .drain(LEASE, &[doc])
        .await
        .unwrap();
    let after = read(&c, "outbox:bXNnLTQz", &json!("tenant-1")).await;
    assert_eq!(
        (after["status"].clone(), after["ttl"].clone()),
        (json!("done"), json!(999))
    );
}

#[tokio::test]
async fn documents_that_are_not_pending_outbox_documents_are_never_published_or_touched() {
    let c = container().await;
    let broker = InMemoryBroker::new();
    let genuine = pending("msg-1", "t");
    let mut variants = vec![
        json!({ "id": "order-1", "tenantId": "t", "quantity": 1 }),
        json!({ "id": "inbox:bXNnLTE", "_chatterType": "inbox", "MessageId": "msg-1", "tenantId": "t" }),
    ];
    // R3.02: other discriminators; R3.03: other statuses; R3.04/R3.05: ids not minted for the message.
    for (key, value) in [
        ("_chatterType", json!("aggregate")),
        ("status", json!("delivered")),
        ("status", json!("undeliverable")),
        ("status", json!("")),
        ("status", json!("Pending")),
        ("id", json!("app-authored-id")),
        ("id", json!("outbox:c29tZS1vdGhlci1tZXNzYWdl")),
    ] {
        let mut doc = genuine.clone();
        doc[key] = value;
        if key != "id" {
            doc["id"] = json!(format!("outbox:{}", variants.len()));
        }
        variants.push(doc);
    }
    let mut without_status = genuine.clone();
    without_status
        .as_object_mut()
        .unwrap()
        .shift_remove("status");
    without_status["id"] = json!("outbox:no-status");
    variants.push(without_status);

    let mut stored_docs = Vec::new();
    for doc in variants {
        stored_docs.push(stored(&c, doc).await);
    }
    let drain = default_drain(broker.clone(), &c);
    let report = drain.drain(LEASE, &stored_docs).await.unwrap();
    // R3.21/R3.22: nothing published, nothing patched (app data never mutated).
    assert_eq!(
        report,
        DrainReport {
            published: 0,
            skipped: stored_docs.len(),
            undeliverable: 0,
            dropped: 0,
        }
    );
    assert_eq!(broker.published_count("orders"), 0);
    for doc in &stored_docs {
        let now = read(&c, doc["id"].as_str().unwrap(), &json!("t")).await;
        assert_eq!(now["_etag"], doc["_etag"], "{} untouched", doc["id"]);
    }
}

/// Test double: a broker that refuses every publish. The in-memory broker cannot be made to fail
/// a publish on demand, and R3.28 is about exactly that fault.
struct RefusingBroker;

impl Broker for RefusingBroker {
    fn publish(&self, message: BrokeredMessage) -> BoxFuture<'_, Result<(), BrokerError>> {
        Box::pin(async move {
            Err(BrokerError::Rejected {
                message_id: message.message_id,
                destination: message.destination,
                reason: "refused by the test double".into(),
            })
        })
    }

    fn subscribe<'a>(
        &'a self,
        destination: &'a str,
    ) -> BoxFuture<'a, Result<Subscription, BrokerError>> {
        Box::pin(async move {
            Err(BrokerError::InvalidDestination {
                destination: destination.to_owned(),
                reason: "the test double only refuses publishes".into(),
            })
        })
    }
}

#[tokio::test]
async fn a_failed_publish_stamps_nothing_and_fails_the_page() {
    let c = container().await;
    let first = stored(&c, pending("msg-a", "t")).await;
    let second = stored(&c, pending("msg-b", "t")).await;
    let drain = default_drain(RefusingBroker, &c);
    // R3.28: the error propagates, the document stays pending, and the page stops there.
    let err = drain
        .drain(LEASE, &[first.clone(), second.clone()])
        .await
        .unwrap_err();
    assert!(
        matches!(&err, DrainError::Publish { message_id, .. } if message_id == "msg-a"),
        "{err}"
    );
    for doc in [first, second] {
        let now = read(&c, doc["id"].as_str().unwrap(), &json!("t")).await;
        assert_eq!(now["status"], "pending");
        assert!(now.get("ttl").is_none());
    }
}

// A lease lost mid-page (another instance owns it now) stops the page: no document is started
// after the loss, the one in flight finishes, the rest stay pending for the new owner, and the
// page fails rather than counting as drained.
#[tokio::test]
async fn a_page_stops_when_its_lease_is_lost_and_leaves_the_rest_pending() {
    let (emulator, connection) = chatter_tests::store::emulator_server().await;
    let c = provisioned(&connection, "shop", "orders", PATHS).await;
    let mut docs = Vec::new();
    for i in 0..10 {
        docs.push(stored(&c, pending(&format!("m-{i}"), "t1")).await);
    }
    // Every stamp is answered 300 ms late and every publish confirmed 100 ms late, so the
    // page's one key takes seconds.
    emulator
        .faults()
        .answer_late("PATCH", std::time::Duration::from_millis(300));
    // Test double: the in-memory broker, confirming each publish 100 ms late. The in-memory
    // broker confirms at once, without yielding, so a key's publishes (which do not wait for
    // stamps) would all be done before the drain could notice anything; a real broker's confirm
    // takes a round trip, and no real broker is slow by exactly this much on demand.
    let broker = Intercepted::new(InMemoryBroker::new(), |_| {
        Box::pin(async {
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
            None
        })
    });
    let mut sub = broker.inner().subscribe("orders").await.unwrap();
    let drain = default_drain(broker, &c);
    // The lease is lost once the first message reached the broker.
    let lost = async {
        next(&mut sub).await;
    };
    let result = drain.drain_while_owned(LEASE, &docs, lost).await;
    emulator.faults().clear();
    assert!(
        matches!(&result, Err(DrainError::LeaseLost { lease_token }) if lease_token == LEASE),
        "{result:?}"
    );
    let mut still_pending = 0;
    for doc in &docs {
        let id = doc["id"].as_str().unwrap();
        if read(&c, id, &json!("t1")).await["status"] == "pending" {
            still_pending += 1;
        }
    }
    assert!(
        still_pending >= 8,
        "no document started after the loss: {still_pending} of 10 still pending"
    );
}

// Issue 31 item 7: a document that looks pending (`_chatterType` "outbox", `status` "pending")
// under an id that is not the outbox id of its `MessageId` (as another writer may produce it)
// is still skipped, never published or stamped, but not silently: a warning names its id and
// the id expected, at most one a minute however many such documents come.
#[tokio::test]
async fn a_pending_document_under_a_foreign_id_is_skipped_with_a_warning_naming_the_expected_id() {
    let (logs, _guard) = chatter_tests::logs::capture();
    let c = container().await;
    let broker = InMemoryBroker::new();
    let mut first = pending("msg-python-1", "t");
    first["id"] = json!("python-1");
    let mut second = pending("msg-python-2", "t");
    second["id"] = json!("python-2");
    let first = stored(&c, first).await;
    let second = stored(&c, second).await;
    let drain = default_drain(broker.clone(), &c);

    let report = drain.drain(LEASE, &[first, second]).await.unwrap();

    assert_eq!((report.published, report.skipped), (0, 2));
    assert_eq!(broker.published_count("orders"), 0);
    assert_eq!(read(&c, "python-1", &json!("t")).await["status"], "pending");
    let warnings = logs.matching(tracing::Level::WARN, "skips document");
    assert_eq!(warnings.len(), 1, "rate-limited: {warnings:?}");
    let warning = &warnings[0];
    assert_eq!(warning.field("id"), Some("python-1"), "{warning:?}");
    let expected = chatter_runtime::cosmos::outbox_id("msg-python-1").unwrap();
    assert_eq!(
        warning.field("expected_id"),
        Some(expected.as_str()),
        "{warning:?}"
    );
    assert!(warning.message.contains(&expected), "{}", warning.message);
}
