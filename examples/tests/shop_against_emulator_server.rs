//! The shop example as a separate process against `chatter-emulator`: this process then reads
//! what the example wrote with its own, independent SDK client and finds the section-0 shapes.

use std::process::Command;

use chatter_runtime::cosmos::{self, CosmosConnection};
use chatter_tests::process::stdout_of_success;
use chatter_tests::store::{INBOX_MARKER_WIRE_KEYS, OUTBOX_WIRE_KEYS, keys_then, wire_keys};
use serde_json::Value;

#[tokio::test(flavor = "multi_thread")]
async fn a_second_process_reads_the_examples_documents_in_the_exact_shapes() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let server = chatter_emulator::EmulatorServer::from_listener(listener)
        .unwrap()
        .spawn();
    let endpoint = server.endpoint().to_owned();

    let exe = env!("CARGO_BIN_EXE_shop");
    let stdout = tokio::task::spawn_blocking(move || {
        stdout_of_success(
            Command::new(exe)
                .env("CHATTER_COSMOS_ENDPOINT", &endpoint)
                .env_remove("CHATTER_COSMOS_KEY"),
        )
    })
    .await
    .unwrap();

    // The order ids the example printed, e.g. "  stored order  order-1a2b3c4d-1".
    let orders: Vec<&str> = stdout
        .lines()
        .filter_map(|l| l.trim().strip_prefix("stored order"))
        .map(str::trim)
        .collect();
    assert_eq!(orders.len(), 2, "{stdout}");
    // The second cancellation of the first order was refused for good, with its reason.
    assert!(
        stdout.lines().any(|l| l.trim().starts_with("refused")
            && l.contains(":cancel-again")
            && l.contains("is already cancelled")),
        "{stdout}"
    );

    let reader = CosmosConnection::connect(server.endpoint(), None)
        .await
        .unwrap();
    let container = reader.container("shop", "orders").await.unwrap();
    for order_id in orders {
        let key = || cosmos::partition_key(&[Value::from(order_id)]).unwrap();
        let message_id = format!("{order_id}:create");
        let marker_id = chatter_runtime::cosmos::inbox_id(&message_id).unwrap();
        let marker = cosmos::read_item(&container, key(), &marker_id)
            .await
            .unwrap()
            .into_document()
            .unwrap();
        assert_eq!(
            wire_keys(&marker),
            keys_then(&INBOX_MARKER_WIRE_KEYS, &["orderId"])
        );
        assert_eq!(marker["MessageId"], message_id.as_str());

        let event_id = format!("{message_id}:OrderCreated");
        let outbox_id = chatter_runtime::cosmos::outbox_id(&event_id).unwrap();
        let outbox = cosmos::read_item(&container, key(), &outbox_id)
            .await
            .unwrap()
            .into_document()
            .unwrap();
        // Section 0.2 in order, then the `ttl` the relay's delivered stamp added (0.6).
        assert_eq!(
            wire_keys(&outbox),
            keys_then(&OUTBOX_WIRE_KEYS, &["orderId", "ttl"])
        );
        assert_eq!(outbox["_chatterType"], "outbox");
        assert_eq!(outbox["status"], "delivered");
        assert_eq!(outbox["ttl"], 86400);
        assert_eq!(outbox["Destination"], "order-events");
        assert_eq!(outbox["MessageContentType"], "application/json");
        assert!(
            outbox["MessageContext"].is_string(),
            "MessageContext is a JSON string"
        );
        let body: Value = serde_json::from_str(outbox["MessageBody"].as_str().unwrap()).unwrap();
        assert_eq!(body["orderId"], order_id);
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn serve_mode_shuts_down_on_sigterm_and_releases_its_leases() {
    use std::io::{BufRead, BufReader};
    use std::process::Stdio;

    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let server = chatter_emulator::EmulatorServer::from_listener(listener)
        .unwrap()
        .spawn();
    let endpoint = server.endpoint().to_owned();
    let mut child = Command::new(env!("CARGO_BIN_EXE_shop"))
        .arg("--serve")
        .env("CHATTER_COSMOS_ENDPOINT", &endpoint)
        .env_remove("CHATTER_COSMOS_KEY")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    // Keep reading to the end: a closed pipe would make the example's later `println!` fail.
    let stdout = child.stdout.take().unwrap();
    let (serving_tx, serving_rx) = tokio::sync::oneshot::channel();
    std::thread::spawn(move || {
        let mut serving_tx = Some(serving_tx);
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if line.starts_with("serving until")
                && let Some(tx) = serving_tx.take()
            {
                let _ = tx.send(());
            }
        }
    });
    if tokio::time::timeout(std::time::Duration::from_secs(120), serving_rx)
        .await
        .map_or(true, |r| r.is_err())
    {
        let _ = child.kill();
        panic!("shop --serve never reached its serving state");
    }

    // While it serves, its relay owns the leases of shop/orders.
    let reader = CosmosConnection::connect(&endpoint, None).await.unwrap();
    let leases = reader.container("shop", "orders-leases").await.unwrap();
    let owned = cosmos_change_feed::read_leases(&leases, &processor_name(&reader))
        .await
        .unwrap();
    assert!(
        owned.iter().any(|l| l.owner.is_some()),
        "the serving relay owns leases"
    );

    let status = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    let exit = tokio::task::spawn_blocking(move || child.wait())
        .await
        .unwrap()
        .unwrap();
    assert!(exit.success(), "graceful shutdown exits 0, got {exit}");

    let after = cosmos_change_feed::read_leases(&leases, &processor_name(&reader))
        .await
        .unwrap();
    assert!(!after.is_empty());
    assert!(
        after.iter().all(|l| l.owner.is_none()),
        "every lease released: {after:?}"
    );
}

/// The processor name the shop's relay uses over this store (ground truth: endpoint + containers).
fn processor_name(reader: &CosmosConnection) -> String {
    chatter_runtime::testing::SourceIdentity::GroundTruth {
        monitored_endpoint: reader.endpoint().to_owned(),
        monitored_database: "shop".into(),
        monitored_container: "orders".into(),
        lease_endpoint: reader.endpoint().to_owned(),
        lease_database: "shop".into(),
        lease_container: "orders-leases".into(),
    }
    .processor_name()
}
