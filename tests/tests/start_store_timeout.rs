//! A store that stops answering fails `start()` within the store timeout, with an error that
//! says so, instead of hanging the process before it ever serves.

use std::time::Duration;

use chatter_runtime::error::RelayError;
use chatter_runtime::provision;
use chatter_runtime::{
    BoxError, DocumentReliable, HandlerContext, Runtime, error::ErrorChain, error::StartError,
    handler, relay::RelayOptions,
};
use chatter_tests::store::emulator_server;
use serde::{Deserialize, Serialize};

/// Any command: it only has to make `start()` check its containers.
#[derive(Debug, Serialize, Deserialize, DocumentReliable)]
#[cosmos(database = "shop", container = "ledger", lease = "ledger-leases")]
#[partition_key(path = "/account")]
pub struct PostEntry {
    pub account: String,
}

#[handler]
async fn post(_command: PostEntry, _ctx: &mut HandlerContext) -> Result<(), BoxError> {
    Ok(())
}

/// Starts a runtime against a store that answers 60 s late from now on, with a 500 ms store
/// timeout; `derived` says whether the containers' handles were derived (cached) before.
async fn start_against_a_silent_store(derived: bool) -> String {
    let (emulator, cosmos) = emulator_server().await;
    provision::ensure_container(&cosmos, "shop", "ledger", &["/account"])
        .await
        .unwrap();
    provision::ensure_lease_container(&cosmos, "shop", "ledger-leases")
        .await
        .unwrap();
    if derived {
        cosmos.container("shop", "ledger").await.unwrap();
        cosmos.container("shop", "ledger-leases").await.unwrap();
    }
    // From now on every answer of the store comes 60 s late (chatter-emulator's fault injection).
    emulator.faults().set_latency(Duration::from_secs(60));
    let start = Runtime::builder()
        .cosmos(cosmos)
        .relay_options(RelayOptions::default().store_timeout(Duration::from_millis(500)))
        .start();
    let started = tokio::time::timeout(Duration::from_secs(40), start)
        .await
        .expect("start() returns instead of waiting for the store");
    let error = started.expect_err("a store that does not answer fails the start");
    ErrorChain(&error).to_string()
}

#[tokio::test]
async fn a_container_handle_the_store_does_not_answer_fails_the_start_within_the_store_timeout() {
    let chain = start_against_a_silent_store(false).await;
    assert!(
        chain.contains("shop/ledger") && chain.contains("get_container timed out after 500ms"),
        "{chain}"
    );
}

#[tokio::test]
async fn a_contract_check_the_store_does_not_answer_fails_the_start_within_the_store_timeout() {
    let chain = start_against_a_silent_store(true).await;
    assert!(
        chain.contains("could not read the properties of monitored container 'ledger'")
            && chain.contains("read_container timed out after 500ms"),
        "{chain}"
    );
}

// Relay options that cannot work are refused before any container is checked with them: a zero
// store timeout is an invalid option, not a container that timed out.
#[tokio::test]
async fn relay_options_that_cannot_work_are_refused_before_any_container_is_checked() {
    let (_emulator, cosmos) = emulator_server().await;
    provision::ensure_container(&cosmos, "shop", "ledger", &["/account"])
        .await
        .unwrap();
    let refused = Runtime::builder()
        .cosmos(cosmos)
        .relay_options(RelayOptions::default().store_timeout(Duration::ZERO))
        .start()
        .await;
    assert!(
        matches!(
            refused,
            Err(StartError::Relay(RelayError::InvalidOptions(_)))
        ),
        "{refused:?}"
    );
}

// A page cancelled between a publish and its stamp publishes that message again: a page bound
// not above one publish and one stamp is refused, naming all three.
#[tokio::test]
async fn a_handler_timeout_not_above_publish_and_store_timeouts_is_refused() {
    let (_emulator, cosmos) = emulator_server().await;
    provision::ensure_container(&cosmos, "shop", "ledger", &["/account"])
        .await
        .unwrap();
    let second = Duration::from_secs(1);
    for handler_timeout in [second, 40 * second, 60 * second] {
        let refused = Runtime::builder()
            .cosmos(cosmos.clone())
            .relay_options(
                RelayOptions::default()
                    .publish_timeout(30 * second)
                    .store_timeout(30 * second)
                    .handler_timeout(handler_timeout),
            )
            .start()
            .await;
        let Err(error) = refused else {
            panic!("{handler_timeout:?} was accepted");
        };
        assert!(
            matches!(
                error,
                StartError::Relay(RelayError::HandlerTimeoutTooShort { .. })
            ),
            "{error:?}"
        );
        let chain = ErrorChain(&error).to_string();
        assert!(
            chain.contains(&format!(
                "`handler_timeout` ({handler_timeout:?}) must be greater than `publish_timeout` \
                 (30s) plus `store_timeout` (30s)"
            )),
            "{chain}"
        );
    }
}
