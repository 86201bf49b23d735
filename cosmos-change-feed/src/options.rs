//! [`ChangeFeedProcessorOptions`]: timings and paging of a change-feed processor.

use std::time::Duration;

use crate::error::{InvalidOptions, ProcessorOption};

/// Where a lease that has no checkpoint yet starts reading its feed range.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum StartFrom {
    /// From the beginning of the feed range: every document currently in the container is
    /// handed over once (the default, so documents written before the first start are handed
    /// over too).
    #[default]
    Beginning,
    /// From the moment the lease is first polled: only later changes are handed over.
    Now,
    /// From a point in time: documents whose latest change the store made at or after it
    /// (their `_ts`, whole seconds, compared with the point's second) are handed over. The
    /// service applies it to the read (`If-Modified-Since`); the processor also leaves out any
    /// document changed before it, so the start holds against a store that ignores the header
    /// (the SDK's in-memory emulator does).
    PointInTime(std::time::SystemTime),
}

impl StartFrom {
    /// For a point in time, its whole second since the Unix epoch (before the epoch: 0).
    pub(crate) fn since_seconds(self) -> Option<i64> {
        match self {
            Self::PointInTime(at) => Some(
                at.duration_since(std::time::UNIX_EPOCH)
                    .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX)),
            ),
            Self::Beginning | Self::Now => None,
        }
    }
}

/// Timings and paging of a [`ChangeFeedProcessor`](crate::ChangeFeedProcessor).
///
/// Every field has a documented default ([`Default`]); build with struct-update syntax or the
/// `with_*` methods:
///
/// ```
/// use std::time::Duration;
/// use cosmos_change_feed::ChangeFeedProcessorOptions;
///
/// let options = ChangeFeedProcessorOptions::default()
///     .with_poll_interval(Duration::from_millis(200))
///     .with_max_items_per_page(50);
/// assert_eq!(options.max_items_per_page, 50);
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct ChangeFeedProcessorOptions {
    /// How long a lease's poller waits after a read that found nothing new (or after an error)
    /// before reading its feed range again. Default **1 s**.
    ///
    /// A page with documents, full or not, is followed by the next read at once, so a backlog
    /// is read back to back until the lease is caught up. The .NET change-feed processor
    /// defaults to 5 s. This interval is the bulk of the delay between a write and its
    /// hand-over that a quiet container sees; 1 s keeps that delay low at the cost of one cheap
    /// read (about 1 RU, a 304 when nothing changed) per lease per second.
    pub poll_interval: Duration,
    /// The most documents one page (and so one batch handed to the handler) holds.
    /// Default **100**.
    pub max_items_per_page: u32,
    /// How often an owner rewrites (renews) each lease it owns. Default **5 s**. Must be at most
    /// half of [`lease_expiry`](Self::lease_expiry), so a renewal that fails leaves room for
    /// another before the owner gives the lease up.
    pub lease_renew_interval: Duration,
    /// How long after its last renewal a lease counts as expired, free for another instance
    /// to take. Default **30 s**.
    ///
    /// Judged from when the store last wrote the lease (its `_ts`, by the service's clock): each
    /// instance's clock must agree with the service's well within this interval (NTP is plenty).
    pub lease_expiry: Duration,
    /// How often an instance lists the leases, creates missing ones (new or split feed
    /// ranges), takes free or expired ones and balances with the other instances.
    /// Default **5 s**.
    pub lease_acquire_interval: Duration,
    /// Where a lease without a checkpoint starts. Default [`StartFrom::Beginning`].
    pub start_from: StartFrom,
    /// The bound of every store call the processor makes (a change-feed read, a lease write);
    /// a call past it is cancelled and counts as a failure. Default **30 s**, above the SDK's own
    /// retries of throttled requests.
    pub store_timeout: Duration,
    /// The bound of one batch handler call; past it the call is cancelled, reported as a
    /// [`LeaseFault`](crate::LeaseFault) and the page is read again. Default **5 min**.
    pub handler_timeout: Duration,
    /// The longest wait between two attempts after failures. Failures back off exponentially
    /// (with jitter) from [`poll_interval`](Self::poll_interval) up to this; a success starts
    /// over. Default **10 s**.
    pub max_backoff: Duration,
}

impl Default for ChangeFeedProcessorOptions {
    fn default() -> Self {
        Self {
            poll_interval: Duration::from_secs(1),
            max_items_per_page: 100,
            lease_renew_interval: Duration::from_secs(5),
            lease_expiry: Duration::from_secs(30),
            lease_acquire_interval: Duration::from_secs(5),
            start_from: StartFrom::Beginning,
            store_timeout: Duration::from_secs(30),
            handler_timeout: Duration::from_secs(300),
            max_backoff: Duration::from_secs(10),
        }
    }
}

impl ChangeFeedProcessorOptions {
    /// Sets [`poll_interval`](Self::poll_interval).
    pub fn with_poll_interval(mut self, interval: Duration) -> Self {
        self.poll_interval = interval;
        self
    }

    /// Sets [`max_items_per_page`](Self::max_items_per_page).
    pub fn with_max_items_per_page(mut self, max_items: u32) -> Self {
        self.max_items_per_page = max_items;
        self
    }

