//! The Standalone Inbox Gate (catalog section 7): a Claimed Inbox Marker per message id in an
//! idempotency container, two phases, take-over of an attempt that did not complete, a conflict
//! confirmed by reading back, markers never deleted. Against the embedded store, and a
//! `chatter-emulator` server where a fault is needed.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use chatter_runtime::cosmos::{CosmosConnection, inbox_id, partition_key};
use chatter_runtime::inbox::{
    InboxError, InboxOptions, InboxOptionsError, InboxOutcome, InboxSetupError, StandaloneInbox,
};
use chatter_runtime::provision;
use chatter_runtime::testing::upsert_item;
use chatter_tests::store::{emulator_server, find_document, wire_keys};
use serde_json::{Value, json};

const DB: &str = "payments";
const CONTAINER: &str = "idempotency";

async fn inbox_on(cosmos: &CosmosConnection, options: InboxOptions) -> StandaloneInbox {
    provision::ensure_container(cosmos, DB, CONTAINER, &["/idempotencyKey"])
        .await
        .unwrap();
    StandaloneInbox::new(cosmos, options).await.unwrap()
}

async fn embedded_inbox() -> (CosmosConnection, StandaloneInbox) {
    let cosmos = CosmosConnection::embedded().await.unwrap();
    let inbox = inbox_on(&cosmos, InboxOptions::new(DB, CONTAINER)).await;
    (cosmos, inbox)
}

/// The marker of `message_id`, as stored.
async fn marker(cosmos: &CosmosConnection, message_id: &str) -> Option<Value> {
    let c = cosmos.container(DB, CONTAINER).await.unwrap();
    find_document(&c, &[json!(message_id)], &inbox_id(message_id).unwrap()).await
}

/// A handler that counts its runs and succeeds.
fn counting(
    runs: &Arc<AtomicUsize>,
) -> impl FnOnce() -> std::future::Ready<Result<(), std::io::Error>> {
    let runs = Arc::clone(runs);
    move || {
        runs.fetch_add(1, Ordering::SeqCst);
        std::future::ready(Ok(()))
    }
}

/// Stores `marker` at its id, as another process (or the .NET module) left it.
async fn seed(cosmos: &CosmosConnection, message_id: &str, marker: Value) {
    let c = cosmos.container(DB, CONTAINER).await.unwrap();
    upsert_item(&c, partition_key(&[json!(message_id)]).unwrap(), &marker)
        .await
        .unwrap();
}

/// A Claimed Inbox Marker exactly as the .NET module writes it (section 0.4).
fn dotnet_marker(message_id: &str, completed: bool) -> Value {
    json!({
        "id": inbox_id(message_id).unwrap(),
        "_chatterType": "inbox",
        "MessageId": message_id,
        "ReceivedAtUtc": "2026-11-30T08:15:00.1234567Z",
        "Completed": completed,
        "idempotencyKey": message_id,
    })
}

// R7.20, R7.36, R7.39: a new id runs the handler once and leaves a completed marker in the
// exact wire shape, keyed by the message id; R7.21, R7.28: a redelivery skips the handler.
#[tokio::test]
async fn a_new_message_id_runs_the_handler_once_and_a_redelivery_skips_it() {
    let (cosmos, inbox) = embedded_inbox().await;
    let runs = Arc::new(AtomicUsize::new(0));
    assert_eq!(
        inbox.receive("evt-1", counting(&runs)).await.unwrap(),
        InboxOutcome::Handled
    );
    assert_eq!(
        inbox.receive("evt-1", counting(&runs)).await.unwrap(),
        InboxOutcome::AlreadyCompleted
    );
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    let stored = marker(&cosmos, "evt-1").await.unwrap();
    assert_eq!(
        wire_keys(&stored),
        [
            "id",
            "_chatterType",
            "MessageId",
            "ReceivedAtUtc",
            "Completed",
            // chatter's own: how long the claim could stay live (the .NET module ignores it).
            "ClaimSeconds",
            "idempotencyKey"
        ]
    );
    assert_eq!(stored["id"], inbox_id("evt-1").unwrap());
    assert_eq!(stored["_chatterType"], "inbox");
    assert_eq!(stored["MessageId"], "evt-1");
    assert_eq!(stored["Completed"], true);
    assert_eq!(stored["idempotencyKey"], "evt-1");
    assert!(stored["ReceivedAtUtc"].as_str().unwrap().ends_with('Z'));
}

