//! Bounded polling: no timed assertions, every wait ends with a panic naming what was awaited.

use std::future::Future;
use std::time::Duration;

/// Polls `condition` every `every` until it holds; panics naming `what` once `within` has passed
/// without it holding.
///
/// The condition is checked first, so a condition that already holds returns at once.
pub async fn eventually<F, Fut>(within: Duration, every: Duration, what: &str, mut condition: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + within;
    while !condition().await {
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out after {within:?} waiting until {what}"
        );
        tokio::time::sleep(every).await;
    }
}
