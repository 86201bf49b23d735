//! Keeps a running handler's claim: renews it every renewal interval with a patch of the marker
//! conditional on its ETag, which the store dates anew (`_ts`), so a claim is short (an attempt
//! that crashes frees its message id within the claim period) and a handler still runs for as
//! long as its process lives and its renewals land. A handler that finishes within one interval
//! costs no renewal.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Mutex, PoisonError};
use std::task::{Context, Poll};
use std::time::Duration;

use serde_json::Value;
use tokio::sync::watch;
use tokio::time::Instant;

use super::StandaloneInbox;
use crate::cosmos::PartitionKey;
use crate::cosmos::store::{self, PatchOp, ReadOutcome};
use crate::document::inbox_marker::{self, CLAIM_SECONDS_FIELD, RECEIVED_AT_UTC_FIELD};

/// How long a failed renewal waits before it is tried again, at most (a quarter of the renewal
/// interval when that is shorter, and never under [`MIN_RETRY`]).
const RETRY_AFTER: Duration = Duration::from_secs(1);

/// The shortest wait before a failed renewal is tried again: an outage is not hammered.
const MIN_RETRY: Duration = Duration::from_millis(50);

/// This attempt's claim while its handler runs.
pub(super) struct Claim {
    /// The marker's ETag: each renewal changes it, and the completion or release is conditional
    /// on the last one.
    etag: Mutex<Option<String>>,
    /// When the claim ends by this process's clock: the start of its last write that landed
    /// plus the claim period, less a guard. Every reader judges it later (by the store's
    /// `_ts`, the second it may truncate and its clock margin), so the handler stops before
    /// anyone may take the claim over, with the guard to spare for timers and the executor.
    ends: Mutex<Instant>,
    period: Duration,
}

/// Why a handler's claim was lost while it ran.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Lost {
    /// No renewal landed before the claim's end.
    RanOut,
    /// The marker is no longer this attempt's claim: another attempt took it over, or it is
    /// gone.
    TakenOver,
}

/// What a read of the marker says of this attempt's claim.
enum Ours {
    /// Still this attempt's pending claim, at this ETag.
    Yes(Option<String>),
    /// Another attempt's, completed, released or gone.
    No,
    /// The read failed: nothing is known.
    Unknown,
}

impl Claim {
    /// The claim a write of the marker that started `at` (and answered `etag`) made, for
    /// `period`.
    pub(super) fn new(etag: Option<String>, at: Instant, period: Duration) -> Self {
        Self {
            etag: Mutex::new(etag),
            ends: Mutex::new(Self::end(at, period)),
            period,
        }
    }

    fn end(at: Instant, period: Duration) -> Instant {
        // A quarter of the period, at most a second.
        let guard = (period / 4).min(Duration::from_secs(1));
        at.checked_add(period.saturating_sub(guard))
            .unwrap_or_else(super::claim::far_future)
    }

    /// The marker's last ETag.
    pub(super) fn etag(&self) -> Option<String> {
        self.etag
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// When the claim ends, by this process's clock.
    pub(super) fn ends(&self) -> Instant {
        *self.ends.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn set_etag(&self, etag: Option<String>) {
        *self.etag.lock().unwrap_or_else(PoisonError::into_inner) = etag;
    }

    fn renewed(&self, etag: Option<String>, at: Instant) {
        self.set_etag(etag);
        *self.ends.lock().unwrap_or_else(PoisonError::into_inner) = Self::end(at, self.period);
    }
}

/// A handler's future that is polled only while its claim has not ended (by this process's
/// clock): a process resuming from a pause past its claim does not run another step of it.
pub(super) struct WhileClaimed<'a, F> {
    pub(super) claim: &'a Claim,
    pub(super) handler: Pin<&'a mut F>,
}

impl<F: Future> Future for WhileClaimed<'_, F> {
    /// `None`: the claim ended first.
    type Output = Option<F::Output>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        if Instant::now() >= self.claim.ends() {
            return Poll::Ready(None);
        }
        self.handler.as_mut().poll(cx).map(Some)
    }
}

