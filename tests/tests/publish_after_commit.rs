//! Publish after commit (issue 34): the process that committed a command's batch publishes its
//! Outbox Documents at once, unless an earlier document of their key is pending; the relay is
//! the safety net for every document this path does not publish.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use chatter_emulator::RunningEmulator;
use chatter_runtime::broker::{Broker as _, BrokerError, InMemoryBroker};
use chatter_runtime::cosmos::CosmosConnection;
use chatter_runtime::{Runtime, relay::RelayOptions};
use chatter_tests::broker::{Intercepted, Interception, next_delivery};
use chatter_tests::runtime::writer;
use chatter_tests::store::{emulator_server, outbox_document, provisioned_with_leases};
use chatter_tests::wait::eventually;
use serde_json::{Value, json};

const DB: &str = "after-commit";
const CONTAINER: &str = "orders";
const EVENTS: &str = "after-commit-events";
const WAIT: Duration = Duration::from_secs(30);
const POLL: Duration = Duration::from_millis(50);

chatter_tests::event_command! {
    /// Places an order and emits one event.
    PlaceEagerOrder { order_id as "orderId" }
    on ("after-commit", "orders", "orders-leases") at "/orderId",
    handled by place, sends "placed" to "after-commit-events"
}

fn order(key: &str) -> PlaceEagerOrder {
    PlaceEagerOrder {
        order_id: key.to_owned(),
    }
}

/// A served store with the orders container and its leases.
async fn store() -> (RunningEmulator, CosmosConnection) {
    let (emulator, cosmos) = emulator_server().await;
    provisioned_with_leases(&cosmos, DB, CONTAINER, &["/orderId"], "orders-leases").await;
    (emulator, cosmos)
}

/// Test double (a slow confirm at every publish, which no real broker gives on demand): `broker`
/// confirming each publish `late`.
fn confirming_late(
    broker: &InMemoryBroker,
    late: Duration,
) -> Intercepted<impl Fn(&chatter_runtime::BrokeredMessage) -> Interception + Send + Sync + 'static>
{
    Intercepted::new(broker.clone(), move |_| {
        Box::pin(async move {
            tokio::time::sleep(late).await;
            None
        })
    })
}

/// A relay that reads the change feed once at start and then only every `poll`.
fn relay_polling_every(poll: Duration) -> RelayOptions {
    chatter_tests::relay::fast_relay(Duration::from_secs(10)).poll_interval(poll)
}

async fn runtime(
    cosmos: &CosmosConnection,
    broker: impl chatter_runtime::broker::Broker,
    relay: RelayOptions,
    after_commit: bool,
) -> Runtime {
    Runtime::builder()
        .cosmos(cosmos.clone())
        .broker(broker)
        .consume(false)
        .relay_options(relay)
        .publish_after_commit(after_commit)
        .without_metrics()
        .start()
        .await
        .unwrap()
}

/// Waits until the relay owns its leases and has read each once (a checkpoint was written):
/// with an hour's poll interval, it does not read again within a test.
async fn relay_read_once(runtime: &Runtime) {
    eventually(
        WAIT,
        POLL,
        "the relay read each of its leases once",
        || async {
            let leases = runtime.health().await.leases;
            !leases.is_empty() && leases.iter().all(|l| l.last_checkpoint_age.is_some())
        },
    )
    .await;
}

async fn stamped_delivered(cosmos: &CosmosConnection, key: &str, message_id: &str) -> bool {
    let container = cosmos.container(DB, CONTAINER).await.unwrap();
    let doc = outbox_document(&container, &[Value::from(key)], message_id).await;
    doc["status"] == "delivered" && doc["ttl"].is_i64()
}

/// Asserts that the next two events of `events`, each within `within`, are cmd-1's then
/// cmd-2's: the second command's event did not overtake the first's.
async fn first_two_in_order(events: &mut chatter_runtime::broker::Subscription, within: Duration) {
    let first = next_delivery(events, within).await;
    let second = next_delivery(events, within).await;
    assert_eq!(
        [
            first.message.message_id.as_str(),
            second.message.message_id.as_str()
        ],
        ["cmd-1:placed", "cmd-2:placed"],
        "the second command's event overtook the first's"
    );
}

