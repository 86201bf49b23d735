//! Cosmos access layer against real emulators: the SDK's in-memory emulator in process
//! (`CosmosConnection::embedded`) and the same emulator served over HTTP by `chatter-emulator`.

use std::sync::Arc;

use chatter_runtime::cosmos::{
    ContainerClient, CosmosConnection, CosmosStoreError, ReadOutcome, partition_key, read_item,
};
use chatter_runtime::provision::{ensure_container, ensure_lease_container};
use chatter_runtime::testing::{
    BatchOperation, create_item, execute_batch, patch_item, read_container_properties, upsert_item,
};
use chatter_tests::store::{embedded, provisioned};
use serde_json::{Value, json};

/// `shop/orders` (partitioned by `/orderId`) in a fresh embedded store.
async fn shop_orders() -> Arc<ContainerClient> {
    provisioned(&embedded().await, "shop", "orders", &["/orderId"]).await
}

fn pk(value: &str) -> chatter_runtime::cosmos::PartitionKey {
    partition_key(&[json!(value)]).unwrap()
}

/// Creates `doc` under the partition-key value `o1`.
async fn create_in_o1(orders: &ContainerClient, doc: Value) {
    create_item(orders, pk("o1"), &doc).await.unwrap();
}

/// Asserts that reading `id` under the partition-key value `key` finds nothing.
async fn assert_not_found(orders: &ContainerClient, key: &str, id: &str) {
    assert_eq!(
        read_item(orders, pk(key), id).await.unwrap(),
        ReadOutcome::NotFound,
        "{id} under {key} is not found"
    );
}

#[tokio::test]
async fn container_cache_returns_the_same_handle_and_derives_once_per_pair() {
    let conn = embedded().await;
    ensure_container(&conn, "shop", "orders", &["/orderId"])
        .await
        .unwrap();
    ensure_container(&conn, "fin", "ledger", &["/account"])
        .await
        .unwrap();
    let before = conn.container_derivations();

    let first = conn.container("shop", "orders").await.unwrap();
    let second = conn.container("shop", "orders").await.unwrap();
    assert!(Arc::ptr_eq(&first, &second), "the cached handle is reused");
    assert_eq!(conn.container_derivations() - before, 1);

    // A clone shares the cache.
    let third = conn.clone().container("shop", "orders").await.unwrap();
    assert!(Arc::ptr_eq(&first, &third));
    assert_eq!(conn.container_derivations() - before, 1);

    let other = conn.container("fin", "ledger").await.unwrap();
    assert!(
        !Arc::ptr_eq(&first, &other),
        "distinct pairs, distinct handles"
    );
    assert_eq!(conn.container_derivations() - before, 2);
}

#[tokio::test]
async fn container_cache_keys_on_the_pair_not_a_joined_string() {
    let conn = embedded().await;
    ensure_container(&conn, "ab", "c", &["/pk"]).await.unwrap();
    ensure_container(&conn, "a", "bc", &["/pk"]).await.unwrap();
    let one = conn.container("ab", "c").await.unwrap();
    let two = conn.container("a", "bc").await.unwrap();
    assert!(!Arc::ptr_eq(&one, &two));
}

#[tokio::test]
async fn container_never_provisions_a_missing_container() {
    let conn = embedded().await;
    ensure_container(&conn, "shop", "orders", &["/orderId"])
        .await
        .unwrap();

    assert_missing(&conn, "shop", "missing").await;
    // Still missing: nothing was created, and the failure was not cached.
    assert_missing(&conn, "shop", "missing").await;
    assert_missing(&conn, "nodb", "orders").await;
}

/// Asserts that deriving the handle of `database/container` fails with 404.
async fn assert_missing(conn: &CosmosConnection, database: &str, container: &str) {
    let err = conn
        .container(database, container)
        .await
        .err()
        .expect("missing");
    assert_eq!(err.status(), Some(404), "{err}");
}

#[tokio::test]
async fn provisioning_is_idempotent_and_sets_default_ttl_and_partition_key_paths() {
    let conn = embedded().await;
    for _ in 0..2 {
        ensure_container(&conn, "shop", "orders", &["/orderId"])
            .await
            .unwrap();
        ensure_lease_container(&conn, "shop", "orders-leases")
            .await
            .unwrap();
        ensure_container(&conn, "shop", "tenants", &["/tenantId", "/userId"])
            .await
            .unwrap();
    }

    let orders = conn.container("shop", "orders").await.unwrap();
    let settings = read_container_properties(&orders).await.unwrap();
    assert_eq!(settings.default_ttl, Some(-1));
    assert_eq!(settings.partition_key_paths, vec!["/orderId"]);

    let leases = conn.container("shop", "orders-leases").await.unwrap();
    let settings = read_container_properties(&leases).await.unwrap();
    assert_eq!(settings.default_ttl, Some(-1));
    assert_eq!(settings.partition_key_paths, vec!["/id"]);

    let tenants = conn.container("shop", "tenants").await.unwrap();
    let settings = read_container_properties(&tenants).await.unwrap();
    assert_eq!(settings.default_ttl, Some(-1));
    assert_eq!(settings.partition_key_paths, vec!["/tenantId", "/userId"]);
}

