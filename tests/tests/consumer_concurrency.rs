//! A command's consumer handles up to its consumer concurrency deliveries at once, through the
//! in-memory broker and the embedded store: deliveries of different partition-key values run
//! together, those of one value one after another in arrival order, and a concurrency of 0 is
//! refused at start. Nothing here measures time: the handler records when each delivery starts
//! and ends, and the tests read orders and counts out of that record.

use std::sync::Mutex;
use std::time::Duration;

use chatter_runtime::BrokeredMessage;
use chatter_runtime::broker::{Broker, InMemoryBroker};
use chatter_runtime::cosmos::CosmosConnection;
use chatter_runtime::{
    BoxError, DocumentReliable, HandlerContext, Runtime, constants::DEFAULT_CONSUMER_CONCURRENCY,
    error::StartError, handler,
};
use chatter_tests::broker::next_delivery;
use chatter_tests::store::{embedded, provisioned};
use chatter_tests::wait::eventually;
use serde::{Deserialize, Serialize};
use serde_json::json;

const WAIT: Duration = Duration::from_secs(60);
const POLL: Duration = Duration::from_millis(20);
/// How long a handler holds its delivery: long enough that deliveries taken together overlap.
const WORK: Duration = Duration::from_millis(150);

/// One step of a sequence of steps of one key; `run` keeps the tests of this binary apart.
#[derive(Debug, Clone, Serialize, Deserialize, DocumentReliable)]
#[cosmos(database = "concurrency", container = "steps", lease = "steps-leases")]
#[partition_key(path = "/key")]
#[chatter(destination = "chatter-test-concurrency-step")]
pub struct Step {
    pub run: String,
    pub key: String,
    pub seq: u32,
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct Event {
    run: String,
    key: String,
    seq: u32,
    started: bool,
}

/// Every handler start and end, in the order they happened.
static EVENTS: Mutex<Vec<Event>> = Mutex::new(Vec::new());

fn record(command: &Step, started: bool) {
    EVENTS.lock().unwrap().push(Event {
        run: command.run.clone(),
        key: command.key.clone(),
        seq: command.seq,
        started,
    });
}

#[handler]
async fn step(command: Step, ctx: &mut HandlerContext) -> Result<(), BoxError> {
    record(&command, true);
    tokio::time::sleep(WORK).await;
    ctx.upsert(json!({ "id": format!("step-{}", command.seq), "key": command.key }))?;
    record(&command, false);
    Ok(())
}

/// A step whose handler blocks until its run is in [`RELEASED`].
#[derive(Debug, Clone, Serialize, Deserialize, DocumentReliable)]
#[cosmos(database = "concurrency", container = "steps", lease = "steps-leases")]
#[partition_key(path = "/key")]
#[chatter(destination = "chatter-test-concurrency-held-step")]
pub struct HeldStep {
    pub run: String,
    pub key: String,
    pub seq: u32,
}

static RELEASED: Mutex<Vec<String>> = Mutex::new(Vec::new());

#[handler]
async fn held_step(command: HeldStep, ctx: &mut HandlerContext) -> Result<(), BoxError> {
    let step = Step {
        run: command.run,
        key: command.key,
        seq: command.seq,
    };
    record(&step, true);
    while !RELEASED.lock().unwrap().contains(&step.run) {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    ctx.upsert(json!({ "id": format!("held-step-{}", step.seq), "key": step.key }))?;
    record(&step, false);
    Ok(())
}

fn events_of(run: &str) -> Vec<Event> {
    EVENTS
        .lock()
        .unwrap()
        .iter()
        .filter(|event| event.run == run)
        .cloned()
        .collect()
}

/// The most deliveries that were being handled at one moment.
fn max_concurrent(events: &[Event]) -> usize {
    let mut running = 0usize;
    let mut max = 0;
    for event in events {
        if event.started {
            running += 1;
            max = max.max(running);
        } else {
            running -= 1;
        }
    }
    max
}

fn run_id() -> String {
    uuid::Uuid::new_v4().simple().to_string()
}

/// Publishes `command` as the message `message_id` to `destination`.
async fn publish(
    broker: &InMemoryBroker,
    destination: &str,
    message_id: String,
    command: &impl Serialize,
) {
    broker
        .publish(BrokeredMessage::json(
            message_id,
            destination,
            serde_json::to_string(command).unwrap(),
        ))
        .await
        .unwrap();
}

/// A runtime on `cosmos` consuming from `broker` with `concurrency`, its relay off.
async fn consuming(
    cosmos: CosmosConnection,
    broker: &InMemoryBroker,
    concurrency: usize,
) -> Runtime {
    Runtime::builder()
        .cosmos(cosmos)
        .broker(broker.clone())
        .without_relay()
        .consumer_concurrency(concurrency)
        .start()
        .await
        .unwrap()
}

/// Publishes `steps` (key, seq) of `run` in this order, then starts a runtime consuming them
/// with `concurrency`, and waits until every one was handled and acked.
async fn handle_all(run: &str, steps: &[(String, u32)], concurrency: usize) -> Vec<Event> {
    let cosmos = embedded().await;
    provisioned(&cosmos, "concurrency", "steps", &["/key"]).await;
    let broker = InMemoryBroker::new();
    let destination = Step::DOCUMENT_RELIABILITY.destination;
    for (key, seq) in steps {
        let command = Step {
            run: run.to_owned(),
            key: key.clone(),
            seq: *seq,
        };
        publish(&broker, destination, format!("{run}-{key}-{seq}"), &command).await;
    }
    let runtime = consuming(cosmos, &broker, concurrency).await;
    eventually(WAIT, POLL, "every step was handled and acked", || {
        let ended = events_of(run).iter().filter(|e| !e.started).count();
        let done = ended == steps.len() && broker.pending_count(destination) == 0;
        async move { done }
    })
    .await;
    runtime.shutdown().await;
    events_of(run)
}

// 20 deliveries of 20 keys with a concurrency of 4: four are handled at once, never more.
#[tokio::test]
async fn a_consumer_handles_up_to_its_concurrency_at_once() {
    let run = run_id();
    let steps: Vec<(String, u32)> = (0..20).map(|n| (format!("{run}-k{n}"), 0)).collect();
    let events = handle_all(&run, &steps, 4).await;
    assert_eq!(
        events.iter().filter(|e| e.started).count(),
        20,
        "each handled once: {events:?}"
    );
    assert_eq!(
        max_concurrent(&events),
        4,
        "as many at once as the concurrency, and no more: {events:?}"
    );
}

// Five steps of each of four keys, published two of one key in a row: a key's steps start in
// arrival order, each after the one before it ended, while different keys overlap.
#[tokio::test]
async fn deliveries_of_one_key_run_one_after_another_in_arrival_order() {
    let run = run_id();
    let key = |k: usize| format!("{run}-k{k}");
    let mut steps = Vec::new();
    for pair in [0, 2] {
        for k in 0..4 {
            steps.push((key(k), pair));
            steps.push((key(k), pair + 1));
        }
    }
    for k in 0..4 {
        steps.push((key(k), 4));
    }
    let events = handle_all(&run, &steps, 4).await;
    for k in 0..4 {
        let of_key: Vec<(u32, bool)> = events
            .iter()
            .filter(|e| e.key == key(k))
            .map(|e| (e.seq, e.started))
            .collect();
        let expected: Vec<(u32, bool)> = (0..5).flat_map(|s| [(s, true), (s, false)]).collect();
        assert_eq!(of_key, expected, "key {k}: one at a time, in arrival order");
    }
    assert!(
        max_concurrent(&events) > 1,
        "different keys were handled at once: {events:?}"
    );
}

#[tokio::test]
async fn start_refuses_a_consumer_concurrency_of_zero() {
    let cosmos = embedded().await;
    let error = Runtime::builder()
        .cosmos(cosmos)
        .without_relay()
        .consumer_concurrency(0)
        .start()
        .await
        .unwrap_err();
    assert!(
        matches!(error, StartError::ConsumerConcurrency { concurrency: 0 }),
        "{error:?}"
    );
    assert_eq!(
        error.to_string(),
        "consumer concurrency 0 is out of range: a consumer handles 1 to 65535 deliveries at once"
    );
    assert!(std::error::Error::source(&error).is_none());
    assert_eq!(DEFAULT_CONSUMER_CONCURRENCY, 16, "the documented default");
}

// Shutdown while three deliveries are in progress and one waits behind its key: shutdown waits
// for the three, which commit and are acked; the waiting one never starts and goes back to the
// broker unsettled, which delivers it again (marked redelivered) ahead of what it never took.
#[tokio::test]
async fn shutdown_finishes_deliveries_in_progress_and_returns_those_waiting_for_their_key() {
    let run = run_id();
    let cosmos = embedded().await;
    provisioned(&cosmos, "concurrency", "steps", &["/key"]).await;
    let broker = InMemoryBroker::new();
    let destination = HeldStep::DOCUMENT_RELIABILITY.destination;
    let key = |k: usize| format!("{run}-k{k}");
    // With a concurrency of 4 the consumer takes the first four: k0 twice, k1, k2.
    let steps = [(0, 0), (0, 1), (1, 0), (2, 0), (3, 0)];
    for (k, seq) in steps {
        let command = HeldStep {
            run: run.clone(),
            key: key(k),
            seq,
        };
        publish(&broker, destination, format!("{}-{seq}", key(k)), &command).await;
    }
    let runtime = consuming(cosmos, &broker, 4).await;
    eventually(WAIT, POLL, "three deliveries are in progress", || {
        let started = events_of(&run).len();
        async move { started == 3 }
    })
    .await;
    let shutdown = tokio::spawn(runtime.shutdown());
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(
        !shutdown.is_finished(),
        "shutdown waits for the deliveries in progress"
    );
    RELEASED.lock().unwrap().push(run.clone());
    tokio::time::timeout(WAIT, shutdown)
        .await
        .expect("shutdown ends once the deliveries in progress ended")
        .unwrap();

    let events = events_of(&run);
    let ended: Vec<(String, u32)> = events
        .iter()
        .filter(|e| !e.started)
        .map(|e| (e.key.clone(), e.seq))
        .collect();
    assert_eq!(ended.len(), 3, "{events:?}");
    for expected in [(key(0), 0), (key(1), 0), (key(2), 0)] {
        assert!(
            ended.contains(&expected),
            "{expected:?} finished: {events:?}"
        );
    }
    assert_eq!(events.len(), 6, "nothing else started: {events:?}");
    assert_eq!(
        broker.pending_count(destination),
        2,
        "the three were acked; two are left"
    );
    let mut subscription = broker.subscribe(destination).await.unwrap();
    let waiting = next_delivery(&mut subscription, WAIT).await;
    assert_eq!(waiting.message.message_id, format!("{}-1", key(0)));
    assert!(waiting.redelivered, "it was held, never handled");
    let untaken = next_delivery(&mut subscription, WAIT).await;
    assert_eq!(untaken.message.message_id, format!("{}-0", key(3)));
    assert!(!untaken.redelivered);
}
