//! The change-feed processor (`cosmos_change_feed`) against the SDK's
//! in-memory emulator: delivery, checkpoints, lease balancing, hand-over, expiry, splits.
//!
//! No timed assertions: every wait is a bounded poll with a generous timeout.

mod support;

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use azure_data_cosmos::CosmosClient;
use chatter_emulator::RunningEmulator;
use cosmos_change_feed::{
    BatchFuture, ChangeFeedBatch, LeaseFault, LeaseFaultStage, RunningProcessor, StartFrom,
    lease_id,
};
use serde_json::json;
use support::{
    Seen, Store, client_of, embedded, eventually, fast_options, feed_range, midpoint, order_ids,
    recording, served, upsert,
};

const DB: &str = "cfp";
const MONITORED: &str = "orders";
const LEASES: &str = "orders-leases";
/// Generous bound for anything the processor should do "soon".
const WAIT: Duration = Duration::from_secs(60);
/// How often a wait checks its condition.
const POLL: Duration = Duration::from_millis(50);

async fn store_on(client: &CosmosClient) -> Store {
    Store::on(client, DB, MONITORED, LEASES).await
}

/// A `chatter-emulator` server (kept while the handle lives) and the store on it.
async fn served_store() -> (RunningEmulator, Store) {
    let (emulator, client) = served().await;
    (emulator, store_on(&client).await)
}

async fn embedded_store() -> Store {
    store_on(&embedded().await).await
}

async fn write_orders(store: &Store, range: std::ops::Range<usize>, version: u32) {
    for i in range {
        let order = format!("order-{i}");
        upsert(
            &store.monitored,
            &order,
            &json!({ "id": order, "orderId": order, "version": version }),
        )
        .await;
    }
}

async fn start(
    store: &Store,
    processor: &str,
    instance: &str,
    handler: impl Fn(ChangeFeedBatch) -> BatchFuture + Send + Sync + 'static,
) -> RunningProcessor {
    store
        .processor(processor, instance)
        .options(fast_options())
        .start(handler)
        .await
        .unwrap()
}

/// One handed-over batch: its lease token and document ids.
type Attempt = (String, Vec<String>);

/// Every handed-over batch, in order.
type Batches = Arc<Mutex<Vec<Attempt>>>;

/// Appends `batch`'s lease token and document ids to `batches`.
fn record(batches: &Batches, batch: &ChangeFeedBatch) {
    let ids = batch
        .documents
        .iter()
        .filter_map(|d| d["id"].as_str().map(str::to_owned))
        .collect();
    batches
        .lock()
        .unwrap()
        .push((batch.lease_token.clone(), ids));
}

/// Waits until `processor` polls all `ranges` leases.
async fn every_lease_owned(processor: &RunningProcessor, ranges: usize) {
    owns(processor, ranges, "every lease is owned").await;
}

/// Waits until `processor` polls `count` leases; `what` names the wait if it times out.
async fn owns(processor: &RunningProcessor, count: usize, what: &str) {
    eventually(WAIT, POLL, what, || {
        let all = processor.owned_leases().len() == count;
        async move { all }
    })
    .await;
}

/// Waits until `seen` holds every order id of `orders` (see [`order_ids`]); `what` names the
/// wait if it times out.
async fn saw_orders(seen: &Seen, orders: std::ops::Range<usize>, what: &str) {
    let ids = order_ids(orders);
    eventually(WAIT, POLL, what, || {
        let done = seen.ids().is_superset(&ids);
        async move { done }
    })
    .await;
}

/// Writes one order, waits until `holding` says a handler holds its page, then refuses lease
/// writes (PUT 503) for 4 s: past the give-up point of [`fast_options`], so the held lease is
/// given up while its handler runs, and its writes work again afterwards.
async fn give_up_a_held_lease(
    emulator: &RunningEmulator,
    store: &Store,
    holding: impl Fn() -> bool,
) {
    write_orders(store, 0..1, 1).await;
    eventually(WAIT, POLL, "the handler holds a page", || {
        let held = holding();
        async move { held }
    })
    .await;
    emulator.faults().refuse("PUT", 503, Duration::from_secs(4));
}

/// Stores the lease of `processor` for `min..max` as another instance left it.
async fn put_lease(
    store: &Store,
    processor: &str,
    (min, max): (&str, &str),
    owner: Option<&str>,
    timestamp: i64,
) {
    store
        .put_lease(processor, &feed_range(min, max), owner, timestamp)
        .await;
}

/// A processor `name` (instance `host-1`) with `options` and a handler that does nothing, and
/// the lease tokens it reports released, in order.
async fn releasing(
    store: &Store,
    name: &str,
    options: cosmos_change_feed::ChangeFeedProcessorOptions,
) -> (RunningProcessor, Arc<Mutex<Vec<String>>>) {
    let released = Arc::new(Mutex::new(Vec::<String>::new()));
    let record = Arc::clone(&released);
    let processor = store
        .processor(name, "host-1")
        .options(options)
        .on_lease_released(move |lease| record.lock().unwrap().push(lease.to_owned()))
        .start(|_| Box::pin(async { Ok(()) }))
        .await
        .unwrap();
    (processor, released)
}

async fn feed_range_count(store: &Store) -> usize {
    store.monitored.read_feed_ranges(None).await.unwrap().len()
}

#[tokio::test]
async fn every_written_document_is_handed_to_the_handler_at_least_once() {
    let store = embedded_store().await;
    write_orders(&store, 0..40, 1).await;
    let seen = Seen::default();
    let processor = start(&store, "relay", "host-1", recording(&seen)).await;

    // Documents written before and after the start.
    write_orders(&store, 40..80, 1).await;
    saw_orders(&seen, 0..80, "every document was handed over").await;

    // A change to a delivered document is handed over again (latest version).
    write_orders(&store, 0..1, 2).await;
    eventually(
        WAIT,
        POLL,
        "the changed document was handed over again",
        || async { seen.count("order-0") >= 2 },
    )
    .await;
    processor.shutdown().await;
}

#[tokio::test]
async fn a_handler_error_hands_the_same_documents_again_without_advancing_the_continuation() {
    let store = embedded_store().await;
    write_orders(&store, 0..1, 1).await;

    let failing = Arc::new(AtomicBool::new(true));
    let failures = Arc::new(AtomicUsize::new(0));
    let batches: Arc<Mutex<Vec<Attempt>>> = Arc::default();
    let handler = {
        let (failing, failures, batches) = (
            Arc::clone(&failing),
            Arc::clone(&failures),
            Arc::clone(&batches),
        );
        move |batch: ChangeFeedBatch| -> BatchFuture {
            record(&batches, &batch);
            if failing.load(Ordering::SeqCst) {
                failures.fetch_add(1, Ordering::SeqCst);
                Box::pin(async { Err("broker unavailable".into()) })
            } else {
                Box::pin(async { Ok(()) })
            }
        }
    };
    let processor = start(&store, "relay", "host-1", handler).await;

    eventually(WAIT, POLL, "the handler failed three times", || async {
        failures.load(Ordering::SeqCst) >= 3
    })
    .await;
    let (lease_token, _) = batches.lock().unwrap()[0].clone();
    {
        let batches = batches.lock().unwrap();
        assert!(
            batches
                .iter()
                .all(|(token, ids)| *token == lease_token && *ids == vec!["order-0".to_owned()]),
            "every attempt carries the same documents from the same lease: {batches:?}"
        );
    }
    let lease = store
        .leases_of("relay")
        .await
        .into_iter()
        .find(|l| l.lease_token == lease_token)
        .expect("the lease exists");
    assert_eq!(
        lease.continuation_token, None,
        "a failed batch is not checkpointed"
    );
    assert_eq!(lease.owner.as_deref(), Some("host-1"));

    failing.store(false, Ordering::SeqCst);
    eventually(
        WAIT,
        POLL,
        "the batch was checkpointed after it succeeded",
        || async {
            store
                .leases_of("relay")
                .await
                .iter()
                .any(|l| l.lease_token == lease_token && l.continuation_token.is_some())
        },
    )
    .await;
    let delivered = batches.lock().unwrap().len();
    let after_success = delivered;
    // Quiet now: the checkpointed batch is not handed over again.
    write_orders(&store, 1..40, 1).await;
    eventually(WAIT, POLL, "later documents were handed over", || async {
        let ids: BTreeSet<String> = batches
            .lock()
            .unwrap()
            .iter()
            .flat_map(|(_, ids)| ids.clone())
            .collect();
        ids.is_superset(&order_ids(0..40))
    })
    .await;
    let redelivered_order_0 = batches.lock().unwrap()[after_success..]
        .iter()
        .any(|(_, ids)| ids.contains(&"order-0".to_owned()));
    assert!(
        !redelivered_order_0,
        "a checkpointed document is not handed over again"
    );
    processor.shutdown().await;
}