#[tokio::test]
async fn a_committed_event_is_published_and_stamped_without_waiting_for_the_relays_read() {
    let (_emulator, cosmos) = store().await;
    let broker = InMemoryBroker::new();
    let mut events = broker.subscribe(EVENTS).await.unwrap();
    // The relay reads once at start, then not for an hour: only publish after commit can
    // publish the event within the wait.
    let runtime = runtime(
        &cosmos,
        broker.clone(),
        relay_polling_every(Duration::from_secs(3600)),
        true,
    )
    .await;
    relay_read_once(&runtime).await;
    runtime.dispatch(order("o-1"), "cmd-1").await.unwrap();
    let delivery = next_delivery(&mut events, WAIT).await;
    assert_eq!(delivery.message.message_id, "cmd-1:placed");
    eventually(WAIT, POLL, "it is stamped delivered", || {
        let cosmos = cosmos.clone();
        async move { stamped_delivered(&cosmos, "o-1", "cmd-1:placed").await }
    })
    .await;
    runtime.shutdown().await;
}

#[tokio::test]
async fn with_publish_after_commit_off_the_event_waits_for_the_relays_read() {
    let (_emulator, cosmos) = store().await;
    let broker = InMemoryBroker::new();
    let mut events = broker.subscribe(EVENTS).await.unwrap();
    let runtime = runtime(
        &cosmos,
        broker.clone(),
        relay_polling_every(Duration::from_secs(3600)),
        false,
    )
    .await;
    relay_read_once(&runtime).await;
    runtime.dispatch(order("o-1"), "cmd-1").await.unwrap();
    chatter_tests::broker::assert_quiet_for(&mut events, Duration::from_secs(2)).await;
    let container = cosmos.container(DB, CONTAINER).await.unwrap();
    let doc = outbox_document(&container, &[json!("o-1")], "cmd-1:placed").await;
    assert_eq!(doc["status"], "pending");
    // Not shut down: its drain would publish the document.
}

#[tokio::test]
async fn a_key_whose_earlier_document_is_pending_keeps_its_order() {
    let (_emulator, cosmos) = store().await;
    let broker = InMemoryBroker::new();
    let mut events = broker.subscribe(EVENTS).await.unwrap();
    // This process publishes after its commits; its relay reads every 2 s.
    let runtime = runtime(
        &cosmos,
        broker.clone(),
        relay_polling_every(Duration::from_secs(2)),
        true,
    )
    .await;
    // Another process committed o-1's first command and has not published it.
    let other = writer(&cosmos, InMemoryBroker::new()).await;
    other.dispatch(order("o-1"), "cmd-1").await.unwrap();
    // The second command of o-1: its event must not overtake the first one.
    runtime.dispatch(order("o-1"), "cmd-2").await.unwrap();
    first_two_in_order(&mut events, WAIT).await;
    runtime.shutdown().await;
}

#[tokio::test]
async fn a_document_whose_publish_after_commit_failed_is_published_by_the_relay() {
    let (_emulator, cosmos) = store().await;
    let inner = InMemoryBroker::new();
    let mut events = inner.subscribe(EVENTS).await.unwrap();
    // Test double (a failed publish at a known moment, the first of the run): the broker
    // refuses the first publish as unavailable, then publishes as usual.
    let publishes = Arc::new(AtomicUsize::new(0));
    let broker = Intercepted::new(inner.clone(), {
        let publishes = Arc::clone(&publishes);
        move |message: &chatter_runtime::BrokeredMessage| {
            let first = publishes.fetch_add(1, Ordering::SeqCst) == 0;
            let refused = BrokerError::Rejected {
                message_id: message.message_id.clone(),
                destination: message.destination.clone(),
                reason: "the test's broker nacks the first publish".to_owned(),
            };
            Box::pin(async move { first.then_some(Err(refused)) })
        }
    });
    let runtime = runtime(
        &cosmos,
        broker,
        relay_polling_every(Duration::from_millis(200)),
        true,
    )
    .await;
    runtime.dispatch(order("o-1"), "cmd-1").await.unwrap();
    let delivery = next_delivery(&mut events, WAIT).await;
    assert_eq!(delivery.message.message_id, "cmd-1:placed");
    eventually(WAIT, POLL, "the relay stamped it delivered", || {
        let cosmos = cosmos.clone();
        async move { stamped_delivered(&cosmos, "o-1", "cmd-1:placed").await }
    })
    .await;
    // The eager publish failed, the relay's went out.
    assert_eq!(publishes.load(Ordering::SeqCst), 2);
    runtime.shutdown().await;
}

