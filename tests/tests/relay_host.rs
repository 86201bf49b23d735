//! The pipeline-integrated relay in a started runtime (catalog 3.122, 4.2): the contract is
//! verified for every monitored container before any processor is built, and a started relay
//! publishes each genuine pending Outbox Document once and never touches anything else.

use std::collections::HashMap;
use std::time::Duration;

use chatter_runtime::broker::{Broker, InMemoryBroker};
use chatter_runtime::cosmos::{self, CosmosConnection};
use chatter_runtime::relay::RelayOptions;
use chatter_runtime::testing::Registry;
use chatter_runtime::testing::distinct_sources;
use chatter_runtime::{
    BoxError, DocumentReliable, HandlerContext, Outcome, Runtime, error::StartError, handler,
};
use chatter_tests::store::{document, embedded, provisioned_with_leases};
use chatter_tests::wait::eventually;
use cosmos_change_feed::read_leases;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

/// Places an order and emits `OrderCreated`.
#[derive(Serialize, Deserialize, DocumentReliable)]
#[cosmos(database = "shop", container = "orders", lease = "orders-leases")]
#[partition_key(path = "/orderId")]
#[serde(rename_all = "camelCase")]
pub struct CreateOrder {
    pub order_id: String,
}

#[handler]
async fn create_order(command: CreateOrder, ctx: &mut HandlerContext) -> Result<(), BoxError> {
    ctx.upsert(json!({ "id": command.order_id, "orderId": command.order_id, "status": "placed" }))?;
    ctx.send_json(
        &format!("{}:created", ctx.message_id()),
        "order-events",
        &json!({ "orderId": command.order_id }),
    )?;
    Ok(())
}

/// Dispatches `CreateOrder` for `order_id` as the message `message_id`.
async fn create_order_as(runtime: &Runtime, order_id: &str, message_id: &str) -> Outcome {
    runtime
        .dispatch(
            CreateOrder {
                order_id: order_id.to_owned(),
            },
            message_id,
        )
        .await
        .unwrap()
}

/// Posts a ledger entry; its container is the one the contract tests break.
#[derive(Serialize, Deserialize, DocumentReliable)]
#[cosmos(database = "finance", container = "ledger", lease = "ledger-leases")]
#[partition_key(path = "/tenantId")]
#[serde(rename_all = "camelCase")]
pub struct PostLedgerEntry {
    pub tenant_id: String,
}

#[handler]
async fn post(_command: PostLedgerEntry, _ctx: &mut HandlerContext) -> Result<(), BoxError> {
    Ok(())
}

fn fast() -> RelayOptions {
    RelayOptions::default()
        .poll_interval(Duration::from_millis(50))
        .lease_acquire_interval(Duration::from_millis(200))
        .lease_renew_interval(Duration::from_millis(500))
        .lease_expiry(Duration::from_secs(3))
}

async fn store(ledger_path: &str) -> CosmosConnection {
    let cosmos = embedded().await;
    provisioned_with_leases(&cosmos, "shop", "orders", &["/orderId"], "orders-leases").await;
    provisioned_with_leases(
        &cosmos,
        "finance",
        "ledger",
        &[ledger_path],
        "ledger-leases",
    )
    .await;
    cosmos
}

#[tokio::test]
async fn a_contract_violation_fails_the_start_before_any_processor_is_built() {
    // R4.30/R4.32: the ledger container is partitioned by /accountId, not the declared /tenantId;
    // the valid orders container gets no processor either.
    let cosmos = store("/accountId").await;
    let err = Runtime::builder()
        .cosmos(cosmos.clone())
        .relay_options(fast())
        .start()
        .await
        .unwrap_err();
    assert!(matches!(err, StartError::Relay(_)), "{err}");
    let message = err.to_string();
    assert!(
        message.contains("/tenantId")
            && message.contains("/accountId")
            && message.contains("'ledger'"),
        "{message}"
    );
    for (database, lease) in [("shop", "orders-leases"), ("finance", "ledger-leases")] {
        let leases = cosmos.container(database, lease).await.unwrap();
        for source in distinct_sources(&Registry::from_inventory().unwrap(), cosmos.endpoint()) {
            assert!(
                read_leases(&leases, &source.processor_name)
                    .await
                    .unwrap()
                    .is_empty(),
                "no lease was created"
            );
        }
    }
}

// R3.60-R3.64 at registration: invalid delivery settings fail the start, with the catalog's
// texts, before any lease is created.
#[tokio::test]
async fn invalid_delivery_settings_fail_the_start_with_the_specified_texts() {
    let cosmos = store("/tenantId").await;
    for (status, ttl, text) in [
        (
            "",
            86_400,
            "A delivered status value is required and cannot be empty.",
        ),
        (
            "pending",
            86_400,
            "cannot equal the pending status 'pending'",
        ),
        (
            "undeliverable",
            86_400,
            "cannot equal the undeliverable status 'undeliverable'",
        ),
        (
            "delivered",
            0,
            "The delivered TTL must be a positive number of seconds (got 0)",
        ),
    ] {
        let options = fast().delivered_status(status).delivered_ttl_seconds(ttl);
        let err = Runtime::builder()
            .cosmos(cosmos.clone())
            .relay_options(options)
            .start()
            .await
            .unwrap_err();
        assert!(err.to_string().contains(text), "{err}");
    }
    let leases = cosmos.container("shop", "orders-leases").await.unwrap();
    for source in distinct_sources(&Registry::from_inventory().unwrap(), cosmos.endpoint()) {
        let created = read_leases(&leases, &source.processor_name).await.unwrap();
        assert!(created.is_empty(), "no lease was created");
    }
}

