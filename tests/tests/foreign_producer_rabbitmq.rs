//! A command sent by another service: the Python example of the brokers chapter ("A command
//! sent by another service", `chatter-runtime/docs/brokers.md`), run as written with `pika`
//! against RabbitMQ, is a command chatter handles: its handler gets the body and the message
//! id the script set, and its inbox marker commits under that id.
//!
//! Real parts: the embedded store, RabbitMQ at 127.0.0.1:5672, and the machine's `python3` with
//! `pika`, which the test installs from PyPI into its own folder of the target directory on its
//! first run (nothing outside `target/` changes). Only the queue's name is changed, so that a
//! run has a queue of its own on the shared server.
#![cfg(feature = "rabbitmq")]

use std::sync::Mutex;
use std::time::Duration;

use chatter_runtime::broker::RabbitMqBroker;
use chatter_runtime::cosmos::{CosmosConnection, inbox_id};
use chatter_runtime::provision;
use chatter_runtime::{BoxError, DocumentReliable, HandlerContext, Runtime, handler};
use chatter_tests::rabbitmq;
use chatter_tests::runtime::registry_at;
use chatter_tests::store::find_document;
use chatter_tests::wait::eventually;
use serde::{Deserialize, Serialize};
use serde_json::json;

const WAIT: Duration = Duration::from_secs(60);

/// The chapter's command: `{"orderId": "o-1", "amount": 7}`.
#[derive(Debug, Serialize, Deserialize, DocumentReliable)]
#[cosmos(
    database = "shop",
    container = "foreign-orders",
    lease = "foreign-orders-leases"
)]
#[partition_key(path = "/orderId")]
#[serde(rename_all = "camelCase")]
pub struct CreateOrder {
    pub order_id: String,
    pub amount: u32,
}

/// What the handler was given: (message id, order id, amount).
static HANDLED: Mutex<Vec<(String, String, u32)>> = Mutex::new(Vec::new());

#[handler]
async fn create_order(command: CreateOrder, ctx: &mut HandlerContext) -> Result<(), BoxError> {
    HANDLED.lock().unwrap().push((
        ctx.message_id().to_owned(),
        command.order_id,
        command.amount,
    ));
    Ok(())
}

/// A folder holding `pika`, for `PYTHONPATH`: installed there by `pip` the first time.
fn pika() -> std::path::PathBuf {
    let folder = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("pika-1.3.2");
    if !folder.join("pika").is_dir() {
        let installed = std::process::Command::new("python3")
            .args(["-m", "pip", "install", "--quiet", "--target"])
            .arg(&folder)
            .arg("pika==1.3.2")
            .output()
            .expect("python3 runs");
        assert!(
            installed.status.success(),
            "pip installs pika: {}",
            String::from_utf8_lossy(&installed.stderr)
        );
    }
    folder
}

/// The chapter's Python block: the fenced `python` code after "In Python with `pika`".
fn python_example() -> String {
    let chapter = include_str!("../../chatter-runtime/docs/brokers.md");
    let after = chapter
        .split_once("In Python with `pika`")
        .expect("the chapter has the Python example")
        .1;
    let block = after
        .split_once("```python\n")
        .expect("a python block follows")
        .1;
    block
        .split_once("```")
        .expect("the block is closed")
        .0
        .to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_brokers_chapter_python_producer_sends_a_command_chatter_handles() {
    let example = python_example();
    let queue = format!("orders.create-{}", uuid::Uuid::new_v4().simple());
    let script = example.replace("\"orders.create\"", &format!("\"{queue}\""));
    assert_ne!(
        script, example,
        "the example publishes to \"orders.create\""
    );

    let cosmos = CosmosConnection::embedded().await.unwrap();
    provision::ensure_for::<CreateOrder>(&cosmos).await.unwrap();
    let broker = RabbitMqBroker::connect_retrying(rabbitmq::URI, WAIT)
        .await
        .unwrap();
    // `start()` declares the command's queue, so the script's mandatory publish is routed.
    let runtime = Runtime::builder()
        .cosmos(cosmos.clone())
        .broker(broker)
        .registry(registry_at::<CreateOrder>(&queue))
        .start()
        .await
        .unwrap();

    let ran = tokio::task::spawn_blocking(move || {
        std::process::Command::new("python3")
            .env("PYTHONPATH", pika())
            .args(["-c", &script])
            .output()
    })
    .await
    .unwrap()
    .expect("python3 runs");
    assert!(
        ran.status.success(),
        "the example ran ({}): {}",
        ran.status,
        String::from_utf8_lossy(&ran.stderr)
    );

    eventually(
        WAIT,
        Duration::from_millis(100),
        "the command is handled",
        || {
            let handled = !HANDLED.lock().unwrap().is_empty();
            async move { handled }
        },
    )
    .await;
    assert_eq!(
        *HANDLED.lock().unwrap(),
        [("o-1-create".to_owned(), "o-1".to_owned(), 7)]
    );
    let orders = cosmos.container("shop", "foreign-orders").await.unwrap();
    let marker = find_document(&orders, &[json!("o-1")], &inbox_id("o-1-create").unwrap()).await;
    let marker = marker.expect("the inbox marker committed under the script's message id");
    assert_eq!(marker["MessageId"], "o-1-create");
    runtime.shutdown().await;
    let direct = rabbitmq::connect(WAIT).await;
    rabbitmq::delete_emptied(&direct, &[queue.as_str()], WAIT).await;
}
