//! One owned lease at work: its poller (read a page, hand it over, checkpoint) and its
//! renewer, sharing the lease document under a lock so every write is ETag-guarded against
//! the latest ETag.

use std::collections::BTreeMap;
use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use azure_data_cosmos::clients::ContainerClient;
use azure_data_cosmos::feed::FeedRange;
use futures::FutureExt;
use serde_json::Value;
use tokio_util::sync::CancellationToken;

use crate::backoff::Backoff;
use crate::batch::{BatchHandler, BoxError, ChangeFeedBatch, LeaseLost};
use crate::error::ErrorChain;
use crate::fault::{FaultHandler, HandlerPanicked, HandlerTimedOut, LeaseFault, LeaseFaultStage};
use crate::lease::{LeaseDocument, LeaseStore, LeaseWrite, now_millis};
use crate::options::ChangeFeedProcessorOptions;
use crate::page::RangeReader;
use crate::request::RequestError;
use crate::store::{StoreError, bounded};

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
    /// Cancelled when the lease is lost (taken by another instance, or given up because it could
    /// not be renewed): the batch handler's [`LeaseLost`].
    lost: CancellationToken,
    /// Cancelled once the poller has finished (its last page handed over, the lease released):
    /// only then does the renewer stop, so a long page never lets the lease expire under it.
    poller_done: CancellationToken,
    /// When the lease was last written successfully (acquired, renewed, checkpointed): shared
    /// with the batch handler's [`LeaseLost`], which counts the lease lost past its give-up
    /// point at once, before the renewer wakes to say so.
    last_written: Arc<Mutex<std::time::Instant>>,
}

impl LeaseSlot {
    /// The slot of `lease`, acquired by a write that started at `written_at` (the moment its
    /// stored timestamp records, from which the give-up point is measured).
    pub(crate) fn new(
        lease: LeaseDocument,
        range: FeedRange,
        shutdown: &CancellationToken,
        written_at: std::time::Instant,
    ) -> Self {
        Self {
            lease_token: lease.lease_token.clone(),
            id: lease.id.clone(),
            lease: tokio::sync::Mutex::new(lease),
            range,
            stop: shutdown.child_token(),
            reason: Mutex::new(None),
            lost: CancellationToken::new(),
            poller_done: CancellationToken::new(),
            last_written: Arc::new(Mutex::new(written_at)),
        }
    }

    fn since_last_written(&self) -> Duration {
        self.last_written
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .elapsed()
    }

    /// Asks the worker to stop for `reason` (the first reason given wins).
    pub(crate) fn stop(&self, reason: StopReason) {
        let mut current = self.reason.lock().unwrap_or_else(|p| p.into_inner());
        current.get_or_insert(reason);
        // Lost whatever stopped the worker first: the page in flight is someone else's now.
        if reason == StopReason::Lost {
            self.lost.cancel();
        }
        self.stop.cancel();
    }

    /// Whether the lease was lost (taken by another instance, or given up).
    pub(crate) fn is_lost(&self) -> bool {
        self.lost.is_cancelled()
    }

