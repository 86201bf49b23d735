//! [`ChangeFeedEstimator`]: how many changed documents each lease of a processor has still to
//! hand over, counted by reading the change feed after each lease's checkpoint.

use std::sync::Arc;

use azure_data_cosmos::clients::ContainerClient;
use azure_data_cosmos::feed::FeedRange;
use serde_json::Value;

use crate::coordinator::{read_ranges, split_parents, unfinished_children, without};
use crate::error::ErrorChain;
use crate::lease::{LeaseDocument, LeaseStore, lease_scope};
use crate::options::{ChangeFeedProcessorOptions, StartFrom};
use crate::page;
use crate::ranges::{self, Bounds, bounds};
use crate::store::{StoreError, bounded};

/// Estimates how many changed documents each lease of a processor has still to hand over.
///
/// For every lease of the processor (every instance's, owned or free) it reads the lease's feed
/// range from the lease's checkpoint to the current end of the change feed, page by page, and
/// counts the documents a caller-given predicate accepts. It counts *documents*, not
/// transactions: unlike an LSN difference (what the .NET SDK's estimator reports), the count is
/// exact after partition splits and can leave out changes the caller does not care about.
///
/// It only reads: it never writes a lease nor checkpoints, so it can run beside the processor
/// (in the same process or any other) without disturbing it.
///
/// # Cost
///
/// Every estimate reads every change after each checkpoint: its Request Unit cost grows with the
/// backlog (roughly the cost of reading those pages, plus one read of about 1 RU per caught-up
/// lease, plus a lease query and a feed-range read). Call it on an interval (tens of seconds to
/// minutes for a gauge), not per message; [`LeaseBacklog::request_charge`] tells what each
/// lease's read was billed. At most one page of documents is held at a time.
///
/// # Accuracy
///
/// An estimate is a snapshot. Checkpoints are read once at the start, so a lease handing over a
/// page meanwhile counts that page as pending; documents written while the estimate runs may or
/// may not be counted. The change feed is read in "latest version" mode, as the processor reads
/// it: a document changed several times after the checkpoint counts once, and deletes are not
/// seen.
///
/// ```no_run
/// # async fn demo(
/// #     orders: std::sync::Arc<azure_data_cosmos::clients::ContainerClient>,
/// #     leases: std::sync::Arc<azure_data_cosmos::clients::ContainerClient>,
/// # ) -> Result<(), cosmos_change_feed::StoreError> {
/// use cosmos_change_feed::{ChangeFeedEstimator, ChangeFeedProcessorOptions};
///
/// // The same processor name and start position as the processor's.
/// let estimator = ChangeFeedEstimator::new("orders-sync", orders, leases)
///     .options(ChangeFeedProcessorOptions::default());
/// for lease in estimator.estimate(|order| order["status"] == "open").await? {
///     match lease.pending {
///         Ok(pending) => println!("{}: {pending} open orders pending", lease.lease_token),
///         Err(error) => eprintln!("{}: could not be read: {error}", lease.lease_token),
///     }
/// }
/// # Ok(())
/// # }
/// ```
pub struct ChangeFeedEstimator {
    processor_name: String,
    monitored: Arc<ContainerClient>,
    leases: Arc<ContainerClient>,
    options: ChangeFeedProcessorOptions,
    /// The monitored container's lease scope, read at the first estimate.
    scope: tokio::sync::OnceCell<String>,
}

impl std::fmt::Debug for ChangeFeedEstimator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChangeFeedEstimator")
            .field("processor_name", &self.processor_name)
            .field("options", &self.options)
            .finish_non_exhaustive()
    }
}

/// The backlog of one lease ([`ChangeFeedEstimator::estimate`]).
#[derive(Debug)]
#[non_exhaustive]
pub struct LeaseBacklog {
    /// The lease token: the lease's feed range as `{min}-{max}`, as in
    /// [`ChangeFeedBatch::lease_token`](crate::ChangeFeedBatch::lease_token).
    pub lease_token: String,
    /// The instance owning the lease when it was listed; `None` when free. An owner that
    /// stopped renewing is still named (see [`LeaseDocument::owner`]).
    pub owner: Option<String>,
    /// The documents after the lease's checkpoint for which the predicate was true, or why the
    /// lease's feed could not be read to its end.
    pub pending: Result<u64, StoreError>,
    /// The Request Units billed for reading this lease's feed (also the pages read before a
    /// failure; 0 when nothing was read).
    pub request_charge: f64,
    /// Whether the read surely reached the end of the lease's range: false when the container's
    /// feed ranges could not be read, so a range that split was read whole, and an empty page
    /// from one partition may have ended it early (a document not read may still be ahead).
    pub complete: bool,
}

