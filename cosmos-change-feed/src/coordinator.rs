//! The acquire loop of one instance: keeps a lease per feed range, takes its fair share of
//! them, replaces split ranges' leases by their children's, and runs a worker per owned lease.

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;

use azure_data_cosmos::clients::ContainerClient;
use azure_data_cosmos::feed::FeedRange;
use azure_data_cosmos::options::ReadFeedRangesOptions;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::balance::{self, LeaseView, Take};
use crate::error::ErrorChain;
use crate::lease::{LeaseDocument, LeaseStore, LeaseWrite, now_millis};
use crate::ranges::{self, Bounds, bounds};
use crate::store::{StoreError, bounded};
use crate::worker::{self, LeaseSlot, StopReason, WorkerContext};

/// Reads the monitored container's feed ranges (physical partitions), bypassing the SDK's
/// cache when `refresh` so that splits are seen.
pub(crate) async fn read_ranges(
    monitored: &ContainerClient,
    refresh: bool,
    timeout: std::time::Duration,
) -> Result<Vec<FeedRange>, StoreError> {
    let options = ReadFeedRangesOptions::default().with_force_refresh(refresh);
    bounded("read_feed_ranges", timeout, async {
        monitored
            .read_feed_ranges(Some(options))
            .await
            .map_err(|e| StoreError::request("read_feed_ranges", e))
    })
    .await
}

/// Creates a free lease for every part of a feed range that no lease of the processor covers
/// (a new processor, a container that gained ranges, or leases that stopped tiling the key range
/// after merges and splits at other boundaries). Coverage, not a single overlap, decides: a range
/// half covered by a lease gets a lease for its other half. Returns how many were created.
pub(crate) async fn create_missing_leases(
    store: &LeaseStore,
    leases: &[LeaseDocument],
    ranges: &[FeedRange],
) -> Result<usize, StoreError> {
    let existing = lease_bounds(leases);
    let mut created = 0;
    for range in ranges {
        for piece in ranges::uncovered(&bounds(range), &existing) {
            let Some(piece) = ranges::feed_range(&piece) else {
                tracing::error!(processor = %store.processor, min = %piece.0, max = %piece.1, "an uncovered key range has invalid bounds; no lease can be made for it");
                continue;
            };
            let lease = LeaseDocument::new(&store.processor, store.scope(), &piece);
            if store.create(&lease).await? {
                tracing::info!(processor = %store.processor, lease = %lease.lease_token, "lease created");
                created += 1;
            } else if store.repair(&lease).await? {
                // A document holds the lease's id but is no readable lease: without this its
                // range would never be served.
                tracing::error!(
                    processor = %store.processor, lease = %lease.lease_token,
                    "replaced a malformed lease document by a new lease (its continuation kept if it had one)"
                );
                created += 1;
            }
        }
    }
    Ok(created)
}

/// The key ranges of `leases` (those whose range can be read).
fn lease_bounds(leases: &[LeaseDocument]) -> Vec<Bounds> {
    leases
        .iter()
        .filter_map(LeaseDocument::range)
        .map(|r| bounds(&r))
        .collect()
}

/// The indexes of the leases that are the parent of a split whose delete failed: a lease whose
/// range is covered entirely by other leases' smaller ranges (its children). Its children serve
/// its range; reading the parent as well would see their documents twice.
///
/// A parent only once its children cover all of it: a split that created some children and
/// failed on the others is finished by its owner first (the children start from the parent's
/// checkpoint), so no key range restarts from nothing.
pub(crate) fn split_parents(leases: &[LeaseDocument]) -> Vec<usize> {
    let ranges = ranges_of(leases);
    let is_parent = |i: usize| {
        let Some(range) = &ranges[i] else {
            return false;
        };
        let children: Vec<Bounds> = ranges
            .iter()
            .enumerate()
            .filter(|(j, _)| *j != i)
            .filter_map(|(_, other)| other.clone())
            .filter(|child| ranges::strictly_within(child, range))
            .collect();
        !children.is_empty() && ranges::uncovered(range, &children).is_empty()
    };
    (0..leases.len()).filter(|i| is_parent(*i)).collect()
}

/// The leases without those of a split still in progress: a child lease whose range lies
/// within another remaining lease's range (its parent, not yet covered by all of its children,
/// so not retired). Such a child is taken by no instance while its parent is there: the parent
/// may be served again (its owner finishes the split by creating the missing children), and
/// serving both would hand the child's documents over twice, out of order.
fn hold_back_unfinished_children(
    processor: &str,
    leases: Vec<LeaseDocument>,
) -> Vec<LeaseDocument> {
    let held = unfinished_children(&leases);
    for &i in &held {
        tracing::debug!(
            processor, lease = %leases[i].lease_token,
            "a child lease of a split still in progress is not taken while its parent lease exists"
        );
    }
    without(leases, &held)
}