    /// The batch handler's view of the loss: the renewer's verdict, or the give-up point
    /// passed without a write.
    fn lease_lost(&self, options: &ChangeFeedProcessorOptions) -> LeaseLost {
        LeaseLost::new(
            self.lost.clone(),
            Arc::clone(&self.last_written),
            give_up_after(options),
        )
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
    /// (412/404) is no lost lease by itself: an earlier write of this instance may have
    /// committed although its answer never came (it timed out), changing the ETag. The lease is
    /// read again: still this instance's, the write is made once more on its new ETag; someone
    /// else's or gone, the lease was taken and the worker is told to stop.
    ///
    /// Any other failure is reported to the processor's fault handler as a `stage` fault.
    async fn write(
        &self,
        ctx: &WorkerContext,
        stage: LeaseFaultStage,
        change: impl Fn(&mut LeaseDocument),
    ) -> Result<(), WriteError> {
        let store = &ctx.store;
        let what = stage.as_str();
        let mut lease = self.lease.lock().await;
        let mut updated = lease.clone();
        change(&mut updated);
        // Other instances judge expiry from this stored timestamp, so this instance measures
        // its own give-up point from the same moment: when the write started, not when its
        // answer came.
        let mut started = std::time::Instant::now();
        updated.timestamp = now_millis();
        // `replace` is bounded by the store timeout.
        let mut written = store.replace(&updated).await;
        if matches!(written, LeaseWrite::Conflict)
            && let Some(stored) = self.still_ours(ctx).await
        {
            tracing::info!(
                processor = %store.processor, lease = %self.lease_token, during = what,
                "the lease's ETag changed under an earlier write of this instance that committed without an answer; writing again"
            );
            // The change applied to the lease as stored (that earlier write may have been a
            // checkpoint ahead of the copy held here), on its ETag.
            updated = stored;
            change(&mut updated);
            // The stored timestamp is this write's: the give-up point counts from it.
            started = std::time::Instant::now();
            updated.timestamp = now_millis();
            written = store.replace(&updated).await;
        }
        match written {
            LeaseWrite::Written(etag) => {
                updated.etag = etag;
                *lease = updated;
                *self.last_written.lock().unwrap_or_else(|p| p.into_inner()) = started;
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

    /// The lease as stored (with its ETag) when it is still this instance's (its owner), read
    /// after a conflict; `None` when it is someone else's, gone, or cannot be read (then the
    /// conflict stands: failing closed, the lease is given up).
    async fn still_ours(&self, ctx: &WorkerContext) -> Option<LeaseDocument> {
        match ctx.store.read(&self.id).await {
            Ok(Some(stored))
                if stored.owner.as_deref() == Some(ctx.instance.as_str())
                    && stored.etag.is_some() =>
            {
                Some(stored)
            }
            Ok(_) => None,
            Err(error) => {
                tracing::warn!(processor = %ctx.store.processor, lease = %self.lease_token, error = %ErrorChain(&error), "could not read the lease back after a conflict; it is given up");
                None
            }
        }
    }

    /// Writes `continuation` as the lease's checkpoint (see [`LeaseSlot::write`]).
    async fn checkpoint(
        &self,
        ctx: &WorkerContext,
        continuation: &Option<String>,
    ) -> Result<(), WriteError> {
        self.write(ctx, LeaseFaultStage::Checkpoint, |l| {
            l.continuation_token.clone_from(continuation);
        })
        .await
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
    pub(crate) owned: Arc<Mutex<BTreeMap<String, LeaseProgress>>>,
    /// Wakes the coordinator early (e.g. after a 410 hinting at a split).
    pub(crate) wake: Arc<tokio::sync::Notify>,
    /// Told about every lease fault.
    pub(crate) faults: FaultHandler,
    /// Told about every empty read, if anyone asked.
    pub(crate) empty_reads: Option<EmptyReadHandler>,
    /// Told about every lease this instance stops polling, if anyone asked.
    pub(crate) acquired: Option<LeaseHandler>,
    pub(crate) released: Option<LeaseHandler>,
}

/// Told the lease token of every read that found nothing new.
pub(crate) type EmptyReadHandler = Arc<dyn Fn(&str) + Send + Sync>;

/// Told the lease token of every lease this instance stops polling.
pub(crate) type LeaseHandler = Arc<dyn Fn(&str) + Send + Sync>;

impl WorkerContext {
    /// Reports `fault` to the fault handler; a handler that panics is contained here.
    pub(crate) fn report(&self, fault: &LeaseFault<'_>) {
        let _ = std::panic::catch_unwind(AssertUnwindSafe(|| (self.faults)(fault)));
    }
}

/// Renews the lease every `lease_renew_interval` until its poller has finished (not merely been
/// asked to stop: a page in flight keeps its lease). A lease that could not be written for
/// longer than the expiry minus a margin may already be someone else's: its poller
/// is stopped rather than serving a lease this instance can no longer vouch for.
pub(crate) async fn renew(ctx: WorkerContext, slot: Arc<LeaseSlot>) {
    let processor = ctx.store.processor.as_str();
    let give_up_after = give_up_after(&ctx.options);
    let mut wait = ctx.options.lease_renew_interval;
    loop {
        tokio::select! {
            () = tokio::time::sleep(wait) => {}
            () = slot.poller_done.cancelled() => return,
        }
        wait = ctx.options.lease_renew_interval;
        // The write may not outlast the point where the lease must be given up: past it another
        // instance may own the lease while this one still serves it.
        let left = give_up_after.saturating_sub(slot.since_last_written());
        let renewed = tokio::time::timeout(
            left.max(Duration::from_millis(1)),
            slot.write(&ctx, LeaseFaultStage::Renew, |_| {}),
        )
        .await
        .unwrap_or(Err(WriteError::Failed));
        match renewed {
            Ok(()) => tracing::trace!(lease = %slot.lease_token, "lease renewed"),
            Err(WriteError::Lost) => return,
            Err(WriteError::Failed) if slot.since_last_written() >= give_up_after => {
                tracing::error!(
                    processor, lease = %slot.lease_token, unwritten_for = ?slot.since_last_written(),
                    "the lease could not be renewed for almost its expiry; this instance stops serving it, and any instance (this one included) may acquire it again"
                );
                slot.stop(StopReason::Lost);
                return;
            }
            // Tried again sooner than the renew interval, so one failed renewal never lets
            // the lease reach its give-up point: half the time left before it.
            Err(WriteError::Failed) => {
                let left = give_up_after.saturating_sub(slot.since_last_written());
                wait = wait.min(left / 2).max(Duration::from_millis(10));
            }
        }
    }
}

/// How long a lease may go unwritten before this instance stops vouching for it: a margin
/// before the expiry, the smaller of one renew interval and a fifth of the expiry, so even a
/// renew interval close to the expiry leaves renewals room to work.
fn give_up_after(options: &ChangeFeedProcessorOptions) -> Duration {
    let margin = options.lease_renew_interval.min(options.lease_expiry / 5);
    options.lease_expiry.saturating_sub(margin)
}

/// Polls the lease's feed range until the worker stops, then releases the lease if it stopped
/// for a graceful shutdown.
pub(crate) async fn poll(ctx: WorkerContext, slot: Arc<LeaseSlot>) {
    // The renewer stops once this poller has finished, whatever way: also if it panicked.
    let _done = slot.poller_done.clone().drop_guard();
    // Which poller the entry belongs to, so only its own entry is removed: the coordinator starts
    // a lease's next poller only after this one has finished, and the tag keeps that so.
    static POLLERS: AtomicU64 = AtomicU64::new(0);
    let poller = POLLERS.fetch_add(1, Ordering::Relaxed);
    lock_owned(&ctx.owned).insert(
        slot.lease_token.clone(),
        LeaseProgress {
            poller,
            ..LeaseProgress::default()
        },
    );
    let position = poll_until_stopped(&ctx, &slot).await;
    // Only this poller's own entry is removed and reported released: if a newer poller of the
    // same lease runs already, the lease has not left this instance.
    let released = {
        let mut owned = lock_owned(&ctx.owned);
        let own = owned
            .get(&slot.lease_token)
            .is_some_and(|progress| progress.poller == poller);
        if own {
            owned.remove(&slot.lease_token);
        }
        own
    };
    if let Some(on_released) = ctx.released.as_ref().filter(|_| released) {
        let _ = std::panic::catch_unwind(AssertUnwindSafe(|| on_released(&slot.lease_token)));
    }
    slot.poller_done.cancel();
    if slot.reason() == StopReason::Shutdown {
        release(&ctx, &slot, position).await;
    }
}

/// What an owned lease has done lately, for health reports.
#[derive(Debug, Clone, Default)]
pub(crate) struct LeaseProgress {
    /// The poller this entry belongs to.
    poller: u64,
    /// When the lease last confirmed its position: a page handled and checkpointed, or a read
    /// that found nothing new.
    pub(crate) last_progress: Option<std::time::Instant>,
    /// The fault since the last progress, if any.
    pub(crate) last_error: Option<String>,
    /// Whether that fault does not clear by itself (see [`needs_operator`]).
    pub(crate) needs_operator: bool,
}

fn lock_owned(
    owned: &Mutex<BTreeMap<String, LeaseProgress>>,
) -> std::sync::MutexGuard<'_, BTreeMap<String, LeaseProgress>> {
    owned.lock().unwrap_or_else(|p| p.into_inner())
}

/// A failed, panicked or timed-out handler: recorded for health reports and reported as a
/// Handler fault.
fn report_handler_failure(
    ctx: &WorkerContext,
    slot: &LeaseSlot,
    error: &(dyn std::error::Error + Send + Sync + 'static),
) {
    record_fault(ctx, slot, &ErrorChain(error));
    ctx.report(&LeaseFault {
        lease_token: &slot.lease_token,
        stage: LeaseFaultStage::Handler,
        error,
    });
}

/// Records a fault of the lease for health reports.
fn record_fault(ctx: &WorkerContext, slot: &LeaseSlot, error: &dyn std::fmt::Display) {
    record_fault_of(ctx, slot, error, false);
}

/// Records a fault of the lease for health reports, saying whether it needs an operator.
fn record_fault_of(
    ctx: &WorkerContext,
    slot: &LeaseSlot,
    error: &dyn std::fmt::Display,
    needs_operator: bool,
) {
    if let Some(progress) = lock_owned(&ctx.owned).get_mut(&slot.lease_token) {
        progress.last_error = Some(error.to_string());
        progress.needs_operator = needs_operator;
    }
}

/// Whether a failed change-feed read will fail the same way until someone acts: a request the
/// service refuses as malformed (400, e.g. a continuation it does not accept, or 500 with
/// sub-status 20203, an invalid continuation), credentials or permissions (401, 403), or a
/// container that is gone (404 without a sub-status: not the transient 404/1002 of a session
/// not yet readable).
pub(crate) fn needs_operator(error: &StoreError) -> bool {
    let Some(request) = error.failed_request() else {
        return false;
    };
    matches!(
        (request.status, request.sub_status.unwrap_or(0)),
        (400 | 401 | 403, _) | (404, 0) | (500, 20203)
    )
}

/// Records progress; a lease that had faulted logs that it recovered.
fn record_progress(ctx: &WorkerContext, slot: &LeaseSlot) {
    let recovered = lock_owned(&ctx.owned)
        .get_mut(&slot.lease_token)
        .and_then(|progress| {
            progress.last_progress = Some(std::time::Instant::now());
            progress.needs_operator = false;
            progress.last_error.take()
        });
    if let Some(error) = recovered {
        tracing::info!(
            processor = %ctx.store.processor, lease = %slot.lease_token, previous_error = %error,
            "change-feed lease recovered: it advances again"
        );
    }
}

/// Returns the position reached (handed-over pages and empty reads only), which a release
/// writes even when the last checkpoint write failed.
async fn poll_until_stopped(ctx: &WorkerContext, slot: &LeaseSlot) -> Option<String> {
    let mut poll = Poll::new(ctx, slot).await;
    while !slot.is_stopping() {
        match poll.step().await {
            Next::Read => {}
            Next::Pause(delay) => {
                slot.pause(delay).await;
            }
            Next::Lost => return poll.position,
        }
    }
    poll.finish().await
}

/// What a lease's poller does after one step.
enum Next {
    /// Read the next page at once.
    Read,
    /// Wait (or until asked to stop), then read.
    Pause(Duration),
    /// The lease is someone else's now: stop without writing anything more.
    Lost,
}

/// One lease's poller between steps: where it reads from, what it has written, and what it
/// owes the lease.
struct Poll<'a> {
    ctx: &'a WorkerContext,
    slot: &'a LeaseSlot,
    /// Failures back off from the poll interval up to `max_backoff`; a success starts over.
    backoff: Backoff,
    /// Where the next read starts. It advances after every handled page even when writing the
    /// checkpoint fails, so a `Now` start keeps its position and a handled page is not handed
    /// over again by this owner; the written checkpoint catches up on the next write.
    position: Option<String>,
    /// The continuation last written to the lease; a position ahead of it is written as soon as
    /// a write works again.
    written: Option<String>,
    /// The checkpoint of the page just handled (and its size), written while the next page is
    /// handled (or read): a backlog pays no store round trip of its own for it.
    checkpoint: Option<(Option<String>, usize)>,
    /// The page after the one just handled, read while it was handled: the next step hands it
    /// over without waiting for a read (an empty one is read again instead). At most one page
    /// is held ahead.
    ahead: Option<Result<PageRead, StoreError>>,
    /// The reader of the lease's range, kept across pages so a range over several physical
    /// partitions is read round all of them; dropped (and opened again from `position`)
    /// whenever a page it read is not handed over.
    reader: Option<RangeReader>,
    /// Empty pages in a row: only a whole round of the range's partitions without changes
    /// means the lease is caught up.
    empty_in_a_row: usize,
}

impl<'a> Poll<'a> {
    async fn new(ctx: &'a WorkerContext, slot: &'a LeaseSlot) -> Self {
        let position = slot.lease.lock().await.continuation_token.clone();
        Self {
            ctx,
            slot,
            backoff: Backoff::new(ctx.options.poll_interval, ctx.options.max_backoff),
            written: position.clone(),
            position,
            checkpoint: None,
            ahead: None,
            reader: None,
            empty_in_a_row: 0,
        }
    }

    /// Takes the page read ahead, or reads one (beside the previous page's checkpoint), and
    /// does what it calls for.
    async fn step(&mut self) -> Next {
        let (ctx, slot) = (self.ctx, self.slot);
        // An empty page read ahead is read again now: documents written while the previous page
        // was handled are handed over at once, not after the poll interval.
        let ahead = self
            .ahead
            .take()
            .filter(|read| !matches!(read, Ok(page) if page.documents.is_empty()));
        let read = match ahead {
            Some(read) => read,
            None => {
                let read = bounded(
                    "query_change_feed",
                    ctx.options.store_timeout,
                    read_page(ctx, &slot.range, self.position.as_deref(), &mut self.reader),
                );
                let Some((next, count)) = self.checkpoint.take() else {
                    let read = read.await;
                    return self.take(read).await;
                };
                let (wrote, read) = tokio::join!(slot.checkpoint(ctx, &next), read);
                // The page read beside a failed write is dropped (read again after the
                // backoff); beside a lost lease it is not handed over.
                if let Err(next) = self.wrote(wrote, next, count) {
                    return next;
                }
                read
            }
        };
        self.take(read).await
    }

    /// Does what a read calls for: a failure backs off, an empty page moves on, a page is
    /// handed over.
    async fn take(&mut self, read: Result<PageRead, StoreError>) -> Next {
        // Asked to stop during the read: its page is not handed over (nor checkpointed).
        if self.slot.is_stopping() {
            return Next::Read;
        }
        match read {
            Err(error) => self.read_failed(&error),
            Ok(page) if page.documents.is_empty() => {
                self.nothing_new(page.continuation, page.parts).await
            }
            Ok(page) => self.hand_over(page).await,
        }
    }

    /// Records what writing a handled page's checkpoint `next` did: `Err` with the step to take
    /// when it did not work (the checkpoint is kept, to be written with the next write).
    fn wrote(
        &mut self,
        wrote: Result<(), WriteError>,
        next: Option<String>,
        count: usize,
    ) -> Result<(), Next> {
        let (ctx, slot) = (self.ctx, self.slot);
        match wrote {
            Ok(()) => {
                self.written = next;
                tracing::debug!(processor = %ctx.store.processor, lease = %slot.lease_token, documents = count, "checkpointed");
                record_progress(ctx, slot);
                self.backoff.reset();
                Ok(())
            }
            Err(WriteError::Lost) => Err(Next::Lost),
            // The position stays ahead of the checkpoint until a write works.
            Err(WriteError::Failed) => {
                self.checkpoint.get_or_insert((next, count));
                Err(self.checkpoint_failed(true))
            }
        }
    }

    /// A checkpoint could not be written: reported, tried again after the backoff (with a
    /// fresh reader when the page read beside it is dropped).
    fn checkpoint_failed(&mut self, drop_reader: bool) -> Next {
        if drop_reader {
            self.ahead = None;
            self.reader = None;
            self.empty_in_a_row = 0;
        }
        record_fault(self.ctx, self.slot, &"the checkpoint could not be written");
        Next::Pause(self.backoff.next_delay())
    }

    /// A read failed: reported (a 410 makes the coordinator look at the feed ranges again),
    /// and tried again after the backoff, or at the cap when it needs an operator.
    fn read_failed(&mut self, error: &StoreError) -> Next {
        let (ctx, slot) = (self.ctx, self.slot);
        self.reader = None;
        self.empty_in_a_row = 0;
        // Shown in `lease_statuses` either way, so a lease held up by a long split or merge is
        // not taken for a healthy one.
        let operator = needs_operator(error);
        record_fault_of(ctx, slot, &ErrorChain(error), operator);
        if error.status() == Some(410) {
            tracing::info!(
                processor = %ctx.store.processor, lease = %slot.lease_token, error = %ErrorChain(error),
                "feed range gone (split or merge in progress); re-reading the feed ranges"
            );
            ctx.wake.notify_one();
        } else {
            ctx.report(&LeaseFault {
                lease_token: &slot.lease_token,
                stage: LeaseFaultStage::Read,
                error,
            });
        }
        Next::Pause(if operator {
            // It fails the same way until someone acts: tried again at the cap, not hammered.
            ctx.options.max_backoff
        } else {
            // A throttled read waits at least as long as the service asked.
            self.backoff
                .next_delay_at_least(error.failed_request().and_then(RequestError::retry_after))
        })
    }

    /// A page without documents from one of the range's `parts` partitions: its position is
    /// kept (and written, e.g. the first `Now` position of a fresh lease); the next partition
    /// is read at once until a whole round found nothing, which is the lease caught up.
    async fn nothing_new(&mut self, next: Option<String>, parts: usize) -> Next {
        let (ctx, slot) = (self.ctx, self.slot);
        self.position = next.clone();
        // A handled page's checkpoint still unwritten is behind this position, which replaces it
        // (and is kept as the checkpoint still owed when the write fails).
        let owed = self.checkpoint.take();
        if next != self.written {
            match slot.checkpoint(ctx, &next).await {
                Err(WriteError::Lost) => return Next::Lost,
                Err(WriteError::Failed) => {
                    let count = owed.map_or(0, |(_, count)| count);
                    self.checkpoint = Some((next, count));
                    return self.checkpoint_failed(false);
                }
                Ok(()) => self.written = next,
            }
        }
        self.empty_in_a_row += 1;
        if self.empty_in_a_row < parts {
            return Next::Read;
        }
        // A round as the reader knew it: the range may have split since it was opened (the SDK
        // then reads the children too), so count its partitions again before calling the lease
        // caught up.
        if let Some(reader) = self.reader.as_mut()
            && self.empty_in_a_row < reader.recount(&ctx.monitored, &slot.range).await
        {
            return Next::Read;
        }
        self.empty_in_a_row = 0;
        record_progress(ctx, slot);
        if let Some(empty_reads) = &ctx.empty_reads {
            let _ = std::panic::catch_unwind(AssertUnwindSafe(|| {
                empty_reads(&slot.lease_token);
            }));
        }
        self.backoff.reset();
        Next::Pause(ctx.options.poll_interval)
    }

    /// Hands a page to the batch handler, while the previous page's checkpoint is written and,
    /// after a full page, the next page is read. Handled: the position moves past it, its checkpoint is written with
    /// the next step, and the page read meanwhile is handed over next (read until caught up:
    /// only an empty read waits the poll interval; a short page is no sign of the end, as the
    /// service also cuts pages at its response-size limit). Failed, panicked or timed out:
    /// reported, the page read ahead is dropped, and the same documents are read again after
    /// the backoff. Checkpoints keep page order: a page's is written only after it was handled,
    /// and so every page before it.
    async fn hand_over(&mut self, page: PageRead) -> Next {
        let (ctx, slot) = (self.ctx, self.slot);
        self.empty_in_a_row = 0;
        let PageRead {
            documents,
            continuation: next,
            request_charge,
            ..
        } = page;
        let count = documents.len();
        let lease_lost = slot.lease_lost(&ctx.options);
        let batch = ChangeFeedBatch {
            documents,
            lease_token: slot.lease_token.clone(),
            feed_range: slot.range.clone(),
            request_charge,
            lease_lost: lease_lost.clone(),
        };
        let handling = tokio::time::timeout(
            ctx.options.handler_timeout,
            AssertUnwindSafe((ctx.handler)(batch)).catch_unwind(),
        );
        let previous = self.checkpoint.take();
        let next_ahead = next.clone();
        let checkpointing = async {
            match &previous {
                Some((written, _)) => Some(slot.checkpoint(ctx, written).await),
                None => None,
            }
        };
        // The reader stands after this page: the read ahead continues from there. Only after a
        // full page: a short one most likely ends the backlog, and a read ahead of it would
        // mostly come back empty and be read again (an empty read is cheap on Cosmos DB, not
        // free, and a whole-partition scan on the emulator).
        let full = u32::try_from(count).is_ok_and(|count| count >= ctx.options.max_items_per_page);
        let reader = &mut self.reader;
        let reading_ahead = async move {
            if !full {
                return None;
            }
            let read = read_page(ctx, &slot.range, next_ahead.as_deref(), reader);
            Some(bounded("query_change_feed", ctx.options.store_timeout, read).await)
        };
        let (handled, wrote, ahead) = tokio::join!(handling, checkpointing, reading_ahead);
        // Lost while the page was handled (past the give-up point, though the renewer may not
        // have run to say so): nothing of the page is checkpointed, whatever the handler
        // returned, as it may have stopped early on `is_lost()`. Once the handler was told so,
        // it stays so, though a write that was in flight may have landed since.
        let lost = lease_lost.is_lost();
        let failure = match handled {
            Ok(Ok(Ok(()))) => None,
            Ok(Ok(Err(error))) => Some(error),
            Ok(Err(panic)) => {
                Some(Box::new(HandlerPanicked::from_payload(panic.as_ref())) as BoxError)
            }
            Err(_) => Some(Box::new(HandlerTimedOut {
                after: ctx.options.handler_timeout,
            }) as BoxError),
        };
        if failure.is_none() && !lost {
            // Handled: this page's checkpoint supersedes the previous one, written or not.
            self.position = next.clone();
            self.checkpoint = Some((next, count));
        }
        // A failed write backs off (the page read ahead dropped); a lost lease stops at once.
        let mut backing_off = None;
        if let (Some(wrote), Some((written, previous_count))) = (wrote, previous) {
            let kept = self.checkpoint.take();
            let outcome = self.wrote(wrote, written, previous_count);
            // A failed write kept the previous checkpoint; a handled page's is newer.
            if kept.is_some() {
                self.checkpoint = kept;
            }
            match outcome {
                Ok(()) => {}
                Err(Next::Lost) => return Next::Lost,
                Err(next) => backing_off = Some(next),
            }
        }
        if lost {
            // A failure of the handler is still reported (it may be why it stopped).
            if let Some(error) = &failure {
                report_handler_failure(ctx, slot, error.as_ref());
            }
            if !slot.is_lost() {
                tracing::error!(
                    processor = %ctx.store.processor, lease = %slot.lease_token,
                    unwritten_for = ?slot.since_last_written(),
                    "the lease went unwritten past its give-up point while a page was handled; this instance stops serving it and checkpoints nothing of the page"
                );
                slot.stop(StopReason::Lost);
            }
            return Next::Lost;
        }
        let Some(error) = failure else {
            if let Some(next) = backing_off {
                return next;
            }
            self.ahead = ahead;
            return Next::Read;
        };
        // Read again from the position before this page.
        self.reader = None;
        report_handler_failure(ctx, slot, error.as_ref());
        tracing::debug!(
            processor = %ctx.store.processor, lease = %slot.lease_token, documents = count,
            "the same documents are read again after a backoff"
        );
        backing_off.unwrap_or_else(|| Next::Pause(self.backoff.next_delay()))
    }

    /// Asked to stop with a handled page not yet checkpointed: writes it now, so a split's
    /// child leases start after it (a shutdown's release writes the position anyway; a lost
    /// lease is someone else's to write). Returns the position reached.
    async fn finish(self) -> Option<String> {
        if let Some((next, _)) = self.checkpoint
            && self.slot.reason() != StopReason::Lost
            && self.slot.checkpoint(self.ctx, &next).await.is_err()
        {
            record_fault(self.ctx, self.slot, &"the checkpoint could not be written");
        }
        self.position
    }
}

/// One page read from a lease's feed range.
struct PageRead {
    documents: Vec<Value>,
    /// The continuation after the page.
    continuation: Option<String>,
    /// The Request Units the read was billed.
    request_charge: f64,
    /// How many pages make one round of the range's partitions.
    parts: usize,
}

/// Reads the next page of the lease's feed range with `reader`, opening it from `continuation`
/// first if there is none.
async fn read_page(
    ctx: &WorkerContext,
    range: &FeedRange,
    continuation: Option<&str>,
    reader: &mut Option<RangeReader>,
) -> Result<PageRead, StoreError> {
    let reader = match reader {
        Some(reader) => reader,
        None => reader
            .insert(RangeReader::open(&ctx.monitored, range, &ctx.options, continuation).await?),
    };
    let page = reader.next_page().await?;
    let (continuation, request_charge) = (page.continuation.clone(), page.request_charge);
    Ok(PageRead {
        documents: page.into_documents(),
        continuation,
        request_charge,
        parts: reader.parts(),
    })
}

/// Clears the owner (keeping the checkpoint) so another instance may take the lease at once.
async fn release(ctx: &WorkerContext, slot: &LeaseSlot, position: Option<String>) {
    let mut lease = slot.lease.lock().await;
    let mut released = lease.clone();
    released.owner = None;
    released.continuation_token = position;
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
            processor = %ctx.store.processor, lease = %slot.lease_token, error = %ErrorChain(&error),
            "could not release the lease; it becomes free when it expires"
        ),
    }
}
