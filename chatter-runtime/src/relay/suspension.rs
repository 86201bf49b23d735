//! Drain Suspension: a lease whose confirmations keep failing stops draining; and the other
//! per-lease state of the drain (a lease blocked by a broker refusal).
//!
//! A Confirmation Failure is a publish the broker confirmed followed by a status stamp that
//! failed: the message is on the broker, the page is not checkpointed, and every redrain would
//! publish it again. Marking the document cannot help (that is a write to the store that refuses
//! writes), so the relay stops draining the lease instead, which needs no write at all:
//!
//! - one [`DrainGate`] per change-feed processor (source identity), state per lease token;
//! - [`CONFIRMATION_FAILURE_THRESHOLD`] consecutive Confirmation Failures open a suspension, and
//!   the lease's pages are refused for the [`SUSPENSION_WINDOW`];
//! - when the window has elapsed, exactly one page is let through as a probe; a probe whose
//!   confirmation fails again waits another full window;
//! - only a [`ConfirmationReceipt`] (a status stamp that landed, delivered or undeliverable)
//!   closes a suspension and resets the count. A page that confirmed nothing (empty, or only
//!   documents that are not pending) is no evidence either way and changes nothing.
//!
//! While a lease has failed confirmations, for its probe, and while the broker refuses one of
//! its documents (the lease is *blocked*, [`DrainGate::record_refusal`]), [`DrainGate::admit`]
//! has its pages drained one document at a time, so a failing page publishes one document
//! however wide it is. A lease that leaves the instance is [forgotten](DrainGate::forget): its
//! new owner, or this instance when it comes back, starts with a clean record.
//!
//! Threshold and window are the specification's constants, not options. The clock is a
//! [`MonotonicClock`], injectable so tests are exact without waiting a minute.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, PoisonError};
use std::time::{Duration, Instant};

use super::diagnostics;
use crate::telemetry::metrics::SourceMetrics;

/// Consecutive Confirmation Failures on one lease that open a Drain Suspension.
pub const CONFIRMATION_FAILURE_THRESHOLD: u32 = 5;

/// How long a suspended lease's pages are refused before one probe is let through.
pub const SUSPENSION_WINDOW: Duration = Duration::from_secs(60);

/// A monotonic clock: the time elapsed since some fixed origin.
pub trait MonotonicClock: Send + Sync + 'static {
    /// The time elapsed since this clock's origin; never decreases.
    fn now(&self) -> Duration;
}

/// The process's monotonic clock ([`Instant`]).
#[derive(Debug, Clone, Copy)]
pub(crate) struct SystemClock {
    origin: Instant,
}

impl Default for SystemClock {
    fn default() -> Self {
        Self {
            origin: Instant::now(),
        }
    }
}

impl MonotonicClock for SystemClock {
    fn now(&self) -> Duration {
        self.origin.elapsed()
    }
}

#[cfg(feature = "test-support")]
/// A clock that moves only when told to ([`ManualClock::advance`]), for tests.
#[derive(Debug, Default)]
pub struct ManualClock(Mutex<Duration>);

#[cfg(feature = "test-support")]
impl ManualClock {
    /// A clock at its origin.
    pub fn new() -> Self {
        Self::default()
    }

    /// Moves the clock forward by `by`.
    pub fn advance(&self, by: Duration) {
        *self.0.lock().unwrap_or_else(PoisonError::into_inner) += by;
    }
}

