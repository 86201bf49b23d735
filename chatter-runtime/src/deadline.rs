//! Deadlines from duration options: a user may pass `Duration::MAX` (or any huge value) to mean
//! "no bound", and `Instant::now() + d` would then overflow and panic. Every deadline derived
//! from an option goes through [`deadline_after`], which saturates at a far future instead.

use std::time::Duration;

use tokio::time::Instant;

/// The farthest a deadline from an option reaches: about 100 years, "never" for a process.
pub(crate) const FAR_FUTURE: Duration = Duration::from_secs(100 * 365 * 24 * 3600);

/// `now + within`, saturating at [`FAR_FUTURE`] from now (never a panic).
pub(crate) fn deadline_after(within: Duration) -> Instant {
    let now = Instant::now();
    now.checked_add(within.min(FAR_FUTURE))
        // A monotonic clock 100 years from its end does not exist; a guard, not a case.
        .unwrap_or(now)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_huge_wait_saturates_at_the_far_future() {
        let before = Instant::now();
        let deadline = deadline_after(Duration::MAX);
        assert!(deadline >= before + FAR_FUTURE);
        assert!(deadline_after(Duration::from_secs(1)) < before + Duration::from_secs(60));
    }
}