impl ChangeFeedEstimator {
    /// An estimator for the processor `processor_name` (as given to
    /// [`ChangeFeedProcessor::builder`](crate::ChangeFeedProcessor::builder)), whose change feed
    /// is `monitored`'s and whose leases are in `leases`.
    pub fn new(
        processor_name: impl Into<String>,
        monitored: Arc<ContainerClient>,
        leases: Arc<ContainerClient>,
    ) -> Self {
        Self {
            processor_name: processor_name.into().trim().to_owned(),
            monitored,
            leases,
            options: ChangeFeedProcessorOptions::default(),
            scope: tokio::sync::OnceCell::new(),
        }
    }

    /// Replaces the options (default: [`ChangeFeedProcessorOptions::default`]). The estimator
    /// uses three of them:
    /// [`start_from`](ChangeFeedProcessorOptions::start_from), which must be the processor's
    /// (where a lease without a checkpoint starts),
    /// [`max_items_per_page`](ChangeFeedProcessorOptions::max_items_per_page) (the documents
    /// one read fetches, and so the most held at a time) and
    /// [`store_timeout`](ChangeFeedProcessorOptions::store_timeout) (the bound of each read).
    pub fn options(mut self, options: ChangeFeedProcessorOptions) -> Self {
        self.options = options;
        self
    }

    /// One estimate per lease of the processor, in lease-token order: every instance's leases
    /// (owned or free; [`LeaseBacklog::owner`] says whose).
    ///
    /// Each lease's feed range is read from its checkpoint (without one: from the start with
    /// [`StartFrom::Beginning`], from its point with [`StartFrom::PointInTime`]; with
    /// [`StartFrom::Now`] nothing is behind it, so 0) in pages of
    /// `max_items_per_page`, each read bounded by `store_timeout`, until the first empty page
    /// (caught up, as the processor's poller sees it). `counted` is called once per document
    /// read and decides whether it counts. Leases are read one after another.
    ///
    /// Splits: a lease whose range is covered by other leases' ranges is the parent of a split
    /// whose delete failed (the processor no longer polls it); it is left out, or its children's
    /// documents would count twice. While a split is only partly done (some children created,
    /// the parent still there and served), the children are left out and the parent counts
    /// for their range. A lease whose range split but whose children leases do not
    /// exist yet is read over its whole range, one current feed range at a time, starting each
    /// from the lease's checkpoint (as its children will), so the total stays right during a
    /// split (when the feed ranges cannot be read, such a lease is read over its whole range at
    /// once and may be undercounted: the SDK serves such a read one partition per page, and an
    /// empty page from one partition ends it). A lease whose feed range cannot be parsed is left
    /// out (the processor does not poll it either).
    ///
    /// # Errors
    ///
    /// Listing the leases failing fails the call. A lease whose feed cannot be read reports it
    /// in its own [`LeaseBacklog::pending`]; the other leases are still counted.
    pub async fn estimate(
        &self,
        counted: impl Fn(&Value) -> bool + Sync,
    ) -> Result<Vec<LeaseBacklog>, StoreError> {
        // Read once per estimator: the container's resource id never changes.
        let scope = self
            .scope
            .get_or_try_init(|| {
                bounded(
                    "read_container",
                    self.options.store_timeout,
                    lease_scope(&self.monitored),
                )
            })
            .await?
            .clone();
        let store = LeaseStore {
            container: Arc::clone(&self.leases),
            processor: self.processor_name.clone(),
            scope: Some(scope),
            timeout: self.options.store_timeout,
        };
        // As the processor serves them: a split's retired parent and a split's unfinished
        // children (their parent still reads their range) are not counted.
        let leases = store.list().await?;
        let parents = split_parents(&leases);
        let leases = without(leases, &parents);
        let held = unfinished_children(&leases);
        // The current feed ranges, to read a lease spanning several of them one at a time. Without
        // them each lease is read over its whole range.
        let ranges = match read_ranges(&self.monitored, true, self.options.store_timeout).await {
            Ok(ranges) => Some(ranges),
            Err(error) => {
                tracing::debug!(
                    processor = %self.processor_name, error = %ErrorChain(&error),
                    "could not read the monitored container's feed ranges; each lease is read over its whole range"
                );
                None
            }
        };
        let mut backlogs = Vec::with_capacity(leases.len());
        for (i, lease) in leases.iter().enumerate() {
            if held.contains(&i) {
                continue;
            }
            let Some(range) = lease.range() else {
                tracing::warn!(
                    processor = %self.processor_name, lease = %lease.lease_token,
                    "a lease's feed range cannot be parsed; it is left out of the estimate"
                );
                continue;
            };
            backlogs.push(
                self.lease_backlog(lease, &range, ranges.as_deref(), &counted)
                    .await,
            );
        }
        backlogs.sort_by(|a, b| a.lease_token.cmp(&b.lease_token));
        Ok(backlogs)
    }

