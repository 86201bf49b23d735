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

/// The documented example relay file (the ```toml block after "A relay without Rust" in the
/// `chatter` command's chapter, `chatter-runtime/docs/cli.md`), with only
/// what points at a machine adapted: the endpoint, the key file (none for the emulator) and the
/// broker URL file.
fn readme_relay_file(endpoint: &str, url_file: &std::path::Path) -> String {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../chatter-runtime/docs/cli.md"
    );
    let readme = std::fs::read_to_string(path).expect("the chapter on the `chatter` command");
    let chapter = readme
        .split_once("**A relay without Rust.**")
        .expect("the chapter's relay section")
        .1;
    let block = chapter
        .split_once("```toml\n")
        .expect("the example file")
        .1
        .split_once("```")
        .expect("the end of the example file")
        .0;
    block
        .lines()
        .filter_map(|line| {
            let key = line.split('=').next().unwrap_or_default().trim();
            match key {
                "endpoint" => Some(format!("endpoint = \"{endpoint}\"")),
                "key_file" => None,
                "url_file" => Some(format!("url_file = \"{}\"", url_file.display())),
                _ => Some(line.to_owned()),
            }
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// A running `chatter relay --config`: its output lines as they come.
struct Relay {
    child: std::process::Child,
    lines: std::sync::mpsc::Receiver<String>,
    seen: Vec<String>,
}

impl Relay {
    fn start(config: &std::path::Path, envs: &[(&str, &str)]) -> Self {
        let mut command = Command::new(env!("CARGO_BIN_EXE_chatter"));
        command
            .args(["relay", "--config"])
            .arg(config)
            .env_remove("CHATTER_BROKER_URL")
            .env_remove("CHATTER_COSMOS_KEY")
            .env_remove("CHATTER_COSMOS_ENDPOINT")
            .env_remove("RUST_LOG")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        for (key, value) in envs {
            command.env(key, value);
        }
        let mut child = command.spawn().unwrap();
        let (send, lines) = std::sync::mpsc::channel();
        for (stream, reader) in [
            (
                "stdout",
                Box::new(child.stdout.take().unwrap()) as Box<dyn std::io::Read + Send>,
            ),
            ("stderr", Box::new(child.stderr.take().unwrap())),
        ] {
            let send = send.clone();
            std::thread::spawn(move || {
                use std::io::BufRead;
                for line in std::io::BufReader::new(reader).lines() {
                    let Ok(line) = line else { break };
                    if send.send(format!("{stream}: {line}")).is_err() {
                        break;
                    }
                }
            });
        }
        Self {
            child,
            lines,
            seen: Vec::new(),
        }
    }

    /// Waits (up to `WAIT`) for an output line `wanted` accepts; panics with everything seen
    /// when the relay exits or the wait ends first.
    async fn wait_for(&mut self, wanted: impl Fn(&str) -> bool) -> String {
        let deadline = std::time::Instant::now() + WAIT;
        loop {
            match self.lines.try_recv() {
                Ok(line) => {
                    self.seen.push(line.clone());
                    if wanted(&line) {
                        return line;
                    }
                }
                Err(std::sync::mpsc::TryRecvError::Empty) => {
                    assert!(
                        std::time::Instant::now() < deadline,
                        "not seen; the output:\n{}",
                        self.seen.join("\n")
                    );
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                Err(std::sync::mpsc::TryRecvError::Disconnected) => {
                    let status = self.child.try_wait();
                    panic!(
                        "the relay ended ({status:?}); its output:\n{}",
                        self.seen.join("\n")
                    );
                }
            }
        }
    }

    /// SIGTERM, then its exit code and the rest of its output.
    async fn stop(mut self) -> (Option<i32>, Vec<String>) {
        let pid = self.child.id().to_string();
        assert!(
            Command::new("kill")
                .args(["-TERM", &pid])
                .status()
                .unwrap()
                .success()
        );
        // Every line up to the end of both streams (the readers stop there).
        let (status, seen) = tokio::task::spawn_blocking(move || {
            let status = self.child.wait().unwrap();
            let mut seen = self.seen;
            seen.extend(self.lines.iter());
            (status, seen)
        })
        .await
        .unwrap();
        (status.code(), seen)
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn the_readme_relay_file_starts_and_logs_the_leases_it_owns_on_stderr() {
    let emulator = chatter_emulator::EmulatorServer::bind("127.0.0.1:0".parse().unwrap())
        .await
        .unwrap()
        .spawn();
    let cosmos = chatter_runtime::cosmos::CosmosConnection::connect(emulator.endpoint(), None)
        .await
        .unwrap();
    chatter_runtime::provision::ensure_container(
        &cosmos,
        "shop",
        "orders",
        &["/tenantId", "/orderId"],
    )
    .await
    .unwrap();
    chatter_runtime::provision::ensure_lease_container(&cosmos, "shop", "orders-leases")
        .await
        .unwrap();
    let url_file = config_file(RABBITMQ);
    let config = config_file(&readme_relay_file(emulator.endpoint(), &url_file));

    let mut relay = Relay::start(&config, &[]);
    relay
        .wait_for(|line| line.starts_with("stdout: chatter relay started"))
        .await;
    let owned = relay
        .wait_for(|line| line.starts_with("stderr:") && line.contains("owns leases"))
        .await;
    assert!(owned.contains("INFO"), "{owned}");
    assert!(!owned.contains("(0 now)"), "{owned}");
    let (code, output) = relay.stop().await;
    assert_eq!(code, Some(0), "{}", output.join("\n"));
    assert!(
        output
            .iter()
            .any(|line| line.starts_with("stderr:") && line.contains("lease acquired")),
        "the runtime's own info logs reach standard error: {}",
        output.join("\n")
    );
    let _ = std::fs::remove_file(config);
    let _ = std::fs::remove_file(url_file);
}

#[tokio::test(flavor = "multi_thread")]
async fn timings_the_file_does_not_set_are_derived_from_those_it_sets() {
    let (emulator, _cosmos) = served_store_with_leases("orders", "orders-leases").await;
    // A short lease expiry (the renew interval follows it) and a publish bound above the
    // handler timeout's default (the handler timeout follows it and the store timeout).
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
lease_expiry_seconds = 3
publish_timeout_seconds = 600
"#,
        emulator.endpoint()
    ));
    let mut relay = Relay::start(&config, &[("CHATTER_BROKER_URL", RABBITMQ)]);
    relay
        .wait_for(|line| line.starts_with("stdout: chatter relay started"))
        .await;
    let (code, output) = relay.stop().await;
    assert_eq!(code, Some(0), "{}", output.join("\n"));
    let _ = std::fs::remove_file(config);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_relay_without_a_broker_url_names_what_its_file_takes() {
    let (emulator, _cosmos) = served_store_with_leases("orders", "orders-leases").await;
    let config = config_file(&format!(
        "[cosmos]\nendpoint = \"{}\"\n[broker]\nkind = \"rabbitmq\"\n[[relay]]\ndatabase = \"{DB}\"\n\
         container = \"orders\"\nlease_container = \"orders-leases\"\npartition_key = \"/orderId\"\n",
        emulator.endpoint()
    ));
    let output = tokio::task::spawn_blocking({
        let config = config.clone();
        move || {
            Command::new(env!("CARGO_BIN_EXE_chatter"))
                .args(["relay", "--config"])
                .arg(&config)
                .env_remove("CHATTER_BROKER_URL")
                .env_remove("CHATTER_COSMOS_ENDPOINT")
                .output()
                .unwrap()
        }
    })
    .await
    .unwrap();
    let text = stderr(&output);
    assert_eq!(output.status.code(), Some(2), "{text}");
    assert!(
        text.contains("CHATTER_BROKER_URL") && text.contains("url_file"),
        "{text}"
    );
    assert!(!text.contains("--broker-url-file"), "{text}");
    let _ = std::fs::remove_file(config);
}
