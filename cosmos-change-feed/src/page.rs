//! One page of a feed range's change feed: the read the lease workers and the estimator share.

use std::cell::{Ref, RefCell};
use std::num::NonZeroU32;

use azure_data_cosmos::clients::ContainerClient;
use azure_data_cosmos::feed::{ContinuationToken, FeedRange, FeedScope};
use azure_data_cosmos::models::ChangeFeedItem;
use azure_data_cosmos::options::{ChangeFeedOptions, ChangeFeedStartFrom, MaxItemCountHint};
use futures::StreamExt;
use serde_json::Value;

use crate::options::{ChangeFeedProcessorOptions, StartFrom};
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
    let max_items = NonZeroU32::new(options.max_items_per_page).unwrap_or(NonZeroU32::MIN);
    let mut feed_options =
        ChangeFeedOptions::default().with_max_item_count(MaxItemCountHint::Limit(max_items));
    if let Some(token) = continuation {
        feed_options =
            feed_options.with_continuation_token(ContinuationToken::from_string(token.to_owned()));
    }
    let start = match options.start_from {
        StartFrom::Beginning => ChangeFeedStartFrom::Beginning,
        StartFrom::Now => ChangeFeedStartFrom::Now,
    };
    let mut pages = monitored
        .query_change_feed::<RefCell<Value>>(
            FeedScope::range(range.clone()),
            start,
            Some(feed_options),
        )
        .await
        .map_err(|e| StoreError::request(OPERATION, e))?;
    let page = match pages.next().await {
        Some(page) => page.map_err(|e| StoreError::request(OPERATION, e))?,
        None => {
            return Ok(ChangePage {
                items: Vec::new(),
                continuation: continuation.map(str::to_owned),
                request_charge: 0.0,
            });
        }
    };
    let next = pages
        .to_continuation_token()
        .map_err(|e| StoreError::request(OPERATION, e))?
        .as_str()
        .to_owned();
    let request_charge = page
        .headers()
        .request_charge()
        .map_or(0.0, |charge| charge.value());
    Ok(ChangePage {
        items: page.into_items(),
        continuation: Some(next),
        request_charge,
    })
}
