//! [`RelayOptions`]: every setting of the change-feed relay, in one flat builder.

use std::time::Duration;

use cosmos_change_feed::ChangeFeedProcessorOptions;

use super::delivery::DeliverySettings;
use super::error::RelayError;
use super::in_flight::DEFAULT_MAX_IN_FLIGHT;

/// The default bound of one publish and of one stamp.
pub(crate) const DEFAULT_DRAIN_TIMEOUT: Duration = Duration::from_secs(30);

/// Settings of the change-feed relay, passed to
/// [`RuntimeBuilder::relay_options`](crate::RuntimeBuilder::relay_options).
///
/// Start from the defaults and change what you need:
///
/// ```
/// use std::time::Duration;
/// use chatter_runtime::relay::RelayOptions;
///
/// let options = RelayOptions::default()
///     .poll_interval(Duration::from_millis(250))
///     .lease_expiry(Duration::from_secs(20))
///     .delivered_ttl_seconds(3_600);
/// # let _ = options;
/// ```
///
/// `start()` checks them together and refuses settings that cannot work (a zero interval, a
/// renew interval above half the lease expiry, a `handler_timeout` not above `publish_timeout`
/// plus `store_timeout`, a blank or reserved delivered status, a ttl that is not positive).
///
/// A huge duration (`Duration::MAX`) is taken as "never" / "no bound": every wait and deadline
/// derived from it saturates (at about 100 years for a deadline), never an overflow panic.
#[derive(Debug, Clone)]
#[must_use = "options do nothing until passed to `RuntimeBuilder::relay_options`"]
pub struct RelayOptions {
    pub(crate) processor: ChangeFeedProcessorOptions,
    pub(crate) delivery: DeliverySettings,
    pub(crate) publish_timeout: Duration,
    pub(crate) max_in_flight: usize,
    pub(crate) backlog_interval: Duration,
    pub(crate) sweep_interval: Duration,
    pub(crate) stranded_after: Duration,
    /// Test seam: the Drain Suspension gates' clock (the process's monotonic clock otherwise).
    #[cfg(feature = "test-support")]
    pub(crate) suspension_clock: Option<SuspensionClock>,
}

/// A Drain Suspension clock carried by the options (feature `test-support`).
#[cfg(feature = "test-support")]
#[derive(Clone)]
pub(crate) struct SuspensionClock(pub(crate) std::sync::Arc<dyn super::suspension::MonotonicClock>);

#[cfg(feature = "test-support")]
impl std::fmt::Debug for SuspensionClock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SuspensionClock")
    }
}

/// The default [`RelayOptions::backlog_interval`].
const DEFAULT_BACKLOG_INTERVAL: Duration = Duration::from_secs(30);
/// The default [`RelayOptions::sweep_interval`].
const DEFAULT_SWEEP_INTERVAL: Duration = Duration::from_secs(60);
/// The default [`RelayOptions::stranded_after`].
const DEFAULT_STRANDED_AFTER: Duration = Duration::from_secs(5 * 60);

impl Default for RelayOptions {
    fn default() -> Self {
        Self {
            processor: ChangeFeedProcessorOptions::default(),
            delivery: DeliverySettings::default(),
            publish_timeout: DEFAULT_DRAIN_TIMEOUT,
            max_in_flight: DEFAULT_MAX_IN_FLIGHT,
            backlog_interval: DEFAULT_BACKLOG_INTERVAL,
            sweep_interval: DEFAULT_SWEEP_INTERVAL,
            stranded_after: DEFAULT_STRANDED_AFTER,
            #[cfg(feature = "test-support")]
            suspension_clock: None,
        }
    }
}

impl RelayOptions {
    /// How late after a message's first publish a running relay with these options may publish
    /// it again: a lease taken over after its expiry, then a Drain Suspension's window
    /// (saturating: a lease that never expires has no bound, `Duration::MAX`).
    pub(crate) fn republish_within(&self) -> Duration {
        self.processor
            .lease_expiry
            .saturating_add(super::suspension::SUSPENSION_WINDOW)
    }