/// The leases (by index) that are children of a split still in progress: each lies within
/// another lease's range (its parent, not yet covered by all of its children). Neither served
/// nor estimated while the parent is there; the parent stands for their range.
pub(crate) fn unfinished_children(leases: &[LeaseDocument]) -> Vec<usize> {
    let ranges = ranges_of(leases);
    let is_unfinished_child = |i: usize| {
        let Some(range) = &ranges[i] else {
            return false;
        };
        ranges
            .iter()
            .flatten()
            .any(|parent| ranges::strictly_within(range, parent))
    };
    (0..leases.len())
        .filter(|i| is_unfinished_child(*i))
        .collect()
}

/// Each lease's key range, `None` for one whose range cannot be read.
fn ranges_of(leases: &[LeaseDocument]) -> Vec<Option<Bounds>> {
    leases
        .iter()
        .map(|l| l.range().map(|r| bounds(&r)))
        .collect()
}

/// `leases` without the ones at `indexes`.
pub(crate) fn without(leases: Vec<LeaseDocument>, indexes: &[usize]) -> Vec<LeaseDocument> {
    leases
        .into_iter()
        .enumerate()
        .filter(|(i, _)| !indexes.contains(i))
        .map(|(_, lease)| lease)
        .collect()
}

/// Logs at Error when the leases do not tile the whole key range `""..FF`: documents in a gap
/// would never be handed over.
fn check_coverage(processor: &str, leases: &[LeaseDocument]) {
    let covered = lease_bounds(leases);
    let gaps = ranges::gaps(&covered);
    if !gaps.is_empty() {
        tracing::error!(
            processor, gaps = ?gaps,
            "the leases do not cover the whole key range; the gaps get leases when the feed ranges can be read"
        );
    }
}

struct Running {
    slot: Arc<LeaseSlot>,
    poller: JoinHandle<()>,
    renewer: JoinHandle<()>,
}

pub(crate) struct Coordinator {
    pub(crate) ctx: WorkerContext,
    pub(crate) shutdown: CancellationToken,
    pub(crate) tracker: TaskTracker,
    running: HashMap<String, Running>,
    /// Leases being split by a task of their own (waiting for their page in flight, then
    /// replacing the lease by its children), by lease id: not taken again meanwhile.
    splitting: HashMap<String, JoinHandle<()>>,
}

impl Coordinator {
    pub(crate) fn new(
        ctx: WorkerContext,
        shutdown: CancellationToken,
        tracker: TaskTracker,
    ) -> Self {
        Self {
            ctx,
            shutdown,
            tracker,
            running: HashMap::new(),
            splitting: HashMap::new(),
        }
    }

    /// Runs acquire cycles until shutdown. Workers stop (and release) through their own
    /// child tokens.
    pub(crate) async fn run(mut self) {
        let wake = Arc::clone(&self.ctx.wake);
        loop {
            if self.shutdown.is_cancelled() {
                break;
            }
            self.cycle().await;
            tokio::select! {
                () = tokio::time::sleep(self.ctx.options.lease_acquire_interval) => {}
                () = wake.notified() => {}
                () = self.shutdown.cancelled() => break,
            }
        }
        tracing::debug!(processor = %self.ctx.store.processor, instance = %self.ctx.instance, "acquire loop stopped");
    }

    async fn cycle(&mut self) {
        let processor = self.ctx.store.processor.clone();
        // What a test counts an instance's cycles by (a balancing bound is in cycles).
        tracing::trace!(target: "cosmos_change_feed::acquire_cycle", %processor, instance = %self.ctx.instance, "acquire cycle");
        // A worker told to stop stays here until its poller has finished (its page may run up to
        // the handler timeout): the balancer counts it as running, so the lease is not taken
        // again, and served twice, while its last page is still being handled.
        self.running
            .retain(|_, running| !running.poller.is_finished() || !running.renewer.is_finished());
        self.splitting.retain(|_, split| !split.is_finished());

        let ranges = match read_ranges(&self.ctx.monitored, true, self.ctx.options.store_timeout)
            .await
        {
            Ok(ranges) => Some(ranges),
            Err(error) => {
                tracing::warn!(%processor, error = %ErrorChain(&error), "could not read the monitored container's feed ranges");
                None
            }
        };
        let mut leases = match self.ctx.store.list().await {
            Ok(leases) => leases,
            Err(error) => {
                tracing::warn!(%processor, error = %ErrorChain(&error), "could not list the leases; retrying later");
                return;
            }
        };
        if let Some(ranges) = &ranges {
            match create_missing_leases(&self.ctx.store, &leases, ranges).await {
                Ok(0) => {}
                Ok(_) => match self.ctx.store.list().await {
                    Ok(listed) => leases = listed,
                    Err(error) => {
                        tracing::warn!(%processor, error = %ErrorChain(&error), "could not list the leases; retrying later");
                        return;
                    }
                },
                Err(error) => {
                    tracing::warn!(%processor, error = %ErrorChain(&error), "could not create leases")
                }
            }
        }

        check_coverage(&processor, &leases);
        let leases = self.retire_split_parents(leases).await;
        let leases = hold_back_unfinished_children(&processor, leases);
        self.balance(&leases).await;
        if let Some(ranges) = &ranges {
            self.split_leases(ranges).await;
        }
    }

