//! The shop example as a separate process against `chatter-emulator`: this process then reads
//! what the example wrote with its own, independent SDK client and finds the section-0 shapes.

use std::process::Command;

use chatter_runtime::cosmos::{self, CosmosConnection};
use serde_json::Value;

fn user_keys(doc: &Value) -> Vec<&str> {
    // Cosmos adds `_rid`, `_self`, `_etag`, `_attachments`, `_ts`; chatter's own `_chatterType` stays.
    doc.as_object()
        .unwrap()
        .keys()
        .map(String::as_str)
        .filter(|k| !matches!(*k, "_rid" | "_self" | "_etag" | "_attachments" | "_ts"))
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_second_process_reads_the_examples_documents_in_the_exact_shapes() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let server = chatter_emulator::EmulatorServer::from_listener(listener)
        .unwrap()
        .spawn();
    let endpoint = server.endpoint().to_owned();

    let exe = env!("CARGO_BIN_EXE_shop");
    let output = tokio::task::spawn_blocking(move || {
        Command::new(exe)
            .env("CHATTER_COSMOS_ENDPOINT", &endpoint)
            .env_remove("CHATTER_COSMOS_KEY")
            .output()
    })
    .await
    .unwrap()
    .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "shop failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );

    // The order ids the example printed, e.g. "  stored order  order-1a2b3c4d-1".
    let orders: Vec<&str> = stdout
        .lines()
        .filter_map(|l| l.trim().strip_prefix("stored order"))
        .map(str::trim)
        .collect();
    assert_eq!(orders.len(), 2, "{stdout}");

    let reader = CosmosConnection::connect(server.endpoint(), None)
        .await
        .unwrap();
    let container = reader.container("shop", "orders").await.unwrap();
    for order_id in orders {
        let key = || cosmos::partition_key(&[Value::from(order_id)]).unwrap();
        let message_id = format!("{order_id}:create");
        let marker_id = chatter_runtime::document::inbox_id(&message_id).unwrap();
        let marker = cosmos::read_item(&container, key(), &marker_id)
            .await
            .unwrap()
            .into_document()
            .unwrap();
        assert_eq!(
            user_keys(&marker),
            [
                "id",
                "_chatterType",
                "MessageId",
                "ReceivedAtUtc",
                "orderId"
            ]
        );
        assert_eq!(marker["MessageId"], message_id.as_str());

        let event_id = format!("{message_id}:OrderCreated");
        let outbox_id = chatter_runtime::document::outbox_id(&event_id).unwrap();
        let outbox = cosmos::read_item(&container, key(), &outbox_id)
            .await
            .unwrap()
            .into_document()
            .unwrap();
        // Section 0.2 in order, then the `ttl` the relay's delivered stamp added (0.6).
        assert_eq!(
            user_keys(&outbox),
            [
                "id",
                "_chatterType",
                "status",
                "MessageId",
                "Destination",
                "MessageBody",
                "MessageContentType",
                "MessageContext",
                "orderId",
                "ttl"
            ]
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