// R7.37, R7.38: a positive marker ttl is stamped as an integer; zero or negative stamps none.
#[tokio::test]
async fn a_positive_marker_ttl_is_stamped_and_no_other() {
    let cosmos = CosmosConnection::embedded().await.unwrap();
    let with = inbox_on(
        &cosmos,
        InboxOptions::new(DB, CONTAINER).marker_ttl_seconds(3600),
    )
    .await;
    with.receive("ttl-1", || async { Ok::<(), std::io::Error>(()) })
        .await
        .unwrap();
    assert_eq!(marker(&cosmos, "ttl-1").await.unwrap()["ttl"], 3600);
    let zero = inbox_on(
        &cosmos,
        InboxOptions::new(DB, CONTAINER).marker_ttl_seconds(0),
    )
    .await;
    zero.receive("ttl-0", || async { Ok::<(), std::io::Error>(()) })
        .await
        .unwrap();
    assert!(marker(&cosmos, "ttl-0").await.unwrap().get("ttl").is_none());
}

// R7.22, R7.41, interop: a pending marker (an attempt that crashed, here as the .NET module
// writes it) is taken over: the handler runs once and the marker is completed.
#[tokio::test]
async fn a_pending_marker_of_a_crashed_attempt_is_taken_over() {
    let (cosmos, inbox) = embedded_inbox().await;
    seed(&cosmos, "evt-crashed", dotnet_marker("evt-crashed", false)).await;
    let runs = Arc::new(AtomicUsize::new(0));
    assert_eq!(
        inbox.receive("evt-crashed", counting(&runs)).await.unwrap(),
        InboxOutcome::TakenOver
    );
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    assert_eq!(
        marker(&cosmos, "evt-crashed").await.unwrap()["Completed"],
        true
    );
}

// Interop: a completed marker the .NET module wrote is recognised: the handler does not run.
#[tokio::test]
async fn a_completed_marker_written_by_dotnet_skips_the_handler() {
    let (cosmos, inbox) = embedded_inbox().await;
    seed(&cosmos, "evt-dotnet", dotnet_marker("evt-dotnet", true)).await;
    let runs = Arc::new(AtomicUsize::new(0));
    assert_eq!(
        inbox.receive("evt-dotnet", counting(&runs)).await.unwrap(),
        InboxOutcome::AlreadyCompleted
    );
    assert_eq!(runs.load(Ordering::SeqCst), 0);
}

// R7.24, R7.25: a conflicting document that is not this id's marker (another kind, another
// message id) is not skipped: the receive fails loudly and the handler does not run.
#[tokio::test]
async fn a_conflict_with_a_document_that_is_not_the_marker_fails_loudly() {
    let (cosmos, inbox) = embedded_inbox().await;
    let mut outbox = dotnet_marker("evt-foreign", true);
    outbox["_chatterType"] = json!("outbox");
    seed(&cosmos, "evt-foreign", outbox).await;
    let mut other = dotnet_marker("evt-other", true);
    other["MessageId"] = json!("someone-else");
    seed(&cosmos, "evt-other", other).await;
    let runs = Arc::new(AtomicUsize::new(0));
    for id in ["evt-foreign", "evt-other"] {
        let error = inbox.receive(id, counting(&runs)).await.unwrap_err();
        assert!(
            matches!(error, InboxError::UnconfirmedConflict { .. }),
            "{error:?}"
        );
        assert!(
            error
                .to_string()
                .contains("could not confirm the conflicting document"),
            "{error}"
        );
    }
    assert_eq!(runs.load(Ordering::SeqCst), 0);
}

// R7.30, R7.32, R7.42: a failing handler leaves its marker pending (never deleted), and the next
// delivery takes it over; once completed, a later delivery never runs the handler (the trap never
// springs) and the marker stays completed.
#[tokio::test]
async fn a_failed_handler_leaves_a_pending_marker_that_the_next_delivery_takes_over() {
    let (cosmos, inbox) = embedded_inbox().await;
    let error = inbox
        .receive("evt-flaky", || async {
            Err(std::io::Error::other("the mail server said no"))
        })
        .await
        .unwrap_err();
    let InboxError::Handler { source, .. } = &error else {
        panic!("{error:?}");
    };
    assert_eq!(source.to_string(), "the mail server said no");
    assert_eq!(
        marker(&cosmos, "evt-flaky").await.unwrap()["Completed"],
        false
    );
    let runs = Arc::new(AtomicUsize::new(0));
    assert_eq!(
        inbox.receive("evt-flaky", counting(&runs)).await.unwrap(),
        InboxOutcome::TakenOver
    );
    let trap = inbox
        .receive("evt-flaky", || async {
            Err(std::io::Error::other("must never run"))
        })
        .await
        .unwrap();
    assert_eq!(trap, InboxOutcome::AlreadyCompleted);
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    assert_eq!(
        marker(&cosmos, "evt-flaky").await.unwrap()["Completed"],
        true
    );
}