#[cfg(feature = "test-support")]
impl MonotonicClock for ManualClock {
    fn now(&self) -> Duration {
        *self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// Evidence that a status stamp (delivered or undeliverable) landed in the store: the status
/// write path is up. Minted by the drain for each stamp that returned; a page's receipts are
/// combined and presented to the gate once, after all its documents.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConfirmationReceipt;

/// One lease's record: its confirmations, and whether the broker refuses its documents.
#[derive(Debug, Clone, Default)]
struct LeaseDrainState {
    consecutive_failures: u32,
    /// When the suspension was opened or last re-armed; `None` while not suspended.
    suspended_at: Option<Duration>,
    /// Why the broker refuses a document of this lease, while its pages fail on that refusal.
    blocked: Option<String>,
}

impl LeaseDrainState {
    /// Whether the record says nothing any more (and is dropped).
    fn is_clear(&self) -> bool {
        self.consecutive_failures == 0 && self.suspended_at.is_none() && self.blocked.is_none()
    }
}

/// How a page of a lease may be drained ([`DrainGate::admit`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admission {
    /// Not at all: the lease is suspended and its probe is not due.
    Refused,
    /// Its partition-key groups concurrently: the lease is doing well.
    Concurrent,
    /// One document at a time, stopping at the first failure: the lease has failed
    /// confirmations, this page is its probe, or the broker refuses one of its documents. A
    /// failing page then publishes at most one document, so the suspension's bound (one
    /// publish per failed page, one per probe window) holds however wide the page is.
    OneAtATime,
}

/// The Drain Suspension gate of one change-feed processor.
pub struct DrainGate {
    source_identity: String,
    clock: Arc<dyn MonotonicClock>,
    leases: Mutex<HashMap<String, LeaseDrainState>>,
    /// Set once, when the relay starts with metrics on.
    metrics: OnceLock<Arc<SourceMetrics>>,
}

impl std::fmt::Debug for DrainGate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DrainGate")
            .field("source_identity", &self.source_identity)
            .field("suspended", &self.suspended_leases())
            .finish_non_exhaustive()
    }
}

impl DrainGate {
    /// The gate of the processor `source_identity` (its processor name), on the system clock.
    pub fn new(source_identity: impl Into<String>) -> Self {
        Self::with_clock(source_identity, Arc::new(SystemClock::default()))
    }

    /// The time on this gate's clock: publish after commit's pause after a failure runs on it
    /// too, so a test's compressed clock shortens both.
    pub(crate) fn now(&self) -> Duration {
        self.clock.now()
    }

    /// The gate of `source_identity` on `clock`.
    pub fn with_clock(source_identity: impl Into<String>, clock: Arc<dyn MonotonicClock>) -> Self {
        Self {
            source_identity: source_identity.into(),
            clock,
            leases: Mutex::new(HashMap::new()),
            metrics: OnceLock::new(),
        }
    }

    /// Counts the suspensions this gate opens on `metrics` (the first call wins).
    pub(crate) fn record_on(&self, metrics: Arc<SourceMetrics>) {
        let _ = self.metrics.set(metrics);
    }

    /// The processor this gate belongs to.
    pub fn source_identity(&self) -> &str {
        &self.source_identity
    }

    /// Whether any lease of this processor is failing now (failed confirmations, suspended,
    /// or blocked by a refusing broker): publish after commit then leaves every document to
    /// the relay, which drains such a lease one document at a time.
    pub(crate) fn any_failing(&self) -> bool {
        !self.leases().is_empty()
    }

