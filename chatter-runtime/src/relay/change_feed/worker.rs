//! One owned lease at work: its poller (read a page, hand it over, checkpoint) and its
//! renewer, sharing the lease document under a lock so every write is ETag-guarded against
//! the latest ETag.

use std::collections::BTreeSet;
use std::num::NonZeroU32;
use std::panic::AssertUnwindSafe;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use azure_data_cosmos::clients::ContainerClient;
use azure_data_cosmos::feed::{ContinuationToken, FeedRange, FeedScope};
use azure_data_cosmos::options::{ChangeFeedOptions, ChangeFeedStartFrom, MaxItemCountHint};
use futures::{FutureExt, StreamExt};
use serde_json::Value;
use tokio_util::sync::CancellationToken;

use super::fault::{FaultHandler, HandlerPanicked, LeaseFault, LeaseFaultStage};
use super::lease::{LeaseDocument, LeaseStore, LeaseWrite, now_millis};
use super::options::{ChangeFeedProcessorOptions, StartFrom};
use super::{BatchHandler, ChangeFeedBatch};
use crate::cosmos::CosmosStoreError;
use crate::registry::BoxError;

/// Why a lease's worker stops.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum StopReason {
    /// Graceful shutdown: release the lease.
    Shutdown,
    /// Someone else owns the lease now: leave it alone.
    Lost,
    /// The feed range split: the coordinator replaces the lease by child leases.
    Split,
}

/// An owned lease: the latest lease document (with its ETag) and the worker's stop signal.
pub(crate) struct LeaseSlot {
    pub(crate) lease: tokio::sync::Mutex<LeaseDocument>,
    pub(crate) range: FeedRange,
    pub(crate) lease_token: String,
    pub(crate) id: String,
    stop: CancellationToken,
    reason: Mutex<Option<StopReason>>,
}

impl LeaseSlot {
    pub(crate) fn new(
        lease: LeaseDocument,
        range: FeedRange,
        shutdown: &CancellationToken,
    ) -> Self {
        Self {
            lease_token: lease.lease_token.clone(),
            id: lease.id.clone(),
            lease: tokio::sync::Mutex::new(lease),
            range,
            stop: shutdown.child_token(),
            reason: Mutex::new(None),
        }
    }

    /// Asks the worker to stop for `reason` (the first reason given wins).
    pub(crate) fn stop(&self, reason: StopReason) {
        let mut current = self.reason.lock().unwrap_or_else(|p| p.into_inner());
        current.get_or_insert(reason);
        self.stop.cancel();
    }

    /// Whether the worker has been asked to stop (or the processor is shutting down).
    pub(crate) fn is_stopping(&self) -> bool {
        self.stop.is_cancelled()
    }

    fn reason(&self) -> StopReason {
        self.reason
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .unwrap_or(StopReason::Shutdown)
    }

    /// Sleeps `duration` unless asked to stop first. `true` when the sleep completed.
    async fn pause(&self, duration: Duration) -> bool {
        tokio::select! {
            () = tokio::time::sleep(duration) => true,
            () = self.stop.cancelled() => false,
        }
    }

    /// Applies `change` to the lease and writes it, guarded by the current ETag. A conflict
    /// (412/404) means the lease was taken: the worker is told to stop.
    ///
    /// Any other failure is reported to the processor's fault handler as a `stage` fault.
    async fn write(
        &self,
        ctx: &WorkerContext,
        stage: LeaseFaultStage,
        change: impl FnOnce(&mut LeaseDocument),
    ) -> Result<(), WriteError> {
        let store = &ctx.store;
        let what = stage.as_str();
        let mut lease = self.lease.lock().await;
        let mut updated = lease.clone();
        change(&mut updated);
        updated.timestamp = now_millis();
        match store.replace(&updated).await {
            LeaseWrite::Written(etag) => {
                updated.etag = etag;
                *lease = updated;
                Ok(())
            }
            LeaseWrite::Conflict => {
                tracing::info!(
                    processor = %store.processor,
                    lease = %self.lease_token,
                    during = what,
                    "lease lost: another instance took it"
                );
                self.stop(StopReason::Lost);
                Err(WriteError::Lost)
            }
            LeaseWrite::Failed(error) => {
                ctx.report(&LeaseFault {
                    lease_token: &self.lease_token,
                    stage,
                    error: &error,
                });
                Err(WriteError::Failed)
            }
        }
    }
}

