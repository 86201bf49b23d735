//! The wall clock by which this instance judges what the store recorded: an inbox claim's
//! deadline, a marker's `ReceivedAtUtc`, how long a pending Outbox Document has waited (the
//! sweep). With feature `test-support` it is shifted by the calling thread's skew
//! ([`crate::testing::skew_clock`]): the simulation runs each instance on a thread of its own,
//! its clock off the store's by a drawn amount, as hosts' clocks are.

use time::OffsetDateTime;

/// Now, by this instance's clock.
pub(crate) fn now_utc() -> OffsetDateTime {
    let now = OffsetDateTime::now_utc();
    #[cfg(feature = "test-support")]
    let now = now + CLOCK_SKEW.with(std::cell::Cell::get);
    now
}

#[cfg(feature = "test-support")]
thread_local! {
    /// How far this thread's clock is from the true one (test seam).
    pub(crate) static CLOCK_SKEW: std::cell::Cell<time::Duration> =
        const { std::cell::Cell::new(time::Duration::ZERO) };
}
