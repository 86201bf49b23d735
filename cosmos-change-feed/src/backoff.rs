//! [`Backoff`]: retry delays for loops that must never give up: exponential, with jitter,
//! capped, reset on success (backon's exponential schedule, without a retry limit).

use std::time::Duration;

use backon::{BackoffBuilder, ExponentialBackoff, ExponentialBuilder};

/// The delays between attempts of one retry loop: the schedule the processor's own loops use
/// after failures, usable for any loop of yours that must keep trying (a reconnect loop, say).
///
/// ```
/// use std::time::Duration;
/// use cosmos_change_feed::Backoff;
///
/// let mut backoff = Backoff::new(Duration::from_millis(100), Duration::from_secs(5));
/// let first = backoff.next_delay();
/// assert!(first >= Duration::from_millis(100) && first <= Duration::from_millis(200));
/// backoff.reset(); // after a success
/// ```
#[derive(Debug)]
pub struct Backoff {
    builder: ExponentialBuilder,
    delays: ExponentialBackoff,
}

impl Backoff {
    /// Delays from `min`, doubling up to `max`, each with up to 100 % jitter added (so never
    /// below `min`; a cap of `2 * max` with jitter).
    pub fn new(min: Duration, max: Duration) -> Self {
        let builder = ExponentialBuilder::default()
            .with_min_delay(min)
            .with_max_delay(max.max(min))
            .with_factor(2.0)
            .with_jitter()
            .without_max_times();
        Self {
            delays: builder.build(),
            builder,
        }
    }

    /// The delay before the next attempt.
    pub fn next_delay(&mut self) -> Duration {
        // Without a retry limit the schedule never ends; the fallback is only a guard.
        self.delays.next().unwrap_or(Duration::from_secs(1))
    }

    /// The delay before the next attempt, at least `floor` (a server's `Retry-After`).
    pub fn next_delay_at_least(&mut self, floor: Option<Duration>) -> Duration {
        let delay = self.next_delay();
        floor.map_or(delay, |floor| delay.max(floor))
    }

    /// Starts the schedule over after a success.
    pub fn reset(&mut self) {
        self.delays = self.builder.build();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn delays_grow_to_the_cap_and_start_over_after_a_reset() {
        let (min, max) = (Duration::from_millis(100), Duration::from_secs(2));
        let mut backoff = Backoff::new(min, max);
        let delays: Vec<Duration> = (0..12).map(|_| backoff.next_delay()).collect();
        assert!(
            delays.iter().all(|d| *d >= min && *d <= max * 2),
            "{delays:?}"
        );
        assert!(
            delays[11] >= max,
            "capped, not stuck at the minimum: {delays:?}"
        );
        backoff.reset();
        assert!(backoff.next_delay() <= min * 2, "reset to the minimum");
        let floor = Some(Duration::from_secs(10));
        assert_eq!(backoff.next_delay_at_least(floor), Duration::from_secs(10));
    }
}