    /// A lease whose range contains another lease's range is the parent of a split whose
    /// delete failed: it is never polled again (its children serve its range, and polling both
    /// would hand documents over twice); its delete is retried. Returns the other leases.
    async fn retire_split_parents(&self, leases: Vec<LeaseDocument>) -> Vec<LeaseDocument> {
        let parents = split_parents(&leases);
        if parents.is_empty() {
            return leases;
        }
        let processor = &self.ctx.store.processor;
        for &i in &parents {
            let parent = &leases[i];
            match self.ctx.store.delete(parent).await {
                LeaseWrite::Written(_) => tracing::info!(
                    %processor, parent = %parent.lease_token,
                    "deleted the lease of a split feed range after an earlier failed delete"
                ),
                LeaseWrite::Conflict => tracing::info!(
                    %processor, parent = %parent.lease_token,
                    "the lease of a split feed range changed or went since it was read; it is not polled, and looked at again next cycle"
                ),
                LeaseWrite::Failed(error) => tracing::warn!(
                    %processor, parent = %parent.lease_token, error = %ErrorChain(&error),
                    "could not delete the lease of a split feed range; it is not polled, and the delete is retried next cycle"
                ),
            }
        }
        without(leases, &parents)
    }

    async fn balance(&mut self, leases: &[LeaseDocument]) {
        let now = now_millis();
        let expiry = self.ctx.options.lease_expiry;
        let views: Vec<LeaseView> = leases
            .iter()
            .filter(|l| l.range().is_some())
            .map(|l| LeaseView {
                id: l.id.clone(),
                live_owner: l.live_owner(expiry, now).map(str::to_owned),
            })
            .collect();
        // A lease being split counts as running: its parent is not taken again meanwhile.
        let running: BTreeSet<String> = self
            .running
            .keys()
            .chain(self.splitting.keys())
            .cloned()
            .collect();
        for take in balance::plan(&views, &self.ctx.instance, &running) {
            let (id, stolen_from) = match take {
                Take::Available(id) => (id, None),
                Take::Steal { id, from } => (id, Some(from)),
            };
            if self.shutdown.is_cancelled() {
                return;
            }
            if let Some(lease) = leases.iter().find(|l| l.id == id) {
                self.acquire(lease, stolen_from, now).await;
            }
        }
    }

