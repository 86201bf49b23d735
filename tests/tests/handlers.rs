//! Handlers people can write, through the real pipeline (embedded store, in-memory broker): a
//! ticket-booking service that reads before it writes, writes conditionally on an ETag, rejects
//! a command for good, and reaches application state.

use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use chatter_runtime::broker::{Broker, InMemoryBroker};
use chatter_runtime::cosmos::CosmosConnection;
use chatter_runtime::provision;
use chatter_runtime::{
    BoxError, DocumentReliable, HandlerContext, Query, Rejection, Runtime, RuntimeBuilder, State,
    broker::dead_letter_destination, constants::DEAD_LETTER_REASON_CONTEXT_KEY,
    error::BatchFailure, error::DispatchError, error::PipelineError, error::StartError, handler,
    relay::RelayOptions,
};
use chatter_tests::broker::{next_delivery, publish_command, settled};
use chatter_tests::logs::capture;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use tracing::Level;

const DB: &str = "tickets";
const CONTAINER: &str = "shows";

/// What seats cost: application state the booking handler takes as `State<Pricing>`.
#[derive(Debug)]
pub struct Pricing {
    pub cents_per_seat: u32,
}

/// Books a seat of a show, refused for good when it is taken.
#[derive(Debug, Serialize, Deserialize, DocumentReliable)]
#[cosmos(database = "tickets", container = "shows", lease = "shows-leases")]
#[partition_key(path = "/showId")]
#[serde(rename_all = "camelCase")]
pub struct ReserveSeat {
    pub show_id: String,
    pub seat: String,
    pub holder: String,
}

/// A seat document: `seat:{seat}` in its show's partition.
#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Seat {
    id: String,
    show_id: String,
    holder: String,
    price_cents: u32,
}

/// How often each message id's booking handler ran.
static BOOKINGS: Mutex<Vec<String>> = Mutex::new(Vec::new());

#[handler]
async fn reserve_seat(
    command: ReserveSeat,
    ctx: &mut HandlerContext,
    pricing: State<Pricing>,
) -> Result<(), BoxError> {
    BOOKINGS.lock().unwrap().push(ctx.message_id().to_owned());
    let id = format!("seat:{}", command.seat);
    if let Some(taken) = ctx.read::<Seat>(&id).await? {
        return Err(Rejection::new(format!(
            "seat {} is taken by {}",
            command.seat, taken.document.holder
        ))
        .into());
    }
    ctx.create(Seat {
        id,
        show_id: command.show_id.clone(),
        holder: command.holder.clone(),
        price_cents: pricing.cents_per_seat,
    })?;
    ctx.send_json(
        &format!("seat-reserved-{}", ctx.message_id()),
        "SeatReserved",
        &json!({ "showId": command.show_id, "seat": command.seat }),
    )?;
    Ok(())
}

/// Books a seat without looking first: a taken seat fails its `create` with 409.
#[derive(Debug, Serialize, Deserialize, DocumentReliable)]
#[cosmos(database = "tickets", container = "shows", lease = "shows-leases")]
#[partition_key(path = "/showId")]
#[serde(rename_all = "camelCase")]
pub struct ReserveSeatBlindly {
    pub show_id: String,
    pub seat: String,
}

#[handler]
async fn reserve_blindly(
    command: ReserveSeatBlindly,
    ctx: &mut HandlerContext,
) -> Result<(), BoxError> {
    ctx.create(
        json!({ "id": format!("seat:{}", command.seat), "showId": command.show_id, "holder": "?" }),
    )?;
    Ok(())
}