#[tokio::test]
async fn provisioning_an_existing_container_with_other_partition_key_paths_fails() {
    let conn = embedded().await;
    ensure_container(&conn, "shop", "orders", &["/orderId"])
        .await
        .unwrap();
    let err = ensure_container(&conn, "shop", "orders", &["/customerId"])
        .await
        .unwrap_err();
    assert!(
        matches!(err, CosmosStoreError::PartitionKeyPathsMismatch { .. }),
        "{err}"
    );
}

#[tokio::test]
async fn a_committed_batch_reports_200_and_per_operation_success_codes() {
    let orders = shop_orders().await;
    create_in_o1(&orders, json!({"id": "old", "orderId": "o1", "n": 0})).await;

    let outcome = execute_batch(
        &orders,
        pk("o1"),
        vec![
            BatchOperation::Create(json!({"id": "a", "orderId": "o1"})),
            BatchOperation::Upsert(json!({"id": "b", "orderId": "o1"})),
            BatchOperation::Replace {
                id: "old".into(),
                doc: json!({"id": "old", "orderId": "o1", "n": 1}),
                if_match: None,
            },
            BatchOperation::Delete {
                id: "a".into(),
                if_match: None,
            },
        ],
    )
    .await
    .unwrap();
    assert!(outcome.is_success(), "{outcome:?}");
    assert_eq!(outcome.status, 200);
    assert_eq!(outcome.status_codes(), vec![201, 201, 200, 204]);

    let replaced = read_item(&orders, pk("o1"), "old").await.unwrap();
    assert_eq!(replaced.into_document().unwrap()["n"], json!(1));
    assert_not_found(&orders, "o1", "a").await;
}

#[tokio::test]
async fn a_batch_with_a_duplicate_create_reports_409_on_that_operation_and_rolls_back() {
    let orders = shop_orders().await;
    create_in_o1(&orders, json!({"id": "dup", "orderId": "o1"})).await;

    let outcome = execute_batch(
        &orders,
        pk("o1"),
        vec![
            BatchOperation::Create(json!({"id": "before", "orderId": "o1"})),
            BatchOperation::Create(json!({"id": "dup", "orderId": "o1", "second": true})),
            BatchOperation::Upsert(json!({"id": "after", "orderId": "o1"})),
        ],
    )
    .await
    .expect("a failed batch the service answered is Ok");
    assert!(!outcome.is_success());
    assert_eq!(outcome.status, 207, "{outcome:?}");
    assert_eq!(outcome.status_codes(), vec![424, 409, 424]);
    assert_eq!(
        outcome.failed_operation().map(|(i, op)| (i, op.status)),
        Some((1, 409))
    );

    // Atomic: neither the operation before nor the one after the conflict was applied.
    for id in ["before", "after"] {
        assert_not_found(&orders, "o1", id).await;
    }
    let existing = read_item(&orders, pk("o1"), "dup").await.unwrap();
    assert!(existing.into_document().unwrap().get("second").is_none());

    // Conflict first: [409, 424, 424].
    let outcome = execute_batch(
        &orders,
        pk("o1"),
        vec![
            BatchOperation::Create(json!({"id": "dup", "orderId": "o1"})),
            BatchOperation::Create(json!({"id": "x", "orderId": "o1"})),
            BatchOperation::Create(json!({"id": "y", "orderId": "o1"})),
        ],
    )
    .await
    .unwrap();
    assert_eq!(outcome.status, 207);
    assert_eq!(outcome.status_codes(), vec![409, 424, 424]);
}

#[tokio::test]
async fn read_item_reports_404_for_a_missing_document_and_200_with_the_raw_document() {
    let orders = shop_orders().await;

    let missing = read_item(&orders, pk("o1"), "nope").await.unwrap();
    assert_eq!(missing, ReadOutcome::NotFound);
    assert_eq!(missing.status(), 404);

    upsert_item(
        &orders,
        pk("o1"),
        &json!({"id": "d", "orderId": "o1", "MessageBody": "{\"a\":1}"}),
    )
    .await
    .unwrap();
    let found = read_item(&orders, pk("o1"), "d").await.unwrap();
    assert_eq!(found.status(), 200);
    let ReadOutcome::Found { document, etag } = found else {
        unreachable!()
    };
    assert!(etag.is_some());
    assert_eq!(document["MessageBody"], json!("{\"a\":1}"));
    assert!(
        document["_ts"].is_i64(),
        "system properties come back: {document}"
    );

    // Same id, other partition: 404.
    assert_not_found(&orders, "o2", "d").await;
}