impl StandaloneInbox {
    /// Renews `claim` of the marker `marker_id` (whose `ReceivedAtUtc` is `received_at`: it
    /// names this attempt), written at `claimed_at`, every renewal interval until `stop` turns
    /// true (a renewal under way then finishes, so the claim's ETag is known; none starts
    /// after), or until the claim is lost. No renewal while the claim already outlasts the
    /// handler's `deadline`.
    #[allow(clippy::too_many_arguments)]
    pub(super) async fn keep(
        &self,
        key: PartitionKey,
        marker_id: &str,
        received_at: &str,
        claim: &Claim,
        claimed_at: Instant,
        deadline: Instant,
        mut stop: watch::Receiver<bool>,
        message_id: &str,
    ) -> Option<Lost> {
        let interval = self.options.renewal();
        let retry = RETRY_AFTER.min(interval / 4).max(MIN_RETRY);
        let mut last = claimed_at;
        loop {
            let next = (last + interval).min(claim.ends());
            tokio::select! {
                biased;
                _ = stop.wait_for(|stop| *stop) => return None,
                () = tokio::time::sleep_until(next) => {}
            }
            // Renewed until it lands, the claim ends, or the handler is done.
            loop {
                if *stop.borrow() {
                    return None;
                }
                let attempt = Instant::now();
                let ends = claim.ends();
                if attempt >= ends {
                    return Some(Lost::RanOut);
                }
                if ends >= deadline {
                    // The claim already outlasts the handler's deadline: nothing to renew.
                    tokio::select! {
                        biased;
                        _ = stop.wait_for(|stop| *stop) => return None,
                        () = tokio::time::sleep_until(ends) => return Some(Lost::RanOut),
                    }
                }
                let left = ends - attempt;
                // The store gives every write an ETag; without one the marker is read for it.
                let Some(etag) = claim.etag() else {
                    match self.ours(key.clone(), marker_id, received_at, left).await {
                        Ours::Yes(Some(etag)) => {
                            claim.set_etag(Some(etag));
                            continue;
                        }
                        Ours::No => return Some(Lost::TakenOver),
                        Ours::Yes(None) | Ours::Unknown => {
                            tokio::time::sleep(retry.min(left)).await;
                            continue;
                        }
                    }
                };
                let renew = [PatchOp::Set(
                    format!("/{CLAIM_SECONDS_FIELD}"),
                    Value::from(self.options.claim_seconds()),
                )];
                let patched = store::bounded(
                    "patch_item",
                    left.min(self.options.store_timeout),
                    store::patch_item_if_match(
                        &self.container,
                        key.clone(),
                        marker_id,
                        &renew,
                        &etag,
                    ),
                )
                .await;
                match patched {
                    Ok(written) => {
                        claim.renewed(written.etag, attempt);
                        last = attempt;
                        break;
                    }
                    // Gone: a copy may create it afresh at once.
                    Err(error) if error.is_status(404) => return Some(Lost::TakenOver),
                    Err(error) if error.is_status(412) => {
                        // A renewal whose answer was lost may have landed: the marker is still
                        // this attempt's if it names the same `ReceivedAtUtc` and is pending.
                        let left = claim.ends().saturating_duration_since(Instant::now());
                        match self.ours(key.clone(), marker_id, received_at, left).await {
                            Ours::Yes(etag) => claim.set_etag(etag),
                            Ours::No => return Some(Lost::TakenOver),
                            Ours::Unknown => tokio::time::sleep(retry.min(left)).await,
                        }
                    }
                    Err(error) => {
                        tracing::debug!(message_id, error = %crate::error_chain::ErrorChain(&error), "chatter inbox could not renew a running handler's claim; trying again until it ends");
                        let left = claim.ends().saturating_duration_since(Instant::now());
                        tokio::time::sleep(retry.min(left)).await;
                    }
                }
            }
        }
    }

    /// The marker's ETag if it is still this attempt's pending claim (named by its
    /// `ReceivedAtUtc`, not completed, not released); read within `within`.
    async fn ours(
        &self,
        key: PartitionKey,
        marker_id: &str,
        received_at: &str,
        within: Duration,
    ) -> Ours {
        let read = store::bounded(
            "read_item",
            within.min(self.options.store_timeout),
            store::read_item(&self.container, key, marker_id),
        )
        .await;
        match read {
            Ok(ReadOutcome::Found { document, etag }) => {
                let ours = document.get(RECEIVED_AT_UTC_FIELD).and_then(Value::as_str)
                    == Some(received_at)
                    && !inbox_marker::is_completed(&document)
                    && document.get(CLAIM_SECONDS_FIELD).and_then(Value::as_u64) != Some(0);
                if ours { Ours::Yes(etag) } else { Ours::No }
            }
            Ok(ReadOutcome::NotFound) => Ours::No,
            Err(_) => Ours::Unknown,
        }
    }

    /// After this attempt's completion or release met a 412: the marker's ETag if it is still
    /// this attempt's claim (a renewal whose answer was lost changed it), to write again on.
    pub(super) async fn still_ours(
        &self,
        key: PartitionKey,
        marker_id: &str,
        received_at: &str,
    ) -> Option<String> {
        match self
            .ours(key, marker_id, received_at, self.options.store_timeout)
            .await
        {
            Ours::Yes(etag) => etag,
            Ours::No | Ours::Unknown => None,
        }
    }
}
