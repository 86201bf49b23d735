//! The Document-Tier Batch-Lifecycle Behavior against the SDK's in-memory emulator (catalog areas
//! 1.4-1.5 and 2): one TransactionalBatch per command with the inbox marker as op 0, executed once,
//! duplicates confirmed by point-read.

use std::sync::atomic::{AtomicUsize, Ordering};

use chatter_runtime::BrokeredMessage;
use chatter_runtime::cosmos::{self, CosmosConnection};
use chatter_runtime::provision;
use chatter_runtime::{
    BoxError, DocumentReliable, HandlerContext, Runtime, error::DispatchError, error::ErrorChain,
    handler,
};
use chatter_runtime::{Outcome, error::PipelineError};
use chatter_tests::store::{
    INBOX_MARKER_WIRE_KEYS, OUTBOX_WIRE_KEYS, document, find_document, keys_then, wire_keys,
};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

/// Places an order: writes the order and sends `OrderCreated` through the outbox.
#[derive(Debug, Clone, Serialize, Deserialize, DocumentReliable)]
#[cosmos(database = "shop", container = "orders", lease = "orders-leases")]
#[partition_key(path = "/orderId")]
#[serde(rename_all = "camelCase")]
pub struct CreateOrder {
    pub order_id: String,
    pub quantity: u32,
    /// What the handler should do: "ok", "fail", "reserved-id", "wrong-partition", "too-many",
    /// "blank-destination", "no-content-type".
    pub behaviour: String,
}

static CREATE_ORDER_RUNS: AtomicUsize = AtomicUsize::new(0);

#[handler]
async fn create_order(command: CreateOrder, ctx: &mut HandlerContext) -> Result<(), BoxError> {
    CREATE_ORDER_RUNS.fetch_add(1, Ordering::SeqCst);
    match command.behaviour.as_str() {
        "reserved-id" => {
            ctx.create(json!({ "id": "inbox:forged", "orderId": command.order_id }))?
        }
        "wrong-partition" => ctx.create(json!({ "id": "order", "orderId": "another-order" }))?,
        "too-many" => {
            for i in 0..200 {
                ctx.create(json!({ "id": format!("line-{i}"), "orderId": command.order_id }))?;
            }
        }
        _ => {}
    }
    ctx.upsert(json!({ "id": command.order_id, "orderId": command.order_id, "quantity": command.quantity }))?;
    match command.behaviour.as_str() {
        "blank-destination" => ctx.send(BrokeredMessage::json("poison", "   ", "{}"))?,
        "no-content-type" => {
            let mut message = BrokeredMessage::json("poison", "order-events", "{}");
            message.content_type = String::new();
            ctx.send(message)?;
        }
        _ => {}
    }
    ctx.send(BrokeredMessage {
        message_id: format!("{}-created", ctx.message_id()),
        destination: "order-events".into(),
        body: json!({ "orderId": command.order_id }).to_string(),
        content_type: "application/json".into(),
        context: serde_json::Map::from_iter([("custom-header".to_owned(), json!("value"))]),
    })?;
    if command.behaviour == "fail" {
        return Err("the handler failed after staging".into());
    }
    Ok(())
}

/// Posts to a ledger partitioned hierarchically; its handler stages nothing (marker-only batch).
#[derive(Debug, Clone, Serialize, Deserialize, DocumentReliable)]
#[cosmos(database = "finance", container = "ledger", lease = "ledger-leases")]
#[partition_key(path = "/tenant/id", path = "/region")]
pub struct PostLedgerEntry {
    pub tenant: Tenant,
    pub region: String,
}

/// The tenant of a ledger entry.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Tenant {
    pub id: String,
}

#[handler]
async fn post_ledger_entry(
    _command: PostLedgerEntry,
    _ctx: &mut HandlerContext,
) -> Result<(), BoxError> {
    Ok(())
}

/// A command whose partition key may be absent: then it passes through without a batch.
#[derive(Debug, Clone, Serialize, Deserialize, DocumentReliable)]
#[cosmos(database = "shop", container = "carts", lease = "carts-leases")]
#[partition_key(path = "/cartId")]
#[serde(rename_all = "camelCase")]
pub struct TouchCart {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cart_id: Option<String>,
}

static TOUCH_CART_STAGE_ERROR: std::sync::Mutex<Option<String>> = std::sync::Mutex::new(None);

#[handler]
async fn touch_cart(_command: TouchCart, ctx: &mut HandlerContext) -> Result<(), BoxError> {
    let err = ctx.upsert(json!({ "id": "x", "cartId": "c" })).unwrap_err();
    *TOUCH_CART_STAGE_ERROR.lock().unwrap() = Some(err.to_string());
    Ok(())
}

