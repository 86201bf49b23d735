//! [`InboxOptions`]: where the standalone inbox keeps its markers and how it confirms a
//! conflict; checked when the inbox is built, with the .NET module's texts.

use std::time::Duration;

use crate::document::inbox_marker::{CLAIMED_MARKER_RESERVED_ROOT_FIELDS, TTL_FIELD};
use crate::partition_key;

/// The default partition-key path of an idempotency container.
pub const DEFAULT_IDEMPOTENCY_KEY_PATH: &str = "/idempotencyKey";

/// Settings of a [`StandaloneInbox`](super::StandaloneInbox).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct InboxOptions {
    /// The database of the idempotency container.
    pub database: String,
    /// The idempotency container (its partition key: [`partition_key_path`](Self::partition_key_path)).
    pub container: String,
    /// Where a marker carries its partition value, the message id. Default `/idempotencyKey`;
    /// one path (the partition value is the message id alone).
    pub partition_key_path: String,
    /// Seconds after which Cosmos deletes a marker (its `ttl`); `None` (default) or not positive:
    /// markers are kept, and the container's default time-to-live decides.
    pub marker_ttl_seconds: Option<i64>,
    /// Point reads that try to confirm a conflicting marker (default 5, at least 1).
    pub read_back_attempts: u32,
    /// The wait between two of them (default 50 ms).
    pub read_back_interval: Duration,
    /// The bound of each store call (default 30 s).
    pub store_timeout: Duration,
    /// How long one attempt's handler may run (default 5 minutes; a runtime sets its delivery
    /// timeout less its store timeout): [`receive`](super::StandaloneInbox::receive) stops a
    /// handler that runs longer. Its claim, renewed meanwhile, keeps a second copy of the
    /// message from running beside it. At least one second.
    pub claim_timeout: Duration,
    /// How far a reader's clock may be from the Cosmos service's (default 10 s): a claim is
    /// taken over only once it has been over for this long too.
    pub clock_margin: Duration,
    /// How long a claim lasts unless renewed (default [`DEFAULT_CLAIM_PERIOD`]; never more
    /// than the claim timeout). While its handler runs, the claim is renewed every
    /// [`renewal_interval`](Self::renewal_interval), so an attempt that crashes frees its
    /// message id within this period, a second and the clock margin. At least one second;
    /// rounded up to whole seconds in the marker.
    pub claim_period: Option<Duration>,
    /// How often a running handler's claim is renewed (default a third of the claim period):
    /// one conditional patch of the marker each time, none for a handler that finishes
    /// sooner. At least [`MIN_RENEWAL_INTERVAL`] and at most half the claim period, so a
    /// renewal that fails has another chance before the claim ends.
    pub renewal_interval: Option<Duration>,
}

/// The longest [`InboxOptions::claim_timeout`] accepted: a day.
pub const MAX_CLAIM_TIMEOUT: Duration = Duration::from_secs(24 * 3600);

/// The default of [`InboxOptions::clock_margin`].
pub const DEFAULT_CLOCK_MARGIN: Duration = Duration::from_secs(10);

/// The shortest [`InboxOptions::renewal_interval`] accepted: renewals are writes.
pub const MIN_RENEWAL_INTERVAL: Duration = Duration::from_millis(100);

/// The default of [`InboxOptions::claim_period`] (with the default clock margin, a crashed
/// attempt's message id is free about 31 s after its last renewal).
pub const DEFAULT_CLAIM_PERIOD: Duration = Duration::from_secs(20);

impl InboxOptions {
    /// The defaults, for the idempotency container `database/container`.
    pub fn new(database: impl Into<String>, container: impl Into<String>) -> Self {
        Self {
            database: database.into(),
            container: container.into(),
            partition_key_path: DEFAULT_IDEMPOTENCY_KEY_PATH.to_owned(),
            marker_ttl_seconds: None,
            read_back_attempts: 5,
            read_back_interval: Duration::from_millis(50),
            store_timeout: Duration::from_secs(30),
            claim_timeout: Duration::from_secs(300),
            clock_margin: DEFAULT_CLOCK_MARGIN,
            claim_period: None,
            renewal_interval: None,
        }
    }

    /// Sets [`claim_period`](Self::claim_period).
    pub fn claim_period(mut self, period: Duration) -> Self {
        self.claim_period = Some(period);
        self
    }

    /// Sets [`renewal_interval`](Self::renewal_interval).
    pub fn renewal_interval(mut self, interval: Duration) -> Self {
        self.renewal_interval = Some(interval);
        self
    }

