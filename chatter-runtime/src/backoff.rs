//! The retry schedule of chatter's loops that wait for a broker to come back: the change-feed
//! processor's [`Backoff`], from 100 ms doubling to 5 s.

use std::time::Duration;

pub(crate) use cosmos_change_feed::Backoff;

/// The schedule of loops waiting for a broker to come back: 100 ms doubling to 5 s.
pub(crate) fn reconnect() -> Backoff {
    Backoff::new(Duration::from_millis(100), Duration::from_secs(5))
}

/// The schedule of asking a store again whether an inbox marker exists: 100 ms doubling to 2 s
/// (a throttled or unavailable store answers within seconds).
pub(crate) fn marker_read() -> Backoff {
    Backoff::new(Duration::from_millis(100), Duration::from_secs(2))
}