#[tokio::test]
async fn patch_sets_status_and_ttl_in_one_request() {
    let orders = shop_orders().await;
    create_in_o1(
        &orders,
        json!({"id": "outbox:bXNnLTE", "orderId": "o1", "status": "pending"}),
    )
    .await;

    let outcome = patch_item(
        &orders,
        pk("o1"),
        "outbox:bXNnLTE",
        &[("/status", json!("delivered")), ("/ttl", json!(86400))],
    )
    .await
    .unwrap();
    assert_eq!(outcome.status, 200);

    let doc = read_item(&orders, pk("o1"), "outbox:bXNnLTE")
        .await
        .unwrap()
        .into_document()
        .unwrap();
    assert_eq!(doc["status"], json!("delivered"));
    assert_eq!(doc["ttl"], json!(86400));
    // Server-side PATCH: no client-side read-modify-write tracking property was added.
    let keys: Vec<&String> = doc.as_object().unwrap().keys().collect();
    assert!(
        keys.iter().all(|k| !k.starts_with("_azsdk")),
        "unexpected tracking property in {keys:?}"
    );

    let err = patch_item(&orders, pk("o1"), "missing", &[("/status", json!("x"))])
        .await
        .unwrap_err();
    assert_eq!(err.status(), Some(404), "{err}");
}

#[tokio::test]
async fn hierarchical_partition_keys_round_trip() {
    let conn = embedded().await;
    let tenants = provisioned(&conn, "shop", "tenants", &["/tenantId", "/userId"]).await;
    let key = || partition_key(&[json!("t1"), json!(42)]).unwrap();

    let outcome = execute_batch(
        &tenants,
        key(),
        vec![BatchOperation::Create(
            json!({"id": "doc", "tenantId": "t1", "userId": 42}),
        )],
    )
    .await
    .unwrap();
    assert!(outcome.is_success(), "{outcome:?}");

    let doc = read_item(&tenants, key(), "doc")
        .await
        .unwrap()
        .into_document()
        .unwrap();
    assert_eq!(doc["tenantId"], json!("t1"));
    assert_eq!(doc["userId"], json!(42));

    let other = partition_key(&[json!("t1"), json!("42")]).unwrap();
    assert_eq!(
        read_item(&tenants, other, "doc").await.unwrap(),
        ReadOutcome::NotFound,
        "JSON kind is part of the key"
    );
}

#[tokio::test]
async fn partition_key_rejects_arrays_and_objects() {
    let err = partition_key(&[json!(["a"])]).unwrap_err();
    assert!(err.to_string().contains("array"), "{err}");
    let err = partition_key(&[json!("a"), json!({"b": 1})]).unwrap_err();
    assert!(err.to_string().contains("object"), "{err}");
}

#[tokio::test]
async fn emulator_server_shares_documents_between_independent_connections() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let server = chatter_emulator::EmulatorServer::from_listener(listener)
        .unwrap()
        .spawn();
    assert_eq!(server.endpoint(), format!("http://127.0.0.1:{port}/"));

    let writer = CosmosConnection::connect(&format!("http://127.0.0.1:{port}"), None)
        .await
        .expect("connects with the emulator's well-known key");
    let orders = provisioned(&writer, "shop", "orders", &["/orderId"]).await;
    create_in_o1(&orders, json!({"id": "shared", "orderId": "o1", "v": 1})).await;

    // A second, independent client (own SDK pipeline, own caches) reads it back over HTTP,
    // dialling `localhost` rather than the advertised `127.0.0.1`.
    let reader = CosmosConnection::connect(&format!("http://localhost:{port}/"), None)
        .await
        .unwrap();
    let orders = reader.container("shop", "orders").await.unwrap();
    let doc: Value = read_item(&orders, pk("o1"), "shared")
        .await
        .unwrap()
        .into_document()
        .expect("the document written by the other connection");
    assert_eq!(doc["v"], json!(1));

    // Batches and patches go over the wire too.
    let outcome = execute_batch(
        &orders,
        pk("o1"),
        vec![
            BatchOperation::Create(json!({"id": "shared", "orderId": "o1"})),
            BatchOperation::Create(json!({"id": "new", "orderId": "o1"})),
        ],
    )
    .await
    .unwrap();
    assert_eq!(outcome.status_codes(), vec![409, 424]);
    patch_item(
        &orders,
        pk("o1"),
        "shared",
        &[("/status", json!("delivered"))],
    )
    .await
    .unwrap();
    let settings = read_container_properties(&orders).await.unwrap();
    assert_eq!(settings.default_ttl, Some(-1));
}
