//! Microsoft Entra ID instead of an account key: `CosmosConnection::connect_with_credential`
//! sends the credential's token, never a key signature, as `chatter-emulator` (served over
//! HTTP) sees in each request's `Authorization` header. The credential is the test's own: it
//! hands out a known token and records the scopes it is asked for.

use std::sync::{Arc, Mutex};

use azure_core::credentials::{AccessToken, TokenCredential, TokenRequestOptions};
use chatter_runtime::cosmos::{CosmosConnection, CosmosStoreError, partition_key};
use chatter_runtime::provision;
use chatter_runtime::testing::upsert_item;
use chatter_tests::store::emulator_server;
use serde_json::{Value, json};
use time::OffsetDateTime;

/// Hands out one known token and records every request for one.
#[derive(Debug, Default)]
struct KnownToken {
    asked: Mutex<Vec<Vec<String>>>,
}

#[async_trait::async_trait]
impl TokenCredential for KnownToken {
    async fn get_token(
        &self,
        scopes: &[&str],
        _options: Option<TokenRequestOptions<'_>>,
    ) -> azure_core::Result<AccessToken> {
        self.asked
            .lock()
            .unwrap()
            .push(scopes.iter().map(|s| s.to_string()).collect());
        Ok(AccessToken::new(
            "known-test-token",
            OffsetDateTime::now_utc() + time::Duration::hours(1),
        ))
    }
}

/// Hands out no token, as a managed identity that is not there.
#[derive(Debug)]
struct NoToken;

#[async_trait::async_trait]
impl TokenCredential for NoToken {
    async fn get_token(
        &self,
        _scopes: &[&str],
        _options: Option<TokenRequestOptions<'_>>,
    ) -> azure_core::Result<AccessToken> {
        Err(azure_core::Error::with_message(
            azure_core::error::ErrorKind::Credential,
            "no managed identity on this machine",
        ))
    }
}

#[tokio::test]
async fn a_token_credential_reaches_the_store_as_an_entra_id_token_never_a_key_signature() {
    let (emulator, _keyed) = emulator_server().await;
    let credential = Arc::new(KnownToken::default());
    let keyed_before = emulator.authorization_count("master");
    let aad_before = emulator.authorization_count("aad");

    let cosmos = CosmosConnection::connect_with_credential(emulator.endpoint(), credential.clone())
        .await
        .unwrap();
    provision::ensure_container(&cosmos, "entra", "orders", &["/orderId"])
        .await
        .unwrap();
    let orders = cosmos.container("entra", "orders").await.unwrap();
    let doc = json!({ "id": "o-1", "orderId": "o-1" });
    upsert_item(&orders, partition_key(&[json!("o-1")]).unwrap(), &doc)
        .await
        .unwrap();
    let read: Option<Value> = cosmos
        .read("entra", "orders", &[json!("o-1")], "o-1")
        .await
        .unwrap();

    assert_eq!(read.unwrap()["orderId"], "o-1");
    assert!(
        emulator.authorization_count("aad") - aad_before >= 3,
        "the account read, the container, the write and the read carried the token"
    );
    assert_eq!(
        emulator.authorization_count("master"),
        keyed_before,
        "no request was signed with a key"
    );
    let asked = credential.asked.lock().unwrap().clone();
    assert!(!asked.is_empty(), "the credential was asked for a token");
    assert!(
        asked
            .iter()
            .all(|scopes| scopes == &["https://cosmos.azure.com/.default"]),
        "{asked:?}"
    );
}

#[tokio::test]
async fn a_credential_that_hands_out_no_token_fails_the_connect_saying_so() {
    let (emulator, _keyed) = emulator_server().await;

    let error = CosmosConnection::connect_with_credential(emulator.endpoint(), Arc::new(NoToken))
        .await
        .unwrap_err();

    assert!(matches!(error, CosmosStoreError::NoToken { .. }), "{error}");
    assert!(error.to_string().contains(emulator.endpoint()), "{error}");
    assert!(error.to_string().contains("CHATTER_COSMOS_KEY"), "{error}");
    // The credential's own reason is in the chain.
    let chain = chatter_runtime::error::ErrorChain(&error).to_string();
    assert!(
        chain.contains("no managed identity on this machine"),
        "{chain}"
    );
}