    /// Sets [`lease_renew_interval`](Self::lease_renew_interval).
    pub fn with_lease_renew_interval(mut self, interval: Duration) -> Self {
        self.lease_renew_interval = interval;
        self
    }

    /// Sets [`lease_expiry`](Self::lease_expiry).
    pub fn with_lease_expiry(mut self, expiry: Duration) -> Self {
        self.lease_expiry = expiry;
        self
    }

    /// Sets [`lease_acquire_interval`](Self::lease_acquire_interval).
    pub fn with_lease_acquire_interval(mut self, interval: Duration) -> Self {
        self.lease_acquire_interval = interval;
        self
    }

    /// Sets [`store_timeout`](Self::store_timeout).
    pub fn with_store_timeout(mut self, timeout: Duration) -> Self {
        self.store_timeout = timeout;
        self
    }

    /// Sets [`handler_timeout`](Self::handler_timeout).
    pub fn with_handler_timeout(mut self, timeout: Duration) -> Self {
        self.handler_timeout = timeout;
        self
    }

    /// Sets [`max_backoff`](Self::max_backoff).
    pub fn with_max_backoff(mut self, max_backoff: Duration) -> Self {
        self.max_backoff = max_backoff;
        self
    }

    /// Sets [`start_from`](Self::start_from).
    pub fn with_start_from(mut self, start_from: StartFrom) -> Self {
        self.start_from = start_from;
        self
    }

    /// Checks the options make sense together: non-zero intervals and page size, and a renew
    /// interval of at most half the expiry. The first rule broken is returned.
    pub fn validate(&self) -> Result<(), InvalidOptions> {
        let zero = [
            (ProcessorOption::PollInterval, self.poll_interval),
            (
                ProcessorOption::LeaseRenewInterval,
                self.lease_renew_interval,
            ),
            (ProcessorOption::LeaseExpiry, self.lease_expiry),
            (
                ProcessorOption::LeaseAcquireInterval,
                self.lease_acquire_interval,
            ),
            (ProcessorOption::StoreTimeout, self.store_timeout),
            (ProcessorOption::HandlerTimeout, self.handler_timeout),
            (ProcessorOption::MaxBackoff, self.max_backoff),
        ]
        .into_iter()
        .find(|(_, value)| value.is_zero());
        if let Some((option, _)) = zero {
            return Err(InvalidOptions::Zero { option });
        }
        if self.max_items_per_page == 0 {
            return Err(InvalidOptions::Zero {
                option: ProcessorOption::MaxItemsPerPage,
            });
        }
        // A renewal that fails must leave room for another before the owner gives the lease up
        // (a margin before the expiry): at more than half the expiry, every renewal that is
        // not instant would drop a quiet lease and take it again.
        if self.lease_renew_interval > self.lease_expiry / 2 {
            return Err(InvalidOptions::RenewIntervalTooLong {
                renew_interval: self.lease_renew_interval,
                lease_expiry: self.lease_expiry,
            });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_valid() {
        ChangeFeedProcessorOptions::default().validate().unwrap();
    }

    // At 0.8 of the expiry and above, the give-up margin left no time for a renewal's write:
    // every quiet lease was dropped and taken again each cycle. Half the expiry is the most.
    #[test]
    fn a_renew_interval_above_half_the_expiry_is_rejected_and_half_is_accepted() {
        let expiry = Duration::from_secs(30);
        for renew in [Duration::from_secs(24), Duration::from_millis(15_001)] {
            let options = ChangeFeedProcessorOptions::default()
                .with_lease_renew_interval(renew)
                .with_lease_expiry(expiry);
            assert_eq!(
                options.validate(),
                Err(InvalidOptions::RenewIntervalTooLong {
                    renew_interval: renew,
                    lease_expiry: expiry,
                }),
                "{renew:?}"
            );
        }
        ChangeFeedProcessorOptions::default()
            .with_lease_renew_interval(Duration::from_secs(15))
            .with_lease_expiry(expiry)
            .validate()
            .unwrap();
    }

    #[test]
    fn a_renew_interval_not_shorter_than_the_expiry_is_rejected() {
        let options = ChangeFeedProcessorOptions::default()
            .with_lease_renew_interval(Duration::from_secs(30))
            .with_lease_expiry(Duration::from_secs(30));
        let err = options.validate().unwrap_err();
        assert_eq!(
            err,
            InvalidOptions::RenewIntervalTooLong {
                renew_interval: Duration::from_secs(30),
                lease_expiry: Duration::from_secs(30),
            }
        );
        assert!(err.to_string().contains("lease_renew_interval"), "{err}");
    }

    #[test]
    fn zero_values_are_rejected() {
        assert_eq!(
            ChangeFeedProcessorOptions::default()
                .with_max_items_per_page(0)
                .validate(),
            Err(InvalidOptions::Zero {
                option: ProcessorOption::MaxItemsPerPage
            })
        );
        let err = ChangeFeedProcessorOptions::default()
            .with_poll_interval(Duration::ZERO)
            .validate()
            .unwrap_err();
        assert_eq!(
            err,
            InvalidOptions::Zero {
                option: ProcessorOption::PollInterval
            }
        );
        assert_eq!(err.to_string(), "`poll_interval` must be greater than zero");
    }
}