#[tokio::test]
async fn two_processors_with_the_same_name_split_the_leases_and_together_see_every_document() {
    let store = embedded_store().await;
    let ranges = feed_range_count(&store).await;
    assert!(
        ranges >= 2,
        "the emulator gives a container several feed ranges ({ranges})"
    );
    let seen = Seen::default();
    let a = start(&store, "relay", "host-a", recording(&seen)).await;
    let b = start(&store, "relay", "host-b", recording(&seen)).await;

    eventually(
        WAIT,
        POLL,
        "every lease is owned and the instances are balanced (one steal per acquire cycle)",
        || async {
            let (owned_a, owned_b) = (a.owned_leases(), b.owned_leases());
            owned_a.len() + owned_b.len() == ranges && owned_a.len().abs_diff(owned_b.len()) <= 1
        },
    )
    .await;
    let (owned_a, owned_b) = (a.owned_leases(), b.owned_leases());
    assert!(
        owned_a.iter().all(|l| !owned_b.contains(l)),
        "no lease is polled twice: {owned_a:?} / {owned_b:?}"
    );
    assert!(
        owned_a.len().abs_diff(owned_b.len()) <= 1,
        "{owned_a:?} / {owned_b:?}"
    );

    write_orders(&store, 0..60, 1).await;
    saw_orders(&seen, 0..60, "together they saw every document").await;
    a.shutdown().await;
    b.shutdown().await;
}

#[tokio::test]
async fn shutting_one_processor_down_releases_its_leases_and_the_other_takes_them_over() {
    let store = embedded_store().await;
    let ranges = feed_range_count(&store).await;
    let seen = Seen::default();
    let a = start(&store, "relay", "host-a", recording(&seen)).await;
    let b = start(&store, "relay", "host-b", recording(&seen)).await;
    eventually(WAIT, POLL, "both instances own leases", || async {
        !a.owned_leases().is_empty()
            && !b.owned_leases().is_empty()
            && a.owned_leases().len() + b.owned_leases().len() == ranges
    })
    .await;

    let released = a.owned_leases();
    a.shutdown().await;
    let leases = store.leases_of("relay").await;
    for token in &released {
        let lease = leases.iter().find(|l| &l.lease_token == token).unwrap();
        assert_ne!(
            lease.owner.as_deref(),
            Some("host-a"),
            "a shut-down instance owns nothing: {lease:?}"
        );
    }

    owns(&b, ranges, "the remaining instance owns every lease").await;
    write_orders(&store, 0..40, 1).await;
    saw_orders(&seen, 0..40, "the remaining instance saw every document").await;
    b.shutdown().await;
}

/// Leases of every feed range owned by a dead instance, "ghost", whose clock read
/// `ghost_clock` when it last renewed them (just now, by the store's clock).
async fn ghost_leases(store: &Store, processor: &str, ghost_clock: i64) -> usize {
    let ranges = store.monitored.read_feed_ranges(None).await.unwrap();
    for range in &ranges {
        store
            .put_lease(processor, range, Some("ghost"), ghost_clock)
            .await;
    }
    ranges.len()
}

fn now_ms() -> i64 {
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH);
    i64::try_from(now.unwrap().as_millis()).unwrap()
}

// Clocks: expiry is judged by the store's time of the last write (`_ts`), so a dead instance
// whose clock ran an hour ahead does not keep its leases for an hour.
#[tokio::test]
async fn an_expired_lease_of_a_dead_instance_is_stolen_whatever_its_clock_said() {
    let store = embedded_store().await;
    write_orders(&store, 0..30, 1).await;
    let ranges = ghost_leases(&store, "relay", now_ms() + 3_600_000).await;

    let seen = Seen::default();
    let processor = start(&store, "relay", "host-1", recording(&seen)).await;
    owns(&processor, ranges, "the live instance owns every lease").await;
    let leases = store.leases_of("relay").await;
    assert_eq!(leases.len(), ranges, "no duplicate leases: {leases:?}");
    assert!(
        leases.iter().all(|l| l.owner.as_deref() == Some("host-1")),
        "{leases:?}"
    );
    saw_orders(&seen, 0..30, "the ghost's documents were handed over").await;
    processor.shutdown().await;
}

// Clocks: a lease renewed by an instance whose clock runs far behind is not taken before the
// expiry has passed since the store wrote it.
#[tokio::test]
async fn a_lease_written_by_a_slow_clock_is_not_taken_before_it_expired() {
    let store = embedded_store().await;
    let ranges = ghost_leases(&store, "relay", 1_000).await;
    let written = std::time::Instant::now();
    let options = fast_options().with_lease_expiry(Duration::from_secs(12));
    let seen = Seen::default();
    let processor = store
        .processor("relay", "host-1")
        .options(options)
        .start(recording(&seen))
        .await
        .unwrap();
    // Many acquire cycles, well within the expiry: the ghost counts as a live instance, so
    // this one takes no more than its fair share (by stealing), not every lease as expired.
    tokio::time::sleep(Duration::from_secs(2)).await;
    if written.elapsed() < Duration::from_secs(10) {
        let owned = processor.owned_leases();
        assert!(
            owned.len() <= ranges.div_ceil(2),
            "taken as expired before the expiry: {owned:?} of {ranges}"
        );
    }
    owns(&processor, ranges, "taken once expired").await;
    processor.shutdown().await;
}

#[tokio::test]
async fn a_live_owner_keeps_its_lease_while_renewing_it() {
    let store = embedded_store().await;
    let ranges = feed_range_count(&store).await;
    let first = start(&store, "relay", "host-1", recording(&Seen::default())).await;
    owns(&first, ranges, "the first instance owns every lease").await;
    // A second processor under another name shares the lease container without touching
    // the first one's leases.
    let other = start(&store, "audit", "host-2", recording(&Seen::default())).await;
    owns(&other, ranges, "the other processor owns its own leases").await;
    assert_eq!(first.owned_leases().len(), ranges);
    assert_eq!(store.leases_of("relay").await.len(), ranges);
    assert_eq!(store.leases_of("audit").await.len(), ranges);
    first.shutdown().await;
    other.shutdown().await;
}

#[tokio::test]
async fn graceful_shutdown_leaves_every_lease_unowned_with_its_checkpoint() {
    let store = embedded_store().await;
    write_orders(&store, 0..30, 1).await;
    let seen = Seen::default();
    let processor = start(&store, "relay", "host-1", recording(&seen)).await;
    saw_orders(&seen, 0..30, "every document was handed over").await;
    processor.shutdown().await;

    let leases = store.leases_of("relay").await;
    assert_eq!(leases.len(), feed_range_count(&store).await);
    assert!(leases.iter().all(|l| l.owner.is_none()), "{leases:?}");
    assert!(
        leases.iter().all(|l| l.continuation_token.is_some()),
        "checkpoints are kept: {leases:?}"
    );

    // A restart resumes from the checkpoints: nothing already delivered comes again.
    let again = Seen::default();
    let restarted = start(&store, "relay", "host-2", recording(&again)).await;
    write_orders(&store, 30..31, 1).await;
    eventually(WAIT, POLL, "the new document was handed over", || async {
        again.ids().contains("order-30")
    })
    .await;
    assert_eq!(again.ids(), order_ids(30..31));
    restarted.shutdown().await;
}

#[tokio::test]
async fn a_feed_range_split_replaces_the_parent_lease_by_child_leases_without_losing_documents() {
    let (emulator, store) = served_store().await;
    let ranges_before = feed_range_count(&store).await;
    write_orders(&store, 0..40, 1).await;

    let seen = Seen::default();
    let processor = start(&store, "relay", "host-1", recording(&seen)).await;
    saw_orders(&seen, 0..40, "every document was handed over").await;

    // Split the first physical partition, then change every document again.
    emulator
        .store()
        .split_partition(DB, MONITORED, 0, Duration::from_millis(10));
    // Changes made while the split completes and before the processor noticed it.
    write_orders(&store, 0..40, 2).await;
    eventually(
        WAIT,
        POLL,
        "the parent lease was replaced by two child leases",
        || async {
            store.leases_of("relay").await.len() == ranges_before + 1
                && processor.owned_leases().len() == ranges_before + 1
        },
    )
    .await;
    write_orders(&store, 40..60, 1).await;
    eventually(
        WAIT,
        POLL,
        "every change after the split was handed over",
        || async {
            let seen = seen.snapshot();
            (0..40).all(|i| seen.get(&format!("order-{i}")).copied().unwrap_or(0) >= 2)
                && (40..60).all(|i| seen.contains_key(&format!("order-{i}")))
        },
    )
    .await;
    let leases = store.leases_of("relay").await;
    assert!(
        leases.iter().all(|l| l.continuation_token.is_some()),
        "child leases start from the parent's checkpoint: {leases:?}"
    );
    processor.shutdown().await;
}

