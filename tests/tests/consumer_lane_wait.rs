//! A delivery waiting in its partition-key value's lane is bounded (issue 32 item 5): once it
//! has waited `RuntimeBuilder::lane_wait_limit` behind a delivery of its key still in
//! progress, it is returned to the broker (logged at warn), which delivers it again, before the
//! broker's consumer timeout (RabbitMQ's 30 minutes) would close the channel and requeue
//! everything on it. Nothing here measures time: a handler holds its delivery until the test
//! releases it, and the test waits for the log of the return.

use std::sync::Mutex;
use std::time::Duration;

use chatter_runtime::broker::{Broker, InMemoryBroker};
use chatter_runtime::{
    BoxError, BrokeredMessage, DocumentReliable, HandlerContext, Runtime, error::StartError,
    handler,
};
use chatter_tests::logs;
use chatter_tests::store::{embedded, provisioned};
use chatter_tests::wait::eventually;
use serde::{Deserialize, Serialize};
use serde_json::json;
use tracing::Level;

const WAIT: Duration = Duration::from_secs(60);
const POLL: Duration = Duration::from_millis(20);

/// A step of one key; step 0 is held until its run is in [`RELEASED`].
#[derive(Debug, Clone, Serialize, Deserialize, DocumentReliable)]
#[cosmos(database = "lanes", container = "steps", lease = "steps-leases")]
#[partition_key(path = "/key")]
#[chatter(destination = "chatter-test-lane-wait-step")]
pub struct LaneStep {
    pub run: String,
    pub key: String,
    pub seq: u32,
}

/// Every handler start: (run, seq, whether the broker delivered it before).
static STARTED: Mutex<Vec<(String, u32, bool)>> = Mutex::new(Vec::new());
static RELEASED: Mutex<Vec<String>> = Mutex::new(Vec::new());

#[handler]
async fn lane_step(command: LaneStep, ctx: &mut HandlerContext) -> Result<(), BoxError> {
    STARTED
        .lock()
        .unwrap()
        .push((command.run.clone(), command.seq, ctx.redelivered()));
    while command.seq == 0 && !RELEASED.lock().unwrap().contains(&command.run) {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    ctx.upsert(json!({ "id": format!("step-{}", command.seq), "key": command.key }))?;
    Ok(())
}

fn started_of(run: &str) -> Vec<(u32, bool)> {
    STARTED
        .lock()
        .unwrap()
        .iter()
        .filter(|(r, ..)| r == run)
        .map(|(_, seq, redelivered)| (*seq, *redelivered))
        .collect()
}

#[tokio::test]
async fn a_delivery_waiting_behind_its_key_past_the_lane_wait_limit_is_returned_to_the_broker() {
    let (captured, _guard) = logs::capture();
    let run = uuid::Uuid::new_v4().simple().to_string();
    let cosmos = embedded().await;
    provisioned(&cosmos, "lanes", "steps", &["/key"]).await;
    let broker = InMemoryBroker::new();
    let destination = LaneStep::DOCUMENT_RELIABILITY.destination;
    for seq in [0, 1] {
        let command = LaneStep {
            run: run.clone(),
            key: format!("{run}-k"),
            seq,
        };
        broker
            .publish(BrokeredMessage::json(
                format!("{run}-{seq}"),
                destination,
                serde_json::to_string(&command).unwrap(),
            ))
            .await
            .unwrap();
    }
    let runtime = Runtime::builder()
        .cosmos(cosmos)
        .broker(broker.clone())
        .without_relay()
        .consumer_concurrency(4)
        .lane_wait_limit(Duration::from_millis(200))
        .start()
        .await
        .unwrap();

    eventually(WAIT, POLL, "step 0 holds the key's lane", || {
        let started = started_of(&run);
        async move { started == [(0, false)] }
    })
    .await;
    let second = format!("{run}-1");
    eventually(WAIT, POLL, "step 1 was returned to the broker", || {
        let returned = captured
            .matching(Level::WARN, "waited")
            .iter()
            .any(|entry| entry.field("message_id") == Some(second.as_str()));
        async move { returned }
    })
    .await;
    assert_eq!(started_of(&run), [(0, false)], "step 1 never ran meanwhile");

    RELEASED.lock().unwrap().push(run.clone());
    eventually(WAIT, POLL, "both steps were handled and acked", || {
        let done = started_of(&run).len() == 2 && broker.pending_count(destination) == 0;
        async move { done }
    })
    .await;
    // Delivered again as a copy with its attempt not counted: its first attempt, as it never ran.
    assert_eq!(
        started_of(&run),
        [(0, false), (1, false)],
        "step 1 ran once, on its first attempt"
    );
    runtime.shutdown().await;
}

#[tokio::test]
async fn start_refuses_a_lane_wait_limit_of_zero() {
    let error = Runtime::builder()
        .broker(InMemoryBroker::new())
        .lane_wait_limit(Duration::ZERO)
        .start()
        .await
        .unwrap_err();
    assert!(matches!(error, StartError::ZeroLaneWaitLimit), "{error}");
}
