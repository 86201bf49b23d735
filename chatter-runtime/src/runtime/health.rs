//! [`Health`]: what a running [`Runtime`](super::Runtime) is doing now, to back a liveness or
//! readiness probe.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use crate::broker::Liveness;

/// A consumer's state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum ConsumerState {
    /// Consuming its destination.
    Subscribed,
    /// Its subscription was lost (broker restart, dropped connection); it subscribes again with
    /// backoff and was logged at Error when the outage started.
    Reconnecting,
    /// Stopped by a shutdown.
    Stopped,
}

/// One command's consumer.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct ConsumerHealth {
    /// The command it delivers.
    pub command: &'static str,
    /// The destination it consumes.
    pub destination: &'static str,
    /// What it is doing now.
    pub state: ConsumerState,
    /// The last error while reconnecting, if it is reconnecting.
    pub last_error: Option<String>,
}

/// One change-feed lease this instance owns.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct LeaseHealth {
    /// The relay processor (source identity) it belongs to.
    pub processor: String,
    /// The lease token (feed range).
    pub lease_token: String,
    /// How long ago it last confirmed its position; `None` before its first read.
    pub last_checkpoint_age: Option<Duration>,
    /// The fault it is failing with now, if any.
    pub last_error: Option<String>,
    /// Whether that fault does not clear by itself (the store refuses the lease's reads for
    /// permissions, a missing container or a continuation it does not accept): an operator
    /// must act; the read is tried again every `max_backoff`.
    pub needs_operator: bool,
    /// Whether it is under a Drain Suspension (its confirmations kept failing).
    pub suspended: bool,
    /// Why the broker refuses one of its pending documents, while it does: the lease is blocked
    /// on a broker setting (a permission, a conflicting queue, a size limit, no route), or on a
    /// message a standalone relay's body resolver built that the broker can never take. The
    /// reason names the destination, the broker's reply and the fix; the documents stay
    /// pending and are published once it is fixed, without a restart.
    pub blocked: Option<String>,
    /// The pending Outbox Documents after its checkpoint, as last estimated (every
    /// [`RelayOptions::backlog_interval`](crate::relay::RelayOptions::backlog_interval)); `None` with
    /// metrics off or before the first estimate.
    pub backlog: Option<u64>,
    /// The age of the oldest pending Outbox Document of its feed range (by its last write), as
    /// last swept (every [`RelayOptions::sweep_interval`](crate::relay::RelayOptions::sweep_interval));
    /// `None` when none is pending or before the first sweep. A stall to alert on, whatever
    /// holds the document back; also the `chatter.messaging.outbox.pending.oldest_age` gauge.
    pub oldest_pending_age: Option<Duration>,
    /// The pending Outbox Documents the stranded-document sweep found behind its checkpoint
    /// (read past without being published) since this instance owns the lease. Each was logged
    /// at Error, naming it, and written back so that it is published; not 0 means something
    /// read past pending documents, worth a look. Also the `chatter.messaging.outbox.stranded`
    /// counter.
    pub stranded: u64,
}

/// What a runtime is doing now ([`Runtime::health`](super::Runtime::health)).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Health {
    /// Every consumer, one per registered command (none with `consume(false)`).
    pub consumers: Vec<ConsumerHealth>,
    /// Every lease this instance owns now (other instances own the rest).
    pub leases: Vec<LeaseHealth>,
}

impl Health {
    /// Whether everything makes progress: every consumer is subscribed and no owned lease is
    /// failing, suspended or blocked. A readiness probe answers 503 while this is `false`; every
    /// `false` has been logged at Error with its cause.
    pub fn is_healthy(&self) -> bool {
        self.consumers
            .iter()
            .all(|c| c.state == ConsumerState::Subscribed)
            && self
                .leases
                .iter()
                .all(|l| l.last_error.is_none() && !l.suspended && l.blocked.is_none())
    }
}

/// A consumer's shared state: written by its task, read by [`Health`].
#[derive(Debug, Clone)]
pub(super) struct ConsumerStatus {
    pub(super) command: &'static str,
    pub(super) destination: &'static str,
    inner: Arc<Mutex<StatusInner>>,
}

#[derive(Debug)]
struct StatusInner {
    liveness: Option<Liveness>,
    reconnecting: bool,
    stopped: bool,
    last_error: Option<String>,
}

impl ConsumerStatus {
    pub(super) fn new(command: &'static str, destination: &'static str) -> Self {
        Self {
            command,
            destination,
            inner: Arc::new(Mutex::new(StatusInner {
                liveness: None,
                reconnecting: false,
                stopped: false,
                last_error: None,
            })),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, StatusInner> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    pub(super) fn subscribed(&self, liveness: Liveness) {
        let mut inner = self.lock();
        inner.liveness = Some(liveness);
        inner.reconnecting = false;
        inner.last_error = None;
    }

    pub(super) fn reconnecting(&self, error: Option<String>) {
        let mut inner = self.lock();
        inner.reconnecting = true;
        if error.is_some() {
            inner.last_error = error;
        }
    }

    pub(super) fn stopped(&self) {
        self.lock().stopped = true;
    }

    pub(super) fn health(&self) -> ConsumerHealth {
        let inner = self.lock();
        let live = inner.liveness.as_ref().is_some_and(Liveness::is_live);
        let state = if inner.stopped {
            ConsumerState::Stopped
        } else if inner.reconnecting || !live {
            ConsumerState::Reconnecting
        } else {
            ConsumerState::Subscribed
        };
        ConsumerHealth {
            command: self.command,
            destination: self.destination,
            state,
            last_error: inner.last_error.clone(),
        }
    }
}