    async fn acquire(&mut self, lease: &LeaseDocument, stolen_from: Option<String>, now: i64) {
        let processor = self.ctx.store.processor.as_str();
        let instance = self.ctx.instance.as_str();
        let Some(range) = lease.range() else { return };
        let previous = lease.owner.clone().filter(|o| !o.is_empty());
        let mut updated = lease.clone();
        updated.owner = Some(instance.to_owned());
        let started = std::time::Instant::now();
        updated.timestamp = now_millis();
        match self.ctx.store.replace(&updated).await {
            LeaseWrite::Written(etag) => updated.etag = etag,
            LeaseWrite::Conflict => {
                tracing::debug!(processor, instance, lease = %lease.lease_token, "another instance took the lease first");
                return;
            }
            LeaseWrite::Failed(error) => {
                tracing::warn!(processor, instance, lease = %lease.lease_token, error = %ErrorChain(&error), "could not acquire the lease");
                return;
            }
        }
        match (stolen_from, previous) {
            (Some(from), _) => tracing::info!(
                processor, instance, lease = %lease.lease_token, from = %from,
                "lease stolen from an over-loaded instance"
            ),
            (None, Some(previous)) if previous != instance => {
                let idle_ms = now.saturating_sub(lease.last_written_ms());
                tracing::info!(
                    processor, instance, lease = %lease.lease_token, previous_owner = %previous, idle_ms,
                    "expired lease stolen"
                );
            }
            _ => tracing::info!(processor, instance, lease = %lease.lease_token, "lease acquired"),
        }
        if let Some(on_acquired) = &self.ctx.acquired {
            let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                on_acquired(&lease.lease_token);
            }));
        }
        let slot = Arc::new(LeaseSlot::new(updated, range, &self.shutdown, started));
        let poller = self
            .tracker
            .spawn(worker::poll(self.ctx.clone(), Arc::clone(&slot)));
        let renewer = self
            .tracker
            .spawn(worker::renew(self.ctx.clone(), Arc::clone(&slot)));
        self.running.insert(
            slot.id.clone(),
            Running {
                slot,
                poller,
                renewer,
            },
        );
    }

    /// Replaces each owned lease whose feed range split by one lease per child range, each
    /// starting from the parent's checkpoint (the SDK resumes a parent's continuation within a
    /// child range), then deletes the parent. Nothing is skipped: children begin where the
    /// parent's last successful batch ended.
    async fn split_leases(&mut self, ranges: &[FeedRange]) {
        let current: BTreeSet<Bounds> = ranges.iter().map(bounds).collect();
        let split: Vec<(String, Vec<FeedRange>)> = self
            .running
            .iter()
            .filter(|(_, running)| !running.slot.is_stopping())
            .filter(|(_, running)| !current.contains(&bounds(&running.slot.range)))
            .filter_map(|(id, running)| {
                // Children come from every range overlapping the lease, intersected with it, so
                // a lease that spans a boundary after a merge and a split elsewhere keeps all of
                // its keys.
                let lease = bounds(&running.slot.range);
                let pieces: Vec<Bounds> = current
                    .iter()
                    .filter_map(|range| ranges::intersect(&lease, range))
                    .collect();
                if pieces.len() < 2 {
                    // Within one range (e.g. a lease left by a merge): it stays as it is.
                    return None;
                }
                let children: Option<Vec<FeedRange>> =
                    pieces.iter().map(ranges::feed_range).collect();
                children.map(|children| (id.clone(), children))
            })
            .collect();
        for (id, children) in split {
            if let Some(running) = self.running.remove(&id) {
                // In a task of its own: its page in flight may take up to the handler timeout,
                // and the acquire cycle (other leases, other splits) must not wait for it.
                let task = self
                    .tracker
                    .spawn(split_lease(self.ctx.clone(), running, children));
                self.splitting.insert(id, task);
            }
        }
    }
}

/// Stops the worker of a lease whose range split, waits for its page in flight, then replaces
/// the lease by one lease per child range (each from the parent's checkpoint) and deletes it.
async fn split_lease(ctx: WorkerContext, running: Running, children: Vec<FeedRange>) {
    let processor = ctx.store.processor.clone();
    running.slot.stop(StopReason::Split);
    // Wait for the in-flight batch (if any) to be handed over and checkpointed.
    let _ = running.poller.await;
    let _ = running.renewer.await;
    if running.slot.is_lost() {
        // Someone else owns the parent now: the split is theirs to make, from their checkpoint.
        tracing::info!(%processor, lease = %running.slot.lease_token, "a lease lost while its split waited for its page is not split here");
        return;
    }
    let parent = running.slot.lease.lock().await.clone();
    let mut child_tokens = Vec::new();
    for child in &children {
        let mut lease = LeaseDocument::new(&processor, ctx.store.scope(), child);
        lease.continuation_token = parent.continuation_token.clone();
        child_tokens.push(lease.lease_token.clone());
        if let Err(error) = ctx.store.create(&lease).await {
            tracing::warn!(
                %processor, parent = %parent.lease_token, child = %lease.lease_token, error = %ErrorChain(&error),
                "could not create a child lease after a split; retrying next cycle"
            );
            return;
        }
    }
    match ctx.store.delete(&parent).await {
        LeaseWrite::Written(_) => tracing::info!(
            %processor, instance = %ctx.instance, parent = %parent.lease_token,
            children = ?child_tokens, "feed range split: lease replaced by child leases"
        ),
        LeaseWrite::Conflict => tracing::warn!(
            %processor, parent = %parent.lease_token,
            "the split lease changed hands before it could be deleted; its new owner splits it"
        ),
        LeaseWrite::Failed(error) => tracing::warn!(
            %processor, parent = %parent.lease_token, error = %ErrorChain(&error),
            "could not delete the split lease; retrying next cycle"
        ),
    }
    ctx.wake.notify_one();
}
