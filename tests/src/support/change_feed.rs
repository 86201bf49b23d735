//! The change feed as the relay's tests see it: the current feed ranges of a container. (The
//! change-feed processor's and estimator's own tests live in the `cosmos-change-feed` crate.)

use std::collections::BTreeSet;

use chatter_runtime::cosmos::ContainerClient;

/// The lease tokens (`{min}-{max}`) of `container`'s current feed ranges (the SDK's cache
/// bypassed, so splits are seen).
pub async fn feed_range_tokens(container: &ContainerClient) -> BTreeSet<String> {
    use azure_data_cosmos::options::ReadFeedRangesOptions;
    container
        .read_feed_ranges(Some(
            ReadFeedRangesOptions::default().with_force_refresh(true),
        ))
        .await
        .unwrap()
        .iter()
        .map(|r| format!("{}-{}", r.min_inclusive(), r.max_exclusive()))
        .collect()
}