// A lease whose feed range split reads every child partition of it, not just the first, while
// it is still one lease: with a 10-minute acquire interval the coordinator does not replace it
// by its children for the whole test, and the changes of every child are handed over within a
// few polls. Both start positions.
#[tokio::test]
async fn a_lease_over_a_split_range_hands_over_every_childs_changes_before_it_is_replaced() {
    for start_from in [StartFrom::Beginning, StartFrom::Now] {
        let (emulator, store) = served_store().await;
        let seen = Seen::default();
        let options = fast_options()
            .with_lease_acquire_interval(Duration::from_secs(600))
            .with_start_from(start_from);
        let caught_up = Arc::new(Mutex::new(BTreeSet::<String>::new()));
        let record = Arc::clone(&caught_up);
        let processor = store
            .processor("unsplit", "host-1")
            .options(options)
            .on_empty_read(move |lease| {
                record.lock().unwrap().insert(lease.to_owned());
            })
            .start(recording(&seen))
            .await
            .unwrap();
        let ranges = feed_range_count(&store).await;
        every_lease_owned(&processor, ranges).await;
        // Every lease has read its range up to now before anything changes.
        eventually(WAIT, POLL, "every lease caught up", || {
            let all = caught_up.lock().unwrap().len() == ranges;
            async move { all }
        })
        .await;
        write_orders(&store, 0..20, 1).await;
        saw_orders(
            &seen,
            0..20,
            "the documents before the split were handed over",
        )
        .await;
        emulator
            .store()
            .split_partition(DB, MONITORED, 0, Duration::from_millis(10));
        eventually(WAIT, POLL, "the split completed", || async {
            feed_range_count(&store).await == ranges + 1
        })
        .await;
        write_orders(&store, 20..120, 1).await;
        eventually(
            Duration::from_secs(20),
            POLL,
            "every change after the split was handed over, whichever child it is in",
            || {
                let done = seen.ids().is_superset(&order_ids(20..120));
                async move { done }
            },
        )
        .await;
        assert_eq!(
            processor.owned_leases().len(),
            ranges,
            "{start_from:?}: still the leases from before the split"
        );
        processor.shutdown().await;
    }
}

// A split waits for its lease's page in flight (up to the handler timeout) in a task of its
// own: meanwhile the acquire cycle goes on, here taking the leases another instance released.
#[tokio::test]
async fn a_split_waiting_for_its_page_in_flight_does_not_hold_up_acquiring_other_leases() {
    let (emulator, store) = served_store().await;
    let ranges = store.monitored.read_feed_ranges(None).await.unwrap();
    let mut tokens: Vec<(String, String)> = ranges
        .iter()
        .map(|r| (r.min_inclusive().to_string(), r.max_exclusive().to_string()))
        .collect();
    tokens.sort();
    let open = Arc::new(AtomicBool::new(false));
    let held = Arc::new(Mutex::new(None::<String>));
    let holding = {
        let (open, held) = (Arc::clone(&open), Arc::clone(&held));
        move |batch: ChangeFeedBatch| -> BatchFuture {
            let (open, held) = (Arc::clone(&open), Arc::clone(&held));
            Box::pin(async move {
                let first = {
                    let mut held = held.lock().unwrap();
                    let first = held.is_none();
                    held.get_or_insert_with(|| batch.lease_token.clone());
                    first
                };
                if first {
                    while !open.load(Ordering::SeqCst) {
                        tokio::time::sleep(Duration::from_millis(10)).await;
                    }
                }
                Ok(())
            })
        }
    };
    let a = start(&store, "busy-split", "host-a", holding).await;
    let b = start(&store, "busy-split", "host-b", |_| {
        Box::pin(async { Ok(()) })
    })
    .await;
    eventually(WAIT, POLL, "both instances own leases", || {
        let both = !a.owned_leases().is_empty()
            && !b.owned_leases().is_empty()
            && a.owned_leases().len() + b.owned_leases().len() == ranges.len();
        async move { both }
    })
    .await;
    write_orders(&store, 0..40, 1).await;
    eventually(WAIT, POLL, "a page of host-a is held", || {
        let is_held = held.lock().unwrap().is_some();
        async move { is_held }
    })
    .await;
    let token = held.lock().unwrap().clone().unwrap();
    let partition = tokens
        .iter()
        .position(|(min, max)| format!("{min}-{max}") == token)
        .expect("the held lease is a physical partition's range");
    emulator.store().split_partition(
        DB,
        MONITORED,
        u32::try_from(partition).unwrap(),
        Duration::from_millis(10),
    );
    eventually(WAIT, POLL, "the split completed", || async {
        feed_range_count(&store).await == ranges.len() + 1
    })
    .await;
    // Acquire cycles of host-a (every 200 ms) see the split now and wait for its page; host-b
    // leaves.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let released = b.owned_leases();
    b.shutdown().await;
    eventually(
        Duration::from_secs(10),
        POLL,
        "host-a took the leases host-b released while its split waits",
        || {
            let owned = a.owned_leases();
            let all = released.iter().all(|lease| owned.contains(lease));
            async move { all }
        },
    )
    .await;
    open.store(true, Ordering::SeqCst);
    owns(
        &a,
        ranges.len() + 1,
        "host-a serves every range, the split one's children included",
    )
    .await;
    a.shutdown().await;
}