#[tokio::test]
async fn an_empty_registry_starts_and_stops_with_no_relay_work() {
    // R4.33.
    let cosmos = CosmosConnection::embedded().await.unwrap();
    let runtime = Runtime::builder()
        .cosmos(cosmos)
        .registry(Registry::build([], []).unwrap())
        .start()
        .await
        .unwrap();
    assert!(runtime.relay_leases().await.is_empty());
    runtime.shutdown().await;
}

#[tokio::test]
async fn the_relay_publishes_each_pending_document_once_and_never_touches_other_documents() {
    let cosmos = store("/tenantId").await;
    let orders = cosmos.container("shop", "orders").await.unwrap();
    // Controls seeded before start (R3.122): a domain document and an already-delivered outbox
    // document; neither may be published or changed.
    let key = || cosmos::partition_key(&[json!("control")]).unwrap();
    let domain = json!({ "id": "control-order", "orderId": "control", "_chatterType": "order", "status": "pending" });
    let delivered = json!({
        "id": chatter_runtime::cosmos::outbox_id("old").unwrap(), "_chatterType": "outbox", "status": "delivered",
        "MessageId": "old", "Destination": "order-events", "MessageBody": "{}", "MessageContentType": "application/json",
        "MessageContext": "{}", "orderId": "control",
    });
    for doc in [&domain, &delivered] {
        chatter_runtime::testing::create_item(&orders, key(), doc)
            .await
            .unwrap();
    }
    let seeded: HashMap<String, Value> =
        futures::future::join_all([&domain, &delivered].map(|d| {
            let orders = orders.clone();
            let id = d["id"].as_str().unwrap().to_owned();
            async move {
                let doc = document(&orders, &[json!("control")], &id).await;
                (id, doc)
            }
        }))
        .await
        .into_iter()
        .collect();

    let broker = InMemoryBroker::new();
    let mut events = broker.subscribe("order-events").await.unwrap();
    let runtime = Runtime::builder()
        .cosmos(cosmos.clone())
        .broker(broker.clone())
        .relay_options(fast())
        .start()
        .await
        .unwrap();
    for i in 0..5 {
        create_order_as(&runtime, &format!("o-{i}"), &format!("m-{i}")).await;
    }
    let mut seen = Vec::new();
    while seen.len() < 5 {
        let delivery = tokio::time::timeout(Duration::from_secs(30), events.next())
            .await
            .expect("published")
            .unwrap()
            .unwrap();
        seen.push(delivery.message.message_id.clone());
        delivery.ack().await.unwrap();
    }
    seen.sort();
    assert_eq!(
        seen,
        (0..5).map(|i| format!("m-{i}:created")).collect::<Vec<_>>()
    );
    // Every outbox document ends delivered with a positive ttl.
    for i in 0..5 {
        let id = chatter_runtime::cosmos::outbox_id(&format!("m-{i}:created")).unwrap();
        let key = [json!(format!("o-{i}"))];
        eventually(
            Duration::from_secs(30),
            Duration::from_millis(20),
            "the outbox document is stamped delivered",
            || async { document(&orders, &key, &id).await["status"] == "delivered" },
        )
        .await;
        let doc = document(&orders, &key, &id).await;
        assert_eq!(doc["ttl"], 86400);
    }
    // No republish within a settle window of many polls, and the controls are untouched.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(broker.published_count("order-events"), 5);
    for (id, before) in seeded {
        let now = document(&orders, &[json!("control")], &id).await;
        assert_eq!(now["_etag"], before["_etag"], "{id} untouched");
    }
    let leases = runtime.relay_leases().await;
    assert_eq!(leases.len(), 2, "one processor per distinct source");
    runtime.shutdown().await;
}

/// Issue 10's request cost: every batch's and every relay request's charge is summed per
/// runtime (the emulator's charges are nominal; the path from each response is what counts).
#[tokio::test]
async fn request_charges_are_summed_per_command_and_per_relayed_message() {
    let cosmos = store("/tenantId").await;
    let broker = InMemoryBroker::new();
    let runtime = Runtime::builder()
        .cosmos(cosmos.clone())
        .broker(broker.clone())
        .consume(false)
        .relay_options(fast())
        .start()
        .await
        .unwrap();
    assert_eq!(runtime.request_charges().commands, 0);
    assert_eq!(runtime.request_charges().per_command(), None);
    for n in 0..3 {
        create_order_as(&runtime, &format!("rc-{n}"), &format!("rc-{n}")).await;
    }
    eventually(
        Duration::from_secs(30),
        Duration::from_millis(20),
        "the three events are relayed and stamped",
        || async { runtime.request_charges().relayed_messages == 3 },
    )
    .await;
    assert_eq!(broker.published_count("order-events"), 3);
    let charges = runtime.request_charges();
    assert_eq!(charges.commands, 3);
    let per_command = charges.per_command().unwrap();
    assert!(per_command > 0.0, "{charges:?}");
    let per_message = charges.per_relayed_message().unwrap();
    assert!(per_message > 0.0, "{charges:?}");

    // A duplicate's rolled-back batch and its confirming read are a command's cost too.
    let outcome = create_order_as(&runtime, "rc-0", "rc-0").await;
    assert_eq!(outcome, chatter_runtime::Outcome::Duplicate);
    let after = runtime.request_charges();
    assert_eq!(after.commands, 4);
    assert!(after.command_request_units > charges.command_request_units);
    assert_eq!(after.relayed_messages, 3);
    runtime.shutdown().await;
}