#[tokio::test]
async fn the_relay_of_the_committing_process_does_not_publish_its_documents_again() {
    let (_emulator, cosmos) = store().await;
    let broker = InMemoryBroker::new();
    let received = chatter_tests::broker::Received::on(&broker, EVENTS).await;
    // Every publish is confirmed 30 ms late and the relay reads every 10 ms, so that its reads
    // fall between a commit and its stamp.
    let slow = confirming_late(&broker, Duration::from_millis(30));
    let runtime = runtime(
        &cosmos,
        slow,
        relay_polling_every(Duration::from_millis(10)),
        true,
    )
    .await;
    const COMMANDS: usize = 30;
    for n in 0..COMMANDS {
        runtime
            .dispatch(order(&format!("o-{}", n % 3)), format!("cmd-{n}"))
            .await
            .unwrap();
    }
    eventually(WAIT, POLL, "every event published", || {
        let distinct = received.distinct();
        async move { distinct == COMMANDS }
    })
    .await;
    runtime.relay_idle(WAIT).await.unwrap();
    let twice: Vec<_> = received
        .snapshot()
        .into_iter()
        .filter(|(_, n)| *n > 1)
        .collect();
    assert!(twice.is_empty(), "published more than once: {twice:?}");
    runtime.shutdown().await;
}

#[tokio::test]
async fn a_burst_of_one_keys_commands_in_one_process_is_published_in_order_without_the_relay() {
    let (_emulator, cosmos) = store().await;
    let broker = InMemoryBroker::new();
    let mut events = broker.subscribe(EVENTS).await.unwrap();
    // Every publish is confirmed 20 ms late, so each command commits while the previous one's
    // event is still in flight; the relay does not read within the test.
    let slow = confirming_late(&broker, Duration::from_millis(20));
    let runtime = runtime(
        &cosmos,
        slow,
        relay_polling_every(Duration::from_secs(3600)),
        true,
    )
    .await;
    relay_read_once(&runtime).await;
    const BURST: usize = 5;
    for n in 0..BURST {
        runtime
            .dispatch(order("o-1"), format!("cmd-{n}"))
            .await
            .unwrap();
    }
    let mut arrived = Vec::new();
    for _ in 0..BURST {
        match tokio::time::timeout(Duration::from_secs(10), events.next()).await {
            Ok(Some(Ok(delivery))) => {
                arrived.push(delivery.message.message_id.clone());
                delivery.ack().await.unwrap();
            }
            other => panic!("after {arrived:?}: {other:?}"),
        }
    }
    let expected: Vec<String> = (0..BURST).map(|n| format!("cmd-{n}:placed")).collect();
    assert_eq!(arrived, expected);
    runtime.shutdown().await;
}

#[tokio::test]
async fn a_duplicate_command_during_its_dispatch_does_not_make_the_relay_publish_the_document_again()
 {
    let (_emulator, cosmos) = store().await;
    let broker = InMemoryBroker::new();
    let received = chatter_tests::broker::Received::on(&broker, EVENTS).await;
    // The first command's eager publish is confirmed 300 ms late: its duplicate is handled (and
    // its batch fails as a duplicate) meanwhile, and the relay reads every 10 ms.
    let slow = confirming_late(&broker, Duration::from_millis(300));
    let runtime = runtime(
        &cosmos,
        slow,
        relay_polling_every(Duration::from_millis(10)),
        true,
    )
    .await;
    relay_read_once(&runtime).await;
    for _ in 0..2 {
        runtime.dispatch(order("o-1"), "cmd-1").await.unwrap();
    }
    eventually(WAIT, POLL, "the event stamped delivered", || {
        stamped_delivered(&cosmos, "o-1", "cmd-1:placed")
    })
    .await;
    runtime.relay_idle(WAIT).await.unwrap();
    // A relay publish started just before the stamp would land within the confirm delay.
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert_eq!(
        received.snapshot().get("cmd-1:placed"),
        Some(&1),
        "published once: {:?}",
        received.snapshot()
    );
    runtime.shutdown().await;
}