// A lease opened over one partition whose range then split counts its partitions again at the
// end of a round: an idle first child does not make it wait a poll interval before reading the
// second one. Only the second child changes; the first thing the lease does about it is hand its
// changes over, not report itself caught up.
#[tokio::test]
async fn a_lease_whose_range_split_reads_its_second_child_before_calling_itself_caught_up() {
    let (emulator, store) = served_store().await;
    let events = Arc::new(Mutex::new(Vec::<(&'static str, String)>::new()));
    let (on_empty, on_batch) = (Arc::clone(&events), Arc::clone(&events));
    let seen = Seen::default();
    let record_seen = recording(&seen);
    let options = fast_options()
        .with_poll_interval(Duration::from_secs(2))
        .with_lease_acquire_interval(Duration::from_secs(600));
    let processor = store
        .processor("recount", "host-1")
        .options(options)
        .on_empty_read(move |lease| {
            on_empty
                .lock()
                .unwrap()
                .push(("caught up", lease.to_owned()))
        })
        .start(move |batch: ChangeFeedBatch| {
            on_batch
                .lock()
                .unwrap()
                .push(("batch", batch.lease_token.clone()));
            record_seen(batch)
        })
        .await
        .unwrap();
    let ranges = store.monitored.read_feed_ranges(None).await.unwrap();
    every_lease_owned(&processor, ranges.len()).await;
    eventually(WAIT, POLL, "every lease caught up once", || {
        let leases: BTreeSet<String> = events.lock().unwrap().iter().map(|e| e.1.clone()).collect();
        let all = leases.len() == ranges.len();
        async move { all }
    })
    .await;
    let parent = (
        ranges[0].min_inclusive().to_string(),
        ranges[0].max_exclusive().to_string(),
    );
    let parent_token = format!("{}-{}", parent.0, parent.1);
    emulator
        .store()
        .split_partition(DB, MONITORED, 0, Duration::from_millis(10));
    eventually(WAIT, POLL, "the split completed", || async {
        feed_range_count(&store).await == ranges.len() + 1
    })
    .await;
    let children: Vec<(String, String)> = store
        .monitored
        .read_feed_ranges(None)
        .await
        .unwrap()
        .iter()
        .map(|r| (r.min_inclusive().to_string(), r.max_exclusive().to_string()))
        .filter(|(min, max)| *min >= parent.0 && (parent.1 == "FF" || *max <= parent.1))
        .collect();
    let second = children.iter().max().cloned().expect("two children");
    // Orders whose keys fall in the second child only.
    let mut in_second = Vec::new();
    for i in 0..2000 {
        let key = format!("order-{i}");
        let range = store
            .monitored
            .feed_range_from_partition_key(key.clone(), None)
            .await
            .unwrap();
        let epk = range[0].min_inclusive().to_string();
        if epk >= second.0 && (second.1 == "FF" || epk < second.1) {
            in_second.push(i);
        }
        if in_second.len() == 5 {
            break;
        }
    }
    assert_eq!(in_second.len(), 5);
    // Written right after the split lease called itself caught up: it then sleeps its 2 s poll
    // interval, so the writes land while it sleeps and the next round starts after them.
    let mark = events.lock().unwrap().len();
    eventually(WAIT, POLL, "the split lease caught up again", || {
        let again = events.lock().unwrap()[mark..]
            .iter()
            .any(|e| e.0 == "caught up" && e.1 == parent_token);
        async move { again }
    })
    .await;
    let before = events.lock().unwrap().len();
    for &i in &in_second {
        write_orders(&store, i..i + 1, 2).await;
    }
    eventually(
        WAIT,
        POLL,
        "the second child's changes were handed over",
        || {
            let snapshot = seen.snapshot();
            let done = in_second
                .iter()
                .all(|i| snapshot.get(&format!("order-{i}")).copied().unwrap_or(0) >= 1);
            async move { done }
        },
    )
    .await;
    let after: Vec<(&str, String)> = events.lock().unwrap()[before..]
        .iter()
        .filter(|e| e.1 == parent_token)
        .cloned()
        .collect();
    assert_eq!(
        after.first().map(|e| e.0),
        Some("batch"),
        "the split lease handed the changes over before calling itself caught up: {after:?}"
    );
    processor.shutdown().await;
}

/// Every lease fault reported to `on_fault`: (lease token, stage, error text).
type Faults = Arc<Mutex<Vec<(String, LeaseFaultStage, String)>>>;

fn collecting(faults: &Faults) -> impl Fn(&LeaseFault<'_>) + Send + Sync + 'static {
    let faults = faults.clone();
    move |fault| {
        faults.lock().unwrap().push((
            fault.lease_token.to_owned(),
            fault.stage,
            fault.error.to_string(),
        ));
    }
}

// R8.60 (the processor's side): every lease fault reaches the relay with its lease token, reads
// and failed handlers alike, and the lease is retried rather than abandoned.
#[tokio::test]
async fn read_and_handler_faults_are_reported_with_their_lease_and_retried() {
    let (emulator, store) = served_store().await;
    write_orders(&store, 0..1, 1).await;
    let faults: Faults = Arc::default();
    let fail = Arc::new(AtomicBool::new(true));
    let seen = Seen::default();
    let handler = {
        let (fail, seen) = (fail.clone(), seen.clone());
        move |batch: ChangeFeedBatch| -> BatchFuture {
            let (fail, seen) = (fail.clone(), seen.clone());
            Box::pin(async move {
                if fail.load(Ordering::SeqCst) {
                    return Err("the handler refuses this page".into());
                }
                seen.record_all(batch.documents.iter().filter_map(|d| d["id"].as_str()));
                Ok(())
            })
        }
    };
    let processor = store
        .processor("faults", "host-1")
        .options(fast_options())
        .on_fault(collecting(&faults))
        .start(handler)
        .await
        .unwrap();
    let reported = |stage: LeaseFaultStage| {
        let faults = faults.clone();
        move || {
            let found = faults.lock().unwrap().iter().any(|(_, s, _)| *s == stage);
            async move { found }
        }
    };
    eventually(
        WAIT,
        POLL,
        "a handler fault is reported",
        reported(LeaseFaultStage::Handler),
    )
    .await;
    // The store refuses the change-feed reads (GET) for a while: read faults are reported too.
    emulator
        .faults()
        .refuse("GET", 503, Duration::from_secs(3600));
    eventually(
        WAIT,
        POLL,
        "a read fault is reported",
        reported(LeaseFaultStage::Read),
    )
    .await;
    emulator.faults().clear();
    fail.store(false, Ordering::SeqCst);
    eventually(WAIT, POLL, "the retried page is handled", || {
        let done = seen.count("order-0") == 1;
        async move { done }
    })
    .await;
    let leases: BTreeSet<String> = store
        .leases_of("faults")
        .await
        .into_iter()
        .map(|l| l.lease_token)
        .collect();
    for (lease, stage, error) in faults.lock().unwrap().iter() {
        assert!(
            leases.contains(lease),
            "{lease} is one of the processor's leases"
        );
        if *stage == LeaseFaultStage::Handler {
            assert_eq!(error, "the handler refuses this page");
        }
    }
    processor.shutdown().await;
}

// Lease protocol: the renewer keeps renewing until the poller has finished, also on shutdown, so
// a page still in flight never lets its lease expire and be taken (and handed over twice).
#[tokio::test]
async fn a_page_in_flight_during_shutdown_keeps_its_lease_until_it_is_done() {
    let store = embedded_store().await;
    write_orders(&store, 0..1, 1).await;
    let started = Arc::new(AtomicBool::new(false));
    let seen_by_a = Seen::default();
    let slow = {
        let (started, seen) = (started.clone(), seen_by_a.clone());
        move |batch: ChangeFeedBatch| -> BatchFuture {
            let (started, seen) = (started.clone(), seen.clone());
            Box::pin(async move {
                started.store(true, Ordering::SeqCst);
                // Longer than twice the lease expiry (3 s).
                tokio::time::sleep(Duration::from_secs(7)).await;
                seen.record_all(batch.documents.iter().filter_map(|d| d["id"].as_str()));
                Ok(())
            })
        }
    };
    let a = start(&store, "in-flight", "host-a", slow).await;
    eventually(WAIT, POLL, "host-a is handling the page", || {
        let going = started.load(Ordering::SeqCst);
        async move { going }
    })
    .await;
    let stopping = tokio::spawn(a.shutdown());
    let ranges = feed_range_count(&store).await;
    // host-b starts once host-a released its idle leases, so it takes free leases and never
    // needs to steal: the only way to the busy lease is its expiry.
    eventually(WAIT, POLL, "host-a released every idle lease", || async {
        let leases = store.leases_of("in-flight").await;
        leases.iter().filter(|l| l.owner.is_none()).count() == ranges - 1
    })
    .await;
    let seen_by_b = Seen::default();
    let b = start(&store, "in-flight", "host-b", recording(&seen_by_b)).await;
    stopping.await.unwrap();
    assert_eq!(seen_by_a.count("order-0"), 1, "host-a finished its page");
    owns(&b, ranges, "host-b owns every lease").await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(
        seen_by_b.count("order-0"),
        0,
        "host-b never got the page host-a was still handling"
    );
    b.shutdown().await;
}

// Lease protocol: an owner that cannot write its lease for almost the expiry stops serving it
// (another instance may own it by now), and takes it up again once the store is back.
#[tokio::test]
async fn an_owner_that_cannot_renew_its_lease_stops_serving_it_and_takes_it_up_again() {
    let (emulator, store) = served_store().await;
    let seen = Seen::default();
    let processor = start(&store, "unwritable", "host-1", recording(&seen)).await;
    let ranges = feed_range_count(&store).await;
    every_lease_owned(&processor, ranges).await;
    // Lease writes (PUT) refused: renewals fail.
    emulator.faults().refuse("PUT", 503, Duration::from_secs(6));
    eventually(WAIT, POLL, "the unwritable leases are given up", || {
        let none = processor.owned_leases().is_empty();
        async move { none }
    })
    .await;
    owns(&processor, ranges, "taken up again once writes work").await;
    write_orders(&store, 0..20, 1).await;
    saw_orders(&seen, 0..20, "documents flow again").await;
    processor.shutdown().await;
}

// One lease, one poller per instance: a lease given up while its handler is still running (its
// renewals failed) is not taken again until that handler has finished, so no two handler calls
// of one lease overlap and the lease stays listed once it is served again.
#[tokio::test]
async fn a_lease_given_up_mid_page_is_not_served_twice_and_stays_listed() {
    let (emulator, store) = served_store().await;
    let active = Arc::new(AtomicUsize::new(0));
    let most = Arc::new(AtomicUsize::new(0));
    let calls = Arc::new(AtomicUsize::new(0));
    let open = Arc::new(AtomicBool::new(false));
    // The lease-lost signal of the held page, to see when that very lease is given up.
    let held = Arc::new(Mutex::new(None::<cosmos_change_feed::LeaseLost>));
    let handler = {
        let (active, most, calls, open, held) = (
            Arc::clone(&active),
            Arc::clone(&most),
            Arc::clone(&calls),
            Arc::clone(&open),
            Arc::clone(&held),
        );
        move |batch: ChangeFeedBatch| -> BatchFuture {
            let (active, most, calls, open, held) = (
                Arc::clone(&active),
                Arc::clone(&most),
                Arc::clone(&calls),
                Arc::clone(&open),
                Arc::clone(&held),
            );
            Box::pin(async move {
                held.lock()
                    .unwrap()
                    .get_or_insert_with(|| batch.lease_lost.clone());
                let now = active.fetch_add(1, Ordering::SeqCst) + 1;
                most.fetch_max(now, Ordering::SeqCst);
                calls.fetch_add(1, Ordering::SeqCst);
                // The first call holds its page until the test opens the gate.
                while !open.load(Ordering::SeqCst) {
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
                active.fetch_sub(1, Ordering::SeqCst);
                Ok(())
            })
        }
    };
    let processor = start(&store, "one-poller", "host-1", handler).await;
    let ranges = feed_range_count(&store).await;
    every_lease_owned(&processor, ranges).await;
    give_up_a_held_lease(&emulator, &store, || calls.load(Ordering::SeqCst) == 1).await;
    eventually(WAIT, POLL, "the held lease is given up", || {
        let given_up = held.lock().unwrap().as_ref().is_some_and(|l| l.is_lost());
        async move { given_up }
    })
    .await;
    // Several acquire cycles after lease writes work again, the page is still held.
    tokio::time::sleep(Duration::from_secs(6)).await;
    assert_eq!(
        calls.load(Ordering::SeqCst),
        1,
        "no second poller handed the lease's page over while the first one's handler ran"
    );
    open.store(true, Ordering::SeqCst);
    owns(&processor, ranges, "the lease is served and listed again").await;
    write_orders(&store, 1..2, 1).await;
    eventually(WAIT, POLL, "the lease goes on", || {
        let more = calls.load(Ordering::SeqCst) >= 2;
        async move { more }
    })
    .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(processor.owned_leases().len(), ranges, "every lease listed");
    assert_eq!(
        most.load(Ordering::SeqCst),
        1,
        "handler calls never overlapped"
    );
    processor.shutdown().await;
}

// The handler learns when its lease is lost mid-page (`ChangeFeedBatch::lease_lost`), so it can
// stop instead of working beside the lease's next owner.
#[tokio::test]
async fn a_handler_learns_that_its_lease_was_lost_while_it_holds_a_page() {
    let (emulator, store) = served_store().await;
    let holding = Arc::new(AtomicUsize::new(0));
    let saw_loss = Arc::new(AtomicBool::new(false));
    let handler = {
        let (holding, saw_loss) = (Arc::clone(&holding), Arc::clone(&saw_loss));
        move |batch: ChangeFeedBatch| -> BatchFuture {
            let (holding, saw_loss) = (Arc::clone(&holding), Arc::clone(&saw_loss));
            Box::pin(async move {
                if holding.fetch_add(1, Ordering::SeqCst) == 0 {
                    assert!(!batch.lease_lost.is_lost());
                    // Long work, until the lease is lost.
                    tokio::time::timeout(WAIT, batch.lease_lost.lost())
                        .await
                        .expect("the loss is told");
                    saw_loss.store(batch.lease_lost.is_lost(), Ordering::SeqCst);
                }
                Ok(())
            })
        }
    };
    let processor = start(&store, "lost-mid-page", "host-1", handler).await;
    let ranges = feed_range_count(&store).await;
    every_lease_owned(&processor, ranges).await;
    give_up_a_held_lease(&emulator, &store, || holding.load(Ordering::SeqCst) == 1).await;
    eventually(WAIT, POLL, "the handler saw its lease lost", || {
        let saw = saw_loss.load(Ordering::SeqCst);
        async move { saw }
    })
    .await;
    processor.shutdown().await;
}

// A process paused past its lease's give-up point (a GC or scheduling pause, a suspended VM:
// here the handler blocks the runtime's one thread) resumes with the lease possibly someone
// else's. The handler is told at once, before the renewer has run again to say so: asked right
// after the pause, the lease is lost.
#[tokio::test]
async fn a_handler_paused_past_its_lease_expiry_is_told_at_once_that_the_lease_is_lost() {
    let store = embedded_store().await;
    // Whether the lease counted as lost before the pause and right after it.
    let seen = Arc::new(Mutex::new(Vec::<(bool, bool)>::new()));
    let handler = {
        let seen = Arc::clone(&seen);
        move |batch: ChangeFeedBatch| -> BatchFuture {
            let seen = Arc::clone(&seen);
            Box::pin(async move {
                if seen.lock().unwrap().is_empty() {
                    let before = batch.lease_lost.is_lost();
                    // Past the 3 s expiry of `fast_options`, the whole thread blocked.
                    std::thread::sleep(Duration::from_millis(3_200));
                    let after = batch.lease_lost.is_lost();
                    seen.lock().unwrap().push((before, after));
                }
                Ok(())
            })
        }
    };
    let processor = start(&store, "paused-mid-page", "host-1", handler).await;
    write_orders(&store, 0..1, 1).await;
    eventually(WAIT, POLL, "the handler was called", || {
        let called = !seen.lock().unwrap().is_empty();
        async move { called }
    })
    .await;
    assert_eq!(
        seen.lock().unwrap()[0],
        (false, true),
        "held before the pause, lost right after it"
    );
    processor.shutdown().await;
}

// A handler that stops early once told its lease is lost, and returns `Ok`, has nothing of its
// page checkpointed: the page is handed over again (here to the same instance, which acquires
// the lease anew, being the only one). Before, a lease lost by its give-up point alone (the
// renewer had not run yet) let the worker write the position past the page.
#[tokio::test]
async fn a_page_whose_handler_stopped_early_on_a_lost_lease_is_handed_over_again() {
    let store = embedded_store().await;
    // The first document id of each call, and whether the first call was told of the loss.
    let calls = Arc::new(Mutex::new(Vec::<String>::new()));
    let saw_loss = Arc::new(AtomicBool::new(false));
    let handler = {
        let (calls, saw_loss) = (Arc::clone(&calls), Arc::clone(&saw_loss));
        move |batch: ChangeFeedBatch| -> BatchFuture {
            let (calls, saw_loss) = (Arc::clone(&calls), Arc::clone(&saw_loss));
            Box::pin(async move {
                let first = batch.documents[0]["id"].as_str().unwrap_or_default();
                let call = {
                    let mut calls = calls.lock().unwrap();
                    calls.push(first.to_owned());
                    calls.len()
                };
                if call == 1 {
                    // Past the 3 s expiry of `fast_options`, the whole thread blocked; then
                    // the handler sees the loss and stops without doing its work.
                    std::thread::sleep(Duration::from_millis(3_200));
                    if batch.lease_lost.is_lost() {
                        saw_loss.store(true, Ordering::SeqCst);
                    }
                }
                Ok(())
            })
        }
    };
    let processor = start(&store, "stopped-early", "host-1", handler).await;
    write_orders(&store, 0..1, 1).await;
    eventually(WAIT, POLL, "the page is handed over again", || {
        let calls = calls.lock().unwrap().len();
        async move { calls >= 2 }
    })
    .await;
    assert!(saw_loss.load(Ordering::SeqCst), "the handler was told");
    let calls = calls.lock().unwrap().clone();
    assert_eq!(calls[0], calls[1], "the same page again: {calls:?}");
    processor.shutdown().await;
}

// A read the service refuses for a reason that does not clear by itself (here 403: the
// identity may not read) is a distinct state in `lease_statuses`, reported as a fault and tried
// again at the backoff cap; once reads work again the lease recovers and the state clears.
#[tokio::test]
async fn a_refused_read_is_shown_as_needing_an_operator_until_it_clears() {
    let (emulator, store) = served_store().await;
    let faults = Faults::default();
    let processor = store
        .processor("refused-reads", "host-1")
        .options(fast_options().with_max_backoff(Duration::from_millis(500)))
        .on_fault(collecting(&faults))
        .start(|_| Box::pin(async { Ok(()) }))
        .await
        .unwrap();
    let ranges = feed_range_count(&store).await;
    every_lease_owned(&processor, ranges).await;
    emulator.faults().refuse("GET", 403, Duration::from_secs(3));
    // The lease's error as `lease_statuses` shows it (its whole chain).
    let shown = Mutex::new(String::new());
    eventually(WAIT, POLL, "a lease needs an operator", || {
        let statuses = processor.lease_statuses();
        let found = statuses.into_iter().find_map(|s| {
            s.last_error
                .filter(|e| s.needs_operator && e.contains("403"))
        });
        let needs = found.is_some();
        if let Some(error) = found {
            *shown.lock().unwrap() = error;
        }
        async move { needs }
    })
    .await;
    assert!(
        faults
            .lock()
            .unwrap()
            .iter()
            .any(|(_, stage, error)| *stage == LeaseFaultStage::Read && error.contains("403")),
        "reported as a read fault"
    );
    // The request's own text names the operation and leaves the status to the SDK's header
    // (it said `failed with HTTP status 403: 403: ...`, the status once more per layer).
    let shown = shown.into_inner().unwrap();
    assert!(
        shown.starts_with("Cosmos DB query_change_feed failed: 403: "),
        "{shown}"
    );
    eventually(WAIT, POLL, "every lease recovered", || {
        let clear = processor
            .lease_statuses()
            .iter()
            .all(|s| !s.needs_operator && s.last_error.is_none());
        async move { clear }
    })
    .await;
    processor.shutdown().await;
}

// A 412 is no lost lease by itself: renewals that committed but whose answers came after the
// store timeout leave the instance with an old ETag, and its next write conflicts. The lease is
// read back, found still this instance's, and written again: it is never given up.
#[tokio::test]
async fn a_conflict_after_a_write_that_committed_without_an_answer_keeps_the_lease() {
    let (emulator, store) = served_store().await;
    let options = fast_options()
        .with_store_timeout(Duration::from_millis(500))
        .with_lease_expiry(Duration::from_secs(6));
    let (processor, released) = releasing(&store, "late-answers", options).await;
    let ranges = feed_range_count(&store).await;
    every_lease_owned(&processor, ranges).await;
    // For a second, lease writes commit at once but answer 2 s late: past the store timeout.
    emulator.faults().answer_late("PUT", Duration::from_secs(2));
    tokio::time::sleep(Duration::from_secs(1)).await;
    emulator.faults().clear();
    // Several renewals later, on ETags that changed under them.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(
        released.lock().unwrap().clone(),
        Vec::<String>::new(),
        "no lease was given up"
    );
    assert_eq!(processor.owned_leases().len(), ranges);
    processor.shutdown().await;
}

// Every lease an instance stops polling is reported to `on_lease_released` once its last page is
// done: given up after renewals failed, and released at shutdown (state kept beside the
// processor per lease, such as chatter's Drain Suspension, is dropped there).
#[tokio::test]
async fn every_lease_an_instance_stops_polling_is_reported_released() {
    let (emulator, store) = served_store().await;
    let (processor, released) = releasing(&store, "released", fast_options()).await;
    let ranges = feed_range_count(&store).await;
    every_lease_owned(&processor, ranges).await;
    let owned: BTreeSet<String> = processor.owned_leases().into_iter().collect();
    assert!(released.lock().unwrap().is_empty(), "nothing released yet");
    // Lease writes (PUT) refused: renewals fail and the leases are given up.
    emulator.faults().refuse("PUT", 503, Duration::from_secs(6));
    eventually(WAIT, POLL, "the unwritable leases are given up", || {
        let none = processor.owned_leases().is_empty();
        async move { none }
    })
    .await;
    let given_up: BTreeSet<String> = released.lock().unwrap().iter().cloned().collect();
    assert_eq!(given_up, owned, "each given-up lease is reported");
    owns(&processor, ranges, "taken up again once writes work").await;
    processor.shutdown().await;
    let reports = released.lock().unwrap().clone();
    for lease in &owned {
        assert_eq!(
            reports.iter().filter(|r| *r == lease).count(),
            2,
            "{lease}: given up, then released at shutdown: {reports:?}"
        );
    }
}

// Lease protocol: a lease document that cannot be read is reported at Error, and its feed range
// is still served (the document is replaced by a new lease).
#[tokio::test]
async fn a_malformed_lease_document_is_reported_and_its_range_still_served() {
    let (logs, _guard) = support::capture();
    let store = embedded_store().await;
    let scope = store.scope().await;
    for range in store.monitored.read_feed_ranges(None).await.unwrap() {
        let token = format!("{}-{}", range.min_inclusive(), range.max_exclusive());
        let id = lease_id("malformed", &scope, &token);
        upsert(
            &store.leases,
            &id,
            &json!({
                "id": id, "processorName": "malformed", "monitoredContainer": scope,
                "leaseToken": 7, "owner": ["?"]
            }),
        )
        .await;
    }
    write_orders(&store, 0..20, 1).await;
    let seen = Seen::default();
    let processor = start(&store, "malformed", "host-1", recording(&seen)).await;
    saw_orders(&seen, 0..20, "every document is handed over").await;
    assert!(
        !logs
            .matching(tracing::Level::ERROR, "malformed lease document")
            .is_empty(),
        "reported at Error"
    );
    processor.shutdown().await;
}

// Lease protocol: when deleting the parent lease after a split fails, the parent is never
// polled again beside its children (which would hand its documents over twice); its delete is
// retried until it goes.
#[tokio::test]
async fn a_split_parent_whose_delete_failed_is_never_polled_beside_its_children() {
    let (emulator, store) = served_store().await;
    let ranges_before = feed_range_count(&store).await;
    write_orders(&store, 0..40, 1).await;
    let batches: Batches = Arc::default();
    let handler = {
        let batches = batches.clone();
        move |batch: ChangeFeedBatch| -> BatchFuture {
            record(&batches, &batch);
            Box::pin(async { Ok(()) })
        }
    };
    let processor = start(&store, "parent", "host-1", handler).await;
    let handed_over = |batches: &Batches, range: std::ops::Range<usize>| {
        let seen: BTreeSet<String> = batches
            .lock()
            .unwrap()
            .iter()
            .flat_map(|(_, ids)| ids.clone())
            .collect();
        seen.is_superset(&order_ids(range))
    };
    eventually(WAIT, POLL, "every document was handed over", || {
        let done = handed_over(&batches, 0..40);
        async move { done }
    })
    .await;
    let tokens_before: BTreeSet<String> = store
        .leases_of("parent")
        .await
        .into_iter()
        .map(|l| l.lease_token)
        .collect();

    // Lease deletes refused: the parent stays behind after the split.
    emulator
        .faults()
        .refuse("DELETE", 503, Duration::from_secs(8));
    emulator
        .store()
        .split_partition(DB, MONITORED, 0, Duration::from_millis(10));
    eventually(
        WAIT,
        POLL,
        "child leases exist beside the undeleted parent",
        || async { store.leases_of("parent").await.len() == ranges_before + 2 },
    )
    .await;
    let parent = {
        let now: BTreeSet<String> = store
            .monitored
            .read_feed_ranges(None)
            .await
            .unwrap()
            .iter()
            .map(|r| format!("{}-{}", r.min_inclusive(), r.max_exclusive()))
            .collect();
        tokens_before
            .difference(&now)
            .next()
            .cloned()
            .expect("one range split")
    };
    let since = batches.lock().unwrap().len();
    write_orders(&store, 0..40, 2).await;
    eventually(
        WAIT,
        POLL,
        "the changes after the split were handed over",
        || {
            let done = batches.lock().unwrap()[since..]
                .iter()
                .flat_map(|(_, ids)| ids)
                .collect::<BTreeSet<_>>()
                .len()
                == 40;
            async move { done }
        },
    )
    .await;
    eventually(
        WAIT,
        POLL,
        "the parent lease is deleted once deletes work",
        || async { store.leases_of("parent").await.len() == ranges_before + 1 },
    )
    .await;
    let after: Vec<(String, Vec<String>)> = batches.lock().unwrap()[since..].to_vec();
    assert!(
        after.iter().all(|(token, _)| *token != parent),
        "the split parent {parent} was polled after the split: {after:?}"
    );
    processor.shutdown().await;
}

// Lease protocol: after a merge and a split at another boundary the leases still tile the whole
// key range. The emulator cannot merge, so the lease state is made directly: the first physical
// range's keys are split at a point of its own, and the second lease spans from there over the
// whole second range, as after merging both and splitting elsewhere.
#[tokio::test]
async fn leases_that_cross_range_boundaries_still_tile_the_key_range() {
    let store = embedded_store().await;
    let ranges = store.monitored.read_feed_ranges(None).await.unwrap();
    assert!(ranges.len() >= 2, "{} feed ranges", ranges.len());
    let (first, second) = (&ranges[0], &ranges[1]);
    let (a, b, c) = (
        first.min_inclusive().to_string(),
        first.max_exclusive().to_string(),
        second.max_exclusive().to_string(),
    );
    assert_eq!(second.min_inclusive().to_string(), b, "adjacent ranges");
    let m = midpoint(&a, &b);
    for bounds in [(a.as_str(), m.as_str()), (m.as_str(), c.as_str())] {
        put_lease(&store, "tile", bounds, None, 0).await;
    }
    write_orders(&store, 0..200, 1).await;
    let seen = Seen::default();
    let processor = start(&store, "tile", "host-1", recording(&seen)).await;
    saw_orders(&seen, 0..200, "every document is handed over").await;
    // Every key is in exactly one lease: they tile `""..FF` without overlap.
    let mut tiles: Vec<(String, String)> = store
        .leases_of("tile")
        .await
        .into_iter()
        .map(|l| (l.feed_range.min, l.feed_range.max))
        .collect();
    tiles.sort();
    assert_eq!(tiles.first().map(|t| t.0.as_str()), Some(""), "{tiles:?}");
    assert_eq!(tiles.last().map(|t| t.1.as_str()), Some("FF"), "{tiles:?}");
    assert!(
        tiles.windows(2).all(|w| w[0].1 == w[1].0),
        "no gap, no overlap: {tiles:?}"
    );
    processor.shutdown().await;
}

// A split left half done (a child lease created, the parent not yet covered by all of its
// children, e.g. its owner died in between) holds the child back: no instance takes it while the
// parent is there, so its documents are not handed over by both.
#[tokio::test]
async fn a_child_lease_of_an_unfinished_split_is_not_taken_while_its_parent_exists() {
    let store = embedded_store().await;
    let ranges = store.monitored.read_feed_ranges(None).await.unwrap();
    let processor = start(&store, "half-split", "host-1", |_| {
        Box::pin(async { Ok(()) })
    })
    .await;
    every_lease_owned(&processor, ranges.len()).await;
    // A child of the first range's lease, as the first of two children of a split.
    let (min, max) = (
        ranges[0].min_inclusive().to_string(),
        ranges[0].max_exclusive().to_string(),
    );
    let mid = midpoint(&min, &max);
    let token = format!("{min}-{mid}");
    put_lease(&store, "half-split", (&min, &mid), None, 0).await;
    // Many acquire cycles later, the child is still nobody's and the parent still served.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let owned = processor.owned_leases();
    assert!(!owned.contains(&token), "{owned:?}");
    assert!(owned.contains(&format!("{min}-{max}")), "{owned:?}");
    processor.shutdown().await;
}

// Every store call is bounded: a store that hangs (here: answers after 2 s, past a 500 ms store
// timeout) fails the lease's reads with a timeout, reported as a fault, and the lease carries
// on once the store answers in time again.
#[tokio::test]
async fn a_hanging_store_times_out_as_a_reported_fault_and_the_lease_carries_on() {
    let (emulator, store) = served_store().await;
    let faults: Faults = Arc::default();
    let seen = Seen::default();
    let processor = store
        .processor("slow", "host-1")
        .options(fast_options().with_store_timeout(Duration::from_millis(500)))
        .on_fault(collecting(&faults))
        .start(recording(&seen))
        .await
        .unwrap();
    let ranges = feed_range_count(&store).await;
    every_lease_owned(&processor, ranges).await;
    emulator.faults().set_latency(Duration::from_secs(2));
    eventually(WAIT, POLL, "a read timed out and was reported", || {
        let found = faults.lock().unwrap().iter().any(|(_, stage, error)| {
            *stage == LeaseFaultStage::Read && error.contains("timed out")
        });
        async move { found }
    })
    .await;
    emulator.faults().clear();
    write_orders(&store, 0..10, 1).await;
    saw_orders(&seen, 0..10, "documents flow again").await;
    processor.shutdown().await;
}

// Lease scope: one processor name on two monitored containers sharing a lease container has
// distinct leases for each; each instance hands over its own container's documents, all of them.
#[tokio::test]
async fn one_processor_name_on_two_containers_keeps_their_leases_apart() {
    let client = embedded().await;
    let first = Store::on(&client, DB, "orders-a", LEASES).await;
    let second = Store::on(&client, DB, "orders-b", LEASES).await;
    write_orders(&first, 0..20, 1).await;
    write_orders(&second, 100..120, 1).await;
    let (seen_first, seen_second) = (Seen::default(), Seen::default());
    let a = start(&first, "relay", "host-a", recording(&seen_first)).await;
    let b = start(&second, "relay", "host-b", recording(&seen_second)).await;
    saw_orders(&seen_first, 0..20, "the first container's documents").await;
    saw_orders(&seen_second, 100..120, "the second container's documents").await;
    assert_eq!(
        seen_first.ids(),
        order_ids(0..20),
        "only its own container's"
    );
    assert_eq!(
        seen_second.ids(),
        order_ids(100..120),
        "only its own container's"
    );
    let ranges = feed_range_count(&first).await + feed_range_count(&second).await;
    assert_eq!(
        store_leases(&first, "relay").await,
        ranges,
        "a lease per range of each"
    );
    a.shutdown().await;
    b.shutdown().await;
}

/// How many lease documents `processor` has, on any monitored container.
async fn store_leases(store: &Store, processor: &str) -> usize {
    store.leases_of(processor).await.len()
}

// Reset: `reset_leases` deletes every lease of the processor, so its next start begins from
// its start position again.
#[tokio::test]
async fn reset_leases_makes_the_next_start_begin_afresh() {
    let store = embedded_store().await;
    write_orders(&store, 0..20, 1).await;
    let seen = Seen::default();
    let processor = start(&store, "relay", "host-1", recording(&seen)).await;
    saw_orders(&seen, 0..20, "the first run").await;
    processor.shutdown().await;
    let other = start(&store, "other", "host-1", recording(&Seen::default())).await;
    other.shutdown().await;

    let ranges = feed_range_count(&store).await;
    let deleted = cosmos_change_feed::reset_leases(&store.leases, "relay")
        .await
        .unwrap();
    assert_eq!(deleted, ranges);
    assert!(store.leases_of("relay").await.is_empty());
    assert_eq!(
        store_leases(&store, "other").await,
        ranges,
        "other processors' stay"
    );

    let again = Seen::default();
    let processor = start(&store, "relay", "host-1", recording(&again)).await;
    saw_orders(&again, 0..20, "read again from the beginning").await;
    processor.shutdown().await;
}

// Migration: leases written before leases were scoped (no `monitoredContainer`, ids
// `{processor}..{range}`) are moved to the container's scope with their checkpoints, so an
// upgraded processor resumes where the old one stopped.
#[tokio::test]
async fn unscoped_leases_are_moved_to_the_scope_with_their_checkpoints() {
    let store = embedded_store().await;
    write_orders(&store, 0..20, 1).await;
    let seen = Seen::default();
    let processor = start(&store, "relay", "host-1", recording(&seen)).await;
    saw_orders(&seen, 0..20, "the first run").await;
    processor.shutdown().await;
    // Rewrite every lease as an earlier version stored it.
    for lease in store.leases_of("relay").await {
        let mut old = serde_json::to_value(&lease).unwrap();
        let old_id = format!("relay..{}", lease.lease_token);
        old["id"] = json!(old_id);
        old.as_object_mut().unwrap().remove("monitoredContainer");
        upsert(&store.leases, &old_id, &old).await;
        store
            .leases
            .delete_item(lease.id.clone(), &lease.id, None)
            .await
            .unwrap();
    }

    write_orders(&store, 20..30, 1).await;
    let after = Seen::default();
    let processor = start(&store, "relay", "host-1", recording(&after)).await;
    saw_orders(&after, 20..30, "the documents written since").await;
    assert_eq!(
        after.ids(),
        order_ids(20..30),
        "resumed from the checkpoints"
    );
    let leases = store.leases_of("relay").await;
    let scope = store.scope().await;
    assert_eq!(leases.len(), feed_range_count(&store).await, "{leases:?}");
    assert!(
        leases
            .iter()
            .all(|l| l.monitored_container.as_deref() == Some(scope.as_str())),
        "{leases:?}"
    );
    processor.shutdown().await;
}

// Start from a point in time: only documents changed at or after it are handed over (the SDK's
// emulator ignores the header the service applies; the processor's own filter holds either way).
#[tokio::test]
async fn a_point_in_time_start_hands_over_only_later_changes() {
    let store = embedded_store().await;
    write_orders(&store, 0..10, 1).await;
    // `_ts` has whole seconds: the point is in a later second than the first writes.
    tokio::time::sleep(Duration::from_millis(2100)).await;
    let point = std::time::SystemTime::now();
    write_orders(&store, 10..20, 1).await;
    let seen = Seen::default();
    let processor = store
        .processor("pit", "host-1")
        .options(fast_options().with_start_from(StartFrom::PointInTime(point)))
        .start(recording(&seen))
        .await
        .unwrap();
    saw_orders(&seen, 10..20, "the changes after the point").await;
    every_lease_owned(&processor, feed_range_count(&store).await).await;
    // Every lease has read its whole range by the time a later write comes through.
    write_orders(&store, 20..21, 1).await;
    saw_orders(&seen, 20..21, "a later write").await;
    assert_eq!(
        seen.ids(),
        order_ids(10..21),
        "nothing from before the point"
    );
    processor.shutdown().await;
}

// Notifications: every lease an instance takes is reported acquired, once per acquisition:
// at start, and when it takes over the leases of an instance that shut down.
#[tokio::test]
async fn every_lease_an_instance_takes_is_reported_acquired() {
    let store = embedded_store().await;
    let ranges = feed_range_count(&store).await;
    let acquired_by = |instance: &str| {
        let log: Arc<Mutex<Vec<String>>> = Arc::default();
        let sink = Arc::clone(&log);
        let builder = store
            .processor("acq", instance)
            .options(fast_options())
            .on_lease_acquired(move |token: &str| sink.lock().unwrap().push(token.to_owned()));
        (builder, log)
    };
    let (first, first_log) = acquired_by("host-1");
    let first = first.start(recording(&Seen::default())).await.unwrap();
    every_lease_owned(&first, ranges).await;
    let all: BTreeSet<String> = first.owned_leases().into_iter().collect();
    assert_eq!(first_log.lock().unwrap().len(), ranges, "each once");
    assert_eq!(
        first_log
            .lock()
            .unwrap()
            .iter()
            .cloned()
            .collect::<BTreeSet<_>>(),
        all
    );
    let (second, second_log) = acquired_by("host-2");
    let second = second.start(recording(&Seen::default())).await.unwrap();
    first.shutdown().await;
    owns(&second, ranges, "the second instance took every lease").await;
    let taken: BTreeSet<String> = second_log.lock().unwrap().iter().cloned().collect();
    assert_eq!(taken, all);
    second.shutdown().await;
}

#[derive(Debug, serde::Deserialize)]
struct Order {
    #[serde(rename = "orderId")]
    order_id: String,
    version: u32,
}

// The batch: its documents typed, and its feed range (the one its lease token names).
#[tokio::test]
async fn a_batch_gives_its_documents_typed_and_its_feed_range() {
    let store = embedded_store().await;
    write_orders(&store, 0..20, 3).await;
    let typed: Arc<Mutex<Vec<String>>> = Arc::default();
    let sink = Arc::clone(&typed);
    let processor = start(&store, "typed", "host-1", move |batch: ChangeFeedBatch| {
        let orders = batch.documents_as::<Order>().unwrap();
        assert!(orders.iter().all(|o| o.version == 3));
        let range = &batch.feed_range;
        assert_eq!(
            format!("{}-{}", range.min_inclusive(), range.max_exclusive()),
            batch.lease_token
        );
        sink.lock()
            .unwrap()
            .extend(orders.into_iter().map(|o| o.order_id));
        Box::pin(async { Ok(()) })
    })
    .await;
    eventually(WAIT, POLL, "every order typed", || {
        let n = typed.lock().unwrap().len();
        async move { n >= 20 }
    })
    .await;
    let ids: BTreeSet<String> = typed.lock().unwrap().iter().cloned().collect();
    assert_eq!(ids, order_ids(0..20));
    // A document of another shape is named by its id.
    upsert(
        &store.monitored,
        "odd",
        &json!({ "id": "odd", "orderId": "odd", "version": "three" }),
    )
    .await;
    let errors: Arc<Mutex<Vec<String>>> = Arc::default();
    let sink = Arc::clone(&errors);
    let other = start(
        &store,
        "typed-2",
        "host-1",
        move |batch: ChangeFeedBatch| {
            if let Err(error) = batch.documents_as::<Order>() {
                sink.lock().unwrap().push(error.to_string());
            }
            Box::pin(async { Ok(()) })
        },
    )
    .await;
    eventually(WAIT, POLL, "the odd document is named", || {
        let named = errors
            .lock()
            .unwrap()
            .iter()
            .any(|e| e.contains("id 'odd'"));
        async move { named }
    })
    .await;
    processor.shutdown().await;
    other.shutdown().await;
}

// Shutdown with a deadline: a handler that does not finish holds shutdown up only until the
// deadline, which names the lease still being served; without a page in flight it is `Ok`.
#[tokio::test]
async fn shutdown_within_a_deadline_names_the_leases_still_being_served() {
    let store = embedded_store().await;
    let quiet = start(&store, "quiet", "host-1", recording(&Seen::default())).await;
    every_lease_owned(&quiet, feed_range_count(&store).await).await;
    quiet
        .shutdown_within(Duration::from_secs(30))
        .await
        .unwrap();

    let held = Arc::new(AtomicBool::new(false));
    let holding = Arc::clone(&held);
    let processor = start(&store, "stuck", "host-1", move |batch: ChangeFeedBatch| {
        holding.store(true, Ordering::SeqCst);
        let token = batch.lease_token;
        Box::pin(async move {
            std::future::pending::<()>().await;
            let _ = token;
            Ok(())
        })
    })
    .await;
    write_orders(&store, 0..1, 1).await;
    eventually(WAIT, POLL, "a handler holds a page", || {
        let h = held.load(Ordering::SeqCst);
        async move { h }
    })
    .await;
    let error = processor
        .shutdown_within(Duration::from_millis(500))
        .await
        .unwrap_err();
    assert_eq!(error.unreleased.len(), 1, "{error}");
    assert!(error.to_string().contains(&error.unreleased[0]), "{error}");
}

/// The monitored container's change feed, as `chatter-emulator` counts its reads.
const FEED: &str = "dbs/cfp/colls/orders/docs";

// The next page is read while a page is handled (the read is not a step of its own between
// pages), and handing over stays in page order, each document once.
#[tokio::test]
async fn the_next_page_is_read_while_a_page_is_handled() {
    let (emulator, _) = served_store().await;
    // One feed range (one lease, so every change-feed read counted is this lease's), seen by a
    // client that did not cache the four it started with: three pages of two.
    emulator
        .merge_into_one_partition(DB, MONITORED)
        .await
        .unwrap();
    let store = store_on(&client_of(&emulator).await).await;
    for i in 0..6 {
        let id = format!("line-{i}");
        upsert(
            &store.monitored,
            "order-1",
            &json!({ "id": id, "orderId": "order-1" }),
        )
        .await;
    }
    let batches: Batches = Arc::default();
    // Change-feed reads the store answered while the first page of order-1 was being handled.
    let reads_meanwhile = Arc::new(Mutex::new(None::<u64>));
    let emulator = Arc::new(emulator);
    let processor = store
        .processor("read-ahead", "host-1")
        .options(fast_options().with_max_items_per_page(2))
        .start({
            let (batches, reads_meanwhile, emulator) =
                (batches.clone(), reads_meanwhile.clone(), emulator.clone());
            move |batch: ChangeFeedBatch| -> BatchFuture {
                let first = batch.documents.iter().any(|d| d["id"] == "line-0");
                record(&batches, &batch);
                let (reads_meanwhile, emulator) = (reads_meanwhile.clone(), emulator.clone());
                Box::pin(async move {
                    if first {
                        let reads = || emulator.feed_request_count("GET", FEED);
                        let before = reads();
                        // Until a read arrives, or long past any read a poller would make.
                        let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
                        while reads() == before && tokio::time::Instant::now() < deadline {
                            tokio::time::sleep(Duration::from_millis(10)).await;
                        }
                        *reads_meanwhile.lock().unwrap() = Some(reads() - before);
                    }
                    Ok(())
                })
            }
        })
        .await
        .unwrap();
    eventually(WAIT, POLL, "all six lines handed over", || {
        let n = batches
            .lock()
            .unwrap()
            .iter()
            .map(|(_, ids)| ids.len())
            .sum::<usize>();
        async move { n >= 6 }
    })
    .await;
    processor.shutdown().await;
    let reads = reads_meanwhile
        .lock()
        .unwrap()
        .expect("the first page was handled");
    assert!(
        reads >= 1,
        "no change-feed read while the first page was handled"
    );
    let handed: Vec<String> = batches
        .lock()
        .unwrap()
        .iter()
        .flat_map(|(_, ids)| ids.clone())
        .collect();
    let expected: Vec<String> = (0..6).map(|i| format!("line-{i}")).collect();
    assert_eq!(handed, expected, "in page order, each once");
}

// A page read ahead that came back empty is read again once the handler returned: a document
// written while the previous page was handled comes at once, not after the poll interval.
#[tokio::test]
async fn a_document_written_while_a_page_is_handled_comes_without_waiting_the_poll_interval() {
    let store = embedded_store().await;
    upsert(
        &store.monitored,
        "order-1",
        &json!({ "id": "first", "orderId": "order-1" }),
    )
    .await;
    let seen = Seen::default();
    let monitored = Arc::clone(&store.monitored);
    let processor = store
        .processor("empty-ahead", "host-1")
        // Far longer than the wait below: only a read right after the handler finds `second`.
        // Pages of one: `first` fills its page, so the next page is read ahead (and is empty).
        .options(
            fast_options()
                .with_poll_interval(Duration::from_secs(600))
                .with_max_items_per_page(1),
        )
        .start({
            let seen = seen.clone();
            move |batch: ChangeFeedBatch| -> BatchFuture {
                let ids: Vec<String> = batch
                    .documents
                    .iter()
                    .filter_map(|d| d["id"].as_str().map(str::to_owned))
                    .collect();
                seen.record_all(ids.iter().map(String::as_str));
                let monitored = Arc::clone(&monitored);
                Box::pin(async move {
                    if ids.iter().any(|id| id == "first") {
                        // Long enough for the read ahead to come back empty, then the write.
                        tokio::time::sleep(Duration::from_millis(500)).await;
                        upsert(
                            &monitored,
                            "order-1",
                            &json!({ "id": "second", "orderId": "order-1" }),
                        )
                        .await;
                    }
                    Ok(())
                })
            }
        })
        .await
        .unwrap();
    eventually(
        Duration::from_secs(30),
        POLL,
        "the second document came before the poll interval",
        || {
            let done = seen.count("second") > 0;
            async move { done }
        },
    )
    .await;
    processor.shutdown().await;
}
