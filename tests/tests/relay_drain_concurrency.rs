//! The drain's concurrency within a page: documents grouped by partition-key value, each group
//! published in change-feed order (the next document once the broker confirmed the previous one,
//! its stamp running meanwhile), groups concurrently, bounded by one in-flight limit shared by
//! every lease; a failed group fails the whole page, after every document in flight has
//! finished, and the re-read page skips what was already stamped.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use chatter_emulator::RunningEmulator;
use chatter_runtime::BrokeredMessage;
use chatter_runtime::broker::{Broker, BrokerError, InMemoryBroker, Subscription};
use chatter_runtime::cosmos::{self, ContainerClient};
use chatter_runtime::registration::PartitionKeyPath;
use chatter_runtime::testing::{DeliverySettings, OutboxDocument};
use chatter_runtime::testing::{Drain, DrainError, InFlightLimit};
use chatter_tests::broker::Intercepted;
use chatter_tests::store::{created, document, embedded, emulator_server, provisioned};
use futures::FutureExt;
use futures::future::BoxFuture;
use serde_json::{Value, json};

const PATHS: &[&str] = &["/tenantId"];
const KEY: &[PartitionKeyPath] = &[PartitionKeyPath {
    path: "/tenantId",
    pointer: "/tenantId",
}];
const DESTINATION: &str = "orders";
/// Far beyond any drain of a dozen documents: only a drain that can never finish reaches it.
const STUCK: Duration = Duration::from_secs(30);

/// Message ids are `<tenant>-<n>`: the tenant is the document's partition-key value.
fn tenant_of(message_id: &str) -> &str {
    message_id.split('-').next().unwrap_or_default()
}

/// Writes a pending Outbox Document for `message_id` and returns it as the change feed would.
async fn pending(c: &ContainerClient, message_id: &str) -> Value {
    let tenant = tenant_of(message_id);
    let message = BrokeredMessage::json(message_id, DESTINATION, r#"{"orderId":7}"#);
    let doc = OutboxDocument::build(&message, PATHS, &[json!(tenant)]).unwrap();
    created(c, &[json!(tenant)], &doc).await
}

/// The document as stored now (what a re-read of the change feed hands over).
async fn reread(c: &ContainerClient, doc: &Value) -> Value {
    document(c, &[doc["tenantId"].clone()], doc["id"].as_str().unwrap()).await
}

async fn status(c: &ContainerClient, message_id: &str) -> String {
    let id = cosmos::outbox_id(message_id).unwrap();
    document(c, &[json!(tenant_of(message_id))], &id).await["status"]
        .as_str()
        .unwrap()
        .to_owned()
}

/// What [`Observed`] saw.
#[derive(Default)]
struct Seen {
    /// Publishes started, not yet returned.
    in_flight: BTreeSet<String>,
    most_in_flight: usize,
    started: usize,
    /// Publish starts in order, per tenant.
    order: BTreeMap<String, Vec<String>>,
    /// Two publishes of one tenant in flight at once.
    violations: Vec<String>,
}

/// Test double (an observer, not a fault): publishes through a real [`InMemoryBroker`], and
/// records how many publishes are in flight at once and in which order each tenant's start.
/// The first `together` publishes wait for each other, so a drain that publishes one document
/// at a time never gets past the first. Message ids in `refused` fail with a transport error
/// after that wait.
struct Observed {
    inner: InMemoryBroker,
    together: Arc<tokio::sync::Barrier>,
    together_count: usize,
    refused: Mutex<BTreeSet<String>>,
    seen: Mutex<Seen>,
}

impl Observed {
    fn new(together: usize) -> Arc<Self> {
        Arc::new(Self {
            inner: InMemoryBroker::new(),
            together: Arc::new(tokio::sync::Barrier::new(together)),
            together_count: together,
            refused: Mutex::new(BTreeSet::new()),
            seen: Mutex::new(Seen::default()),
        })
    }

    fn refuse(&self, message_id: &str) {
        self.refused.lock().unwrap().insert(message_id.to_owned());
    }

    fn allow_all(&self) {
        self.refused.lock().unwrap().clear();
    }

    async fn publish_observed(&self, message: BrokeredMessage) -> Result<(), BrokerError> {
        let id = message.message_id.clone();
        let tenant = tenant_of(&id).to_owned();
        let first_ones = {
            let mut seen = self.seen.lock().unwrap();
            if seen
                .in_flight
                .iter()
                .any(|other| tenant_of(other) == tenant)
            {
                seen.violations.push(format!(
                    "{id} published while another {tenant} document was"
                ));
            }
            seen.in_flight.insert(id.clone());
            seen.most_in_flight = seen.most_in_flight.max(seen.in_flight.len());
            seen.started += 1;
            seen.order.entry(tenant).or_default().push(id.clone());
            seen.started <= self.together_count
        };
        if first_ones {
            self.together.wait().await;
        }
        let refused = self.refused.lock().unwrap().contains(&id);
        let result = if refused {
            Err(BrokerError::transport(
                "publish",
                std::io::Error::other("connection reset"),
            ))
        } else {
            self.inner.publish(message).await
        };
        self.seen.lock().unwrap().in_flight.remove(&id);
        result
    }
}

impl Broker for Observed {
    fn publish(&self, message: BrokeredMessage) -> BoxFuture<'_, Result<(), BrokerError>> {
        self.publish_observed(message).boxed()
    }

    fn subscribe<'a>(
        &'a self,
        destination: &'a str,
    ) -> BoxFuture<'a, Result<Subscription, BrokerError>> {
        self.inner.subscribe(destination)
    }
}