#[derive(Debug, PartialEq, Eq)]
enum WriteError {
    Lost,
    Failed,
}

/// What a lease's tasks share.
#[derive(Clone)]
pub(crate) struct WorkerContext {
    pub(crate) monitored: Arc<ContainerClient>,
    pub(crate) store: LeaseStore,
    pub(crate) instance: String,
    pub(crate) options: ChangeFeedProcessorOptions,
    pub(crate) handler: BatchHandler,
    pub(crate) owned: Arc<Mutex<BTreeSet<String>>>,
    /// Wakes the coordinator early (e.g. after a 410 hinting at a split).
    pub(crate) wake: Arc<tokio::sync::Notify>,
    /// Told about every lease fault.
    pub(crate) faults: FaultHandler,
}

impl WorkerContext {
    /// Reports `fault` to the fault handler; a handler that panics is contained here.
    pub(crate) fn report(&self, fault: &LeaseFault<'_>) {
        let _ = std::panic::catch_unwind(AssertUnwindSafe(|| (self.faults)(fault)));
    }
}

/// Renews the lease every `lease_renew_interval` until the worker stops.
pub(crate) async fn renew(ctx: WorkerContext, slot: Arc<LeaseSlot>) {
    while slot.pause(ctx.options.lease_renew_interval).await {
        if slot.write(&ctx, LeaseFaultStage::Renew, |_| {}).await == Err(WriteError::Lost) {
            return;
        }
        tracing::trace!(lease = %slot.lease_token, "lease renewed");
    }
}

/// Polls the lease's feed range until the worker stops, then releases the lease if it stopped
/// for a graceful shutdown.
pub(crate) async fn poll(ctx: WorkerContext, slot: Arc<LeaseSlot>) {
    lock_owned(&ctx.owned).insert(slot.lease_token.clone());
    poll_until_stopped(&ctx, &slot).await;
    lock_owned(&ctx.owned).remove(&slot.lease_token);
    if slot.reason() == StopReason::Shutdown {
        release(&ctx, &slot).await;
    }
}

fn lock_owned(owned: &Mutex<BTreeSet<String>>) -> std::sync::MutexGuard<'_, BTreeSet<String>> {
    owned.lock().unwrap_or_else(|p| p.into_inner())
}

async fn poll_until_stopped(ctx: &WorkerContext, slot: &LeaseSlot) {
    let processor = ctx.store.processor.as_str();
    while !slot.is_stopping() {
        let continuation = slot.lease.lock().await.continuation_token.clone();
        let (documents, next) = match read_page(ctx, &slot.range, continuation.as_deref()).await {
            Ok(page) => page,
            Err(error) => {
                if error.status() == Some(410) {
                    tracing::info!(
                        processor, lease = %slot.lease_token, %error,
                        "feed range gone (split or merge in progress); re-reading the feed ranges"
                    );
                    ctx.wake.notify_one();
                } else {
                    ctx.report(&LeaseFault {
                        lease_token: &slot.lease_token,
                        stage: LeaseFaultStage::Read,
                        error: &error,
                    });
                }
                slot.pause(ctx.options.poll_interval).await;
                continue;
            }
        };

        if documents.is_empty() {
            // Nothing to hand over; keep the (possibly advanced) position, e.g. the first
            // `Now` position of a fresh lease.
            if next != continuation
                && slot
                    .write(ctx, LeaseFaultStage::Checkpoint, |l| {
                        l.continuation_token = next;
                    })
                    .await
                    == Err(WriteError::Lost)
            {
                return;
            }
            slot.pause(ctx.options.poll_interval).await;
            continue;
        }

        let count = documents.len();
        let full = u32::try_from(count).unwrap_or(u32::MAX) >= ctx.options.max_items_per_page;
        let batch = ChangeFeedBatch {
            documents,
            lease_token: slot.lease_token.clone(),
        };
        let outcome = AssertUnwindSafe((ctx.handler)(batch)).catch_unwind().await;
        let failure = match outcome {
            Ok(Ok(())) => None,
            Ok(Err(error)) => Some(error),
            Err(panic) => Some(Box::new(HandlerPanicked::from_payload(panic.as_ref())) as BoxError),
        };
        if let Some(error) = &failure {
            ctx.report(&LeaseFault {
                lease_token: &slot.lease_token,
                stage: LeaseFaultStage::Handler,
                error: error.as_ref(),
            });
            tracing::debug!(
                processor, lease = %slot.lease_token, documents = count,
                "the same documents are read again after the poll interval"
            );
        }
        let handled = failure.is_none();
        if !handled {
            slot.pause(ctx.options.poll_interval).await;
            continue;
        }
        match slot
            .write(ctx, LeaseFaultStage::Checkpoint, |l| {
                l.continuation_token = next;
            })
            .await
        {
            Ok(()) => {
                tracing::debug!(processor, lease = %slot.lease_token, documents = count, "checkpointed");
                if !full {
                    slot.pause(ctx.options.poll_interval).await;
                }
            }
            Err(WriteError::Lost) => return,
            Err(WriteError::Failed) => {
                slot.pause(ctx.options.poll_interval).await;
            }
        }
    }
}

