//! Test seams for chatter's own simulation (feature `test-support`): no stability promise.

use std::cell::Cell;

thread_local! {
    /// How far this thread's clock is from the true one, in milliseconds.
    pub(crate) static CLOCK_SKEW_MS: Cell<i64> = const { Cell::new(0) };
}

/// Skews the clock the calling thread's processor code reads by `millis` (negative: behind):
/// the lease timestamps it writes and the moment against which it judges a lease expired. An
/// instance whose tasks all run on one thread (a current-thread runtime) then acts as a host
/// whose clock is off.
pub fn skew_clock(millis: i64) {
    CLOCK_SKEW_MS.with(|skew| skew.set(millis));
}

/// The calling thread's skew, in milliseconds (0 unless [`skew_clock`] set one): the one cell
/// every clock of an instance reads, chatter's own included.
pub fn clock_skew_ms() -> i64 {
    CLOCK_SKEW_MS.with(Cell::get)
}

#[cfg(test)]
mod tests {
    use crate::lease::now_millis;

    #[test]
    fn a_skewed_thread_judges_leases_by_its_own_clock_and_other_threads_by_theirs() {
        let true_now = std::thread::spawn(now_millis).join().unwrap();
        super::skew_clock(4_000);
        assert_eq!(super::clock_skew_ms(), 4_000);
        let skewed = now_millis();
        let other = std::thread::spawn(now_millis).join().unwrap();
        super::skew_clock(0);
        assert!(
            (3_900..4_500).contains(&(skewed - true_now)),
            "{skewed} {true_now}"
        );
        assert!(
            (other - true_now) < 500,
            "another thread's clock is not skewed"
        );
    }
}
