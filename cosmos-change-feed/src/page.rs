//! One page of a feed range's change feed: the read the lease workers and the estimator share.

use std::cell::{Ref, RefCell};
use std::num::NonZeroU32;

use azure_data_cosmos::clients::ContainerClient;
use azure_data_cosmos::feed::{ChangeFeedPageIterator, ContinuationToken, FeedRange, FeedScope};
use azure_data_cosmos::models::ChangeFeedItem;
use azure_data_cosmos::options::{ChangeFeedOptions, ChangeFeedStartFrom, MaxItemCountHint};
use futures::StreamExt;
use serde_json::Value;

use crate::options::{ChangeFeedProcessorOptions, StartFrom};
use crate::ranges::{self, bounds};
use crate::store::StoreError;

/// The operation name of a change-feed read, in errors.
pub(crate) const OPERATION: &str = "query_change_feed";

/// One page read from a feed range, as the SDK returned it.
///
/// Each document is read into a `RefCell` so it can be moved out of the page: the SDK's
/// `ChangeFeedItem` only lends its document (`current()` is a `&T`), and cloning every document
/// of every page was a measurable part of the relay's cost per document.
pub(crate) struct ChangePage {
    items: Vec<ChangeFeedItem<RefCell<Value>>>,
    /// The continuation after this page (the one read from when the SDK returned no page).
    pub(crate) continuation: Option<String>,
    /// The Request Units the read was billed (`x-ms-request-charge`; 0 when not said).
    pub(crate) request_charge: f64,
}

impl ChangePage {
    /// The changed documents, in change-feed order, borrowed from the page.
    pub(crate) fn documents(&self) -> impl Iterator<Item = Ref<'_, Value>> {
        self.items
            .iter()
            .filter_map(ChangeFeedItem::current)
            .map(RefCell::borrow)
    }

    /// The changed documents, in change-feed order, moved out of the page.
    pub(crate) fn into_documents(self) -> Vec<Value> {
        self.items
            .iter()
            .filter_map(|item| item.current().map(RefCell::take))
            .collect()
    }
}

/// Reads one page of `range`'s change feed from `continuation` (without one: from the options'
/// `start_from`), at most `max_items_per_page` documents. Unbounded: callers bound it by their
/// store timeout.
pub(crate) async fn read_page(
    monitored: &ContainerClient,
    range: &FeedRange,
    options: &ChangeFeedProcessorOptions,
    continuation: Option<&str>,
) -> Result<ChangePage, StoreError> {
    RangeReader::open(monitored, range, options, continuation)
        .await?
        .next_page()
        .await
}

/// A change-feed reader of one feed range, kept across pages.
///
/// A range can span several physical partitions (a lease whose range split, until it is
/// replaced by its children's leases). The SDK then reads them round-robin, one partition per
/// page, and a reader made afresh for every page would always start again at the first of them:
/// the others would not be read while the first keeps answering. Kept across pages, the reader
/// goes round all of them; [`parts`](Self::parts) says how many pages (one per partition) make
/// one round, so an empty page is not taken for the whole range being caught up.
pub(crate) struct RangeReader {
    pages: ChangeFeedPageIterator<ChangeFeedItem<RefCell<Value>>>,
    /// The continuation after the last page read (the one opened from before the first).
    continuation: Option<String>,
    parts: usize,
    /// With a point-in-time start, its second: documents changed before it are left out.
    since: Option<i64>,
}

impl RangeReader {
    /// A reader of `range` from `continuation` (without one: from the options' `start_from`).
    pub(crate) async fn open(
        monitored: &ContainerClient,
        range: &FeedRange,
        options: &ChangeFeedProcessorOptions,
        continuation: Option<&str>,
    ) -> Result<Self, StoreError> {
        let max_items = NonZeroU32::new(options.max_items_per_page).unwrap_or(NonZeroU32::MIN);
        let mut feed_options =
            ChangeFeedOptions::default().with_max_item_count(MaxItemCountHint::Limit(max_items));
        if let Some(token) = continuation {
            feed_options = feed_options
                .with_continuation_token(ContinuationToken::from_string(token.to_owned()));
        }
        let start = match options.start_from {
            StartFrom::Beginning => ChangeFeedStartFrom::Beginning,
            StartFrom::Now => ChangeFeedStartFrom::Now,
            StartFrom::PointInTime(at) => {
                ChangeFeedStartFrom::PointInTime(time::OffsetDateTime::from(at))
            }
        };
        let pages = monitored
            .query_change_feed::<RefCell<Value>>(
                FeedScope::range(range.clone()),
                start,
                Some(feed_options),
            )
            .await
            .map_err(|e| StoreError::request(OPERATION, e))?;
        Ok(Self {
            pages,
            continuation: continuation.map(str::to_owned),
            parts: partitions_of(monitored, range).await,
            since: options.start_from.since_seconds(),
        })
    }

    /// The physical partitions the range spans, as the SDK's cached routing map saw them when
    /// the reader was opened (at least 1): one page from each makes a round.
    pub(crate) fn parts(&self) -> usize {
        self.parts
    }

    /// Counts the range's physical partitions again (the SDK's cached routing map: no request
    /// when it is warm), for a range that split while this reader was open; returns the count.
    pub(crate) async fn recount(
        &mut self,
        monitored: &ContainerClient,
        range: &FeedRange,
    ) -> usize {
        self.parts = partitions_of(monitored, range).await;
        self.parts
    }

    /// The next page: the next partition's changes after its position, at most
    /// `max_items_per_page` documents. Unbounded: callers bound it by their store timeout, and
    /// drop the reader when a read fails or is cancelled.
    pub(crate) async fn next_page(&mut self) -> Result<ChangePage, StoreError> {
        let Some(page) = self.pages.next().await else {
            return Ok(ChangePage {
                items: Vec::new(),
                continuation: self.continuation.clone(),
                request_charge: 0.0,
            });
        };
        let page = page.map_err(|e| StoreError::request(OPERATION, e))?;
        let next = self
            .pages
            .to_continuation_token()
            .map_err(|e| StoreError::request(OPERATION, e))?
            .as_str()
            .to_owned();
        self.continuation = Some(next.clone());
        let request_charge = page
            .headers()
            .request_charge()
            .map_or(0.0, |charge| charge.value());
        let mut items = page.into_items();
        if let Some(since) = self.since {
            items.retain(|item| {
                item.current().is_none_or(|doc| {
                    doc.borrow()
                        .get("_ts")
                        .and_then(Value::as_i64)
                        .is_none_or(|ts| ts >= since)
                })
            });
        }
        Ok(ChangePage {
            items,
            continuation: Some(next),
            request_charge,
        })
    }
}

/// How many of the container's feed ranges (physical partitions, from the SDK's cached routing
/// map: no request when it is warm) overlap `range`; 1 when they cannot be read.
async fn partitions_of(monitored: &ContainerClient, range: &FeedRange) -> usize {
    let Ok(ranges) = monitored.read_feed_ranges(None).await else {
        return 1;
    };
    let lease = bounds(range);
    ranges
        .iter()
        .filter(|candidate| ranges::intersect(&bounds(candidate), &lease).is_some())
        .count()
        .max(1)
}
