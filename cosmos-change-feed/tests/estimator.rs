//! The change-feed backlog estimator (`cosmos_change_feed::ChangeFeedEstimator`) against the
//! SDK's in-memory emulator: it counts the documents after each lease's checkpoint that the
//! predicate accepts, per lease and in total, across a partition split, without counting a split
//! parent beside its children, and reports a lease it cannot read without failing the others.
//!
//! The expected counts come from queries scoped to each lease's feed range, not from the change
//! feed. No timed assertions: every wait is a bounded poll with a generous timeout.

mod support;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use azure_data_cosmos::CosmosClient;
use azure_data_cosmos::feed::{FeedRange, FeedScope, Query};
use chatter_emulator::RunningEmulator;
use cosmos_change_feed::{
    BatchFuture, ChangeFeedBatch, ChangeFeedEstimator, ChangeFeedProcessorOptions, LeaseBacklog,
    RunningProcessor, StartFrom,
};
use futures::StreamExt;
use serde_json::{Value, json};
use support::{
    Seen, Store, embedded, eventually, feed_range, feed_range_tokens, midpoint, order_ids,
    recording, served, upsert,
};

const DB: &str = "cfe";
const MONITORED: &str = "orders";
const LEASES: &str = "orders-leases";
/// Generous bound for anything the processor should do "soon".
const WAIT: Duration = Duration::from_secs(60);
/// How often a wait checks its condition.
const POLL: Duration = Duration::from_millis(50);
/// The documents the estimates count: `kind` is `outbox`.
const COUNTED: &str = "outbox";

/// Short timings so hand-overs happen within seconds; small pages so a backlog spans several.
fn fast_options() -> ChangeFeedProcessorOptions {
    support::fast_options().with_max_items_per_page(7)
}

async fn store_on(client: &CosmosClient) -> Store {
    Store::on(client, DB, MONITORED, LEASES).await
}

/// A `chatter-emulator` server (kept while the handle lives) and the store on it.
async fn served_store() -> (RunningEmulator, Store) {
    let (emulator, client) = served().await;
    (emulator, store_on(&client).await)
}

/// Writes `order-{i}` for every `i` of `range` as change `wave`, of kind `outbox` when
/// `counted(i)` (else `other`).
async fn write_orders(
    store: &Store,
    range: std::ops::Range<usize>,
    wave: u32,
    counted: impl Fn(usize) -> bool,
) {
    for i in range {
        let order = format!("order-{i}");
        let kind = if counted(i) { COUNTED } else { "other" };
        upsert(
            &store.monitored,
            &order,
            &json!({ "id": order, "orderId": order, "wave": wave, "kind": kind }),
        )
        .await;
    }
}

/// The estimators' predicate.
fn counted(document: &Value) -> bool {
    document["kind"] == COUNTED
}

/// A handler that refuses every page: nothing is checkpointed past what was.
fn refusing(_batch: ChangeFeedBatch) -> BatchFuture {
    Box::pin(async { Err("not now".into()) })
}

async fn start(
    store: &Store,
    processor: &str,
    handler: impl Fn(ChangeFeedBatch) -> BatchFuture + Send + Sync + 'static,
) -> RunningProcessor {
    store
        .processor(processor, "host-1")
        .options(fast_options())
        .start(handler)
        .await
        .unwrap()
}

/// The lease tokens an estimate reports on.
fn tokens_of(backlogs: &[LeaseBacklog]) -> BTreeSet<String> {
    backlogs.iter().map(|b| b.lease_token.clone()).collect()
}

fn estimator(store: &Store, processor: &str) -> ChangeFeedEstimator {
    ChangeFeedEstimator::new(
        processor,
        Arc::clone(&store.monitored),
        Arc::clone(&store.leases),
    )
    .options(fast_options())
}

/// The ids of the documents of change `wave` and kind `outbox` within `range`, by a query (not
/// the change feed): what an estimate of that range should count.
async fn counted_in(store: &Store, range: FeedRange, wave: u32) -> BTreeSet<String> {
    let query = Query::from("SELECT c.id FROM c WHERE c.wave = @wave AND c.kind = @kind")
        .with_parameter("@wave", wave)
        .unwrap()
        .with_parameter("@kind", COUNTED)
        .unwrap();
    let mut items = store
        .monitored
        .query_items::<Value>(query, FeedScope::range(range), None)
        .await
        .unwrap();
    let mut ids = BTreeSet::new();
    while let Some(item) = items.next().await {
        ids.insert(item.unwrap()["id"].as_str().unwrap().to_owned());
    }
    ids
}

/// Every lease's pending count, by lease token (panics on a lease that could not be read).
fn pending_by_lease(backlogs: &[LeaseBacklog]) -> BTreeMap<String, u64> {
    backlogs
        .iter()
        .map(|b| match &b.pending {
            Ok(pending) => (b.lease_token.clone(), *pending),
            Err(error) => panic!("lease {} could not be read: {error}", b.lease_token),
        })
        .collect()
}