    /// How long publish after commit's record remembers a version it published, from its
    /// settlement, for the relay in the same process: a page read before the stamp landed waits
    /// for the page ahead of it (at most the handler timeout), then runs (at most that again),
    /// after at most a poll interval.
    pub(crate) fn after_commit_remembered_for(&self) -> Duration {
        self.processor
            .handler_timeout
            .saturating_mul(2)
            .saturating_add(self.processor.poll_interval)
    }

    /// Refuses settings that cannot work together, before anything connects.
    pub(crate) fn validate(&self) -> Result<(), RelayError> {
        self.delivery.validate()?;
        self.processor
            .validate()
            .map_err(RelayError::InvalidOptions)?;
        if self.publish_timeout.is_zero() {
            return Err(RelayError::ZeroPublishTimeout);
        }
        if self.max_in_flight == 0 {
            return Err(RelayError::ZeroMaxInFlight);
        }
        if self.backlog_interval.is_zero() {
            return Err(RelayError::ZeroBacklogInterval);
        }
        if self.sweep_interval.is_zero() {
            return Err(RelayError::ZeroSweepInterval);
        }
        // A page cancelled between a publish and its stamp publishes that message again; with a
        // bound no longer than one publish and one stamp, every slow stamp would do so.
        let needed = self
            .publish_timeout
            .saturating_add(self.processor.store_timeout);
        if self.processor.handler_timeout <= needed {
            return Err(RelayError::HandlerTimeoutTooShort {
                handler_timeout: self.processor.handler_timeout,
                publish_timeout: self.publish_timeout,
                store_timeout: self.processor.store_timeout,
            });
        }
        Ok(())
    }

    /// How long a lease waits after a read that found nothing new (or after an error) before
    /// reading its feed range again. Default **1 s**: most of the write-to-publish delay a quiet
    /// container sees, at one cheap read (a 304) per lease per interval. A page with documents
    /// is followed by the next read at once, so a backlog drains back to back. A huge value
    /// reads each lease once, then never again.
    pub fn poll_interval(mut self, interval: Duration) -> Self {
        self.processor.poll_interval = interval;
        self
    }

    /// How often the relay estimates each owned lease's backlog: the pending Outbox Documents
    /// after its checkpoint, exported as the `chatter.messaging.outbox.backlog` gauge and in
    /// [`Runtime::health`](crate::Runtime::health). Default **30 s**. Estimates run only with
    /// metrics on; each reads the change feed after every owned checkpoint, so its RU cost grows
    /// with the backlog (about one page read per 100 changes behind, one cheap read per caught-up
    /// lease). [`start`](crate::RuntimeBuilder::start) refuses zero; a huge value estimates
    /// once, at start.
    pub fn backlog_interval(mut self, interval: Duration) -> Self {
        self.backlog_interval = interval;
        self
    }

    /// How often the relay sweeps the feed ranges of its owned leases for stranded Outbox
    /// Documents: pending ones, older than [`stranded_after`](Self::stranded_after), that the
    /// lease has already read past (a read of the change feed from its checkpoint no longer
    /// returns them), so no drain would ever publish them. Each is logged at Error, counted
    /// (`chatter.messaging.outbox.stranded`), shown in
    /// [`LeaseHealth::stranded`](crate::health::LeaseHealth::stranded) and written back unchanged (an
    /// ETag-guarded no-op patch), which puts it at the end of the change feed, where it is
    /// published as usual. A document the lease has not read yet is never written. The same
    /// sweep records each lease's oldest pending document's age
    /// ([`LeaseHealth::oldest_pending_age`](crate::health::LeaseHealth::oldest_pending_age), the
    /// `chatter.messaging.outbox.pending.oldest_age` gauge). Default **60 s**; the sweep runs
    /// whether metrics are on or off. Each sweep queries the pending documents of every owned
    /// feed range, and reads the change feed after the checkpoints only when some are older than
    /// `stranded_after`. [`start`](crate::RuntimeBuilder::start) refuses zero.
    pub fn sweep_interval(mut self, interval: Duration) -> Self {
        self.sweep_interval = interval;
        self
    }