#[tokio::test]
async fn a_document_published_after_commit_whose_stamp_failed_is_only_stamped_by_the_relay_here() {
    let (emulator, cosmos) = store().await;
    let broker = InMemoryBroker::new();
    let received = chatter_tests::broker::Received::on(&broker, EVENTS).await;
    // The store refuses the first stamp (publish after commit's, the first PATCH of the run)
    // with a status the SDK does not retry: the event is out, its document still pending.
    let armed = Arc::new(std::sync::atomic::AtomicBool::new(true));
    emulator
        .faults()
        .inject_with(Some(Arc::new(move |method: &str, _: &str| {
            (method == "PATCH" && armed.swap(false, Ordering::SeqCst)).then_some(
                chatter_emulator::Injection::Refuse {
                    status: 403,
                    sub_status: None,
                    retry_after: None,
                },
            )
        })));
    let runtime = runtime(
        &cosmos,
        broker.clone(),
        relay_polling_every(Duration::from_millis(100)),
        true,
    )
    .await;
    runtime.dispatch(order("o-1"), "cmd-1").await.unwrap();
    eventually(WAIT, POLL, "the relay stamped it delivered", || {
        let cosmos = cosmos.clone();
        async move { stamped_delivered(&cosmos, "o-1", "cmd-1:placed").await }
    })
    .await;
    runtime.relay_idle(WAIT).await.unwrap();
    // The process that published it knew it had: its relay stamped it, and published nothing.
    assert_eq!(
        received.snapshot().into_iter().collect::<Vec<_>>(),
        [("cmd-1:placed".to_owned(), 1)]
    );
    runtime.shutdown().await;
}

#[tokio::test]
async fn a_pending_check_read_in_a_lagging_region_at_eventual_consistency_keeps_the_keys_order() {
    // The read region catches up every 1.5 s (its first step 1.5 s after it starts, by when the
    // two commits below are usually made), and an Eventual account sends no session token: the
    // check cannot see what another process committed just before.
    let lag = Duration::from_millis(1500);
    let (write, _read, cosmos) =
        chatter_tests::store::two_regions(chatter_emulator::ConsistencyLevel::Eventual, lag).await;
    provisioned_with_leases(&cosmos, DB, CONTAINER, &["/orderId"], "orders-leases").await;
    let broker = InMemoryBroker::new();
    let mut events = broker.subscribe(EVENTS).await.unwrap();
    let remote = chatter_tests::store::reading_in_read_region(write.endpoint())
        .await
        .unwrap();
    let runtime = runtime(
        &remote,
        broker.clone(),
        relay_polling_every(Duration::from_millis(200)),
        true,
    )
    .await;
    // Another process commits o-1's first command and does not publish it.
    let other = writer(&cosmos, InMemoryBroker::new()).await;
    other.dispatch(order("o-1"), "cmd-1").await.unwrap();
    runtime.dispatch(order("o-1"), "cmd-2").await.unwrap();
    first_two_in_order(&mut events, WAIT).await;
    runtime.shutdown().await;
}

#[tokio::test]
async fn a_document_the_relay_never_publishes_does_not_hold_its_key_back() {
    let (_emulator, cosmos) = store().await;
    // Another writer's mistake in o-1's partition: it looks pending, but its id is not the one
    // Chatter mints for its MessageId, so the relay's pending gate turns it away for good.
    let container = cosmos.container(DB, CONTAINER).await.unwrap();
    let mistaken = json!({
        "id": "not-the-minted-id",
        "_chatterType": "outbox",
        "status": "pending",
        "MessageId": "elsewhere",
        "Destination": EVENTS,
        "orderId": "o-1",
    });
    chatter_tests::store::created(&container, &[json!("o-1")], &mistaken).await;
    let broker = InMemoryBroker::new();
    let mut events = broker.subscribe(EVENTS).await.unwrap();
    // The relay reads once at start, then not for an hour.
    let runtime = runtime(
        &cosmos,
        broker.clone(),
        relay_polling_every(Duration::from_secs(3600)),
        true,
    )
    .await;
    relay_read_once(&runtime).await;
    runtime.dispatch(order("o-1"), "cmd-1").await.unwrap();
    let delivery = next_delivery(&mut events, WAIT).await;
    assert_eq!(delivery.message.message_id, "cmd-1:placed");
    runtime.shutdown().await;
}

#[tokio::test]
async fn a_runtime_without_its_relay_says_at_start_where_its_documents_wait() {
    let (logs, _guard) = chatter_tests::logs::capture();
    let (_emulator, cosmos) = store().await;
    let _runtime = writer(&cosmos, InMemoryBroker::new()).await;
    let said = logs.matching(tracing::Level::INFO, "built without its relay");
    let ours: Vec<_> = said
        .iter()
        .filter(|entry| entry.field("container") == Some(CONTAINER))
        .collect();
    assert_eq!(ours.len(), 1, "{said:?}");
    assert_eq!(ours[0].field("lease"), Some("orders-leases"));
}

