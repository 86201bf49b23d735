//! Drain Suspension state follows lease ownership: a suspended lease that leaves the instance is
//! forgotten (health and the suspended-leases figure show only owned leases), and when it comes
//! back and fails again its suspension is counted and logged again. Against a
//! `chatter-emulator` server that refuses every stamp (PATCH 403) throughout, and lease writes
//! (PUT 503) for a while, so the instance gives its lease up and takes it back.

use std::time::Duration;

use chatter_runtime::Runtime;
use chatter_tests::logs::capture;
use chatter_tests::relay::fast_relay;
use chatter_tests::store::{emulator_server, provisioned_with_leases};
use chatter_tests::wait::eventually;
use tracing::Level;

const WAIT: Duration = Duration::from_secs(60);
const POLL: Duration = Duration::from_millis(50);
const SUSPENDED: &str = "suspended draining lease";

chatter_tests::event_command! {
    /// Opens an account and emits `opened`.
    OpenAccount { account_id as "accountId" }
    on ("bank", "accounts", "accounts-leases") at "/accountId",
    handled by open_account, sends "opened" to "account-events"
}

async fn suspended(runtime: &Runtime) -> bool {
    let health = runtime.health().await;
    health.leases.iter().any(|l| l.suspended) && !runtime.relay_suspended_leases().await.is_empty()
}

#[tokio::test]
async fn a_suspended_lease_that_leaves_is_forgotten_and_suspends_again_when_it_comes_back() {
    let (logs, _guard) = capture();
    let (emulator, cosmos) = emulator_server().await;
    provisioned_with_leases(
        &cosmos,
        "bank",
        "accounts",
        &["/accountId"],
        "accounts-leases",
    )
    .await;
    let runtime = Runtime::builder()
        .cosmos(cosmos)
        .consume(false)
        .relay_options(fast_relay(Duration::from_secs(3)).max_backoff(Duration::from_millis(300)))
        // The relay's pages are what is suspended: the document waits for them.
        .publish_after_commit(false)
        .start()
        .await
        .unwrap();
    let command = OpenAccount {
        account_id: "a-1".into(),
    };
    runtime.dispatch(command, "open-1").await.unwrap();
    // Every stamp is refused: five Confirmation Failures suspend the lease.
    emulator
        .faults()
        .refuse("PATCH", 403, Duration::from_secs(3600));
    eventually(WAIT, POLL, "the lease is suspended", || suspended(&runtime)).await;
    assert_eq!(logs.matching(Level::ERROR, SUSPENDED).len(), 1);

    // Its lease cannot be renewed for almost the expiry: the instance gives it up.
    emulator.faults().refuse("PUT", 503, Duration::from_secs(5));
    eventually(WAIT, POLL, "the lease is given up", || async {
        runtime.health().await.leases.is_empty()
    })
    .await;
    assert!(
        runtime.relay_suspended_leases().await.is_empty(),
        "a lease this instance does not own is not reported suspended"
    );

    // Lease writes work again: the lease comes back with a clean record, fails five times
    // more, and its suspension is counted and logged again.
    eventually(WAIT, POLL, "the lease is owned again", || async {
        !runtime.health().await.leases.is_empty()
    })
    .await;
    eventually(WAIT, POLL, "the lease is suspended again", || async {
        logs.matching(Level::ERROR, SUSPENDED).len() == 2
    })
    .await;
    assert!(suspended(&runtime).await);
    runtime.shutdown().await;
}
