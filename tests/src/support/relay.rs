//! Relay options for tests.

use std::time::Duration;

use chatter_runtime::relay::RelayOptions;

/// Short relay timings so draining, balancing and hand-overs happen within seconds: poll every
/// 100 ms, renew owned leases every 400 ms, try to acquire leases every 250 ms, leases expire
/// after `lease_expiry`; default delivery settings.
pub fn fast_relay(lease_expiry: Duration) -> RelayOptions {
    RelayOptions::default()
        .poll_interval(Duration::from_millis(100))
        .lease_expiry(lease_expiry)
        .lease_renew_interval(Duration::from_millis(400))
        .lease_acquire_interval(Duration::from_millis(250))
}

/// Waits until `runtime`'s relay owns (and so polls) at least `leases` leases.
pub async fn owning(runtime: &chatter_runtime::Runtime, leases: usize) {
    loop {
        let owned: usize = runtime
            .relay_leases()
            .await
            .iter()
            .map(|(_, owned)| owned.len())
            .sum();
        if owned >= leases {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}