fn drain(broker: &Arc<Observed>, c: &Arc<ContainerClient>, limit: &InFlightLimit) -> Drain {
    Drain::new(
        "chatter-cosmos-outbox-relay:test",
        broker.clone(),
        c.clone(),
        KEY,
        DeliverySettings::default(),
    )
    .with_in_flight_limit(limit.clone())
}

async fn container() -> Arc<ContainerClient> {
    provisioned(&embedded().await, "shop", "orders", PATHS).await
}

#[tokio::test]
async fn one_tenants_documents_publish_in_feed_order_while_tenants_run_concurrently_up_to_the_limit()
 {
    let c = container().await;
    let broker = Observed::new(4);
    // Four tenants, three documents each, interleaved as a change feed would interleave them.
    let mut page = Vec::new();
    for n in 0..3 {
        for tenant in ["a", "b", "c", "d"] {
            page.push(pending(&c, &format!("{tenant}-{n}")).await);
        }
    }
    let drain = drain(&broker, &c, &InFlightLimit::new(4));

    let report = tokio::time::timeout(STUCK, drain.drain("0", &page))
        .await
        .expect("four tenants were not published concurrently")
        .unwrap();

    assert_eq!(report.published, 12);
    {
        let seen = broker.seen.lock().unwrap();
        assert_eq!(seen.most_in_flight, 4, "bounded by the in-flight limit");
        assert!(seen.violations.is_empty(), "{:?}", seen.violations);
        for (tenant, order) in &seen.order {
            let expected: Vec<String> = (0..3).map(|n| format!("{tenant}-{n}")).collect();
            assert_eq!(order, &expected, "feed order within tenant {tenant}");
        }
    }
    for doc in &page {
        let id = doc["MessageId"].as_str().unwrap();
        assert_eq!(status(&c, id).await, "delivered", "{id}");
    }
    assert_eq!(broker.inner.published_count(DESTINATION), 12);
}