#[tokio::test]
async fn past_its_task_bound_a_burst_is_left_to_the_relay_and_nothing_is_lost() {
    let (_emulator, cosmos) = store().await;
    let broker = InMemoryBroker::new();
    let received = chatter_tests::broker::Received::on(&broker, EVENTS).await;
    let metrics = chatter_tests::telemetry::Metrics::new();
    // One document in flight at once, each confirmed 300 ms late: a burst of commits piles up
    // dispatch tasks waiting for the one permit, past 4 per permit.
    let slow = confirming_late(&broker, Duration::from_millis(300));
    let runtime = Runtime::builder()
        .cosmos(cosmos.clone())
        .broker(slow)
        .consume(false)
        .relay_options(relay_polling_every(Duration::from_millis(200)).max_in_flight(1))
        .meter(metrics.meter())
        .without_tracing()
        .start()
        .await
        .unwrap();
    const COMMANDS: usize = 12;
    for n in 0..COMMANDS {
        runtime
            .dispatch(order(&format!("o-{n}")), format!("cmd-{n}"))
            .await
            .unwrap();
    }
    eventually(WAIT, POLL, "every event published", || {
        let distinct = received.distinct();
        async move { distinct == COMMANDS }
    })
    .await;
    let busy: f64 = metrics
        .of("chatter.messaging.outbox.after_commit")
        .iter()
        .filter(|p| {
            p.attributes
                .get("chatter.messaging.outbox.after_commit.reason")
                .is_some_and(|reason| reason == "busy")
        })
        .map(|p| p.number())
        .sum();
    assert!(busy >= 1.0, "no batch was left to the relay past the bound");
    runtime.shutdown().await;
}

#[tokio::test]
async fn a_standalone_relay_over_a_command_container_does_not_turn_publish_after_commit_on() {
    let (_emulator, cosmos) = store().await;
    chatter_runtime::provision::ensure_lease_container(&cosmos, DB, "other-leases")
        .await
        .unwrap();
    // It reads once at start, then not for an hour.
    let over_orders = chatter_runtime::relay::StandaloneRelay::builder(
        &cosmos,
        (DB, CONTAINER),
        (DB, "other-leases"),
    )
    .partition_key_paths(&["/orderId"])
    .options(relay_polling_every(Duration::from_secs(3600)))
    .build()
    .unwrap();
    let broker = InMemoryBroker::new();
    let mut events = broker.subscribe(EVENTS).await.unwrap();
    let runtime = Runtime::builder()
        .cosmos(cosmos.clone())
        .broker(broker.clone())
        .consume(false)
        .without_relay()
        .standalone_relay(over_orders)
        .without_metrics()
        .start()
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_secs(1)).await;
    runtime.dispatch(order("o-1"), "cmd-1").await.unwrap();
    // Built without its relay, this runtime publishes nothing right after its commits.
    chatter_tests::broker::assert_quiet_for(&mut events, Duration::from_secs(2)).await;
}

#[tokio::test]
async fn a_key_busy_across_processes_keeps_the_fast_path_while_the_earlier_stamp_lands() {
    let (_emulator, cosmos) = store().await;
    let broker = InMemoryBroker::new();
    let mut events = broker.subscribe(EVENTS).await.unwrap();
    // Test double (a slow confirm at a known moment, which no real broker gives on demand): A's
    // broker says when A's publish starts, and confirms it 40 ms later.
    let publishing = Arc::new(tokio::sync::Notify::new());
    let a_broker = Intercepted::new(broker.clone(), {
        let publishing = Arc::clone(&publishing);
        move |_: &chatter_runtime::BrokeredMessage| {
            publishing.notify_one();
            Box::pin(async {
                tokio::time::sleep(Duration::from_millis(40)).await;
                None
            })
        }
    });
    // Both relays read once at start, then not for an hour: only publish after commit can
    // publish within the wait.
    let hour = relay_polling_every(Duration::from_secs(3600));
    let a = runtime(&cosmos, a_broker, hour.clone(), true).await;
    let b = runtime(&cosmos, broker.clone(), hour, true).await;
    // Balanced (2 leases each) and read once: no lease moves, so no relay reads again.
    chatter_tests::relay::owning(&a, 2).await;
    chatter_tests::relay::owning(&b, 2).await;
    relay_read_once(&a).await;
    relay_read_once(&b).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    a.dispatch(order("o-1"), "cmd-1").await.unwrap();
    // A's check is done and its publish under way: B's check finds cmd-1 pending, unstamped.
    publishing.notified().await;
    b.dispatch(order("o-1"), "cmd-2").await.unwrap();
    first_two_in_order(&mut events, Duration::from_secs(5)).await;
    a.shutdown().await;
    b.shutdown().await;
}