// R7.29, R7.35: a blank id, or one whose marker id is too long, fails before any store call.
#[tokio::test]
async fn a_blank_or_overlong_message_id_fails_before_any_store_call() {
    let (emulator, cosmos) = emulator_server().await;
    let inbox = inbox_on(&cosmos, InboxOptions::new(DB, CONTAINER)).await;
    let posts = emulator.request_count("POST");
    let runs = Arc::new(AtomicUsize::new(0));
    for blank in ["", "   "] {
        let error = inbox.receive(blank, counting(&runs)).await.unwrap_err();
        assert!(
            error
                .to_string()
                .starts_with("A brokered message must carry a non-null, non-whitespace message id"),
            "{error}"
        );
    }
    let error = inbox
        .receive(&"x".repeat(1000), counting(&runs))
        .await
        .unwrap_err();
    assert!(matches!(error, InboxError::Marker { .. }), "{error:?}");
    assert_eq!(emulator.request_count("POST"), posts, "no create was sent");
    assert_eq!(runs.load(Ordering::SeqCst), 0);
}

// R7.23, R7.33: the handler ran but its completion patch was refused (503): the store error is
// returned, the handler ran once, the marker stays pending (the next delivery runs it again).
#[tokio::test]
async fn a_refused_completion_is_an_error_after_the_handler_ran_once() {
    let (emulator, cosmos) = emulator_server().await;
    let inbox = inbox_on(&cosmos, InboxOptions::new(DB, CONTAINER)).await;
    emulator
        .faults()
        .refuse("PATCH", 503, Duration::from_secs(3600));
    let runs = Arc::new(AtomicUsize::new(0));
    let error = inbox
        .receive("evt-patch", counting(&runs))
        .await
        .unwrap_err();
    emulator.faults().clear();
    let InboxError::Completion { source, .. } = &error else {
        panic!("{error:?}");
    };
    assert_eq!(source.status(), Some(503));
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    assert_eq!(
        marker(&cosmos, "evt-patch").await.unwrap()["Completed"],
        false
    );
}

// R7.26: a conflict whose read-back first finds nothing (404) reads again after the interval and
// then finds the completed marker: skipped.
#[tokio::test]
async fn a_read_back_that_first_finds_nothing_reads_again_within_the_budget() {
    let (emulator, cosmos) = emulator_server().await;
    let inbox = inbox_on(
        &cosmos,
        InboxOptions::new(DB, CONTAINER).read_back(5, Duration::from_millis(1500)),
    )
    .await;
    seed(&cosmos, "evt-late", dotnet_marker("evt-late", true)).await;
    let gets = emulator.request_count("GET");
    // The first read answers 404; the window ends before the second.
    emulator
        .faults()
        .refuse("GET", 404, Duration::from_millis(700));
    let runs = Arc::new(AtomicUsize::new(0));
    let outcome = inbox.receive("evt-late", counting(&runs)).await.unwrap();
    emulator.faults().clear();
    assert_eq!(outcome, InboxOutcome::AlreadyCompleted);
    assert_eq!(runs.load(Ordering::SeqCst), 0);
    assert_eq!(emulator.request_count("GET") - gets, 2, "two reads");
}

// R7.27: reads that keep finding nothing use up the budget (one read per attempt), then the
// receive fails loudly.
#[tokio::test]
async fn reads_that_keep_finding_nothing_use_up_the_budget_and_fail() {
    let (emulator, cosmos) = emulator_server().await;
    let inbox = inbox_on(
        &cosmos,
        InboxOptions::new(DB, CONTAINER).read_back(3, Duration::from_millis(10)),
    )
    .await;
    seed(&cosmos, "evt-gone", dotnet_marker("evt-gone", true)).await;
    let gets = emulator.request_count("GET");
    emulator
        .faults()
        .refuse("GET", 404, Duration::from_secs(3600));
    let runs = Arc::new(AtomicUsize::new(0));
    let error = inbox
        .receive("evt-gone", counting(&runs))
        .await
        .unwrap_err();
    emulator.faults().clear();
    assert!(
        matches!(error, InboxError::UnconfirmedConflict { .. }),
        "{error:?}"
    );
    assert_eq!(
        emulator.request_count("GET") - gets,
        3,
        "one read per attempt"
    );
    assert_eq!(runs.load(Ordering::SeqCst), 0);
}