#[tokio::test]
async fn a_tenants_next_document_is_published_once_the_previous_is_confirmed_not_stamped() {
    let (emulator, cosmos) = emulator_server().await;
    let c = provisioned(&cosmos, "shop", "orders", PATHS).await;
    let mut page = Vec::new();
    for n in 0..10 {
        page.push(pending(&c, &format!("a-{n}")).await);
    }
    // Every stamp is answered 2 s late: far longer than ten in-memory publishes take.
    emulator
        .faults()
        .answer_late("PATCH", Duration::from_secs(2));
    let limit = InFlightLimit::new(32);
    // Test double (an observer, not a fault): records, at each publish, how many permits of the
    // in-flight limit other documents hold (this publish holds one itself).
    let held_by_others = Arc::new(Mutex::new(Vec::new()));
    let broker = Arc::new(Intercepted::new(InMemoryBroker::new(), {
        let (limit, held_by_others) = (limit.clone(), held_by_others.clone());
        move |_| {
            held_by_others
                .lock()
                .unwrap()
                .push(32 - limit.available() - 1);
            Box::pin(async { None })
        }
    }));
    let mut subscription = broker.inner().subscribe(DESTINATION).await.unwrap();
    let drain = Drain::new(
        "chatter-cosmos-outbox-relay:test",
        broker.clone(),
        c.clone(),
        KEY,
        DeliverySettings::default(),
    )
    .with_in_flight_limit(limit.clone());

    let report = tokio::time::timeout(STUCK, drain.drain("0", &page))
        .await
        .expect("the page drained")
        .unwrap();

    assert_eq!(report.published, 10);
    // The n-th publish saw the n stamps before it still in flight: the tenant's documents went
    // to the broker back to back, each after the previous one's confirm, not its stamp.
    assert_eq!(
        *held_by_others.lock().unwrap(),
        (0..10).collect::<Vec<usize>>()
    );
    let mut order = Vec::new();
    for _ in 0..10 {
        let delivery = chatter_tests::broker::next_delivery(&mut subscription, STUCK).await;
        order.push(delivery.message.message_id.clone());
        delivery.ack().await.unwrap();
    }
    let expected: Vec<String> = (0..10).map(|n| format!("a-{n}")).collect();
    assert_eq!(order, expected, "the broker saw the tenant's feed order");
    emulator.faults().clear();
    for id in &expected {
        assert_eq!(status(&c, id).await, "delivered", "{id}");
    }
    assert_eq!(limit.available(), 32, "every permit returned");
}

#[tokio::test]
async fn the_in_flight_limit_is_shared_by_the_pages_of_every_lease() {
    let c = container().await;
    // Two leases' pages of four tenants each: eight groups, three permits.
    let broker = Observed::new(3);
    let mut first = Vec::new();
    let mut second = Vec::new();
    for tenant in ["a", "b", "c", "d"] {
        first.push(pending(&c, &format!("{tenant}-0")).await);
    }
    for tenant in ["e", "f", "g", "h"] {
        second.push(pending(&c, &format!("{tenant}-0")).await);
    }
    let limit = InFlightLimit::new(3);
    let one = drain(&broker, &c, &limit);
    let other = drain(&broker, &c, &limit);

    let (a, b) = tokio::time::timeout(
        STUCK,
        futures::future::join(one.drain("0", &first), other.drain("1", &second)),
    )
    .await
    .expect("the two pages did not publish three documents at once");

    assert_eq!(a.unwrap().published + b.unwrap().published, 8);
    assert_eq!(broker.seen.lock().unwrap().most_in_flight, 3);
    assert_eq!(limit.available(), 3, "every permit returned");
}

#[tokio::test]
async fn a_failed_group_fails_the_page_after_the_others_finished_and_the_reread_skips_what_was_stamped()
 {
    let c = container().await;
    let broker = Observed::new(2);
    let page = vec![
        pending(&c, "a-0").await,
        pending(&c, "b-0").await,
        pending(&c, "b-1").await,
    ];
    broker.refuse("a-0");
    let drain = drain(&broker, &c, &InFlightLimit::default());

    let err = tokio::time::timeout(STUCK, drain.drain("0", &page))
        .await
        .expect("the two tenants were not published concurrently")
        .unwrap_err();

    assert!(
        matches!(&err, DrainError::Publish { message_id, .. } if message_id == "a-0"),
        "{err}"
    );
    assert_eq!(status(&c, "a-0").await, "pending");
    // b-0 was in flight when a-0 failed: it finished, stamp included, before the page returned.
    assert_eq!(status(&c, "b-0").await, "delivered");

    // The page is read again (the change feed hands over the documents as they are now).
    broker.allow_all();
    let mut again = Vec::new();
    for doc in &page {
        again.push(reread(&c, doc).await);
    }
    drain.drain("0", &again).await.unwrap();
    for id in ["a-0", "b-0", "b-1"] {
        assert_eq!(status(&c, id).await, "delivered", "{id}");
    }
    let mut subscription = broker.inner.subscribe(DESTINATION).await.unwrap();
    let mut delivered = BTreeMap::<String, usize>::new();
    for _ in 0..3 {
        let delivery = chatter_tests::broker::next_delivery(&mut subscription, STUCK).await;
        *delivered
            .entry(delivery.message.message_id.clone())
            .or_default() += 1;
        delivery.ack().await.unwrap();
    }
    chatter_tests::broker::assert_quiet_for(&mut subscription, Duration::from_millis(200)).await;
    assert_eq!(
        delivered,
        BTreeMap::from([
            ("a-0".to_owned(), 1),
            ("b-0".to_owned(), 1),
            ("b-1".to_owned(), 1)
        ]),
        "each message reached the broker once: the re-read skipped the stamped ones"
    );
}