    /// The claim period in effect: the one set, or the default (the claim timeout when
    /// shorter).
    pub(crate) fn period(&self) -> Duration {
        // Never longer than the handler may run: a longer claim would only delay recovery.
        self.claim_period
            .unwrap_or(DEFAULT_CLAIM_PERIOD)
            .min(self.claim_timeout)
    }

    /// The renewal interval in effect: the one set, or a third of the claim period.
    pub(crate) fn renewal(&self) -> Duration {
        self.renewal_interval.unwrap_or(self.period() / 3)
    }

    /// Sets [`claim_timeout`](Self::claim_timeout).
    pub fn claim_timeout(mut self, timeout: Duration) -> Self {
        self.claim_timeout = timeout;
        self
    }

    /// Sets [`clock_margin`](Self::clock_margin).
    pub fn clock_margin(mut self, margin: Duration) -> Self {
        self.clock_margin = margin;
        self
    }

    /// The claim's length in the marker: the claim period in whole seconds, rounded up.
    pub(crate) fn claim_seconds(&self) -> u64 {
        let period = self.period();
        let seconds = period.as_secs();
        if period.subsec_nanos() > 0 {
            seconds.saturating_add(1)
        } else {
            seconds
        }
    }

    /// The shortest time a pending marker must be kept: its claim, the second `_ts` may
    /// truncate, and the clock margin, in whole seconds.
    pub(crate) fn shortest_marker_life(&self) -> u64 {
        self.claim_seconds()
            .saturating_add(1)
            .saturating_add(self.clock_margin.as_secs())
            .saturating_add(u64::from(self.clock_margin.subsec_nanos() > 0))
    }

    /// Sets [`partition_key_path`](Self::partition_key_path).
    pub fn partition_key_path(mut self, path: impl Into<String>) -> Self {
        self.partition_key_path = path.into();
        self
    }

    /// Sets [`marker_ttl_seconds`](Self::marker_ttl_seconds).
    pub fn marker_ttl_seconds(mut self, seconds: i64) -> Self {
        self.marker_ttl_seconds = Some(seconds);
        self
    }

    /// Sets [`read_back_attempts`](Self::read_back_attempts) and
    /// [`read_back_interval`](Self::read_back_interval).
    pub fn read_back(mut self, attempts: u32, interval: Duration) -> Self {
        self.read_back_attempts = attempts;
        self.read_back_interval = interval;
        self
    }

    /// Refuses what cannot work, in the .NET module's order.
    pub fn validate(&self) -> Result<(), InboxOptionsError> {
        if self.database.trim().is_empty() {
            return Err(InboxOptionsError::BlankDatabase);
        }
        if self.container.trim().is_empty() {
            return Err(InboxOptionsError::BlankContainer);
        }
        let path = self.partition_key_path.as_str();
        if path.trim().is_empty() || partition_key::segments(path).next().is_none() {
            return Err(InboxOptionsError::NoPartitionKeyPath);
        }
        if partition_key::segments(path).any(|segment| segment.trim().is_empty()) {
            return Err(InboxOptionsError::BlankPartitionKeySegment);
        }
        let root = partition_key::segments(path).next().unwrap_or_default();
        if CLAIMED_MARKER_RESERVED_ROOT_FIELDS.contains(&root) {
            return Err(InboxOptionsError::ReservedRoot {
                root: root.to_owned(),
            });
        }
        if self.read_back_attempts == 0 {
            return Err(InboxOptionsError::NoReadBack);
        }
        if self.marker_ttl_seconds.is_some_and(|ttl| ttl > 0) && root == TTL_FIELD {
            return Err(InboxOptionsError::TtlPath);
        }
        if self.claim_timeout < Duration::from_secs(1) || self.claim_timeout > MAX_CLAIM_TIMEOUT {
            return Err(InboxOptionsError::ClaimTimeout {
                timeout: self.claim_timeout,
            });
        }
        let period = self.period();
        if period < Duration::from_secs(1) || period > MAX_CLAIM_TIMEOUT {
            return Err(InboxOptionsError::ClaimPeriod { period });
        }
        let renewal = self.renewal();
        if renewal < MIN_RENEWAL_INTERVAL || renewal > period / 2 {
            return Err(InboxOptionsError::RenewalInterval { renewal, period });
        }
        if let Some(ttl) = self.marker_ttl_seconds.filter(|ttl| *ttl > 0) {
            self.check_marker_life(ttl, "the marker ttl")?;
        }
        Ok(())
    }

