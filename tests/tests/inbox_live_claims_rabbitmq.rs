//! Two consumer processes of one standalone-inbox command over RabbitMQ: a second copy of a
//! message id that reaches one process while the other still runs its handler is never run
//! beside it. It waits for the live claim (delivered again later, uncounted), and once the
//! first attempt completed it is acknowledged as a duplicate. The copies come from a
//! publisher's own retry and from a RabbitMQ channel lost mid-handler (a real TCP cut).
//!
//! Real parts: a `chatter-emulator` server in this process is the store both share, RabbitMQ at
//! 127.0.0.1:5672 the broker (one worker reaches it through a `TcpProxy`), `inbox_worker`
//! (`tests/src/bin/inbox_worker.rs`) the process.
#![cfg(feature = "rabbitmq")]

use std::collections::BTreeMap;
use std::process::{Command, Stdio};
use std::time::Duration;

use chatter_runtime::BrokeredMessage;
use chatter_runtime::broker::Broker;
use chatter_runtime::cosmos::{CosmosConnection, inbox_id};
use chatter_runtime::provision;
use chatter_tests::process::ChildProcess;
use chatter_tests::proxy::TcpProxy;
use chatter_tests::rabbitmq::{self, URI};
use chatter_tests::store::{emulator_server, find_document};
use chatter_tests::wait::eventually;
use serde_json::json;

const WAIT: Duration = Duration::from_secs(120);

fn spawn_worker(endpoint: &str, uri: &str, queue: &str, handler_ms: u64) -> ChildProcess {
    let mut command = Command::new(env!("CARGO_BIN_EXE_inbox_worker"));
    command
        .env("CHATTER_COSMOS_ENDPOINT", endpoint)
        .env("CHATTER_RABBITMQ_URI", uri)
        .env("CHATTER_TEST_QUEUE", queue)
        .env("CHATTER_TEST_HANDLER_MS", handler_ms.to_string())
        .env_remove("CHATTER_TEST_HOLD")
        .env_remove("CHATTER_COSMOS_KEY")
        .stdin(Stdio::piped())
        .stderr(Stdio::inherit());
    ChildProcess::spawn("inbox_worker", &mut command)
}

async fn idempotency_container(cosmos: &CosmosConnection) {
    provision::ensure_container(cosmos, "cards", "idempotency", &["/idempotencyKey"])
        .await
        .unwrap();
}

/// Waits until the marker of every id in `ids` is completed.
async fn all_completed(cosmos: &CosmosConnection, ids: &[String]) {
    let c = cosmos.container("cards", "idempotency").await.unwrap();
    eventually(
        WAIT,
        Duration::from_millis(200),
        "every id's marker is completed",
        || {
            let c = c.clone();
            async move {
                for id in ids {
                    let marker = find_document(&c, &[json!(id)], &inbox_id(id).unwrap()).await;
                    if marker.is_none_or(|m| m["Completed"] != true) {
                        return false;
                    }
                }
                true
            }
        },
    )
    .await;
}

/// Adds the `handled <id>` lines `worker` printed so far to `runs`.
async fn count_runs(worker: &mut ChildProcess, runs: &mut BTreeMap<String, usize>) {
    while let Some(line) = worker.try_line(Duration::from_millis(500)).await {
        if let Some(id) = line.strip_prefix("handled ") {
            *runs.entry(id.to_owned()).or_default() += 1;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_publishers_retry_reaching_another_process_mid_handler_is_not_run_beside_it() {
    let (emulator, cosmos) = emulator_server().await;
    idempotency_container(&cosmos).await;
    let queue = format!("charge-card-{}", uuid::Uuid::new_v4().simple());
    let mut first = spawn_worker(emulator.endpoint(), URI, &queue, 1_500);
    let mut second = spawn_worker(emulator.endpoint(), URI, &queue, 1_500);
    first.line_starting_with("started", WAIT).await;
    second.line_starting_with("started", WAIT).await;
    // Each id published twice at once, as a publisher that retries a send it did not hear
    // confirmed: RabbitMQ hands the two copies to the two consumers in turn.
    let broker = rabbitmq::connect(WAIT).await;
    let ids: Vec<String> = (0..8).map(|i| format!("charge-{i}")).collect();
    for id in &ids {
        for _ in 0..2 {
            let body = json!({ "amount": 10 }).to_string();
            let message = BrokeredMessage::json(id.clone(), queue.clone(), body);
            broker.publish(message).await.unwrap();
        }
    }
    all_completed(&cosmos, &ids).await;
    // The copies that waited come back after about a second and find their id completed.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let mut runs = BTreeMap::new();
    count_runs(&mut first, &mut runs).await;
    count_runs(&mut second, &mut runs).await;
    for id in &ids {
        assert_eq!(
            runs.get(id).copied(),
            Some(1),
            "{id}'s handler ran once, never beside another copy's: {runs:?}"
        );
    }
    rabbitmq::delete_queue(&broker, &queue, WAIT).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delivery_redelivered_by_a_lost_channel_waits_for_the_live_handler_instead_of_running_beside_it()
 {
    let (emulator, cosmos) = emulator_server().await;
    idempotency_container(&cosmos).await;
    let queue = format!("charge-card-{}", uuid::Uuid::new_v4().simple());
    let proxy = TcpProxy::start(rabbitmq::server_addr()).await;
    // The first process reaches RabbitMQ through the proxy; its handler takes 4 s.
    let mut cut_off = spawn_worker(
        emulator.endpoint(),
        &rabbitmq::uri_through(&proxy),
        &queue,
        4_000,
    );
    cut_off.line_starting_with("started", WAIT).await;
    let broker = rabbitmq::connect(WAIT).await;
    let id = "charge-lost-channel".to_owned();
    let body = json!({ "amount": 10 }).to_string();
    broker
        .publish(BrokeredMessage::json(id.clone(), queue.clone(), body))
        .await
        .unwrap();
    // Its handler has started (the lines before it counted: `handled` comes first).
    let mut runs = BTreeMap::new();
    while let Some(line) = cut_off.try_line(WAIT).await {
        if let Some(handled) = line.strip_prefix("handled ") {
            *runs.entry(handled.to_owned()).or_default() += 1;
        }
        if line == format!("holding {id}") {
            break;
        }
    }
    let mut other = spawn_worker(emulator.endpoint(), URI, &queue, 4_000);
    other.line_starting_with("started", WAIT).await;
    // The first process's channel is lost mid-handler: RabbitMQ requeues the message and
    // delivers it to the other process while the handler still runs.
    proxy.cut_for(Duration::from_secs(2));
    all_completed(&cosmos, std::slice::from_ref(&id)).await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    count_runs(&mut cut_off, &mut runs).await;
    count_runs(&mut other, &mut runs).await;
    assert_eq!(
        runs.get(&id).copied(),
        Some(1),
        "the redelivered copy did not run beside the live handler: {runs:?}"
    );
    eventually(
        WAIT,
        Duration::from_millis(200),
        "the redelivered copy is acknowledged as a duplicate",
        || async { rabbitmq::messages(&queue) == Some(0) },
    )
    .await;
    rabbitmq::delete_queue(&broker, &queue, WAIT).await;
}