/// Adds an attendee to a show's guest list: a read-modify-write of one aggregate document.
#[derive(Debug, Serialize, Deserialize, DocumentReliable)]
#[cosmos(database = "tickets", container = "shows", lease = "shows-leases")]
#[partition_key(path = "/showId")]
#[serde(rename_all = "camelCase")]
pub struct AddAttendee {
    pub show_id: String,
    pub name: String,
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct GuestList {
    id: String,
    show_id: String,
    names: Vec<String>,
}

/// Each `AddAttendee` attempt, by attendee name.
static GUEST_ATTEMPTS: Mutex<Vec<String>> = Mutex::new(Vec::new());
/// Set once the attendee "slow" read the guest list on its first attempt.
static SLOW_HAS_READ: AtomicBool = AtomicBool::new(false);
/// Lets the attendee "slow" write after its first read.
static SLOW_MAY_WRITE: tokio::sync::Semaphore = tokio::sync::Semaphore::const_new(0);

#[handler]
async fn add_attendee(command: AddAttendee, ctx: &mut HandlerContext) -> Result<(), BoxError> {
    let first_attempt = {
        let mut attempts = GUEST_ATTEMPTS.lock().unwrap();
        attempts.push(command.name.clone());
        attempts.iter().filter(|n| **n == command.name).count() == 1
    };
    let id = format!("guests:{}", command.show_id);
    let current = ctx.read::<GuestList>(&id).await?;
    if command.name == "slow" && first_attempt {
        // Another delivery changes the list between this read and this write.
        SLOW_HAS_READ.store(true, Ordering::SeqCst);
        SLOW_MAY_WRITE.acquire().await?.forget();
    }
    match current {
        Some(mut list) => {
            list.document.names.push(command.name);
            ctx.replace_if_match(&id, &list.document, &list.etag)?;
        }
        None => ctx.create(GuestList {
            id,
            show_id: command.show_id,
            names: vec![command.name],
        })?,
    }
    Ok(())
}

/// Counts a show's seats with a query within its partition.
#[derive(Debug, Serialize, Deserialize, DocumentReliable)]
#[cosmos(database = "tickets", container = "shows", lease = "shows-leases")]
#[partition_key(path = "/showId")]
#[serde(rename_all = "camelCase")]
pub struct CountSeats {
    pub show_id: String,
    /// `false`: the handler reads nothing (the baseline of a batch of the inbox marker alone).
    pub query: bool,
}

static COUNTED: Mutex<Vec<(String, Vec<String>)>> = Mutex::new(Vec::new());

#[handler]
async fn count_seats(command: CountSeats, ctx: &mut HandlerContext) -> Result<(), BoxError> {
    if !command.query {
        return Ok(());
    }
    let query = Query::from("SELECT * FROM c WHERE STARTSWITH(c.id, @prefix)")
        .with_parameter("@prefix", "seat:")?;
    let seats = ctx.query::<Seat>(query).await?;
    let mut holders: Vec<String> = seats.into_iter().map(|s| s.document.holder).collect();
    holders.sort();
    COUNTED.lock().unwrap().push((command.show_id, holders));
    Ok(())
}

fn pricing() -> Pricing {
    Pricing {
        cents_per_seat: 4200,
    }
}

async fn store() -> CosmosConnection {
    let cosmos = CosmosConnection::embedded().await.unwrap();
    // The container and lease container `ReserveSeat`'s registration names.
    provision::ensure_for::<ReserveSeat>(&cosmos).await.unwrap();
    cosmos
}

fn builder(cosmos: &CosmosConnection, broker: &InMemoryBroker) -> RuntimeBuilder {
    Runtime::builder()
        .cosmos(cosmos.clone())
        .broker(broker.clone())
        .without_relay()
        .redelivery_delay(Duration::from_millis(10))
        .state(pricing())
}

async fn read(cosmos: &CosmosConnection, show: &str, id: &str) -> Option<Value> {
    cosmos
        .read(DB, CONTAINER, &[json!(show)], id)
        .await
        .unwrap()
}

fn seat(show: &str, seat: &str, holder: &str) -> ReserveSeat {
    ReserveSeat {
        show_id: show.into(),
        seat: seat.into(),
        holder: holder.into(),
    }
}

// State: a handler's `State<T>` is the value the runtime was given.
#[tokio::test]
async fn application_state_reaches_the_handler() {
    let cosmos = store().await;
    let runtime = builder(&cosmos, &InMemoryBroker::new())
        .consume(false)
        .start()
        .await
        .unwrap();
    runtime
        .dispatch(seat("s-state", "A1", "ann"), "m-state")
        .await
        .unwrap();
    // Read back typed.
    let stored: Seat = cosmos
        .read(DB, CONTAINER, &[json!("s-state")], "seat:A1")
        .await
        .unwrap()
        .unwrap();
    assert_eq!(stored.price_cents, 4200);
    assert_eq!(stored.show_id, "s-state");
    runtime.shutdown().await;
}

// State: `start()` refuses a handler whose state type the runtime was not given, naming the
// handler, where it was written and the type.
#[tokio::test]
async fn start_refuses_a_handler_whose_state_was_not_given() {
    let cosmos = store().await;
    let error = Runtime::builder()
        .cosmos(cosmos.clone())
        .without_relay()
        .consume(false)
        .start()
        .await
        .unwrap_err();
    let StartError::MissingState {
        handler,
        location,
        state_type,
    } = &error
    else {
        panic!("{error:?}");
    };
    assert!(handler.ends_with("reserve_seat"), "{handler}");
    assert!(location.file.ends_with("handlers.rs"), "{location}");
    assert!(state_type.ends_with("Pricing"), "{state_type}");
    let text = error.to_string();
    assert!(
        text.contains("State<") && text.contains(".state("),
        "{text}"
    );
}

// Reads and rejections: a double booking is read, refused without a retry and dead-lettered at
// once with its reason; the first booking and its event committed. The dead letter is logged
// at Warn: a rejection is the handler's verdict, not a fault (Error would page an operator).
#[tokio::test]
async fn a_double_booking_is_rejected_once_and_dead_lettered_with_its_reason() {
    let (logs, _guard) = capture();
    let cosmos = store().await;
    let broker = InMemoryBroker::new();
    let mut dead = broker
        .subscribe(&dead_letter_destination("ReserveSeat"))
        .await
        .unwrap();
    let runtime = builder(&cosmos, &broker).start().await.unwrap();
    let body = |holder: &str| json!({ "showId": "s-double", "seat": "B7", "holder": holder });
    publish_command(&broker, "ReserveSeat", "m-first", &body("ann")).await;
    settled(&broker, "ReserveSeat").await;
    publish_command(&broker, "ReserveSeat", "m-second", &body("bob")).await;
    let letter = next_delivery(&mut dead, Duration::from_secs(30)).await;
    assert_eq!(letter.message.message_id, "m-second");
    let reason = letter.message.context[DEAD_LETTER_REASON_CONTEXT_KEY]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(reason.contains("seat B7 is taken by ann"), "{reason}");
    settled(&broker, "ReserveSeat").await;
    let runs = BOOKINGS
        .lock()
        .unwrap()
        .iter()
        .filter(|id| *id == "m-second")
        .count();
    assert_eq!(runs, 1, "a rejection is never retried");
    let stored = read(&cosmos, "s-double", "seat:B7").await.unwrap();
    assert_eq!(stored["holder"], "ann");
    runtime.shutdown().await;
    let of_second = |level| {
        logs.at(level)
            .into_iter()
            .filter(|entry| entry.field("message_id") == Some("m-second"))
            .map(|entry| entry.message)
            .collect::<Vec<_>>()
    };
    let warned = of_second(Level::WARN);
    assert!(
        warned
            .iter()
            .any(|m| m == "chatter dead-lettered a command its handler rejected"),
        "{warned:?}"
    );
    assert_eq!(of_second(Level::ERROR), Vec::<String>::new());
}

// Rejections: `dispatch` returns the handler's rejection as such, nothing committed.
#[tokio::test]
async fn dispatch_returns_a_rejection_as_such() {
    let cosmos = store().await;
    let runtime = builder(&cosmos, &InMemoryBroker::new())
        .consume(false)
        .start()
        .await
        .unwrap();
    runtime
        .dispatch(seat("s-dispatch", "C3", "ann"), "m-d1")
        .await
        .unwrap();
    let error = runtime
        .dispatch(seat("s-dispatch", "C3", "bob"), "m-d2")
        .await
        .unwrap_err();
    let DispatchError::Pipeline(pipeline) = &error else {
        panic!("{error:?}");
    };
    assert!(pipeline.is_permanent());
    assert_eq!(
        pipeline.rejection().map(Rejection::reason),
        Some("seat C3 is taken by ann")
    );
    let marker = chatter_runtime::cosmos::inbox_id("m-d2").unwrap();
    assert!(read(&cosmos, "s-dispatch", &marker).await.is_none());
    runtime.shutdown().await;
}

// Batch failures name the document: a `create` of a seat that exists fails as a 409 of that
// document's create, not as per-operation codes to decode.
#[tokio::test]
async fn a_failed_write_names_its_document_and_operation() {
    let cosmos = store().await;
    let runtime = builder(&cosmos, &InMemoryBroker::new())
        .consume(false)
        .start()
        .await
        .unwrap();
    runtime
        .dispatch(seat("s-blind", "D4", "ann"), "m-b1")
        .await
        .unwrap();
    let blind = ReserveSeatBlindly {
        show_id: "s-blind".into(),
        seat: "D4".into(),
    };
    let error = runtime.dispatch(blind, "m-b2").await.unwrap_err();
    let DispatchError::Pipeline(PipelineError::BatchFailed { reason, .. }) = &error else {
        panic!("{error:?}");
    };
    assert_eq!(
        *reason,
        BatchFailure::WriteFailed {
            operation: "create",
            id: "seat:D4".into(),
            status: 409,
            meaning: "a document with this id already exists in the partition",
        }
    );
    let text = chatter_runtime::error::ErrorChain(&error).to_string();
    assert!(
        text.contains("create of document 'seat:D4' failed with 409"),
        "{text}"
    );
    runtime.shutdown().await;
}

// Optimistic concurrency: two read-modify-writes of one guest list race; the one whose read went
// stale fails its batch with a 412, is delivered again, reads the new list and commits: the
// list holds both names.
#[tokio::test]
async fn a_stale_conditional_write_is_retried_and_the_aggregate_counts_both() {
    let cosmos = store().await;
    let broker = InMemoryBroker::new();
    let runtime = builder(&cosmos, &broker).start().await.unwrap();
    let add = |name: &str| json!({ "showId": "s-race", "name": name });
    runtime
        .dispatch(
            AddAttendee {
                show_id: "s-race".into(),
                name: "first".into(),
            },
            "m-g0",
        )
        .await
        .unwrap();
    publish_command(&broker, "AddAttendee", "m-slow", &add("slow")).await;
    tokio::time::timeout(Duration::from_secs(30), async {
        while !SLOW_HAS_READ.load(Ordering::SeqCst) {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await
    .unwrap();
    // Meanwhile another delivery adds "fast" and commits.
    runtime
        .dispatch(
            AddAttendee {
                show_id: "s-race".into(),
                name: "fast".into(),
            },
            "m-fast",
        )
        .await
        .unwrap();
    SLOW_MAY_WRITE.add_permits(1);
    settled(&broker, "AddAttendee").await;
    let list = read(&cosmos, "s-race", "guests:s-race").await.unwrap();
    let mut names: Vec<String> = serde_json::from_value(list["names"].clone()).unwrap();
    names.sort();
    assert_eq!(names, ["fast", "first", "slow"]);
    let slow_attempts = GUEST_ATTEMPTS
        .lock()
        .unwrap()
        .iter()
        .filter(|n| *n == "slow")
        .count();
    assert_eq!(slow_attempts, 2, "the stale attempt was tried again");
    runtime.shutdown().await;
}

// Reads: a query within the command's partition returns typed items of that partition only,
// and the reads' request charges count in the command's figure.
#[tokio::test]
async fn a_query_reads_the_partition_and_its_charge_counts_to_the_command() {
    let cosmos = store().await;
    let runtime = builder(&cosmos, &InMemoryBroker::new())
        .consume(false)
        .start()
        .await
        .unwrap();
    for (show, place, holder) in [
        ("s-q", "A1", "ann"),
        ("s-q", "A2", "bob"),
        ("s-other", "A1", "cy"),
    ] {
        runtime
            .dispatch(seat(show, place, holder), format!("m-q-{show}-{place}"))
            .await
            .unwrap();
    }
    // The same command without its query: a batch of the inbox marker alone.
    let count = |query: bool, message_id: &'static str| {
        let runtime = runtime.clone();
        async move {
            let before = runtime.request_charges().command_request_units;
            let command = CountSeats {
                show_id: "s-q".into(),
                query,
            };
            runtime.dispatch(command, message_id).await.unwrap();
            runtime.request_charges().command_request_units - before
        }
    };
    let without_query = count(false, "m-count-0").await;
    let with_query = count(true, "m-count-1").await;
    let counted = COUNTED.lock().unwrap().clone();
    assert_eq!(
        counted,
        [("s-q".to_owned(), vec!["ann".to_owned(), "bob".to_owned()])]
    );
    assert!(
        with_query > without_query,
        "the query's charge counts: {with_query} RU with it, {without_query} RU without"
    );
    runtime.shutdown().await;
}

// Until the relay caught up: a runtime that dispatches and shuts down at once still publishes
// the event its handler sent (shutdown lets the relay drain what is pending).
#[tokio::test]
async fn shutdown_right_after_dispatch_publishes_the_event() {
    let cosmos = store().await;
    let broker = InMemoryBroker::new();
    let mut events = broker.subscribe("SeatReserved").await.unwrap();
    // The relay reads its leases once, then waits 2 s before reading again: a shutdown right
    // after the dispatch comes before that next read.
    let runtime = Runtime::builder()
        .cosmos(cosmos.clone())
        .broker(broker.clone())
        .state(pricing())
        .consume(false)
        .relay_options(RelayOptions::default().poll_interval(Duration::from_secs(2)))
        .start()
        .await
        .unwrap();
    tokio::time::timeout(Duration::from_secs(30), async {
        while runtime
            .relay_leases()
            .await
            .iter()
            .all(|(_, l)| l.is_empty())
        {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    runtime
        .dispatch(seat("s-quick", "E5", "ann"), "m-quick")
        .await
        .unwrap();
    runtime.shutdown().await;
    let event = next_delivery(&mut events, Duration::from_secs(1)).await;
    assert_eq!(event.message.message_id, "seat-reserved-m-quick");
}

// `relay_idle` waits until nothing is pending, and says so when the runtime does not relay.
#[tokio::test]
async fn relay_idle_waits_for_the_relay_and_refuses_without_one() {
    let cosmos = store().await;
    let writer = builder(&cosmos, &InMemoryBroker::new())
        .consume(false)
        .start()
        .await
        .unwrap();
    writer
        .dispatch(seat("s-idle", "F6", "ann"), "m-idle")
        .await
        .unwrap();
    let error = writer.relay_idle(Duration::from_secs(1)).await.unwrap_err();
    assert!(
        matches!(error, chatter_runtime::error::RelayNotIdle::NoRelay),
        "{error}"
    );
    writer.shutdown().await;

    let broker = InMemoryBroker::new();
    let mut events = broker.subscribe("SeatReserved").await.unwrap();
    let relay = Runtime::builder()
        .cosmos(cosmos.clone())
        .broker(broker.clone())
        .state(pricing())
        .consume(false)
        .start()
        .await
        .unwrap();
    relay.relay_idle(Duration::from_secs(30)).await.unwrap();
    // Idle means published: the event is there to take at once.
    let event = next_delivery(&mut events, Duration::from_millis(100)).await;
    assert_eq!(event.message.message_id, "seat-reserved-m-idle");
    relay.shutdown().await;
}
