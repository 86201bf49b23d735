//! Keeps a running handler's claim: renews it every renewal interval with a patch of the marker
//! conditional on its ETag, which the store dates anew (`_ts`), so a claim is short (an attempt
//! that crashes frees its message id within the claim period) and a handler still runs for as
//! long as its process lives and its renewals land. A handler that finishes within one interval
//! costs no renewal.

use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use serde_json::Value;
use tokio::sync::watch;
use tokio::time::Instant;

use super::StandaloneInbox;
use crate::cosmos::PartitionKey;
use crate::cosmos::store::{self, PatchOp, ReadOutcome};
use crate::document::inbox_marker::{self, CLAIM_SECONDS_FIELD, RECEIVED_AT_UTC_FIELD};

/// How long a failed renewal waits before it is tried again, at most (a quarter of the renewal
/// interval when that is shorter).
const RETRY_AFTER: Duration = Duration::from_secs(1);

/// This attempt's claim while its handler runs.
pub(super) struct Claim {
    /// The marker's ETag: each renewal changes it, and the completion or release is conditional
    /// on the last one.
    etag: Mutex<Option<String>>,
    /// When the claim ends by this process's clock: the start of its last write that landed
    /// plus the claim period. Every reader judges it later (by the store's `_ts`, a second and
    /// its clock margin), so the handler stops before anyone may take the claim over.
    ends: Mutex<Instant>,
}

/// Why a handler's claim was lost while it ran.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Lost {
    /// No renewal landed before the claim's end.
    RanOut,
    /// The marker is no longer this attempt's claim: another attempt took it over.
    TakenOver,
}

impl Claim {
    /// The claim a write of the marker that started `at` (and answered `etag`) made.
    pub(super) fn new(etag: Option<String>, at: Instant, period: Duration) -> Self {
        Self {
            etag: Mutex::new(etag),
            ends: Mutex::new(
                at.checked_add(period)
                    .unwrap_or_else(super::claim::far_future),
            ),
        }
    }

    /// The marker's last ETag.
    pub(super) fn etag(&self) -> Option<String> {
        self.etag
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    fn ends(&self) -> Instant {
        *self.ends.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn renewed(&self, etag: Option<String>, at: Instant, period: Duration) {
        *self.etag.lock().unwrap_or_else(PoisonError::into_inner) = etag;
        *self.ends.lock().unwrap_or_else(PoisonError::into_inner) = at
            .checked_add(period)
            .unwrap_or_else(super::claim::far_future);
    }
}

impl StandaloneInbox {
    /// Renews `claim` of the marker `marker_id` (whose `ReceivedAtUtc` is `received_at`: it
    /// names this attempt) every renewal interval until `stop` turns true (a renewal under way
    /// then finishes, so the claim's ETag is known), or until the claim is lost.
    pub(super) async fn keep(
        &self,
        key: PartitionKey,
        marker_id: &str,
        received_at: &str,
        claim: &Claim,
        mut stop: watch::Receiver<bool>,
        message_id: &str,
    ) -> Option<Lost> {
        let period = self.options.period();
        let interval = self.options.renewal();
        let mut last = Instant::now();
        loop {
            tokio::select! {
                _ = stop.wait_for(|stop| *stop) => return None,
                () = tokio::time::sleep_until(last + interval) => {}
            }
            loop {
                let attempt = Instant::now();
                let ends = claim.ends();
                if attempt >= ends {
                    return Some(Lost::RanOut);
                }
                // The store gives every write an ETag; without one the claim cannot be renewed
                // safely: the handler stops when it ends.
                let Some(etag) = claim.etag() else {
                    tokio::time::sleep_until(ends).await;
                    return Some(Lost::RanOut);
                };
                let renew = [PatchOp::Set(
                    format!("/{CLAIM_SECONDS_FIELD}"),
                    Value::from(self.options.claim_seconds()),
                )];
                let patched = store::bounded(
                    "patch_item",
                    (ends - attempt).min(self.options.store_timeout),
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
                        claim.renewed(written.etag, attempt, period);
                        last = attempt;
                        break;
                    }
                    Err(error) if error.is_status(412) => {
                        // A renewal whose answer was lost may have landed: the marker is still
                        // this attempt's if it names the same `ReceivedAtUtc` and is pending.
                        match self.still_ours(key.clone(), marker_id, received_at).await {
                            Some(etag) => {
                                *claim.etag.lock().unwrap_or_else(PoisonError::into_inner) =
                                    Some(etag);
                            }
                            None => return Some(Lost::TakenOver),
                        }
                    }
                    Err(error) => {
                        tracing::debug!(message_id, error = %crate::error_chain::ErrorChain(&error), "chatter inbox could not renew a running handler's claim; trying again until it ends");
                        let wait = RETRY_AFTER.min(interval / 4);
                        tokio::time::sleep(
                            wait.min(ends.saturating_duration_since(Instant::now())),
                        )
                        .await;
                    }
                }
            }
        }
    }

    /// The marker's ETag if it is still this attempt's pending claim (named by its
    /// `ReceivedAtUtc`); `None` if another attempt's, completed, released or unreadable.
    async fn still_ours(
        &self,
        key: PartitionKey,
        marker_id: &str,
        received_at: &str,
    ) -> Option<String> {
        let read = store::bounded(
            "read_item",
            self.options.store_timeout,
            store::read_item(&self.container, key, marker_id),
        )
        .await;
        let Ok(ReadOutcome::Found { document, etag }) = read else {
            return None;
        };
        let ours = document.get(RECEIVED_AT_UTC_FIELD).and_then(Value::as_str) == Some(received_at)
            && !inbox_marker::is_completed(&document)
            && document.get(CLAIM_SECONDS_FIELD).and_then(Value::as_u64) != Some(0);
        if ours { etag } else { None }
    }
}