    /// How old (since its last write, by the store's `_ts`) a pending Outbox Document must be
    /// before the [sweep](Self::sweep_interval) judges whether it is stranded. Default **5
    /// min**. The rule itself (absent from the change feed after its lease's checkpoint) holds
    /// at any age; the bound keeps the sweep's change-feed read for documents that have had
    /// their time, and any value (zero too) is accepted.
    pub fn stranded_after(mut self, age: Duration) -> Self {
        self.stranded_after = age;
        self
    }

    /// The most documents one page holds. Default **100**.
    pub fn max_items_per_page(mut self, max_items: u32) -> Self {
        self.processor.max_items_per_page = max_items;
        self
    }

    /// How often an instance renews each lease it owns. Default **5 s**; must be at most half
    /// of the [`lease_expiry`](Self::lease_expiry) (a failed renewal is tried again sooner), so
    /// a huge one needs a huge expiry.
    pub fn lease_renew_interval(mut self, interval: Duration) -> Self {
        self.processor.lease_renew_interval = interval;
        self
    }

    /// How long a lease not renewed counts as still owned. Default **30 s**: a dead instance's
    /// leases are taken over after this. Instances sharing a lease container need clocks
    /// synchronized well within it. A huge value (`Duration::MAX`) means a lease is never taken
    /// over from a dead instance; how late a relay may publish a message again then has no
    /// bound, so `start()` refuses a broker that deduplicates only within a window (NATS).
    pub fn lease_expiry(mut self, expiry: Duration) -> Self {
        self.processor.lease_expiry = expiry;
        self
    }

    /// How often an instance takes free and expired leases and balances with the others.
    /// Default **5 s**. A huge value takes leases once, at start.
    pub fn lease_acquire_interval(mut self, interval: Duration) -> Self {
        self.processor.lease_acquire_interval = interval;
        self
    }

    /// The bound of every store call of the relay: change-feed reads, lease writes and the
    /// status stamps. Default **30 s**, above the SDK's own retries of throttled requests. A
    /// huge value leaves them unbounded (and needs a `handler_timeout` above it, which a huge
    /// one is not: both saturate at `Duration::MAX`).
    pub fn store_timeout(mut self, timeout: Duration) -> Self {
        self.processor.store_timeout = timeout;
        self
    }

    /// The bound of draining one page; past it the page is cancelled and read again (a page
    /// cancelled after it published counts as a Confirmation Failure, as its messages are
    /// published again). Default **5 min**; must be greater than `publish_timeout` plus
    /// `store_timeout`, one document's publish and stamp. A huge value never cancels a page.
    pub fn handler_timeout(mut self, timeout: Duration) -> Self {
        self.processor.handler_timeout = timeout;
        self
    }

    /// The longest wait between two attempts after failures: they back off exponentially, with
    /// jitter, from the poll interval up to this (at least a 429's `Retry-After`). Default
    /// **10 s**. A huge value lets the waits keep doubling.
    pub fn max_backoff(mut self, max_backoff: Duration) -> Self {
        self.processor.max_backoff = max_backoff;
        self
    }

    /// Test seam (feature `test-support`): runs every Drain Suspension gate of the relay on
    /// `clock`, so a test steps through the 60 s suspension window instead of waiting it out;
    /// publish after commit's 60 s pause after a failure runs on it too.
    #[cfg(feature = "test-support")]
    pub fn suspension_clock(
        mut self,
        clock: std::sync::Arc<dyn super::suspension::MonotonicClock>,
    ) -> Self {
        self.suspension_clock = Some(SuspensionClock(clock));
        self
    }

