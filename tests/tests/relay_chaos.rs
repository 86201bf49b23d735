//! Chaos: three relay processes (`relay_worker`) share the leases of one monitored container
//! through a `chatter-emulator` server while this process writes 1,000 outbox documents through
//! the document tier. Meanwhile relays are SIGKILLed at random and restarted (20 kills), and the
//! broker is cut off once for 5 s (a TCP proxy in front of RabbitMQ drops every connection and
//! refuses new ones). Passes when no document is lost and every one is stamped delivered.
//!
//! It prints its figures (kills, documents, lost, duplicates, drain time after the last fault);
//! run it alone with `cargo test -p chatter-tests --features rabbitmq --test relay_chaos --
//! --nocapture` to see them.
#![cfg(feature = "rabbitmq")]

use std::collections::BTreeSet;
use std::process::{Command, Stdio};
use std::time::Duration;

use chatter_tests::broker::Received;
use chatter_tests::process::ChildProcess;
use chatter_tests::proxy::TcpProxy;
use chatter_tests::rabbitmq;
use chatter_tests::runtime::writer;
use chatter_tests::store::{emulator_server, outbox_document, provisioned_with_leases};
use serde_json::json;
use tokio::time::Instant;

const DOCUMENTS: usize = 1_000;
const KILLS: usize = 20;
const RELAYS: usize = 3;
const OUTAGE: Duration = Duration::from_secs(5);
/// Generous bound for the drain after the last fault on a noisy shared machine.
const DRAIN_WAIT: Duration = Duration::from_secs(300);
const START_WAIT: Duration = Duration::from_secs(60);

// The same `PlaceOrder` as `relay_worker`, so both register the same monitored container.
include!("../src/relay_commands/place_order.rs");

fn spawn_relay(endpoint: &str, broker_uri: &str) -> ChildProcess {
    let mut command = Command::new(env!("CARGO_BIN_EXE_relay_worker"));
    command
        .env("CHATTER_COSMOS_ENDPOINT", endpoint)
        .env("CHATTER_RABBITMQ_URI", broker_uri)
        .env("CHATTER_TEST_LEASE_EXPIRY_MS", "3000")
        .env_remove("CHATTER_COSMOS_KEY")
        .env_remove("CHATTER_TEST_HANG_AFTER_PUBLISH")
        .stdin(Stdio::piped())
        .stderr(Stdio::null());
    ChildProcess::spawn("relay_worker", &mut command)
}

/// A random number below `n` (uuid v4's random bits; no RNG crate needed for a test).
fn random_below(n: usize) -> usize {
    (uuid::Uuid::new_v4().as_u128() % n as u128) as usize
}

fn event_id(n: usize) -> String {
    format!("order-{n}:place:OrderPlaced")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn relays_killed_at_random_and_a_broker_outage_lose_nothing() {
    let (emulator, cosmos) = emulator_server().await;
    let orders = provisioned_with_leases(
        &cosmos,
        "relay-kill",
        "orders",
        &["/orderId"],
        "orders-leases",
    )
    .await;
    let direct = rabbitmq::connect(START_WAIT).await;
    let queue = format!("chatter-test-chaos-{}", uuid::Uuid::new_v4().simple());
    let received = Received::consume(rabbitmq::subscribe(&direct, &queue, START_WAIT).await);
    let proxy = TcpProxy::start(rabbitmq::server_addr()).await;
    let broker_uri = rabbitmq::uri_through(&proxy);

    let mut relays = Vec::new();
    for _ in 0..RELAYS {
        let mut relay = spawn_relay(emulator.endpoint(), &broker_uri);
        relay.line_starting_with("started", START_WAIT).await;
        relays.push(relay);
    }

    // The writer: the document tier in this process, paced so the faults land while it writes.
    let writer = writer(&cosmos, direct.clone()).await;
    let writing = {
        let writer = writer.clone();
        let queue = queue.clone();
        tokio::spawn(async move {
            for n in 0..DOCUMENTS {
                let command = PlaceOrder {
                    order_id: format!("order-{n}"),
                    events: queue.clone(),
                };
                writer
                    .dispatch(command, format!("order-{n}:place"))
                    .await
                    .unwrap();
                tokio::time::sleep(Duration::from_millis(25)).await;
            }
        })
    };

    // The faults: a SIGKILL of a random relay (replaced at once) every ~1.5 s, and one outage.
    for kill in 0..KILLS {
        tokio::time::sleep(Duration::from_millis(1_000 + random_below(1_000) as u64)).await;
        if kill == KILLS / 2 {
            proxy.cut_for(OUTAGE);
        }
        let victim = random_below(RELAYS);
        let mut successor = spawn_relay(emulator.endpoint(), &broker_uri);
        std::mem::swap(&mut relays[victim], &mut successor);
        successor.kill();
        relays[victim]
            .line_starting_with("started", START_WAIT)
            .await;
    }
    writing.await.unwrap();
    let last_fault = Instant::now();

    let expected: BTreeSet<String> = (0..DOCUMENTS).map(event_id).collect();
    let deadline = last_fault + DRAIN_WAIT;
    while !expected.is_subset(&received.ids()) {
        assert!(
            Instant::now() < deadline,
            "{} of {DOCUMENTS} documents still not delivered {DRAIN_WAIT:?} after the last fault",
            expected.difference(&received.ids()).count()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    for n in 0..DOCUMENTS {
        let key = [json!(format!("order-{n}"))];
        loop {
            let doc = outbox_document(&orders, &key, &event_id(n)).await;
            if doc["status"] == "delivered" {
                break;
            }
            assert!(Instant::now() < deadline, "never stamped: {doc}");
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
    let drained_after = last_fault.elapsed();

    let counts = received.snapshot();
    let lost = expected
        .iter()
        .filter(|id| !counts.contains_key(*id))
        .count();
    let duplicates: usize = counts.values().map(|c| c - 1).sum();
    println!(
        "chaos: kills {KILLS}, broker outages 1 ({OUTAGE:?}), documents {DOCUMENTS}, lost {lost}, \
         duplicates {duplicates} ({:.1}%), drained and stamped {drained_after:?} after the last fault and the last write",
        duplicates as f64 * 100.0 / DOCUMENTS as f64
    );
    assert_eq!(lost, 0);
    assert!(
        counts.keys().all(|id| expected.contains(id)),
        "nothing foreign arrived"
    );

    drop(relays);
    writer.shutdown().await;
    rabbitmq::delete_queue(&direct, &queue, START_WAIT).await;
}