/// A store whose every PATCH (the relay's stamps) is refused with a real HTTP 403.
async fn refusing_stamps() -> (RunningEmulator, Arc<ContainerClient>) {
    let (emulator, cosmos) = emulator_server().await;
    let c = provisioned(&cosmos, "shop", "orders", PATHS).await;
    (emulator, c)
}

#[tokio::test]
async fn a_page_whose_groups_all_fail_to_confirm_counts_one_confirmation_failure() {
    let (emulator, c) = refusing_stamps().await;
    let page = vec![pending(&c, "a-0").await, pending(&c, "b-0").await];
    emulator
        .faults()
        .refuse("PATCH", 403, Duration::from_secs(3600));
    let drain = Drain::new(
        "chatter-cosmos-outbox-relay:test",
        Arc::new(InMemoryBroker::new()),
        c.clone(),
        KEY,
        DeliverySettings::default(),
    );
    // Both groups publish and fail to stamp on every page; the threshold is five pages.
    for page_number in 1..=4 {
        let err = drain.drain("0", &page).await.unwrap_err();
        assert!(matches!(err, DrainError::Confirmation { .. }), "{err}");
        assert!(
            !drain.gate().is_suspended("0"),
            "suspended after {page_number} pages: each group's failure was counted"
        );
    }
    drain.drain("0", &page).await.unwrap_err();
    assert!(
        drain.gate().is_suspended("0"),
        "the fifth failed page suspends"
    );
}

// A key's publish and the stamp of its previous document, in flight together, can both fail:
// the page counts both, a Confirmation Failure and a blocked lease, not only the first.
#[tokio::test]
async fn a_group_whose_stamp_and_next_publish_both_fail_counts_both() {
    let (emulator, c) = refusing_stamps().await;
    let page = vec![pending(&c, "a-0").await, pending(&c, "a-1").await];
    emulator
        .faults()
        .refuse("PATCH", 403, Duration::from_secs(3600));
    // Test double: the in-memory broker, refusing a-1 by a broker setting (a real refusal's
    // shape: `BrokerError::Refused`) 500 ms late, once a-0's stamp had time to fail. A real
    // RabbitMQ refuses at once; the wait orders the two failures for the test.
    let broker = Intercepted::new(InMemoryBroker::new(), |message: &BrokeredMessage| {
        let refused = (message.message_id == "a-1").then(|| message.destination.clone());
        Box::pin(async move {
            let destination = refused?;
            tokio::time::sleep(Duration::from_millis(500)).await;
            Some(Err(BrokerError::Refused {
                destination,
                refusal: chatter_runtime::broker::Refusal::AccessRefused,
                reply: "403 ACCESS_REFUSED (the test double)".to_owned(),
            }))
        })
    });
    let drain = Drain::new(
        "chatter-cosmos-outbox-relay:test",
        Arc::new(broker),
        c.clone(),
        KEY,
        DeliverySettings::default(),
    );

    let err = drain.drain("0", &page).await.unwrap_err();

    // a-0's stamp failed first (answered at once), then a-1's publish was refused.
    assert!(matches!(err, DrainError::Confirmation { .. }), "{err}");
    assert!(
        drain.gate().blocked("0").is_some(),
        "the refusal behind the first failure blocks the lease"
    );
    // Five pages, each with a failed confirmation, suspend the lease.
    for _ in 0..4 {
        let _ = drain.drain("0", &page).await;
    }
    assert!(drain.gate().is_suspended("0"));
    assert_eq!(status(&c, "a-0").await, "pending");
    assert_eq!(status(&c, "a-1").await, "pending");
}
