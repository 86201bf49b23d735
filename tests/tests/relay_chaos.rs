//! Chaos: three relay processes (`relay_worker`) share the leases of one monitored container
//! through a `chatter-emulator` server while this process writes 1,000 outbox documents through
//! the document tier. Meanwhile relays are SIGKILLed at random and restarted (20 kills), and the
//! broker is cut off once for 5 s (a TCP proxy in front of RabbitMQ drops every connection and
//! refuses new ones). Passes when no document is lost and every one is stamped delivered.
//!
//! The same run goes through NATS JetStream too (feature `nats`): the relays publish to a
//! `nats-server` of the test's own through the proxy, and the stream's duplicate window drops
//! the republishes.
//!
//! It prints its figures (kills, documents, lost, duplicates, drain time after the last fault);
//! run it alone with `cargo test -p chatter-tests --all-features --test relay_chaos --
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

/// The broker the relays publish to, behind the proxy.
#[derive(Debug, Clone)]
enum Through {
    RabbitMq(String),
    #[cfg_attr(not(feature = "nats"), allow(dead_code))]
    Nats(String),
}

fn spawn_relay(endpoint: &str, broker: &Through) -> ChildProcess {
    let mut command = Command::new(env!("CARGO_BIN_EXE_relay_worker"));
    match broker {
        Through::RabbitMq(uri) => command
            .env("CHATTER_RABBITMQ_URI", uri)
            .env_remove("CHATTER_NATS_URL"),
        Through::Nats(url) => command.env("CHATTER_NATS_URL", url),
    };
    command
        .env("CHATTER_COSMOS_ENDPOINT", endpoint)
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
    let direct = rabbitmq::connect(START_WAIT).await;
    let queue = format!("chatter-test-chaos-{}", uuid::Uuid::new_v4().simple());
    let received = Received::consume(rabbitmq::subscribe(&direct, &queue, START_WAIT).await);
    let proxy = TcpProxy::start(rabbitmq::server_addr()).await;
    let through = Through::RabbitMq(rabbitmq::uri_through(&proxy));
    chaos(&proxy, &through, &queue, &received, direct.clone()).await;
    rabbitmq::delete_queue(&direct, &queue, START_WAIT).await;
}

#[cfg(feature = "nats")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn relays_killed_at_random_and_a_nats_outage_lose_nothing() {
    use chatter_tests::nats::{self, NatsServer, TestStream};
    let server = NatsServer::start().await;
    let direct = nats::connect(&server.url()).await;
    // The relays' republish bound: lease expiry 3 s plus the 60 s suspension window.
    let stream = TestStream::create(&direct, Duration::from_secs(120)).await;
    let events = stream.subject("chaos");
    let received = Received::consume(nats::subscribe(&direct, &events).await);
    let proxy = TcpProxy::start(server.addr()).await;
    let through = Through::Nats(format!("nats://{}", proxy.addr()));
    chaos(&proxy, &through, &events, &received, direct.clone()).await;
}

/// Three relays publishing to `broker` (through `proxy`) while 1,000 commands are written whose
/// events go to `queue`, 20 kills and one outage; `received` consumes `queue` directly.
async fn chaos(
    proxy: &TcpProxy,
    broker_uri: &Through,
    queue: &str,
    received: &Received,
    direct: impl chatter_runtime::broker::Broker,
) {
    let (emulator, cosmos) = emulator_server().await;
    let orders = provisioned_with_leases(
        &cosmos,
        "relay-kill",
        "orders",
        &["/orderId"],
        "orders-leases",
    )
    .await;
    let mut relays = Vec::new();
    for _ in 0..RELAYS {
        let mut relay = spawn_relay(emulator.endpoint(), broker_uri);
        relay.line_starting_with("started", START_WAIT).await;
        relays.push(relay);
    }

    // The writer: the document tier in this process, paced so the faults land while it writes.
    let writer = writer(&cosmos, direct).await;
    let writing = {
        let writer = writer.clone();
        let queue = queue.to_owned();
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
        let mut successor = spawn_relay(emulator.endpoint(), broker_uri);
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
        "chaos ({broker_uri:?}): kills {KILLS}, broker outages 1 ({OUTAGE:?}), documents {DOCUMENTS}, lost {lost}, \
         duplicates {duplicates} ({:.1}%), drained and stamped {drained_after:?} after the last fault and the last write",
        duplicates as f64 * 100.0 / DOCUMENTS as f64
    );
    assert_eq!(lost, 0);
    if matches!(broker_uri, Through::Nats(_)) {
        // Every republish falls within the stream's duplicate window.
        assert_eq!(duplicates, 0, "JetStream stores each message id once");
    }
    assert!(
        counts.keys().all(|id| expected.contains(id)),
        "nothing foreign arrived"
    );

    drop(relays);
    writer.shutdown().await;
}
