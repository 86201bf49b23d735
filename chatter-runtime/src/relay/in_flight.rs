//! The bound on Outbox Documents in flight at once, shared by the drain and publish after
//! commit.

use std::sync::Arc;

use tokio::sync::Semaphore;

/// The most Outbox Documents in flight at once (publishing or being stamped), shared by every
/// lease of every monitored container of one relay. Clones share the limit.
#[derive(Debug, Clone)]
pub struct InFlightLimit {
    pub(super) permits: Arc<Semaphore>,
    /// The permits it was made with.
    size: usize,
}

/// The default [`InFlightLimit`]: enough to hide a 20 ms store round trip at about 1,400
/// messages a second (32 / 22 ms), while at about 10 RU a stamp the relay stays near what one
/// physical partition serves (10,000 RU/s).
pub(crate) const DEFAULT_MAX_IN_FLIGHT: usize = 32;

impl InFlightLimit {
    /// A limit of `permits` documents in flight (at least one; a number past what a semaphore
    /// can count means as many as it can).
    pub fn new(permits: usize) -> Self {
        let size = permits.clamp(1, Semaphore::MAX_PERMITS);
        Self {
            permits: Arc::new(Semaphore::new(size)),
            size,
        }
    }

    #[cfg(any(test, feature = "test-support"))]
    /// The permits not taken now.
    pub fn available(&self) -> usize {
        self.permits.available_permits()
    }

    /// The permits it was made with: how many documents may be in flight at once.
    pub(crate) fn size(&self) -> usize {
        self.size
    }

    /// Whether no document is in flight now (every permit returned).
    pub(crate) fn holds_none(&self) -> bool {
        self.permits.available_permits() == self.size
    }
}

impl Default for InFlightLimit {
    fn default() -> Self {
        Self::new(DEFAULT_MAX_IN_FLIGHT)
    }
}