/// A command whose partition-key value is an array, which Cosmos cannot take as a key.
#[derive(Debug, Clone, Serialize, Deserialize, DocumentReliable)]
#[cosmos(database = "shop", container = "tags", lease = "tags-leases")]
#[partition_key(path = "/tags")]
pub struct TagOrder {
    pub tags: Vec<String>,
}

static TAG_ORDER_RUNS: AtomicUsize = AtomicUsize::new(0);

#[handler]
async fn tag_order(_command: TagOrder, _ctx: &mut HandlerContext) -> Result<(), BoxError> {
    TAG_ORDER_RUNS.fetch_add(1, Ordering::SeqCst);
    Ok(())
}

async fn runtime() -> (Runtime, CosmosConnection) {
    let cosmos = CosmosConnection::embedded().await.unwrap();
    provision::ensure_container(&cosmos, "shop", "orders", &["/orderId"])
        .await
        .unwrap();
    provision::ensure_container(&cosmos, "shop", "tags", &["/tags"])
        .await
        .unwrap();
    provision::ensure_container(&cosmos, "shop", "carts", &["/cartId"])
        .await
        .unwrap();
    provision::ensure_container(&cosmos, "finance", "ledger", &["/tenant/id", "/region"])
        .await
        .unwrap();
    let runtime = Runtime::builder()
        .cosmos(cosmos.clone())
        .without_relay()
        .start()
        .await
        .unwrap();
    (runtime, cosmos)
}

fn order(id: &str, behaviour: &str) -> CreateOrder {
    CreateOrder {
        order_id: id.into(),
        quantity: 2,
        behaviour: behaviour.into(),
    }
}

async fn read(cosmos: &CosmosConnection, container: &str, pk: Value, id: &str) -> Option<Value> {
    let c = cosmos.container("shop", container).await.unwrap();
    find_document(&c, &[pk], id).await
}