/// Asserts each estimated lease counted exactly the wave-`wave` `outbox` documents of its own
/// range, and returns the total.
async fn assert_per_lease(
    store: &Store,
    processor: &str,
    backlogs: &[LeaseBacklog],
    wave: u32,
) -> u64 {
    let leases = store.leases_of(processor).await;
    let mut total = 0;
    for (token, pending) in pending_by_lease(backlogs) {
        let lease = leases.iter().find(|l| l.lease_token == token).unwrap();
        let range: FeedRange = lease.feed_range_token.parse().unwrap();
        let expected = counted_in(store, range, wave).await.len() as u64;
        assert_eq!(
            pending, expected,
            "lease {token} counts the matching documents of its own range after its checkpoint"
        );
        total += pending;
    }
    let charge: f64 = backlogs.iter().map(|b| b.request_charge).sum();
    eprintln!(
        "estimate of {} leases: {total} pending, {charge:.2} RU in all ({:?})",
        backlogs.len(),
        backlogs
            .iter()
            .map(|b| (b.lease_token.as_str(), b.request_charge))
            .collect::<Vec<_>>()
    );
    total
}

/// Hands over every document written so far (`0..written`) and checkpoints them, then shuts
/// the processor down (its leases released with their checkpoints).
async fn hand_over_and_checkpoint(store: &Store, processor: &str, written: usize) {
    let seen = Seen::default();
    let running = start(store, processor, recording(&seen)).await;
    let ranges = feed_range_tokens(&store.monitored).await.len();
    eventually(
        WAIT,
        POLL,
        "every document was handed over and every lease checkpointed",
        || async {
            let leases = store.leases_of(processor).await;
            seen.ids().is_superset(&order_ids(0..written))
                && leases.len() == ranges
                && leases.iter().all(|l| l.continuation_token.is_some())
        },
    )
    .await;
    running.shutdown().await;
}

// The estimate counts from each lease's checkpoint (not from the beginning), only what the
// predicate accepts, and per lease only its own range's documents.
#[tokio::test]
async fn an_estimate_counts_only_the_matching_documents_after_each_checkpoint() {
    let store = store_on(&embedded().await).await;
    // Wave 1: handed over and checkpointed; most of it would count.
    write_orders(&store, 0..30, 1, |i| i % 5 != 0).await;
    hand_over_and_checkpoint(&store, "relay", 30).await;
    let checkpointed = estimator(&store, "relay").estimate(counted).await.unwrap();
    assert_eq!(
        pending_by_lease(&checkpointed).values().sum::<u64>(),
        0,
        "nothing is pending right after the checkpoints: {checkpointed:?}"
    );

    // Wave 2: new documents and changes to handed-over ones, some of kind `outbox`.
    write_orders(&store, 20..70, 2, |i| i % 3 == 0).await;
    let expected = counted_in(&store, FeedRange::full(), 2).await;
    assert!(!expected.is_empty() && expected.len() < 50);

    let backlogs = estimator(&store, "relay").estimate(counted).await.unwrap();
    let ranges = feed_range_tokens(&store.monitored).await;
    assert_eq!(tokens_of(&backlogs), ranges, "one estimate per lease");
    assert!(backlogs.iter().all(|b| b.owner.is_none()), "{backlogs:?}");
    let total = assert_per_lease(&store, "relay", &backlogs, 2).await;
    assert_eq!(total, expected.len() as u64);

    // It only reads: the checkpoints are where the processor left them.
    let before: BTreeMap<String, Option<String>> = store
        .leases_of("relay")
        .await
        .into_iter()
        .map(|l| (l.lease_token, l.continuation_token))
        .collect();
    let again = estimator(&store, "relay").estimate(counted).await.unwrap();
    assert_eq!(pending_by_lease(&again), pending_by_lease(&backlogs));
    let after: BTreeMap<String, Option<String>> = store
        .leases_of("relay")
        .await
        .into_iter()
        .map(|l| (l.lease_token, l.continuation_token))
        .collect();
    assert_eq!(before, after, "the estimator never checkpoints");
}