// R7.01, R7.03 to R7.05, R7.07, R7.09 to R7.12: the options' defaults, and what they refuse.
#[test]
fn the_options_default_and_refuse_what_cannot_work() {
    let defaults = InboxOptions::new(DB, CONTAINER);
    assert_eq!(defaults.partition_key_path, "/idempotencyKey");
    assert_eq!(defaults.marker_ttl_seconds, None);
    assert_eq!(defaults.read_back_attempts, 5);
    assert_eq!(defaults.read_back_interval, Duration::from_millis(50));
    let refused = |options: InboxOptions| options.validate().unwrap_err();
    assert_eq!(
        refused(InboxOptions::new(" ", CONTAINER)),
        InboxOptionsError::BlankDatabase
    );
    assert_eq!(
        refused(InboxOptions::new(DB, "")),
        InboxOptionsError::BlankContainer
    );
    assert_eq!(
        refused(defaults.clone().partition_key_path("")),
        InboxOptionsError::NoPartitionKeyPath
    );
    assert_eq!(
        refused(defaults.clone().read_back(0, Duration::ZERO)).to_string(),
        "ReadBackMaxAttempts must be at least 1 so the confirm read-back runs at least once."
    );
    assert_eq!(
        refused(
            defaults
                .clone()
                .partition_key_path("/ttl")
                .marker_ttl_seconds(60)
        ),
        InboxOptionsError::TtlPath
    );
    assert!(
        defaults
            .clone()
            .partition_key_path("/ttl")
            .validate()
            .is_ok(),
        "R7.10"
    );
    for reserved in [
        "/id",
        "/_chatterType",
        "/MessageId",
        "/ReceivedAtUtc",
        "/Completed",
    ] {
        assert!(
            matches!(
                refused(defaults.clone().partition_key_path(reserved)),
                InboxOptionsError::ReservedRoot { .. }
            ),
            "{reserved}"
        );
    }
}

// Start-time check: an idempotency container partitioned by another path is refused.
#[tokio::test]
async fn an_idempotency_container_partitioned_otherwise_is_refused() {
    let cosmos = CosmosConnection::embedded().await.unwrap();
    provision::ensure_container(&cosmos, DB, "by-tenant", &["/tenantId"])
        .await
        .unwrap();
    let error = StandaloneInbox::new(&cosmos, InboxOptions::new(DB, "by-tenant"))
        .await
        .unwrap_err();
    assert!(
        matches!(error, InboxSetupError::PartitionKeyPath { .. }),
        "{error:?}"
    );
    let missing = StandaloneInbox::new(&cosmos, InboxOptions::new(DB, "missing"))
        .await
        .unwrap_err();
    assert!(
        matches!(missing, InboxSetupError::Container { .. }),
        "{missing:?}"
    );
}

type Held = std::pin::Pin<Box<dyn std::future::Future<Output = Result<(), std::io::Error>> + Send>>;

/// A handler that counts its runs and returns once `release` is notified.
fn held(
    runs: &Arc<AtomicUsize>,
    release: &Arc<tokio::sync::Notify>,
) -> impl FnOnce() -> Held + Send + use<> {
    let (runs, release) = (Arc::clone(runs), Arc::clone(release));
    move || {
        runs.fetch_add(1, Ordering::SeqCst);
        Box::pin(async move {
            release.notified().await;
            Ok(())
        })
    }
}