#[tokio::test]
async fn participant_commits_marker_writes_and_outbox_in_one_batch() {
    let (runtime, cosmos) = runtime().await;
    let outcome = runtime.dispatch(order("o-1", "ok"), "msg-1").await.unwrap();
    // R2.01/R2.07: op 0 marker + the handler's upsert + one outbox document.
    assert_eq!(outcome, Outcome::Committed { operations: 3 });

    // R2.02/R2.03: the marker's exact shape, no status/ttl/Completed.
    let marker = read(&cosmos, "orders", json!("o-1"), "inbox:bXNnLTE")
        .await
        .expect("marker committed");
    assert_eq!(
        wire_keys(&marker),
        keys_then(&INBOX_MARKER_WIRE_KEYS, &["orderId"])
    );
    assert_eq!(marker["_chatterType"], "inbox");
    assert_eq!(marker["MessageId"], "msg-1");
    assert!(marker["ReceivedAtUtc"].as_str().unwrap().ends_with('Z'));

    let written = read(&cosmos, "orders", json!("o-1"), "o-1")
        .await
        .expect("handler write committed");
    assert_eq!(written["quantity"], 2);

    // R2.60-R2.64: the outbox document's exact shape, MessageContext a JSON string.
    let outbox_id = "outbox:bXNnLTEtY3JlYXRlZA";
    let outbox = read(&cosmos, "orders", json!("o-1"), outbox_id)
        .await
        .expect("outbox committed");
    assert_eq!(
        wire_keys(&outbox),
        keys_then(&OUTBOX_WIRE_KEYS, &["orderId"])
    );
    assert_eq!(outbox["status"], "pending");
    assert_eq!(outbox["MessageId"], "msg-1-created");
    assert_eq!(outbox["Destination"], "order-events");
    assert_eq!(outbox["MessageBody"], r#"{"orderId":"o-1"}"#);
    assert_eq!(outbox["MessageContext"], r#"{"custom-header":"value"}"#);
    assert!(outbox.get("partitionKey").is_none());
}

#[tokio::test]
async fn redelivered_duplicate_is_confirmed_by_point_read_and_commits_nothing_again() {
    let (runtime, cosmos) = runtime().await;
    assert!(matches!(
        runtime.dispatch(order("o-2", "ok"), "msg-2").await.unwrap(),
        Outcome::Committed { .. }
    ));
    let first = read(&cosmos, "orders", json!("o-2"), "o-2").await.unwrap();

    // The handler runs again (side effects outside the batch are at-least-once) ...
    let runs_before = CREATE_ORDER_RUNS.load(Ordering::SeqCst);
    let mut again = order("o-2", "ok");
    again.quantity = 99;
    assert_eq!(
        runtime.dispatch(again, "msg-2").await.unwrap(),
        Outcome::Duplicate
    );
    assert!(CREATE_ORDER_RUNS.load(Ordering::SeqCst) > runs_before);
    // ... but nothing it staged commits a second time (R2.15).
    let after = read(&cosmos, "orders", json!("o-2"), "o-2").await.unwrap();
    assert_eq!(after["quantity"], 2);
    assert_eq!(after["_etag"], first["_etag"]);
}

#[tokio::test]
async fn marker_only_batch_executes_and_its_duplicate_is_confirmed() {
    let (runtime, _cosmos) = runtime().await;
    let entry = PostLedgerEntry {
        tenant: Tenant { id: "acme".into() },
        region: "us-east".into(),
    };
    // R2.09/R2.21: a handler that stages nothing still commits its marker.
    assert_eq!(
        runtime.dispatch(entry.clone(), "ledger-1").await.unwrap(),
        Outcome::Committed { operations: 1 }
    );
    assert_eq!(
        runtime.dispatch(entry, "ledger-1").await.unwrap(),
        Outcome::Duplicate
    );
}

#[tokio::test]
async fn hierarchical_key_stamps_nested_marker_leaves() {
    let (runtime, cosmos) = runtime().await;
    let entry = PostLedgerEntry {
        tenant: Tenant { id: "acme".into() },
        region: "us-east".into(),
    };
    runtime.dispatch(entry, "ledger-2").await.unwrap();
    // R2.04: `tenant.id` = "acme", `region` = "us-east".
    let c = cosmos.container("finance", "ledger").await.unwrap();
    let marker = document(&c, &[json!("acme"), json!("us-east")], "inbox:bGVkZ2VyLTI").await;
    assert_eq!(marker["tenant"], json!({ "id": "acme" }));
    assert_eq!(marker["region"], "us-east");
}

#[tokio::test]
async fn a_forged_document_at_the_marker_id_is_not_a_duplicate() {
    let (runtime, cosmos) = runtime().await;
    let c = cosmos.container("shop", "orders").await.unwrap();
    let pk = cosmos::partition_key(&[json!("o-3")]).unwrap();
    // R2.16: an application document squatting on the marker id.
    chatter_runtime::testing::create_item(
        &c,
        pk,
        &json!({ "id": "inbox:bXNnLTM", "_chatterType": "order", "orderId": "o-3" }),
    )
    .await
    .unwrap();
    let err = runtime
        .dispatch(order("o-3", "ok"), "msg-3")
        .await
        .unwrap_err();
    let DispatchError::Pipeline(PipelineError::BatchFailed {
        operation_statuses, ..
    }) = &err
    else {
        panic!("expected a batch failure, got {err}");
    };
    assert_eq!(operation_statuses.first(), Some(&409), "{err}");
    assert!(
        read(&cosmos, "orders", json!("o-3"), "o-3").await.is_none(),
        "nothing committed"
    );
}

#[tokio::test]
async fn a_marker_of_another_message_id_is_not_a_duplicate() {
    let (runtime, cosmos) = runtime().await;
    let c = cosmos.container("shop", "orders").await.unwrap();
    let pk = cosmos::partition_key(&[json!("o-4")]).unwrap();
    // R2.17: a genuine-looking marker whose MessageId differs.
    let forged = json!({ "id": "inbox:bXNnLTQ", "_chatterType": "inbox", "MessageId": "msg-4-other", "orderId": "o-4" });
    chatter_runtime::testing::create_item(&c, pk, &forged)
        .await
        .unwrap();
    let err = runtime
        .dispatch(order("o-4", "ok"), "msg-4")
        .await
        .unwrap_err();
    assert!(
        matches!(
            err,
            DispatchError::Pipeline(PipelineError::BatchFailed { .. })
        ),
        "{err}"
    );
}

#[tokio::test]
async fn a_participant_without_message_id_fails_before_the_handler_runs() {
    let (runtime, cosmos) = runtime().await;
    for blank in ["", "   "] {
        let runs_before = CREATE_ORDER_RUNS.load(Ordering::SeqCst);
        let err = runtime
            .dispatch(order("o-5", "ok"), blank)
            .await
            .unwrap_err();
        // R2.05, verbatim text.
        assert_eq!(
            err.to_string(),
            "Document-tier reliability participant 'CreateOrder' requires a non-empty MessageId: the once-only guarantee cannot be honored without a message identity to dedup by."
        );
        assert_eq!(
            CREATE_ORDER_RUNS.load(Ordering::SeqCst),
            runs_before,
            "handler must not run"
        );
    }
    assert!(read(&cosmos, "orders", json!("o-5"), "o-5").await.is_none());
}

#[tokio::test]
async fn a_handler_error_commits_nothing() {
    let (runtime, cosmos) = runtime().await;
    let err = runtime
        .dispatch(order("o-6", "fail"), "msg-6")
        .await
        .unwrap_err();
    assert!(
        ErrorChain(&err)
            .to_string()
            .contains("the handler failed after staging"),
        "{err}"
    );
    assert!(read(&cosmos, "orders", json!("o-6"), "o-6").await.is_none());
    assert!(
        read(&cosmos, "orders", json!("o-6"), "inbox:bXNnLTY")
            .await
            .is_none()
    );
    // The same message id succeeds later: a failure left no marker behind.
    let ok = runtime.dispatch(order("o-6", "ok"), "msg-6").await.unwrap();
    assert!(matches!(ok, Outcome::Committed { .. }));
}

#[tokio::test]
async fn the_handle_rejects_reserved_ids_wrong_partitions_and_oversized_batches() {
    let (runtime, cosmos) = runtime().await;
    // R2.30: a reserved-prefix id through the public staging surface.
    let err = runtime
        .dispatch(order("o-7", "reserved-id"), "msg-7")
        .await
        .unwrap_err();
    let err = ErrorChain(&err).to_string();
    assert!(err.contains("Chatter-reserved id namespace"), "{err}");
    let err = runtime
        .dispatch(order("o-8", "wrong-partition"), "msg-8")
        .await
        .unwrap_err();
    let err = ErrorChain(&err).to_string();
    assert!(
        err.contains(
            "the document's partition-key value at [/orderId] is [\"another-order\"], but this \
             delivery's batch is for [\"o-8\"]: a TransactionalBatch writes one logical partition"
        ),
        "{err}"
    );
    let err = runtime
        .dispatch(order("o-9", "too-many"), "msg-9")
        .await
        .unwrap_err();
    let err = ErrorChain(&err).to_string();
    assert!(err.contains("at most 100 operations"), "{err}");
    for id in ["o-7", "o-8", "o-9"] {
        assert!(
            read(&cosmos, "orders", json!(id), id).await.is_none(),
            "{id} committed nothing"
        );
    }
}

// The document tier never writes an Outbox Document the relay would have to stamp undeliverable.
#[tokio::test]
async fn a_message_the_relay_could_never_publish_is_refused_at_staging_and_nothing_commits() {
    let (runtime, cosmos) = runtime().await;
    for (id, behaviour, violation) in [
        (
            "o-20",
            "blank-destination",
            "its 'Destination' is absent, not a JSON string, or blank",
        ),
        (
            "o-21",
            "no-content-type",
            "a content type is resolvable from neither",
        ),
    ] {
        let err = runtime
            .dispatch(order(id, behaviour), &format!("msg-{id}"))
            .await
            .unwrap_err();
        let err = ErrorChain(&err).to_string();
        assert!(err.contains("the message cannot be sent"), "{err}");
        assert!(err.contains(violation), "{err}");
        assert!(
            read(&cosmos, "orders", json!(id), id).await.is_none(),
            "{id} committed nothing"
        );
    }
}

#[tokio::test]
async fn an_unresolved_partition_key_passes_through_without_a_batch() {
    let (runtime, _cosmos) = runtime().await;
    // R1.51: no partition-key value, no batch; staging is refused (R2.66).
    let outcome = runtime
        .dispatch(TouchCart { cart_id: None }, "msg-10")
        .await
        .unwrap();
    assert_eq!(outcome, Outcome::HandledAtLeastOnce);
    let stage_error = TOUCH_CART_STAGE_ERROR.lock().unwrap().clone().unwrap();
    assert!(
        stage_error.contains("no Cosmos batch is active"),
        "{stage_error}"
    );
}

#[tokio::test]
async fn each_command_writes_to_its_own_container() {
    let (runtime, cosmos) = runtime().await;
    // R1.53: CreateOrder -> shop/orders, PostLedgerEntry -> finance/ledger.
    runtime
        .dispatch(order("o-11", "ok"), "msg-11")
        .await
        .unwrap();
    runtime
        .dispatch(
            PostLedgerEntry {
                tenant: Tenant { id: "t".into() },
                region: "r".into(),
            },
            "msg-11",
        )
        .await
        .unwrap();
    assert!(
        read(&cosmos, "orders", json!("o-11"), "inbox:bXNnLTEx")
            .await
            .is_some()
    );
    let ledger = cosmos.container("finance", "ledger").await.unwrap();
    assert!(
        find_document(&ledger, &[json!("t"), json!("r")], "inbox:bXNnLTEx")
            .await
            .is_some()
    );
}

#[tokio::test]
async fn a_partition_key_cosmos_cannot_take_fails_before_the_handler_runs() {
    let (runtime, _cosmos) = runtime().await;
    let err = runtime
        .dispatch(
            TagOrder {
                tags: vec!["a".into()],
            },
            "msg-12",
        )
        .await
        .unwrap_err();
    assert!(
        matches!(err, DispatchError::Pipeline(PipelineError::Cosmos { .. })),
        "{err}"
    );
    assert!(ErrorChain(&err).to_string().contains("array"), "{err}");
    assert_eq!(
        TAG_ORDER_RUNS.load(Ordering::SeqCst),
        0,
        "no handler side effect"
    );
}
