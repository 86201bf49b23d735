//! Two consumer processes of one standalone-inbox command race on the same message ids over
//! RabbitMQ, and one is SIGKILLed in the middle of a handler: every id's marker ends completed,
//! the killed attempt's pending marker is taken over by the survivor once its claim ran out (its
//! handler runs again: the documented at-least-once edge), and no id is lost.
//!
//! Real parts: a `chatter-emulator` server in this process is the store both share, RabbitMQ at
//! 127.0.0.1:5672 the broker, `inbox_worker` (`tests/src/bin/inbox_worker.rs`) the process.
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
use chatter_tests::wait::eventually;
use serde_json::json;

const WAIT: Duration = Duration::from_secs(120);
const IDS: usize = 30;
const HELD: &str = "charge-7";

fn spawn_worker(endpoint: &str, queue: &str, hold: Option<&str>) -> ChildProcess {
    let mut command = Command::new(env!("CARGO_BIN_EXE_inbox_worker"));
    command
        .env("CHATTER_COSMOS_ENDPOINT", endpoint)
        .env("CHATTER_RABBITMQ_URI", URI)
        .env("CHATTER_TEST_QUEUE", queue)
        // The killed attempt's claim runs out 3 s after it was written (plus the clock margin):
        // only then is it taken over.
        .env("CHATTER_TEST_DELIVERY_TIMEOUT_MS", "3000")
        .env_remove("CHATTER_TEST_HANDLER_MS")
        .env_remove("CHATTER_COSMOS_KEY")
        .stdin(Stdio::piped())
        .stderr(Stdio::inherit());
    match hold {
        Some(id) => command.env("CHATTER_TEST_HOLD", id),
        None => command.env_remove("CHATTER_TEST_HOLD"),
    };
    ChildProcess::spawn("inbox_worker", &mut command)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_consumer_killed_mid_handler_loses_no_message_id_and_its_claim_is_taken_over() {
    let (emulator, cosmos) = emulator_server().await;
    provision::ensure_container(&cosmos, "cards", "idempotency", &["/idempotencyKey"])
        .await
        .unwrap();
    let queue = format!("charge-card-{}", uuid::Uuid::new_v4().simple());
    // The doomed process consumes first, so it holds its claim of HELD mid-handler.
    let mut doomed = spawn_worker(emulator.endpoint(), &queue, Some(HELD));
    doomed.line_starting_with("started", WAIT).await;
    // Every id published twice.
    let broker = rabbitmq::connect(WAIT).await;
    for round in 0..2 {
        for i in 0..IDS {
            let body = json!({ "amount": 10 + round }).to_string();
            let message = BrokeredMessage::json(format!("charge-{i}"), queue.clone(), body);
            broker.publish(message).await.unwrap();
        }
    }
    let held = doomed
        .line_starting_with(&format!("holding {HELD}"), WAIT)
        .await;
    assert!(held.ends_with(HELD));
    // The survivor joins while the doomed one holds: both consume the same ids for a while.
    let mut survivor = spawn_worker(emulator.endpoint(), &queue, None);
    survivor.line_starting_with("started", WAIT).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let doomed_pid = doomed.id();
    doomed.kill();

    let c = cosmos.container("cards", "idempotency").await.unwrap();
    eventually(
        WAIT,
        Duration::from_millis(200),
        "every id's marker is completed",
        || {
            let c = c.clone();
            async move {
                for i in 0..IDS {
                    let id = format!("charge-{i}");
                    let marker = find_document(&c, &[json!(id)], &inbox_id(&id).unwrap()).await;
                    if marker.is_none_or(|m| m["Completed"] != true) {
                        return false;
                    }
                }
                true
            }
        },
    )
    .await;

    // What the survivor ran, after the fact (its stdout, while it is still alive).
    let mut runs: BTreeMap<String, usize> = BTreeMap::new();
    survivor_lines(&mut survivor, &mut runs).await;
    assert!(
        runs.get(HELD).copied().unwrap_or(0) >= 1,
        "the survivor took the killed process's claim of {HELD} over and ran it (pid {doomed_pid} held it): {runs:?}"
    );
    rabbitmq::delete_queue(&broker, &queue, WAIT).await;
}

/// Reads the `handled <id>` lines the survivor printed so far into `runs`.
async fn survivor_lines(survivor: &mut ChildProcess, runs: &mut BTreeMap<String, usize>) {
    while let Some(line) = survivor.try_line(Duration::from_millis(500)).await {
        if let Some(id) = line.strip_prefix("handled ") {
            *runs.entry(id.to_owned()).or_default() += 1;
        }
    }
}
