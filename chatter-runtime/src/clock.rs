//! The wall clock by which this instance judges what the store recorded: an inbox claim's
//! deadline, a marker's `ReceivedAtUtc`, how long a pending Outbox Document has waited (the
//! sweep). With feature `test-support` it is shifted by the calling thread's skew
//! ([`crate::testing::skew_clock`]): the simulation runs each instance on a thread of its own,
//! its clock off the store's by a drawn amount, as hosts' clocks are.

use time::OffsetDateTime;

/// Now, by this instance's clock.
pub(crate) fn now_utc() -> OffsetDateTime {
    let now = OffsetDateTime::now_utc();
    // One skew per thread for the whole instance: the leases' clock keeps it.
    #[cfg(feature = "test-support")]
    let now = now + time::Duration::milliseconds(cosmos_change_feed::testing::clock_skew_ms());
    now
}
