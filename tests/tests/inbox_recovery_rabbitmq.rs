//! A standalone-inbox service SIGKILLed mid-handler holds its messages for a claim period, not
//! a delivery timeout: with every default (a 5-minute delivery timeout, a 20 s claim renewed
//! while its handler runs, a 10 s clock margin) each message it held completes in the other
//! service within 60 s of the kill, and no handler of a message ever runs twice at once. (With
//! claims as long as the delivery timeout, about 270 s, half of them had not completed 120 s
//! later.)
//!
//! Real parts: a `chatter-emulator` server in this process is the store both services share,
//! RabbitMQ at 127.0.0.1:5672 the broker, `inbox_worker` (`tests/src/bin/inbox_worker.rs`) the
//! process; the kill is a SIGKILL.
#![cfg(feature = "rabbitmq")]

use std::collections::BTreeMap;
use std::process::{Command, Stdio};
use std::time::Duration;

use chatter_runtime::BrokeredMessage;
use chatter_runtime::broker::Broker;
use chatter_runtime::cosmos::inbox_id;
use chatter_runtime::provision;
use chatter_tests::process::ChildProcess;
use chatter_tests::rabbitmq::{self, URI};
use chatter_tests::store::{emulator_server, find_document};
use serde_json::json;

const WAIT: Duration = Duration::from_secs(120);
const IDS: usize = 10;
/// How long each handler runs: past the first renewal (a third of the 20 s claim period), so
/// the killed service dies mid-handler on claims it renewed.
const HANDLER_MS: &str = "9000";

fn spawn_worker(endpoint: &str, queue: &str) -> ChildProcess {
    let mut command = Command::new(env!("CARGO_BIN_EXE_inbox_worker"));
    command
        .env("CHATTER_COSMOS_ENDPOINT", endpoint)
        .env("CHATTER_RABBITMQ_URI", URI)
        .env("CHATTER_TEST_QUEUE", queue)
        .env("CHATTER_TEST_HANDLER_MS", HANDLER_MS)
        // Every inbox default: no delivery timeout of the test's own.
        .env_remove("CHATTER_TEST_DELIVERY_TIMEOUT_MS")
        .env_remove("CHATTER_TEST_HOLD")
        .env_remove("CHATTER_COSMOS_KEY")
        .stdin(Stdio::piped())
        .stderr(Stdio::inherit());
    ChildProcess::spawn("inbox_worker", &mut command)
}

/// Reads what `worker` printed so far: `holding <id>` as a handler starts, `handled <id>` as it
/// runs; the ids it started handling, in order.
async fn started(worker: &mut ChildProcess, within: Duration) -> Vec<String> {
    let mut ids = Vec::new();
    while let Some(line) = worker.try_line(within).await {
        if let Some(id) = line.strip_prefix("holding ") {
            ids.push(id.to_owned());
        }
    }
    ids
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_service_killed_mid_handler_frees_its_messages_within_a_minute_with_the_defaults() {
    let (emulator, cosmos) = emulator_server().await;
    provision::ensure_container(&cosmos, "cards", "idempotency", &["/idempotencyKey"])
        .await
        .unwrap();
    let queue = format!("charge-card-{}", uuid::Uuid::new_v4().simple());
    let mut doomed = spawn_worker(emulator.endpoint(), &queue);
    doomed.line_starting_with("started", WAIT).await;
    let mut survivor = spawn_worker(emulator.endpoint(), &queue);
    survivor.line_starting_with("started", WAIT).await;
    let broker = rabbitmq::connect(WAIT).await;
    for i in 0..IDS {
        let body = json!({ "amount": 10 }).to_string();
        let message = BrokeredMessage::json(format!("charge-{i}"), queue.clone(), body);
        broker.publish(message).await.unwrap();
    }
    // Killed in the middle of a handler, after its claims were renewed once (every handler
    // still runs, so every PATCH so far is a renewal).
    let held = doomed.line_starting_with("holding ", WAIT).await;
    let held = held.trim_start_matches("holding ").to_owned();
    tokio::time::sleep(Duration::from_millis(7_500)).await;
    assert!(
        emulator.request_count("PATCH") > 0,
        "the running handlers' claims were renewed"
    );
    doomed.kill();
    let killed = tokio::time::Instant::now();

    let c = cosmos.container("cards", "idempotency").await.unwrap();
    let mut completed_after = BTreeMap::new();
    while completed_after.len() < IDS {
        for i in 0..IDS {
            let id = format!("charge-{i}");
            if completed_after.contains_key(&id) {
                continue;
            }
            let marker = find_document(&c, &[json!(id)], &inbox_id(&id).unwrap()).await;
            if marker.is_some_and(|m| m["Completed"] == true) {
                completed_after.insert(id, killed.elapsed());
            }
        }
        assert!(
            killed.elapsed() < WAIT,
            "only {completed_after:?} completed {WAIT:?} after the kill"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let slowest = completed_after.values().max().copied().unwrap_or_default();
    eprintln!("every message completed within {slowest:?} of the kill: {completed_after:?}");
    assert!(
        slowest <= Duration::from_secs(60),
        "the message {held} the killed service held (and every other) completes within 60 s of the kill: {completed_after:?}"
    );
    // The survivor ran the held message itself, after the kill: never two at once (the
    // survivor's runs of an id are one after another; the killed one's ended with it).
    let survivor_started = started(&mut survivor, Duration::from_millis(500)).await;
    assert!(
        survivor_started.contains(&held),
        "the survivor took over {held}: {survivor_started:?}"
    );
    rabbitmq::delete_queue(&broker, &queue, WAIT).await;
}