/// Wave 1 handed over and checkpointed, then wave 2 written and the first physical partition
/// split while the processor is down. Returns the split parent's lease token and the wave-2
/// documents the estimates should count.
async fn split_with_a_backlog(
    emulator: &RunningEmulator,
    store: &Store,
    processor: &str,
) -> (String, BTreeSet<String>) {
    write_orders(store, 0..40, 1, |_| true).await;
    hand_over_and_checkpoint(store, processor, 40).await;
    let before = feed_range_tokens(&store.monitored).await;
    write_orders(store, 10..80, 2, |i| i % 2 == 0).await;
    emulator
        .store()
        .split_partition(DB, MONITORED, 0, Duration::from_millis(10));
    eventually(WAIT, POLL, "the partition split", || async {
        feed_range_tokens(&store.monitored).await.len() == before.len() + 1
    })
    .await;
    let parent = before
        .difference(&feed_range_tokens(&store.monitored).await)
        .next()
        .cloned()
        .expect("one range split");
    (parent, counted_in(store, FeedRange::full(), 2).await)
}

// Across a split: before the processor replaced the split lease, the lease is counted over its
// whole range; after it did, each child counts its own range, and the total is the same.
#[tokio::test]
async fn an_estimate_across_a_split_counts_each_child_range_once() {
    let (emulator, store) = served_store().await;
    let (parent, expected) = split_with_a_backlog(&emulator, &store, "relay").await;

    // The split lease is still the parent's: it is read over both child partitions.
    let during = estimator(&store, "relay").estimate(counted).await.unwrap();
    assert!(during.iter().any(|b| b.lease_token == parent), "{during:?}");
    let total = assert_per_lease(&store, "relay", &during, 2).await;
    assert_eq!(total, expected.len() as u64, "the total during the split");

    // The processor replaces the parent lease by child leases (handing nothing over).
    let running = start(&store, "relay", refusing).await;
    let ranges = feed_range_tokens(&store.monitored).await;
    eventually(
        WAIT,
        POLL,
        "the parent lease was replaced by child leases",
        || async {
            let tokens = store.lease_tokens("relay").await;
            tokens == ranges
        },
    )
    .await;
    running.shutdown().await;

    let after = estimator(&store, "relay").estimate(counted).await.unwrap();
    assert_eq!(
        tokens_of(&after),
        ranges,
        "one estimate per child and per unsplit lease"
    );
    let total = assert_per_lease(&store, "relay", &after, 2).await;
    assert_eq!(total, expected.len() as u64, "the total after the split");
}

// A split parent whose delete failed stays beside its children; the processor no longer polls
// it, and the estimate leaves it out rather than counting its children's documents twice.
#[tokio::test]
async fn a_split_parent_left_beside_its_children_is_not_counted_twice() {
    let (emulator, store) = served_store().await;
    let (parent, expected) = split_with_a_backlog(&emulator, &store, "relay").await;
    let ranges = feed_range_tokens(&store.monitored).await;

    // Lease deletes refused: the parent stays behind after the processor made its children.
    emulator
        .faults()
        .refuse("DELETE", 503, Duration::from_secs(3600));
    let running = start(&store, "relay", refusing).await;
    eventually(
        WAIT,
        POLL,
        "child leases exist beside the undeleted parent",
        || async {
            let tokens = store.lease_tokens("relay").await;
            tokens.contains(&parent) && tokens.is_superset(&ranges)
        },
    )
    .await;
    running.shutdown().await;

    let backlogs = estimator(&store, "relay").estimate(counted).await.unwrap();
    emulator.faults().clear();
    assert!(
        store
            .leases_of("relay")
            .await
            .iter()
            .any(|l| l.lease_token == parent),
        "the parent lease is still there"
    );
    assert_eq!(
        tokens_of(&backlogs),
        ranges,
        "the parent is left out: {backlogs:?}"
    );
    let total = assert_per_lease(&store, "relay", &backlogs, 2).await;
    assert_eq!(total, expected.len() as u64, "not doubled");
}