/// Reads one page of the lease's feed range from `continuation`: the documents and the
/// continuation after them.
async fn read_page(
    ctx: &WorkerContext,
    range: &FeedRange,
    continuation: Option<&str>,
) -> Result<(Vec<Value>, Option<String>), CosmosStoreError> {
    const OPERATION: &str = "query_change_feed";
    let max_items = NonZeroU32::new(ctx.options.max_items_per_page).unwrap_or(NonZeroU32::MIN);
    let mut options =
        ChangeFeedOptions::default().with_max_item_count(MaxItemCountHint::Limit(max_items));
    if let Some(token) = continuation {
        options = options.with_continuation_token(ContinuationToken::from_string(token.to_owned()));
    }
    let start = match ctx.options.start_from {
        StartFrom::Beginning => ChangeFeedStartFrom::Beginning,
        StartFrom::Now => ChangeFeedStartFrom::Now,
    };
    let mut pages = ctx
        .monitored
        .query_change_feed::<Value>(FeedScope::range(range.clone()), start, Some(options))
        .await
        .map_err(|e| CosmosStoreError::request(OPERATION, e))?;
    let page = match pages.next().await {
        Some(page) => page.map_err(|e| CosmosStoreError::request(OPERATION, e))?,
        None => return Ok((Vec::new(), continuation.map(str::to_owned))),
    };
    let next = pages
        .to_continuation_token()
        .map_err(|e| CosmosStoreError::request(OPERATION, e))?
        .as_str()
        .to_owned();
    let documents = page
        .items()
        .iter()
        .filter_map(|item| item.current().cloned())
        .collect();
    Ok((documents, Some(next)))
}

/// Clears the owner (keeping the checkpoint) so another instance may take the lease at once.
async fn release(ctx: &WorkerContext, slot: &LeaseSlot) {
    let mut lease = slot.lease.lock().await;
    let mut released = lease.clone();
    released.owner = None;
    released.timestamp = now_millis();
    match ctx.store.replace(&released).await {
        LeaseWrite::Written(etag) => {
            released.etag = etag;
            *lease = released;
            tracing::info!(
                processor = %ctx.store.processor, instance = %ctx.instance, lease = %slot.lease_token,
                "lease released"
            );
        }
        LeaseWrite::Conflict => tracing::info!(
            processor = %ctx.store.processor, lease = %slot.lease_token,
            "lease already taken by another instance; nothing to release"
        ),
        LeaseWrite::Failed(error) => tracing::warn!(
            processor = %ctx.store.processor, lease = %slot.lease_token, %error,
            "could not release the lease; it becomes free when it expires"
        ),
    }
}