    async fn lease_backlog(
        &self,
        lease: &LeaseDocument,
        range: &FeedRange,
        current: Option<&[FeedRange]>,
        counted: &(dyn Fn(&Value) -> bool + Sync),
    ) -> LeaseBacklog {
        let mut backlog = LeaseBacklog {
            lease_token: lease.lease_token.clone(),
            owner: lease.owner.clone().filter(|owner| !owner.is_empty()),
            pending: Ok(0),
            request_charge: 0.0,
            complete: current.is_some(),
        };
        if lease.continuation_token.is_none() && self.options.start_from == StartFrom::Now {
            // Its first read will start from that moment: nothing is behind it.
            return backlog;
        }
        let mut pending = 0;
        for piece in pieces(range, current) {
            let mut continuation = lease.continuation_token.clone();
            loop {
                let read = bounded(
                    page::OPERATION,
                    self.options.store_timeout,
                    page::read_page(
                        &self.monitored,
                        &piece,
                        &self.options,
                        continuation.as_deref(),
                    ),
                )
                .await;
                let page = match read {
                    Ok(page) => page,
                    Err(error) => {
                        backlog.pending = Err(error);
                        return backlog;
                    }
                };
                backlog.request_charge += page.request_charge;
                let mut documents = 0_u64;
                for document in page.documents() {
                    documents += 1;
                    if counted(&document) {
                        pending += 1;
                    }
                }
                if documents == 0 {
                    break;
                }
                continuation = page.continuation;
            }
        }
        backlog.pending = Ok(pending);
        backlog
    }
}

/// The ranges to read `range` as: its overlaps with the `current` feed ranges when it spans
/// several of them (the SDK answers a read of a range spanning several partitions from one of
/// them at a time, so an empty page from one says nothing of the others), else `range` itself.
fn pieces(range: &FeedRange, current: Option<&[FeedRange]>) -> Vec<FeedRange> {
    let whole = || vec![range.clone()];
    let Some(current) = current else {
        return whole();
    };
    let lease = bounds(range);
    let overlaps: Vec<Bounds> = current
        .iter()
        .filter_map(|r| ranges::intersect(&lease, &bounds(r)))
        .collect();
    if overlaps.len() < 2 || !ranges::uncovered(&lease, &overlaps).is_empty() {
        return whole();
    }
    overlaps
        .iter()
        .map(ranges::feed_range)
        .collect::<Option<Vec<_>>>()
        .unwrap_or_else(whole)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn range(min: &str, max: &str) -> FeedRange {
        ranges::feed_range(&(min.to_owned(), max.to_owned())).unwrap()
    }

    fn tokens(pieces: &[FeedRange]) -> Vec<Bounds> {
        pieces.iter().map(bounds).collect()
    }

    #[test]
    fn a_lease_spanning_several_feed_ranges_is_read_one_range_at_a_time() {
        let current = [range("", "20"), range("20", "40"), range("40", "FF")];
        assert_eq!(
            tokens(&pieces(&range("", "40"), Some(&current))),
            tokens(&[range("", "20"), range("20", "40")])
        );
        // Across a boundary after a merge and a split elsewhere: its overlaps.
        assert_eq!(
            tokens(&pieces(&range("10", "30"), Some(&current))),
            tokens(&[range("10", "20"), range("20", "30")])
        );
    }

    #[test]
    fn a_lease_within_one_feed_range_or_without_the_feed_ranges_is_read_whole() {
        let current = [range("", "20"), range("20", "FF")];
        assert_eq!(
            tokens(&pieces(&range("20", "30"), Some(&current))),
            tokens(&[range("20", "30")])
        );
        assert_eq!(
            tokens(&pieces(&range("", "FF"), None)),
            tokens(&[range("", "FF")])
        );
        // Feed ranges that leave part of the lease uncovered: the whole lease.
        assert_eq!(
            tokens(&pieces(
                &range("", "FF"),
                Some(&[range("", "20"), range("40", "FF")])
            )),
            tokens(&[range("", "FF")])
        );
    }
}