    /// Refuses a time-to-live (`what`: the marker ttl, the container's default) that could
    /// delete a pending marker while its claim may still be live: the next copy of the message
    /// would then claim it afresh and run beside the live handler.
    pub(crate) fn check_marker_life(
        &self,
        ttl_seconds: i64,
        what: &'static str,
    ) -> Result<(), InboxOptionsError> {
        let shortest = self.shortest_marker_life();
        if u64::try_from(ttl_seconds).is_ok_and(|ttl| ttl <= shortest) {
            return Err(InboxOptionsError::MarkerOutlivedByClaim {
                what,
                ttl_seconds,
                claim_seconds: self.claim_seconds(),
                shortest,
            });
        }
        Ok(())
    }
}

/// Why [`InboxOptions`] were refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum InboxOptionsError {
    /// The database is blank.
    #[error("A non-null, non-whitespace database is required.")]
    BlankDatabase,
    /// The container is blank.
    #[error("A non-null, non-whitespace container is required.")]
    BlankContainer,
    /// No partition-key path.
    #[error("A container partition-key path is required.")]
    NoPartitionKeyPath,
    /// A blank segment in the path.
    #[error("Every container partition-key path segment must be non-null and non-whitespace.")]
    BlankPartitionKeySegment,
    /// The path is rooted at a field the marker owns (`id`, `_chatterType`, `MessageId`,
    /// `ReceivedAtUtc`) or the one its second phase patches (`Completed`).
    #[error(
        "The standalone inbox's partition-key path is rooted at '{root}', a field the Claimed Inbox Marker owns; the partition-value stamp would overwrite it. Use another path (default '/idempotencyKey')."
    )]
    ReservedRoot {
        /// The root segment.
        root: String,
    },
    /// No read-back attempt.
    #[error("ReadBackMaxAttempts must be at least 1 so the confirm read-back runs at least once.")]
    NoReadBack,
    /// A positive ttl with a path rooted at `/ttl`.
    #[error(
        "A positive MarkerTimeToLive stamps the Cosmos-reserved 'ttl' field, which collides with a partition-key path rooted at '/ttl' (the partition-value stamp would overwrite the numeric TTL). Use a non-'/ttl' partition-key path (default '/idempotencyKey') or leave MarkerTimeToLive unset."
    )]
    TtlPath,
    /// The claim timeout is under a second or over a day.
    #[error(
        "the standalone inbox's claim timeout ({timeout:?}, a runtime's delivery timeout) must be between one second (a claim is kept in whole seconds) and a day (a crashed attempt's claim is taken over only once it ran out: a longer one would hold its message id that long)"
    )]
    ClaimTimeout {
        /// The claim timeout.
        timeout: Duration,
    },
    /// The claim period is under a second or over a day.
    #[error(
        "the standalone inbox's claim period ({period:?}) must be between one second (a claim is kept in whole seconds) and a day"
    )]
    ClaimPeriod {
        /// The claim period.
        period: Duration,
    },
    /// The renewal interval is under [`MIN_RENEWAL_INTERVAL`], or over half the claim period
    /// (one failed renewal would let the claim run out while its handler runs).
    #[error(
        "the standalone inbox's renewal interval ({renewal:?}) must be at least 100 ms and at most half its claim period ({period:?}): a claim renewed less often runs out after one failed renewal while its handler runs"
    )]
    RenewalInterval {
        /// The renewal interval.
        renewal: Duration,
        /// The claim period.
        period: Duration,
    },
    /// A time-to-live would delete a pending marker while its claim may still be live.
    #[error(
        "{what} ({ttl_seconds} s) could delete a pending inbox marker while its handler may still run (a claim lasts {claim_seconds} s from its last renewal: the claim period, plus the second Cosmos's `_ts` truncates and the clock margin: {shortest} s in all); a copy of the message arriving then would claim it afresh and run the handler beside the live one. Set a time-to-live above {shortest} s (a day or a week is usual; with a `lease` the container's default must stay unset or -1, so set `marker_ttl`), or shorten the claim period"
    )]
    MarkerOutlivedByClaim {
        /// Which time-to-live: the marker ttl or the container's default.
        what: &'static str,
        /// Its seconds.
        ttl_seconds: i64,
        /// The claim, in seconds.
        claim_seconds: u64,
        /// The shortest time-to-live accepted, minus one.
        shortest: u64,
    },
}
