//! What the batch handler is handed and returns: one page of a feed range
//! ([`ChangeFeedBatch`]), whether its lease is still this instance's ([`LeaseLost`]), and the
//! handler's future and error.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use azure_data_cosmos::feed::FeedRange;
use futures::future::BoxFuture;
use serde_json::Value;
use tokio_util::sync::CancellationToken;

/// One page of changed documents from one feed range, handed to the batch handler.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct ChangeFeedBatch {
    /// The changed documents, in change-feed order, as stored (system properties included).
    /// Never empty.
    pub documents: Vec<Value>,
    /// The lease token: the feed range the documents come from, as `{min}-{max}`
    /// (hex effective-partition-key bounds).
    pub lease_token: String,
    /// The lease's feed range, as the SDK knows it (e.g. to read or query just that range).
    pub feed_range: FeedRange,
    /// The Request Units the read of this page was billed (`x-ms-request-charge`; 0 when the
    /// response did not say).
    pub request_charge: f64,
    /// Tells the handler when this instance lost the lease while the page is being handled
    /// (another instance took it, or it could not be renewed for almost its expiry): the new
    /// owner hands the same documents over again, so a handler with long work may stop early.
    /// Whatever it returns then, this instance checkpoints nothing more (unless a shutdown or a
    /// split had stopped the lease first: those write their position, guarded by the lease's
    /// ETag, which fails once another instance wrote the lease).
    pub lease_lost: LeaseLost,
}

impl ChangeFeedBatch {
    /// The documents deserialized as `T`, in change-feed order (a handler whose container
    /// holds one shape; use [`documents`](Self::documents) for several).
    ///
    /// # Errors
    ///
    /// The first document that is not a `T`, naming its position and id; the batch is handed
    /// over again if the handler returns the error, so a document no `T` will ever read needs
    /// handling (skip it by deserializing one at a time).
    pub fn documents_as<T: serde::de::DeserializeOwned>(&self) -> Result<Vec<T>, DocumentError> {
        self.documents
            .iter()
            .enumerate()
            .map(|(position, document)| {
                T::deserialize(document).map_err(|source| DocumentError {
                    position,
                    id: document
                        .get("id")
                        .and_then(Value::as_str)
                        .unwrap_or_default()
                        .to_owned(),
                    type_name: std::any::type_name::<T>(),
                    source,
                })
            })
            .collect()
    }
}

/// A document of a [`ChangeFeedBatch`] that is not of the type asked for.
#[derive(Debug, thiserror::Error)]
#[error("change-feed document {position} (id '{id}') is not a {type_name}")]
#[non_exhaustive]
pub struct DocumentError {
    /// Its position in the batch.
    pub position: usize,
    /// Its `id` (empty when it has none).
    pub id: String,
    /// The type asked for.
    pub type_name: &'static str,
    /// Why it does not deserialize.
    #[source]
    pub source: serde_json::Error,
}

/// Whether the lease of a [`ChangeFeedBatch`] was lost while its page is being handled.
/// Clones share the state.
///
/// Lost once the renewer finds another instance's write, or gives the lease up; and at once
/// when the lease has gone unwritten past its give-up point (a margin before the expiry), even
/// before the renewer wakes to say so: a process paused past the expiry (a long GC or
/// scheduling pause, a suspended VM) resumes with its lease possibly someone else's, and a
/// handler that asks before each piece of work starts none of it.
#[derive(Clone)]
pub struct LeaseLost {
    token: CancellationToken,
    /// When the lease was last written, as the worker records it.
    written: Arc<Mutex<Instant>>,
    /// How long after that write the lease counts as lost.
    give_up_after: Duration,
    /// Set once the give-up point was seen passed: the loss, once told, stays told (a write in
    /// flight may land after it and move the point on, but the handler may have stopped).
    seen: Arc<AtomicBool>,
}

impl std::fmt::Debug for LeaseLost {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LeaseLost")
            .field("lost", &self.is_lost())
            .finish_non_exhaustive()
    }
}

impl LeaseLost {
    pub(crate) fn new(
        token: CancellationToken,
        written: Arc<Mutex<Instant>>,
        give_up_after: Duration,
    ) -> Self {
        Self {
            token,
            written,
            give_up_after,
            seen: Arc::default(),
        }
    }

    /// When the lease stops counting as held unless it is written again (none for an expiry
    /// too long to reach).
    fn deadline(&self) -> Option<Instant> {
        let written = *self.written.lock().unwrap_or_else(|p| p.into_inner());
        written.checked_add(self.give_up_after)
    }

    /// Whether the lease is lost now. Once true, it stays true.
    pub fn is_lost(&self) -> bool {
        if self.token.is_cancelled() || self.seen.load(Ordering::Acquire) {
            return true;
        }
        let passed = self.deadline().is_some_and(|at| Instant::now() >= at);
        if passed {
            self.seen.store(true, Ordering::Release);
        }
        passed
    }

    /// Completes once the lease is lost (never, while it stays this instance's): race it
    /// against the handler's work with `tokio::select!`. It sleeps on tokio's timer until the
    /// lease's give-up point, so await it on a runtime with time enabled (as the processor's
    /// own is); elsewhere tokio panics. [`is_lost`](Self::is_lost) needs no runtime.
    pub async fn lost(&self) {
        loop {
            if self.is_lost() {
                return;
            }
            // The deadline moves with each renewal: looked at again when it passes.
            let Some(deadline) = self.deadline() else {
                return self.token.cancelled().await;
            };
            tokio::select! {
                () = self.token.cancelled() => return,
                () = tokio::time::sleep_until(deadline.into()) => {}
            }
        }
    }
}

/// The error a batch handler returns: any error, reported as a [`LeaseFault`](crate::LeaseFault)
/// of stage [`LeaseFaultStage::Handler`](crate::LeaseFaultStage::Handler).
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// The future a batch handler returns.
pub type BatchFuture = BoxFuture<'static, Result<(), BoxError>>;

pub(crate) type BatchHandler = Arc<dyn Fn(ChangeFeedBatch) -> BatchFuture + Send + Sync>;

#[cfg(test)]
mod tests {
    use super::*;

    // A write in flight when the give-up point passed (a slow checkpoint holding the lease's
    // lock) may land after the handler was told the lease is lost, and move the point on; the
    // handler may have stopped by then, so the page must stay lost (the worker asks again).
    #[test]
    fn a_lease_told_lost_stays_lost_after_a_late_write_lands() {
        let written = Arc::new(Mutex::new(Instant::now() - Duration::from_secs(3)));
        let lease = LeaseLost::new(
            CancellationToken::new(),
            Arc::clone(&written),
            Duration::from_secs(1),
        );
        let handed = lease.clone();
        assert!(handed.is_lost(), "past the give-up point");
        *written.lock().unwrap() = Instant::now();
        assert!(lease.is_lost(), "told once, lost for good");
        let fresh = LeaseLost::new(CancellationToken::new(), written, Duration::from_secs(1));
        assert!(
            !fresh.is_lost(),
            "a page handed over after the write is not"
        );
    }
}
