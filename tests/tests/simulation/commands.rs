//! The workload's commands and what their handlers record.
//!
//! - [`SimPlace`] (document tier): appends its message id to its key's ledger (an ETag write)
//!   and sends 1 to 3 events of its key, in one batch. The ledger's order is the key's commit
//!   order, so the events' first publications can be checked against it (and, inside a batch,
//!   against the order the handler sent them in).
//! - [`SimNotify`] (document tier): sends one notice to [`NOTICES`], a destination the broker
//!   refuses for good (too large, say) until an operator fixes it mid-run: its documents are
//!   stamped `undeliverable`, requeued by the operator through the CLI's code, and published.
//! - [`SimPoison`]: its handler always fails, so it must be dead-lettered, and only after
//!   every attempt ran.
//! - [`SimReserve`] (standalone inbox): an external side effect the recorder watches for two
//!   runs at once, and a sent message committed with the marker's completion.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use chatter_runtime::{BoxError, DocumentReliable, HandlerContext, State, handler};
use serde::{Deserialize, Serialize};
use serde_json::json;

pub const EVENTS: &str = "sim.events";
pub const RESERVED: &str = "sim.reserved";
/// The destination the broker refuses for good until the run fixes it.
pub const NOTICES: &str = "sim.notices";
pub const DATABASE: &str = "sim";
pub const ORDERS: &str = "orders";
pub const IDEMPOTENCY: &str = "idempotency";
/// The attempts of a poison command before it is dead-lettered.
pub const POISON_ATTEMPTS: u32 = 3;

#[derive(Debug, Serialize, Deserialize, DocumentReliable)]
#[cosmos(database = "sim", container = "orders", lease = "leases")]
#[partition_key(path = "/orderId")]
// At the default attempt limit: store faults and ETag races (a hot key across instances) can
// fail all five attempts of a command that does nothing wrong. Its dead letter is replayed by
// the run's operator, and it must still be applied exactly once.
#[serde(rename_all = "camelCase")]
pub struct SimPlace {
    pub order_id: String,
    /// How many events the handler sends (one batch holds them all).
    pub events: u8,
}

/// The event ids a [`SimPlace`] command sends, in the order it sends them.
pub fn event_ids(command_id: &str, events: u8) -> Vec<String> {
    (0..events.max(1))
        .map(|n| format!("{command_id}:placed:{n}"))
        .collect()
}

#[derive(Debug, Serialize, Deserialize, DocumentReliable)]
#[cosmos(database = "sim", container = "orders", lease = "leases")]
#[partition_key(path = "/orderId")]
#[chatter(max_delivery_attempts = 10000)]
#[serde(rename_all = "camelCase")]
pub struct SimNotify {
    pub order_id: String,
}

#[derive(Debug, Serialize, Deserialize, DocumentReliable)]
#[cosmos(database = "sim", container = "orders", lease = "leases")]
#[partition_key(path = "/orderId")]
#[chatter(max_delivery_attempts = 3)]
#[serde(rename_all = "camelCase")]
pub struct SimPoison {
    pub order_id: String,
}

#[derive(Debug, Serialize, Deserialize, DocumentReliable)]
#[inbox(database = "sim", container = "idempotency", lease = "inbox-leases")]
// On a broker that counts deliveries (JetStream), each look of a copy waiting behind a running
// claim is a delivery: a first run of 4 s under a 1 s claim spends about four. The inbox chapter
// says to raise the limit then, as this does.
#[chatter(max_delivery_attempts = 20)]
#[serde(rename_all = "camelCase")]
pub struct SimReserve {
    pub item: String,
    /// How long the side effect takes, in milliseconds.
    pub work_ms: u64,
    /// How long its first run takes instead, if it outruns its claim: the attempt stops it
    /// when the claim is up, and a later run (of `work_ms`) completes it.
    #[serde(default)]
    pub first_run_ms: Option<u64>,
}

/// A key's ledger: the message ids applied to it, in commit order.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Ledger {
    pub id: String,
    pub order_id: String,
    pub applied: Vec<String>,
}

pub const LEDGER_ID: &str = "ledger";

#[handler]
async fn sim_place(
    command: SimPlace,
    ctx: &mut HandlerContext,
    recorder: State<Arc<Recorder>>,
) -> Result<(), BoxError> {
    let id = ctx.message_id().to_owned();
    recorder.place_ran(&id);
    match ctx.read::<Ledger>(LEDGER_ID).await? {
        Some(found) => {
            let mut ledger = found.document;
            ledger.applied.push(id.clone());
            ctx.replace_if_match(LEDGER_ID, &ledger, &found.etag)?;
        }
        None => ctx.create(Ledger {
            id: LEDGER_ID.to_owned(),
            order_id: command.order_id.clone(),
            applied: vec![id.clone()],
        })?,
    }
    for event in event_ids(&id, command.events) {
        ctx.send_json(
            &event,
            EVENTS,
            &json!({ "orderId": command.order_id, "command": id, "event": event }),
        )?;
    }
    Ok(())
}

#[handler]
async fn sim_notify(command: SimNotify, ctx: &mut HandlerContext) -> Result<(), BoxError> {
    let id = ctx.message_id().to_owned();
    ctx.send_json(
        &format!("{id}:notice"),
        NOTICES,
        &json!({ "orderId": command.order_id, "command": id }),
    )?;
    Ok(())
}

#[handler]
async fn sim_poison(
    _command: SimPoison,
    ctx: &mut HandlerContext,
    recorder: State<Arc<Recorder>>,
) -> Result<(), BoxError> {
    recorder.poison_ran(ctx.message_id());
    Err("this command always fails".into())
}