    fn leases(&self) -> MutexGuard<'_, HashMap<String, LeaseDrainState>> {
        // Every critical section is a few infallible steps; a poisoned lock holds a consistent map.
        self.leases.lock().unwrap_or_else(PoisonError::into_inner)
    }

    #[cfg(feature = "test-support")]
    /// Whether a page of `lease_token` may be drained now ([`admit`](Self::admit) does not
    /// refuse it).
    pub fn permit_drain(&self, lease_token: &str) -> bool {
        self.admit(lease_token) != Admission::Refused
    }

    /// How a page of `lease_token` may be drained now. A suspended lease is refused until the
    /// window elapsed; then this call re-arms the window and lets exactly this page through as
    /// the probe, one document at a time.
    pub fn admit(&self, lease_token: &str) -> Admission {
        let mut leases = self.leases();
        let Some(state) = leases.get_mut(lease_token) else {
            return Admission::Concurrent;
        };
        if let Some(suspended_at) = state.suspended_at {
            let now = self.clock.now();
            if now.saturating_sub(suspended_at) < SUSPENSION_WINDOW {
                return Admission::Refused;
            }
            state.suspended_at = Some(now);
        }
        Admission::OneAtATime
    }

    /// Counts one Confirmation Failure of `lease_token`. The failure that reaches the threshold
    /// opens a suspension (logged at Error with `error`); every later one re-arms its window.
    pub fn record_confirmation_failure(
        &self,
        lease_token: &str,
        error: &(dyn std::error::Error + 'static),
    ) {
        let now = self.clock.now();
        let opened = {
            let mut leases = self.leases();
            let state = leases.entry(lease_token.to_owned()).or_default();
            state.consecutive_failures = state.consecutive_failures.saturating_add(1);
            if state.consecutive_failures < CONFIRMATION_FAILURE_THRESHOLD {
                None
            } else {
                let was_suspended = state.suspended_at.is_some();
                state.suspended_at = Some(now);
                (!was_suspended).then_some(state.consecutive_failures)
            }
        };
        if let Some(count) = opened {
            diagnostics::drain_suspended(
                self.metrics.get().map(Arc::as_ref),
                &self.source_identity,
                lease_token,
                count,
                error,
            );
        }
    }

    /// Presents the combined receipt of a page that drained. `None` (the page confirmed
    /// nothing) leaves the confirmation record as it is; a receipt forgets it, and a lease that
    /// was suspended resumes (logged). Either way the broker took the page's documents, so a
    /// refusal that blocked the lease is over (logged).
    pub fn record_confirmation_success(
        &self,
        lease_token: &str,
        receipt: Option<ConfirmationReceipt>,
    ) {
        let (resumed, unblocked) = {
            let mut leases = self.leases();
            let Some(state) = leases.get_mut(lease_token) else {
                return;
            };
            let unblocked = state.blocked.take();
            let mut resumed = false;
            if receipt.is_some() {
                resumed = state.suspended_at.is_some();
                state.consecutive_failures = 0;
                state.suspended_at = None;
            }
            if state.is_clear() {
                leases.remove(lease_token);
            }
            (resumed, unblocked)
        };
        if resumed {
            diagnostics::drain_resumed(&self.source_identity, lease_token);
        }
        if unblocked.is_some() {
            diagnostics::refusal_lifted(&self.source_identity, lease_token);
        }
    }

    /// Records that a page of `lease_token` failed because the broker refuses one of its
    /// documents (`error`: a setting an operator changes). A refusal that starts a block, or
    /// that differs from the one blocking the lease, is logged at Error; the lease shows as
    /// blocked with it until a page drains again.
    pub fn record_refusal(&self, lease_token: &str, error: &(dyn std::error::Error + 'static)) {
        let reason = crate::error_chain::ErrorChain(error).to_string();
        let started = {
            let mut leases = self.leases();
            let state = leases.entry(lease_token.to_owned()).or_default();
            state.blocked.replace(reason.clone()).as_ref() != Some(&reason)
        };
        if started {
            diagnostics::refused(&self.source_identity, lease_token, error);
        }
    }

    /// Forgets everything about `lease_token`: this instance no longer owns it. A lease that
    /// comes back starts with a clean record, so a suspension it opens again is logged and
    /// counted again.
    pub fn forget(&self, lease_token: &str) {
        self.leases().remove(lease_token);
    }

    /// Why the broker refuses a document of `lease_token`, while the lease is blocked on that.
    pub fn blocked(&self, lease_token: &str) -> Option<String> {
        self.leases()
            .get(lease_token)
            .and_then(|state| state.blocked.clone())
    }

    /// Whether `lease_token` is suspended now (including while its probe is out).
    pub fn is_suspended(&self, lease_token: &str) -> bool {
        self.leases()
            .get(lease_token)
            .is_some_and(|state| state.suspended_at.is_some())
    }

    /// The lease tokens suspended now, sorted.
    pub fn suspended_leases(&self) -> Vec<String> {
        let mut suspended: Vec<String> = self
            .leases()
            .iter()
            .filter(|(_, state)| state.suspended_at.is_some())
            .map(|(lease, _)| lease.clone())
            .collect();
        suspended.sort();
        suspended
    }
}
