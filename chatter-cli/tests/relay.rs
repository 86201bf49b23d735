//! `chatter relay --config relay.toml` against `chatter-emulator` served over HTTP and the
//! machine's RabbitMQ: the pending documents of the configured container are published and
//! stamped delivered, SIGTERM stops it gracefully (exit 0); a configuration that is not one
//! exits 2 naming what is wrong, without echoing a secret put in the file.

mod common;

use std::process::{Command, Stdio};
use std::time::Duration;

use chatter_runtime::BrokeredMessage;
use chatter_runtime::broker::{Broker, RabbitMqBroker};
use chatter_runtime::cosmos::{ReadOutcome, partition_key, read_item};
use chatter_runtime::testing::{OutboxDocument, create_item};
use common::{DB, served_store_with_leases, stderr};
use serde_json::json;

const RABBITMQ: &str = "amqp://guest:guest@127.0.0.1:5672/%2f";
const WAIT: Duration = Duration::from_secs(60);

fn config_file(body: &str) -> std::path::PathBuf {
    let path = std::env::temp_dir().join(format!("chatter-relay-{}.toml", uuid::Uuid::new_v4()));
    std::fs::write(&path, body).unwrap();
    path
}

#[tokio::test(flavor = "multi_thread")]
async fn a_relay_from_a_config_file_publishes_pending_documents_and_stops_on_sigterm() {
    let (emulator, cosmos) = served_store_with_leases("orders", "orders-leases").await;
    let orders = cosmos.container(DB, "orders").await.unwrap();
    let destination = format!("chatter-test-cli-relay-{}", uuid::Uuid::new_v4().simple());
    let mut ids = Vec::new();
    for n in 0..3 {
        let message = BrokeredMessage::json(format!("m-{n}"), &destination, r#"{"orderId":"o-1"}"#);
        let doc = OutboxDocument::build(&message, &["/orderId"], &[json!("o-1")]).unwrap();
        ids.push(doc["id"].as_str().unwrap().to_owned());
        create_item(&orders, partition_key(&[json!("o-1")]).unwrap(), &doc)
            .await
            .unwrap();
    }
    let broker = RabbitMqBroker::connect(RABBITMQ).await.unwrap();
    let mut received = broker.subscribe(&destination).await.unwrap();
    let config = config_file(&format!(
        r#"
[cosmos]
endpoint = "{}"

[broker]
kind = "rabbitmq"

[[relay]]
database = "{DB}"
container = "orders"
lease_container = "orders-leases"
partition_key = "/orderId"

[relay.options]
poll_interval_ms = 100
lease_expiry_seconds = 10
"#,
        emulator.endpoint()
    ));

    let child = Command::new(env!("CARGO_BIN_EXE_chatter"))
        .args(["relay", "--config"])
        .arg(&config)
        .env("CHATTER_BROKER_URL", RABBITMQ)
        .env_remove("CHATTER_COSMOS_KEY")
        .env_remove("CHATTER_COSMOS_ENDPOINT")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut got = Vec::new();
    for _ in 0..3 {
        let delivery = tokio::time::timeout(WAIT, received.next())
            .await
            .expect("the relay publishes")
            .unwrap()
            .unwrap();
        got.push(delivery.message.message_id.clone());
        delivery.ack().await.unwrap();
    }
    got.sort();
    assert_eq!(got, ["m-0", "m-1", "m-2"]);
    for id in &ids {
        let deadline = tokio::time::Instant::now() + WAIT;
        loop {
            let ReadOutcome::Found { document, .. } =
                read_item(&orders, partition_key(&[json!("o-1")]).unwrap(), id)
                    .await
                    .unwrap()
            else {
                panic!("{id} is gone");
            };
            if document["status"] == "delivered" {
                break;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "never stamped: {document}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    let pid = child.id().to_string();
    assert!(
        Command::new("kill")
            .args(["-TERM", &pid])
            .status()
            .unwrap()
            .success()
    );
    let output = tokio::task::spawn_blocking(move || child.wait_with_output().unwrap())
        .await
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert_eq!(output.status.code(), Some(0), "{stdout}{}", stderr(&output));
    assert!(stdout.contains("chatter relay started"), "{stdout}");
    assert!(
        stdout.contains("stopping: pages in flight finish"),
        "{stdout}"
    );
    drop(received);
    broker.delete_queue(&destination).await.unwrap();
    let _ = std::fs::remove_file(config);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_file_that_is_no_relay_configuration_exits_2_without_echoing_a_secret() {
    let secret = "AccountKey-s3cr3t==";
    let cases = [
        (
            format!("[cosmos]\nkey = \"{secret}\"\n[broker]\nkind = \"nats\"\n[[relay]]\ndatabase = \"d\"\ncontainer = \"c\"\nlease_container = \"l\"\npartition_key = \"/k\"\n"),
            "unknown field `key`",
        ),
        ("[broker]\nkind = \"kafka\"\n[[relay]]\ndatabase = \"d\"\ncontainer = \"c\"\nlease_container = \"l\"\npartition_key = \"/k\"\n".to_owned(), "kafka"),
        ("relay = []\n[broker]\nkind = \"nats\"\n".to_owned(), "names no [[relay]]"),
    ];
    for (body, expected) in cases {
        let config = config_file(&body);
        let output = Command::new(env!("CARGO_BIN_EXE_chatter"))
            .args(["relay", "--config"])
            .arg(&config)
            .env_remove("CHATTER_BROKER_URL")
            .output()
            .unwrap();
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&output.stdout),
            stderr(&output)
        );
        assert_eq!(output.status.code(), Some(2), "{text}");
        assert!(text.contains(expected), "{expected}: {text}");
        assert!(!text.contains(secret), "{text}");
        let _ = std::fs::remove_file(config);
    }
}