    /// The bound of one publish, broker confirm included, whatever the broker's own bounds.
    /// Default **30 s**. A publish past it fails the page: nothing is stamped, the page is read
    /// again. A huge value leaves publishes bounded by the broker's own timeouts only.
    pub fn publish_timeout(mut self, timeout: Duration) -> Self {
        self.publish_timeout = timeout;
        self
    }

    /// The most Outbox Documents the relay has in flight at once (publishing, or being stamped
    /// after the broker confirmed), over all the leases and monitored containers it drains. A
    /// standalone relay's limit is its own, beside the pipeline relay's and the other
    /// standalone relays' (a runtime's total is their sum).
    /// Default **32**: enough to hide a 20 ms store round trip at about 1,400 messages a second,
    /// while staying near what one physical partition serves (about 10 RU a stamp against
    /// 10,000 RU/s). Must be positive.
    ///
    /// Within a page, documents of one partition-key value are published one after another in
    /// change-feed order (the next once the broker confirmed the previous one, while that one
    /// is stamped); different values are published concurrently up to this limit.
    pub fn max_in_flight(mut self, documents: usize) -> Self {
        self.max_in_flight = documents;
        self
    }

    /// The `status` a delivered Outbox Document is stamped with. Default `"delivered"`; must
    /// not be blank, `pending` or `undeliverable`.
    pub fn delivered_status(mut self, status: impl Into<String>) -> Self {
        self.delivery.delivered_status = status.into();
        self
    }

    /// The `ttl` (seconds) stamped with the delivered status, so Cosmos DB purges delivered
    /// documents. Default **86 400** (one day); must be positive.
    pub fn delivered_ttl_seconds(mut self, seconds: i64) -> Self {
        self.delivery.delivered_ttl_seconds = seconds;
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_setter_changes_only_its_own_setting() {
        let defaults = RelayOptions::default();
        let second = Duration::from_secs(1);
        let changed = RelayOptions::default()
            .poll_interval(2 * second)
            .max_items_per_page(7)
            .lease_renew_interval(3 * second)
            .lease_expiry(40 * second)
            .lease_acquire_interval(4 * second)
            .store_timeout(5 * second)
            .handler_timeout(6 * second)
            .max_backoff(8 * second)
            .publish_timeout(9 * second)
            .max_in_flight(11)
            .delivered_status("sent")
            .delivered_ttl_seconds(60)
            .sweep_interval(12 * second)
            .stranded_after(13 * second);
        let p = &changed.processor;
        assert_eq!(p.poll_interval, 2 * second);
        assert_eq!(p.max_items_per_page, 7);
        assert_eq!(p.lease_renew_interval, 3 * second);
        assert_eq!(p.lease_expiry, 40 * second);
        assert_eq!(p.lease_acquire_interval, 4 * second);
        assert_eq!(p.store_timeout, 5 * second);
        assert_eq!(p.handler_timeout, 6 * second);
        assert_eq!(p.max_backoff, 8 * second);
        assert_eq!(changed.publish_timeout, 9 * second);
        assert_eq!(changed.max_in_flight, 11);
        assert_eq!(defaults.max_in_flight, DEFAULT_MAX_IN_FLIGHT);
        assert_eq!(changed.delivery.delivered_status, "sent");
        assert_eq!(changed.delivery.delivered_ttl_seconds, 60);
        assert_eq!(changed.sweep_interval, 12 * second);
        assert_eq!(changed.stranded_after, 13 * second);
        assert_eq!(defaults.sweep_interval, DEFAULT_SWEEP_INTERVAL);
        assert_eq!(defaults.stranded_after, DEFAULT_STRANDED_AFTER);
        assert_eq!(p.start_from, defaults.processor.start_from);
    }

    #[test]
    fn a_lease_expiry_of_duration_max_saturates_the_republish_bound() {
        let options = RelayOptions::default().lease_expiry(Duration::MAX);
        assert!(options.validate().is_ok());
        assert_eq!(options.republish_within(), Duration::MAX);
    }
}