// One lease whose feed cannot be read (its checkpoint is no continuation the SDK can resume)
// reports its error; the call succeeds and the other leases are counted. Reads refused by the
// store fail every lease but not the call; only listing the leases failing fails the call.
#[tokio::test]
async fn a_lease_whose_feed_cannot_be_read_reports_its_error_and_the_others_still_count() {
    let (emulator, store) = served_store().await;
    write_orders(&store, 0..20, 1, |_| true).await;
    hand_over_and_checkpoint(&store, "relay", 20).await;
    write_orders(&store, 0..40, 2, |i| i % 2 == 1).await;

    // The first lease's checkpoint is overwritten by something that is no continuation.
    let broken = store.leases_of("relay").await.remove(0);
    let mut document = serde_json::to_value(&broken).unwrap();
    document["continuationToken"] = json!("not a continuation");
    upsert(&store.leases, &broken.id, &document).await;

    // One estimator for every call, as a service keeps it.
    let estimator = estimator(&store, "relay")
        .options(fast_options().with_store_timeout(Duration::from_secs(5)));
    let backlogs = estimator.estimate(counted).await.unwrap();
    let (failed, counted_leases): (Vec<&LeaseBacklog>, Vec<&LeaseBacklog>) = backlogs
        .iter()
        .partition(|b| b.lease_token == broken.lease_token);
    assert_eq!(failed.len(), 1, "{backlogs:?}");
    assert!(
        failed[0]
            .pending
            .as_ref()
            .is_err_and(|e| e.status() == Some(400)),
        "the SDK refuses the continuation: {:?}",
        failed[0]
    );
    assert!(!counted_leases.is_empty());
    let mut total = 0;
    for backlog in counted_leases {
        let range = store
            .leases_of("relay")
            .await
            .into_iter()
            .find(|l| l.lease_token == backlog.lease_token)
            .unwrap()
            .feed_range_token
            .parse()
            .unwrap();
        let expected = counted_in(&store, range, 2).await.len() as u64;
        assert_eq!(
            backlog.pending.as_ref().ok(),
            Some(&expected),
            "{backlog:?}"
        );
        total += expected;
    }
    assert!(total > 0, "the other leases have a backlog");

    // Change-feed reads (GET) refused: every lease reports the failure, the call succeeds.
    emulator
        .faults()
        .refuse("GET", 503, Duration::from_secs(3600));
    let refused = estimator.estimate(counted).await.unwrap();
    assert_eq!(refused.len(), backlogs.len());
    assert!(
        refused
            .iter()
            .filter(|b| b.lease_token != broken.lease_token)
            .all(|b| b.pending.as_ref().is_err_and(|e| e.status() == Some(503))),
        "every read was refused: {refused:?}"
    );
    emulator.faults().clear();

    // The lease query (POST) refused: the call fails.
    emulator
        .faults()
        .refuse("POST", 503, Duration::from_secs(3600));
    let listing = estimator.estimate(counted).await;
    emulator.faults().clear();
    assert!(
        listing.as_ref().is_err_and(|e| e.status() == Some(503)),
        "{listing:?}"
    );
}

// A lease without a checkpoint counts from where the processor would start it: everything with
// `Beginning`, nothing with `Now` (its first read starts from that moment).
#[tokio::test]
async fn a_lease_without_a_checkpoint_counts_from_the_processors_start() {
    let store = store_on(&embedded().await).await;
    write_orders(&store, 0..30, 1, |i| i % 2 == 0).await;
    // Free leases of every feed range, never polled (as a processor creates them).
    for range in store.monitored.read_feed_ranges(None).await.unwrap() {
        store.put_lease("fresh", &range, None, 0).await;
    }

    let from_beginning = estimator(&store, "fresh").estimate(counted).await.unwrap();
    let total = assert_per_lease(&store, "fresh", &from_beginning, 1).await;
    assert_eq!(total, 15);

    let from_now = estimator(&store, "fresh")
        .options(fast_options().with_start_from(StartFrom::Now))
        .estimate(counted)
        .await
        .unwrap();
    assert_eq!(from_now.len(), from_beginning.len());
    assert!(
        from_now
            .iter()
            .all(|b| matches!(b.pending, Ok(0)) && b.request_charge == 0.0),
        "nothing is behind a lease starting now: {from_now:?}"
    );
}

// Splits: while a split is only partly done (one child lease created, the parent still there
// and served), the child's range is counted once, by its parent, as the processor serves it.
#[tokio::test]
async fn a_partly_done_split_counts_each_range_once() {
    let store = store_on(&embedded().await).await;
    write_orders(&store, 0..40, 1, |_| true).await;
    hand_over_and_checkpoint(&store, "relay", 40).await;
    write_orders(&store, 0..40, 2, |_| true).await;
    let before = estimator(&store, "relay").estimate(counted).await.unwrap();
    let total: u64 = pending_by_lease(&before).values().sum();
    assert_eq!(total, 40);

    // The first child of the first lease's split, from the parent's checkpoint; the other
    // child not created yet.
    let parent = store.leases_of("relay").await.remove(0);
    let mid = midpoint(&parent.feed_range.min, &parent.feed_range.max);
    let child_range = feed_range(&parent.feed_range.min, &mid);
    let token = format!("{}-{mid}", parent.feed_range.min);
    let id = cosmos_change_feed::lease_id("relay", &store.scope().await, &token);
    let mut child = serde_json::to_value(&parent).unwrap();
    child["id"] = json!(id);
    child["leaseToken"] = json!(token);
    child["feedRange"]["max"] = json!(mid);
    child["feedRangeToken"] = json!(child_range.to_string());
    upsert(&store.leases, &id, &child).await;
    assert!(
        !counted_in(&store, child_range, 2).await.is_empty(),
        "the child's range holds documents"
    );

    let during = estimator(&store, "relay").estimate(counted).await.unwrap();
    assert!(!tokens_of(&during).contains(&token), "{during:?}");
    let total: u64 = pending_by_lease(&during).values().sum();
    assert_eq!(total, 40, "each document counted once: {during:?}");
}