// A second copy of a message id that arrives while the first attempt's handler still runs is
// not run beside it: the claim is live, so the copy is told to come back later. Once the first
// completes, the copy is a duplicate.
#[tokio::test]
async fn a_live_claim_is_never_taken_over_and_the_copy_is_told_to_try_later() {
    let (cosmos, inbox) = embedded_inbox().await;
    let runs = Arc::new(AtomicUsize::new(0));
    let release = Arc::new(tokio::sync::Notify::new());
    let first = tokio::spawn({
        let (inbox, handler) = (inbox.clone(), held(&runs, &release));
        async move { inbox.receive("evt-twice", handler).await }
    });
    while runs.load(Ordering::SeqCst) == 0 {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let error = inbox
        .receive("evt-twice", counting(&runs))
        .await
        .unwrap_err();
    let InboxError::ClaimHeld { for_at_most, .. } = &error else {
        panic!("the copy waits for the live claim: {error:?}");
    };
    // The claim period (20 s by default, renewed while the handler runs), the second `_ts`
    // truncates and the clock margin (10 s).
    assert!(
        *for_at_most > Duration::from_secs(20) && *for_at_most <= Duration::from_secs(31),
        "{for_at_most:?}"
    );
    assert_eq!(runs.load(Ordering::SeqCst), 1, "the copy did not run");
    release.notify_one();
    assert_eq!(first.await.unwrap().unwrap(), InboxOutcome::Handled);
    assert_eq!(
        inbox.receive("evt-twice", counting(&runs)).await.unwrap(),
        InboxOutcome::AlreadyCompleted
    );
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    let stored = marker(&cosmos, "evt-twice").await.unwrap();
    assert_eq!(
        stored["ClaimSeconds"], 20,
        "the claim's period is in the marker"
    );
}

/// Claims of 2 s renewed every 500 ms: renewals within a test's seconds.
fn short_claims() -> InboxOptions {
    InboxOptions::new(DB, CONTAINER)
        .claim_period(Duration::from_secs(2))
        .renewal_interval(Duration::from_millis(500))
}

/// How many times the handlers of [`Runs::sleeping`] ran, how many run now, and the most that
/// ever ran at once. Clones share the counts.
#[derive(Clone, Default)]
struct Runs {
    runs: Arc<AtomicUsize>,
    running: Arc<AtomicUsize>,
    most: Arc<AtomicUsize>,
}

impl Runs {
    /// A handler that counts its run and sleeps `for`.
    fn sleeping(&self, r#for: Duration) -> impl FnOnce() -> Held + Send + use<> {
        let this = self.clone();
        move || {
            this.runs.fetch_add(1, Ordering::SeqCst);
            Box::pin(async move {
                let now = this.running.fetch_add(1, Ordering::SeqCst) + 1;
                this.most.fetch_max(now, Ordering::SeqCst);
                tokio::time::sleep(r#for).await;
                this.running.fetch_sub(1, Ordering::SeqCst);
                Ok(())
            })
        }
    }
}

// A handler that runs far past its claim period keeps its claim by renewing it: copies that
// arrive meanwhile are told to try later, never run beside it (without renewals the claim of a
// 2 s period would be over 3 s after it was written, and the copies would take it over).
#[tokio::test]
async fn a_handler_running_past_its_claim_period_keeps_its_claim_by_renewing_it() {
    let cosmos = CosmosConnection::embedded().await.unwrap();
    let options = short_claims().clock_margin(Duration::ZERO);
    let inbox = inbox_on(&cosmos, options).await;
    let runs = Runs::default();
    let first = tokio::spawn({
        let inbox = inbox.clone();
        let handler = runs.sleeping(Duration::from_secs(7));
        async move { inbox.receive("evt-long", handler).await }
    });
    for _ in 0..6 {
        tokio::time::sleep(Duration::from_secs(1)).await;
        let copy = runs.sleeping(Duration::ZERO);
        match inbox.receive("evt-long", copy).await {
            Err(InboxError::ClaimHeld { .. }) => {}
            other => panic!("a copy while the handler runs is told to try later: {other:?}"),
        }
    }
    assert_eq!(first.await.unwrap().unwrap(), InboxOutcome::Handled);
    assert_eq!(runs.runs.load(Ordering::SeqCst), 1, "only the first ran");
    assert_eq!(runs.most.load(Ordering::SeqCst), 1);
}

// An attempt that dies mid-handler (here: its future dropped, as a process that crashes stops
// everything) stops renewing; its claim is free for a copy within the claim period, a second
// and the clock margin, not after the whole claim timeout.
#[tokio::test]
async fn a_crashed_attempts_claim_is_taken_over_once_its_period_ran_out() {
    let cosmos = CosmosConnection::embedded().await.unwrap();
    let options = short_claims()
        .claim_timeout(Duration::from_secs(300))
        .clock_margin(Duration::from_secs(1));
    let inbox = inbox_on(&cosmos, options).await;
    let runs = Runs::default();
    let doomed = tokio::spawn({
        let inbox = inbox.clone();
        let handler = runs.sleeping(Duration::from_secs(3600));
        async move { inbox.receive("evt-crash", handler).await }
    });
    // Renewed a few times (alive past its 2 s period), then it dies.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(!doomed.is_finished(), "its renewals kept it running");
    doomed.abort();
    let _ = doomed.await;
    runs.running.store(0, Ordering::SeqCst);
    let died = tokio::time::Instant::now();
    let taken_over = loop {
        let copy = runs.sleeping(Duration::ZERO);
        match inbox.receive("evt-crash", copy).await {
            Ok(outcome) => break outcome,
            Err(InboxError::ClaimHeld { .. }) => {
                assert!(
                    died.elapsed() < Duration::from_secs(60),
                    "the claim is still held a minute after its attempt died"
                );
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Err(other) => panic!("{other:?}"),
        }
    };
    assert_eq!(taken_over, InboxOutcome::TakenOver);
    // Its period (2 s), the second `_ts` truncates and the margin (1 s) after its last renewal.
    assert!(
        died.elapsed() <= Duration::from_secs(5),
        "taken over {:?} after the attempt died",
        died.elapsed()
    );
    assert_eq!(runs.runs.load(Ordering::SeqCst), 2);
}

// A handler whose renewals fail until its claim ends is stopped there (it never runs on past a
// claim another attempt may take), nothing of it commits, and the marker stays pending for the
// next copy. Real fault: the served store refuses every patch (503) from the moment the handler
// starts.
#[tokio::test(flavor = "multi_thread")]
async fn a_handler_whose_renewals_fail_past_its_claims_end_is_stopped() {
    let (emulator, cosmos) = emulator_server().await;
    let options = short_claims().clock_margin(Duration::ZERO);
    let inbox = inbox_on(&cosmos, options).await;
    let stopped = Arc::new(AtomicUsize::new(0));
    /// Counts the handler's future dropped before it finished.
    struct Stopped(Arc<AtomicUsize>);
    impl Drop for Stopped {
        fn drop(&mut self) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }
    let faults = emulator.faults();
    let began = tokio::time::Instant::now();
    let error = inbox
        .receive("evt-unrenewed", {
            let stopped = Arc::clone(&stopped);
            move || async move {
                faults.refuse("PATCH", 503, Duration::from_secs(3600));
                let guard = Stopped(stopped);
                tokio::time::sleep(Duration::from_secs(3600)).await;
                std::mem::forget(guard);
                Ok::<(), std::io::Error>(())
            }
        })
        .await
        .unwrap_err();
    assert!(
        matches!(error, InboxError::ClaimLost { .. }),
        "the handler is stopped as its claim ends: {error:?}"
    );
    assert_eq!(stopped.load(Ordering::SeqCst), 1, "the handler was stopped");
    assert!(
        began.elapsed() <= Duration::from_secs(3),
        "stopped {:?} after it began: within its 2 s claim (and the read of a renewal's 412), \
         not at the claim timeout",
        began.elapsed()
    );
    emulator.faults().clear();
    let stored = marker(&cosmos, "evt-unrenewed").await.unwrap();
    assert_eq!(stored["Completed"], false, "nothing of it committed");
}

// A handler that finishes within one renewal interval costs no renewal: its claim's create
// and its completion's patch are its only writes. One that runs three intervals renews about
// three times.
#[tokio::test(flavor = "multi_thread")]
async fn only_a_handler_running_past_a_renewal_interval_renews_its_claim() {
    let (emulator, cosmos) = emulator_server().await;
    let options = short_claims().clock_margin(Duration::ZERO);
    let inbox = inbox_on(&cosmos, options).await;
    let runs = Runs::default();
    let patches = || emulator.request_count("PATCH");
    let before = patches();
    let short = runs.sleeping(Duration::from_millis(100));
    assert_eq!(
        inbox.receive("evt-short", short).await.unwrap(),
        InboxOutcome::Handled
    );
    assert_eq!(patches() - before, 1, "the completion only");
    let before = patches();
    let long = runs.sleeping(Duration::from_millis(1_600));
    assert_eq!(
        inbox.receive("evt-long-renewed", long).await.unwrap(),
        InboxOutcome::Handled
    );
    let renewals = patches() - before - 1;
    assert!(
        (2..=4).contains(&renewals),
        "a 1.6 s handler renews about every 500 ms: {renewals}"
    );
}

// A claim period or renewal interval that cannot keep a claim is refused when the inbox is
// built.
#[tokio::test]
async fn a_claim_that_renewals_cannot_keep_is_refused() {
    let cosmos = CosmosConnection::embedded().await.unwrap();
    provision::ensure_container(&cosmos, DB, CONTAINER, &["/idempotencyKey"])
        .await
        .unwrap();
    let build = |options| {
        let cosmos = cosmos.clone();
        async move { StandaloneInbox::new(&cosmos, options).await }
    };
    let too_short =
        build(InboxOptions::new(DB, CONTAINER).claim_period(Duration::from_millis(500)))
            .await
            .unwrap_err();
    assert!(
        matches!(
            too_short,
            InboxSetupError::Options(InboxOptionsError::ClaimPeriod { .. })
        ),
        "{too_short:?}"
    );
    // At least 100 ms, at most half the 20 s period.
    for renewal in [
        Duration::ZERO,
        Duration::from_millis(50),
        Duration::from_secs(11),
        Duration::from_secs(20),
        Duration::from_secs(30),
    ] {
        let refused = build(InboxOptions::new(DB, CONTAINER).renewal_interval(renewal))
            .await
            .unwrap_err();
        assert!(
            matches!(
                refused,
                InboxSetupError::Options(InboxOptionsError::RenewalInterval { .. })
            ),
            "{renewal:?}: {refused:?}"
        );
    }
    build(InboxOptions::new(DB, CONTAINER).renewal_interval(Duration::from_secs(10)))
        .await
        .unwrap();
}

// A claim that ran out (its attempt crashed) is taken over with a write conditioned on the
// version read: of several copies taking it over at once, exactly one runs the handler.
#[tokio::test]
async fn of_copies_taking_over_a_claim_that_ran_out_at_once_exactly_one_runs() {
    let cosmos = CosmosConnection::embedded().await.unwrap();
    let options = InboxOptions::new(DB, CONTAINER)
        .claim_timeout(Duration::from_secs(1))
        .clock_margin(Duration::ZERO);
    let inbox = inbox_on(&cosmos, options).await;
    let mut crashed = dotnet_marker("evt-crashed-claim", false);
    crashed["ClaimSeconds"] = json!(1);
    seed(&cosmos, "evt-crashed-claim", crashed).await;
    // Written now: over once its second, and the second `_ts` may truncate, have passed.
    tokio::time::sleep(Duration::from_millis(2_100)).await;
    let runs = Arc::new(AtomicUsize::new(0));
    let release = Arc::new(tokio::sync::Notify::new());
    let copies: Vec<_> = (0..4)
        .map(|_| {
            let (inbox, handler) = (inbox.clone(), held(&runs, &release));
            tokio::spawn(async move { inbox.receive("evt-crashed-claim", handler).await })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(500)).await;
    release.notify_waiters();
    let mut taken_over = 0;
    for copy in copies {
        match copy.await.unwrap() {
            Ok(InboxOutcome::TakenOver) => taken_over += 1,
            Ok(InboxOutcome::AlreadyCompleted) | Err(InboxError::ClaimHeld { .. }) => {}
            other => panic!("{other:?}"),
        }
    }
    assert_eq!(taken_over, 1);
    assert_eq!(runs.load(Ordering::SeqCst), 1, "exactly one copy ran");
}

// A handler that outruns its claim is stopped (so it never runs on once a copy may take the
// claim over), and releases the claim: the next copy runs at once.
#[tokio::test]
async fn a_handler_that_outruns_its_claim_is_stopped_and_releases_it() {
    let cosmos = CosmosConnection::embedded().await.unwrap();
    let options = InboxOptions::new(DB, CONTAINER).claim_timeout(Duration::from_secs(1));
    let inbox = inbox_on(&cosmos, options).await;
    let error = inbox
        .receive("evt-slow", || async {
            tokio::time::sleep(Duration::from_secs(3600)).await;
            Ok::<(), std::io::Error>(())
        })
        .await
        .unwrap_err();
    assert!(matches!(error, InboxError::TimedOut { .. }), "{error:?}");
    assert_eq!(
        marker(&cosmos, "evt-slow").await.unwrap()["ClaimSeconds"],
        0
    );
    let runs = Arc::new(AtomicUsize::new(0));
    assert_eq!(
        inbox.receive("evt-slow", counting(&runs)).await.unwrap(),
        InboxOutcome::TakenOver
    );
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

// A handler stopped at its timeout is dropped at once, not when its claim's release is
// answered: a release that waits out the store (the process cut off from it) outlasts the claim,
// and another copy may take the claim over meanwhile (the simulation's seed 9104127). Real
// fault: the served store holds every patch from shortly before the handler's timeout (its
// claim renewed until then, so it times out rather than losing its claim).
#[tokio::test(flavor = "multi_thread")]
async fn a_handler_past_its_timeout_is_dropped_before_its_claim_is_released() {
    let (emulator, cosmos) = emulator_server().await;
    let options = InboxOptions::new(DB, CONTAINER)
        .claim_period(Duration::from_secs(1))
        .renewal_interval(Duration::from_millis(250))
        // Its last renewal (about 1.5 s, before the patches are held) carries the claim 150 ms
        // past the timeout: the handler times out, its claim still live.
        .claim_timeout(Duration::from_millis(2100));
    let inbox = inbox_on(&cosmos, options).await;
    /// Tells when the handler's future is dropped.
    struct Dropped(Option<tokio::sync::oneshot::Sender<()>>);
    impl Drop for Dropped {
        fn drop(&mut self) {
            if let Some(dropped) = self.0.take() {
                let _ = dropped.send(());
            }
        }
    }
    let (dropped, handler_gone) = tokio::sync::oneshot::channel();
    let faults = emulator.faults();
    let receiving = inbox.receive("evt-held", move || async move {
        let held_from = std::time::Instant::now() + Duration::from_millis(1800);
        faults.inject_with(Some(Arc::new(move |method: &str, _: &str| {
            (method == "PATCH" && std::time::Instant::now() >= held_from)
                .then_some(chatter_emulator::Injection::Delay(Duration::from_secs(3)))
        })));
        let _guard = Dropped(Some(dropped));
        tokio::time::sleep(Duration::from_secs(3600)).await;
        Ok::<(), std::io::Error>(())
    });
    tokio::pin!(receiving);
    tokio::select! {
        biased;
        result = &mut receiving => panic!(
            "the attempt ended ({result:?}) while its handler's future was still alive"
        ),
        _ = handler_gone => {}
    }
    let error = receiving.await.unwrap_err();
    emulator.faults().inject_with(None);
    assert!(matches!(error, InboxError::TimedOut { .. }), "{error:?}");
}

// A marker must outlive its claim: a marker ttl, or an idempotency container's default
// time-to-live, that could delete a pending marker while its handler may still run is refused.
#[tokio::test]
async fn a_time_to_live_that_could_delete_a_live_claim_is_refused() {
    let cosmos = CosmosConnection::embedded().await.unwrap();
    provision::ensure_container(&cosmos, DB, CONTAINER, &["/idempotencyKey"])
        .await
        .unwrap();
    // A 20 s claim period + 1 s + 10 s margin (the claim lasts that long from its last
    // renewal, which restarts the marker's time-to-live too): 31 s is too short, 32 s enough.
    let refused = StandaloneInbox::new(
        &cosmos,
        InboxOptions::new(DB, CONTAINER).marker_ttl_seconds(31),
    )
    .await
    .unwrap_err();
    assert!(
        matches!(
            refused,
            InboxSetupError::Options(InboxOptionsError::MarkerOutlivedByClaim { shortest: 31, .. })
        ),
        "{refused:?}"
    );
    StandaloneInbox::new(
        &cosmos,
        InboxOptions::new(DB, CONTAINER).marker_ttl_seconds(32),
    )
    .await
    .unwrap();

    use azure_data_cosmos::models::{ContainerProperties, PartitionKeyDefinition, TimeToLive};
    let properties = ContainerProperties::new(
        "short-lived".to_owned(),
        PartitionKeyDefinition::new(vec!["/idempotencyKey".into()]),
    )
    .with_default_ttl(TimeToLive::Seconds(30));
    cosmos
        .client()
        .database_client(DB)
        .create_container(properties, None)
        .await
        .unwrap();
    let refused = StandaloneInbox::new(&cosmos, InboxOptions::new(DB, "short-lived"))
        .await
        .unwrap_err();
    assert!(
        refused
            .to_string()
            .starts_with("the idempotency container's default time-to-live (30 s) could delete a pending inbox marker"),
        "{refused}"
    );
    // A marker ttl of its own overrides the container's default.
    StandaloneInbox::new(
        &cosmos,
        InboxOptions::new(DB, "short-lived").marker_ttl_seconds(86_400),
    )
    .await
    .unwrap();
}

// A completion only lands on this attempt's own claim: when the marker changed under the
// handler (another attempt took the claim over after it ran out), the completion is refused
// and the marker is left to the attempt that holds it, never marked completed under it.
#[tokio::test]
async fn a_completion_never_marks_completed_a_claim_another_attempt_took_over() {
    let (cosmos, inbox) = embedded_inbox().await;
    let taker = cosmos.clone();
    let error = inbox
        .receive("evt-overtaken", || async move {
            let mut theirs = dotnet_marker("evt-overtaken", false);
            theirs["ClaimSeconds"] = json!(300);
            seed(&taker, "evt-overtaken", theirs).await;
            Ok::<(), std::io::Error>(())
        })
        .await
        .unwrap_err();
    assert!(
        matches!(error, InboxError::CompletionRefused { status: 412, .. }),
        "{error:?}"
    );
    assert_eq!(
        marker(&cosmos, "evt-overtaken").await.unwrap()["Completed"],
        false,
        "the other attempt's claim is not marked completed"
    );
}
