//! Lease faults: what the processor reports when a lease cannot make progress.
//!
//! A processor never stops on a fault: it reports it to the fault handler
//! ([`ChangeFeedProcessorBuilder::on_fault`](crate::ChangeFeedProcessorBuilder::on_fault)) and
//! tries again after the poll interval. Without a handler every fault is logged at Error.

use std::any::Any;
use std::error::Error;
use std::sync::Arc;

/// Where in a lease's work a fault happened.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum LeaseFaultStage {
    /// Reading a page of the change feed failed.
    Read,
    /// The batch handler returned an error or panicked: the page is read again.
    Handler,
    /// Writing the checkpoint after a handled page failed: the page is read again.
    Checkpoint,
    /// Renewing the lease failed.
    Renew,
}

impl LeaseFaultStage {
    /// `read`, `handler`, `checkpoint` or `renew`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Read => "read",
            Self::Handler => "handler",
            Self::Checkpoint => "checkpoint",
            Self::Renew => "renew",
        }
    }
}

/// One fault on one lease.
#[derive(Debug, Clone, Copy)]
#[non_exhaustive]
pub struct LeaseFault<'a> {
    /// The lease (feed range) that faulted.
    pub lease_token: &'a str,
    /// Where.
    pub stage: LeaseFaultStage,
    /// What went wrong: the store's or the handler's error.
    pub error: &'a (dyn Error + 'static),
}

pub(crate) type FaultHandler = Arc<dyn Fn(&LeaseFault<'_>) + Send + Sync>;

/// The handler of a processor built without one: every fault at Error.
pub(crate) fn log_fault(processor: String) -> FaultHandler {
    Arc::new(move |fault: &LeaseFault<'_>| {
        tracing::error!(
            processor,
            lease = fault.lease_token,
            stage = fault.stage.as_str(),
            error = fault.error,
            "change-feed lease faulted; it is retried after the poll interval"
        );
    })
}

/// The batch handler panicked.
#[derive(Debug, thiserror::Error)]
#[error("the batch handler panicked: {message}")]
#[non_exhaustive]
pub struct HandlerPanicked {
    /// The panic's message, when it was a string.
    pub message: String,
}

impl HandlerPanicked {
    pub(crate) fn from_payload(payload: &(dyn Any + Send)) -> Self {
        let message = payload
            .downcast_ref::<&str>()
            .map(|s| (*s).to_owned())
            .or_else(|| payload.downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "a non-string payload".to_owned());
        Self { message }
    }
}

/// The batch handler did not finish within
/// [`handler_timeout`](crate::ChangeFeedProcessorOptions::handler_timeout); it was cancelled and
/// the page is read again.
#[derive(Debug, thiserror::Error)]
#[error(
    "the batch handler did not finish within {after:?}; it was cancelled and the page is read again"
)]
#[non_exhaustive]
pub struct HandlerTimedOut {
    /// The timeout that elapsed.
    pub after: std::time::Duration,
}