#[handler]
async fn sim_reserve(
    command: SimReserve,
    ctx: &mut HandlerContext,
    recorder: State<Arc<Recorder>>,
) -> Result<(), BoxError> {
    let id = ctx.message_id().to_owned();
    let run = recorder.inbox_run(&id);
    let work = match command.first_run_ms {
        Some(first) if run.first => first,
        _ => command.work_ms,
    };
    tokio::time::sleep(Duration::from_millis(work)).await;
    ctx.send_json(
        &format!("{id}:reserved"),
        RESERVED,
        &json!({ "item": command.item, "command": id }),
    )?;
    run.finished();
    Ok(())
}

/// How one run of an inbox handler ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RunEnd {
    /// The side effect finished and the handler returned.
    Finished,
    /// Dropped mid-way: its instance crashed, or its attempt was stopped.
    Cut,
}

#[derive(Debug, Default)]
pub struct InboxRuns {
    /// The instances (slots) running it now.
    pub active: Vec<usize>,
    pub ends: Vec<RunEnd>,
    /// Runs started so far.
    pub started: u32,
}

/// A second run of an inbox handler that started while another was active.
#[derive(Debug, Clone)]
pub struct Overlap {
    pub id: String,
    /// The instances running it already, and the one that started it again.
    pub running: Vec<usize>,
    pub started_on: usize,
    pub at: std::time::Instant,
}

/// The instance (slot) whose thread this is: instances are threads named
/// `sim-<seed>-<run>-<slot>`.
pub fn this_slot() -> usize {
    std::thread::current()
        .name()
        .and_then(|name| name.rsplit('-').next())
        .and_then(|slot| slot.parse().ok())
        .unwrap_or(usize::MAX)
}

/// What the handlers did, shared by every instance of one run.
#[derive(Debug, Default)]
pub struct Recorder {
    pub place_runs: Mutex<BTreeMap<String, u32>>,
    pub poison_runs: Mutex<BTreeMap<String, u32>>,
    pub inbox: Mutex<BTreeMap<String, InboxRuns>>,
    /// Inbox handlers started while another run of them was active.
    pub overlaps: Mutex<Vec<Overlap>>,
    /// Standalone-inbox commands whose copies are published the moment their first run starts
    /// (one per instance, so one likely reaches another instance while the first run works),
    /// and the broker they go to.
    pub copies_on_start: Mutex<BTreeMap<String, (chatter_runtime::BrokeredMessage, usize)>>,
    pub broker: Mutex<Option<chatter_runtime::broker::InMemoryBroker>>,
    /// The run's history, where each inbox handler's run is recorded as it starts and ends (an
    /// overlap is told apart by them: seed 9104127).
    pub history: Mutex<Option<Arc<super::history::History>>>,
}

impl Recorder {
    fn place_ran(&self, id: &str) {
        *self
            .place_runs
            .lock()
            .unwrap()
            .entry(id.to_owned())
            .or_default() += 1;
    }

    fn poison_ran(&self, id: &str) {
        *self
            .poison_runs
            .lock()
            .unwrap()
            .entry(id.to_owned())
            .or_default() += 1;
    }

    fn inbox_event(&self, slot: usize, what: String) {
        if let Some(history) = self.history.lock().unwrap().as_ref() {
            history.harness(slot, what);
        }
    }

    fn inbox_run(self: &Arc<Self>, id: &str) -> InboxRun {
        let slot = this_slot();
        let mut inbox = self.inbox.lock().unwrap();
        let runs = inbox.entry(id.to_owned()).or_default();
        if !runs.active.is_empty() {
            self.overlaps.lock().unwrap().push(Overlap {
                id: id.to_owned(),
                running: runs.active.clone(),
                started_on: slot,
                at: std::time::Instant::now(),
            });
        }
        runs.active.push(slot);
        let first = runs.started == 0;
        runs.started += 1;
        drop(inbox);
        self.inbox_event(slot, format!("inbox handler of {id} starts"));
        let copies = self.copies_on_start.lock().unwrap().remove(id);
        if let (Some((message, count)), Some(broker)) =
            (copies, self.broker.lock().unwrap().clone())
        {
            use chatter_runtime::broker::Broker;
            for _ in 0..count {
                // The in-memory broker enqueues at once: the future is ready.
                drop(futures::FutureExt::now_or_never(
                    broker.publish(super::broker::published_anew(&message)),
                ));
            }
        }
        InboxRun {
            recorder: Arc::clone(self),
            id: id.to_owned(),
            end: RunEnd::Cut,
            slot,
            first,
        }
    }
}

/// One run of an inbox handler: active until dropped; `Cut` unless it finished.
pub struct InboxRun {
    recorder: Arc<Recorder>,
    id: String,
    end: RunEnd,
    slot: usize,
    /// Whether it is the message id's first run.
    first: bool,
}

impl InboxRun {
    fn finished(mut self) {
        self.end = RunEnd::Finished;
    }
}

impl Drop for InboxRun {
    fn drop(&mut self) {
        let mut inbox = self.recorder.inbox.lock().unwrap();
        let runs = inbox.entry(self.id.clone()).or_default();
        if let Some(at) = runs.active.iter().position(|s| *s == self.slot) {
            runs.active.remove(at);
        }
        runs.ends.push(self.end);
        drop(inbox);
        self.recorder.inbox_event(
            self.slot,
            format!("inbox handler of {} ends ({:?})", self.id, self.end),
        );
    }
}
