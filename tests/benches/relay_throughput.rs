//! Benchmark (not a test): the relay's cost per Outbox Document (published and stamped)
//! against a hand-written change-feed loop on the same in-memory emulator, in one run. Prints
//! two ratios, each beside the target of at least 0.95x throughput (relay/hand-written):
//!
//! - **instructions per relayed document** (valgrind's callgrind), the figure that decides:
//!   instruction counts repeat from run to run where wall time on a shared machine does not;
//!   the throughput ratio is hand-written/relay instructions;
//! - **wall-clock throughput** (documents per second, alternating rounds), for reference.
//!
//! `cargo bench -p chatter-tests --bench relay_throughput` (about three minutes, most of it
//! under valgrind; without valgrind on the `PATH` only the wall-clock ratio is printed).
//!
//! Last run (2 cores): relay 2,240,827 instructions per document, hand-written 2,065,921, so
//! 0.922x (target NOT met); wall clock 0.873x. Of the difference, 86,711 a document is the one
//! count of pending documents `shutdown()` makes before it stops the relay (a query the emulator
//! answers by scanning every document of the container: a fixed cost of stopping, whatever the
//! backlog, here spread over 1,000 documents); without it the relay stands at 0.959x. The rest
//! is what the loop does not do: checkpoints and lease renewals (about 55,000), the lease scans,
//! the pending gate and grouping (about 30,000). See the README.
//!
//! # The two sides
//!
//! Each drain gets a fresh store seeded with the same documents: `n` commands dispatched with
//! the relay off, each writing an order, an inbox marker and one pending Outbox Document (so the
//! change feed holds three documents per message, two of them for the pending gate to skip).
//! Both publish to the same [`CountingBroker`] (an `InMemoryBroker` that wakes the bench when
//! the `n`th message is published) and read pages of [`PAGE`] documents:
//!
//! - relay: `Runtime::builder().relay_options(RelayOptions::default()).start()` (contract check,
//!   leases, change-feed processor) until every message reached the broker, then `shutdown()`,
//!   which lets the page in flight finish its last stamp and checkpoint and releases the leases;
//! - hand-written: per feed range, one `query_change_feed` stream from the beginning, keep the
//!   pending outbox documents, publish each, then one server-side patch `[/status, /ttl]`,
//!   until a page comes back empty; no leases, no checkpoints, no contract check, no
//!   partition-key read-back from the declared path (it knows the path is `/orderId`).
//!
//! The hand-written loop is the floor, not a port that could run in production: it does less
//! than the relay must. It writes no checkpoint, so a restart would publish everything again; it
//! renews no lease, so two instances would both publish; it never verifies a document written by
//! another service. Like the relay (and any loop that runs for good), it reads each feed range
//! to its end, its own stamps included (a stamp moves the document to the end of its range's
//! change feed), so both sides read the same pages; an earlier version stopped the moment its
//! last document was stamped and skipped reading back the stamps of the range it finished last,
//! about 100,000 instructions per document of emulator reads the relay could not skip. The
//! emulator scans and clones the whole feed range for every page it serves (about 34 million
//! instructions a read, whatever the page holds); the driver prints both sides' page reads and
//! the emulator's instructions serving them, so the reads can be told apart from the rest.
//!
//! # How the instructions are counted
//!
//! The binary has three measuring modes, `setup <n>`, `relay <n>` and `loop <n>`; its default
//! mode (what `cargo bench` runs) is the driver, which runs itself once per mode under
//! `valgrind --tool=callgrind --callgrind-out-file=<target>/tmp/relay_throughput/<mode>.callgrind`
//! and reads the `totals:` line of each output file, the calls to the emulator's change-feed
//! read handler with their inclusive instructions, and the calls to `Backtrace::capture` (one
//! per SDK error created). Every mode does the same setup: the Tokio
//! runtime, a warm-up store of [`WARM_UP`] commands drained by *each* side (one-time costs such
//! as lazy statics and first allocations are paid before anything is measured), then a fresh
//! store seeded with `n` commands. Then `relay` drains it with the relay, `loop` with the
//! hand-written loop, and `setup` not at all; all three then read the whole change feed back
//! (the drain modes check it, see below). So
//!
//! ```text
//! per document (side) = (totals(side) - totals(setup)) / n
//! ```
//!
//! counts everything relaying one document costs on that side, the emulator's work included
//! (most of it), and nothing else. Time-driven work is counted too: the relay's lease renewals
//! and the coordinator's lease scans run every 5 s, which under valgrind (some 25x slower) come
//! more often per document than at full speed; the coordinator's scans were about 0.3 % of the
//! relay's instructions, and a 60 s poll interval instead of 1 s changed the relay's total by
//! 0.01 %. Run-to-run differences of the relay's total were up to 1 % (hash seeds, timers).
//!
//! The output files stay in place for `callgrind_annotate --inclusive=yes <file> | head -60`.
//!
//! # Backtraces are off in the children
//!
//! Every child runs with `RUST_LIB_BACKTRACE=0`, as in `pipeline_vs_sdk_batch` (see there): the
//! SDK and its emulator create and drop `azure_core` errors on their success paths, and with
//! `RUST_BACKTRACE=1` each captures a backtrace. `RUST_LIB_BACKTRACE=0` turns
//! `Backtrace::capture` off and leaves panic backtraces as `RUST_BACKTRACE` says. It does not
//! move this ratio (wall clock 0.772x with `RUST_BACKTRACE=1`, 0.774x without, on the code
//! before this bench counted instructions); it keeps callgrind's run short.
//!
//! # Wall clock and correctness
//!
//! The wall-clock child runs [`ROUNDS`] rounds (plus a warm-up round) of [`PER_ROUND`]
//! documents per side, each side on a fresh store, alternating which side runs first so drift
//! on a shared machine hits both alike. The clock runs from the start of the drain to the last
//! stamp (relay: `start()` to `shutdown()` returned). Both sides run on one thread (a
//! current-thread runtime), so the ratio is CPU per document. After every drain, in every mode,
//! the store is read back outside the clock: every Outbox Document must be delivered with its
//! ttl, and the broker must hold each message exactly once.
//!
//! `PER_ROUND` stays at 1 000 because the emulator's page reads and patches get slower as the
//! container grows (seeding 2 000 commands takes about four times as long as 1 000), which would
//! push the run past its minutes without telling more about the relay.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use azure_data_cosmos::feed::{FeedRange, FeedScope};
use azure_data_cosmos::models::{PatchInstructions, PatchOperation};
use azure_data_cosmos::options::{
    ChangeFeedOptions, ChangeFeedStartFrom, MaxItemCountHint, PatchItemOptions, PatchStrategy,
};
use chatter_runtime::BrokeredMessage;
use chatter_runtime::broker::{Broker, BrokerError, InMemoryBroker, Subscription};
use chatter_runtime::cosmos::{self, ContainerClient, CosmosConnection};
use chatter_runtime::relay::RelayOptions;
use chatter_runtime::{BoxError, DocumentReliable, HandlerContext, Runtime, handler};
use chatter_tests::callgrind::{self, Invocation};
use chatter_tests::runtime::seed;
use chatter_tests::store::provisioned_with_leases;
use futures::future::BoxFuture;
use futures::{FutureExt, StreamExt};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value, json};
use tokio::sync::Notify;

include!("../src/relay_commands/bench_place_order.rs");

/// The events' queue.
fn destination() -> &'static str {
    "order-events"
}

/// Wall clock: counted rounds (plus one warm-up round) of `PER_ROUND` documents per side.
const ROUNDS: usize = 7;
const PER_ROUND: usize = 1_000;
/// Callgrind: documents of the warm-up store each side drains in every mode before measuring.
const WARM_UP: usize = 100;
/// Callgrind: documents drained by the measured side (the same as a wall-clock round).
const CALLGRIND_DOCUMENTS: usize = PER_ROUND;
/// The relay's default page size, used by the hand-written loop too.
const PAGE: u32 = 100;
const DELIVERED_TTL: i64 = 86_400;
/// The target, relay/hand-written throughput.
const TARGET: f64 = 0.95;

/// What one child process of the driver runs after the common setup.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Mode {
    Setup,
    Relay,
    Loop,
}

impl callgrind::Mode for Mode {
    const ALL: [Self; 3] = [Self::Setup, Self::Relay, Self::Loop];

    fn name(self) -> &'static str {
        match self {
            Self::Setup => "setup",
            Self::Relay => "relay",
            Self::Loop => "loop",
        }
    }
}

/// The side that drains a store.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Side {
    Relay,
    HandWritten,
}

impl Side {
    fn name(self) -> &'static str {
        match self {
            Self::Relay => "relay",
            Self::HandWritten => "hand-written",
        }
    }
}

fn main() -> Result<(), BoxError> {
    let tokio = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    match callgrind::invocation(CALLGRIND_DOCUMENTS)? {
        Invocation::WallClock => {
            let wall = tokio.block_on(wall_clock())?;
            report_wall_clock(&wall);
            Ok(())
        }
        Invocation::Measure(mode, documents) => tokio.block_on(measured(mode, documents)),
        // The driver: every measurement in a child process of this binary.
        Invocation::Driver => {
            let exe = std::env::current_exe()?;
            report_instructions(count_instructions(&exe)?);
            callgrind::wall_clock_child(&exe)
        }
    }
}

/// One child of the driver: the common setup and warm-up, then `documents` drained by `mode`'s
/// side, then the read-back every mode does alike.
async fn measured(mode: Mode, documents: usize) -> Result<(), BoxError> {
    for side in [Side::Relay, Side::HandWritten] {
        let store = Store::seeded(WARM_UP).await?;
        store.drain(side).await?;
        store.verify(side).await?;
    }
    let store = Store::seeded(documents).await?;
    match mode {
        Mode::Setup => {
            // The same read as the drain modes' check, of the same number of documents.
            store.read_back().await?;
        }
        Mode::Relay => {
            store.drain(Side::Relay).await?;
            store.verify(Side::Relay).await?;
        }
        Mode::Loop => {
            store.drain(Side::HandWritten).await?;
            store.verify(Side::HandWritten).await?;
        }
    }
    Ok(())
}

/// Instructions per document of each side, or why they could not be counted.
struct Instructions {
    relay: SideFigures,
    hand_written: SideFigures,
    setup: u64,
}

/// One side's figures beyond the setup run.
struct SideFigures {
    /// Instructions per document.
    per_document: f64,
    /// Change-feed page reads the emulator served.
    reads: i64,
    /// Instructions per document spent in the emulator serving those reads.
    read_per_document: f64,
    /// `azure_core` errors created per document (each one a `Backtrace::capture` call).
    errors_per_document: f64,
}

/// The emulator's handler of a change-feed page read (the SDK's in-memory emulator).
const READ_HANDLER: &str = "in_memory_emulator::operations::handle_read_feed_items";
/// Every `azure_core` (typespec) error calls it once when it is created.
const BACKTRACE_CAPTURE: &str = "<std::backtrace::Backtrace>::capture";

/// What one callgrind output file says.
struct Profile {
    /// The `totals:` line.
    total: u64,
    /// Calls to [`READ_HANDLER`] and their inclusive instructions.
    reads: (u64, u64),
    /// Calls to [`BACKTRACE_CAPTURE`].
    captures: u64,
}

fn count_instructions(exe: &Path) -> Result<Result<Instructions, String>, BoxError> {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("relay_throughput");
    let profiles = match callgrind::profile_modes::<Mode>(exe, &dir, CALLGRIND_DOCUMENTS)? {
        Ok(profiles) => profiles,
        Err(why) => return Ok(Err(why)),
    };
    let profiles: Vec<Profile> = profiles
        .iter()
        .map(|(total, text)| Profile {
            total: *total,
            reads: calls_to(text, READ_HANDLER),
            captures: calls_to(text, BACKTRACE_CAPTURE).0,
        })
        .collect();
    let [setup, relay, hand_written] = &profiles[..] else {
        unreachable!("three modes")
    };
    let per = |side: u64, setup: u64| (side as f64 - setup as f64) / CALLGRIND_DOCUMENTS as f64;
    let figures = |side: &Profile| SideFigures {
        per_document: per(side.total, setup.total),
        reads: side.reads.0 as i64 - setup.reads.0 as i64,
        read_per_document: per(side.reads.1, setup.reads.1),
        errors_per_document: per(side.captures, setup.captures),
    };
    Ok(Ok(Instructions {
        relay: figures(relay),
        hand_written: figures(hand_written),
        setup: setup.total,
    }))
}

/// The calls to every function whose name contains `name` in a callgrind output file, and the
/// instructions they cost (inclusive; the functions counted here do not call themselves).
///
/// The format: `cfn=(id) name` names the callee the first time `id` appears (later `cfn=(id)`
/// alone; `fn=` shares the ids), then `calls=<count> <position>`, then one line whose last
/// field is the call's inclusive cost (the only event counted is `Ir`).
fn calls_to(text: &str, name: &str) -> (u64, u64) {
    let mut names: std::collections::HashMap<&str, &str> = std::collections::HashMap::new();
    let mut callee_matches = false;
    let mut cost_follows = false;
    let (mut calls, mut cost) = (0, 0);
    for line in text.lines() {
        if cost_follows {
            cost_follows = false;
            cost += line
                .split_whitespace()
                .last()
                .and_then(|n| n.parse::<u64>().ok())
                .unwrap_or(0);
            continue;
        }
        let (is_callee, rest) = if let Some(rest) = line.strip_prefix("cfn=") {
            (true, rest)
        } else if let Some(rest) = line.strip_prefix("fn=") {
            (false, rest)
        } else {
            if callee_matches && let Some(rest) = line.strip_prefix("calls=") {
                calls += rest
                    .split_whitespace()
                    .next()
                    .and_then(|n| n.parse::<u64>().ok())
                    .unwrap_or(0);
                cost_follows = true;
            }
            continue;
        };
        // `(id) name` or `(id)`.
        let (id, function) = match rest.split_once(") ") {
            Some((id, function)) => (id, Some(function)),
            None => (rest.trim_end_matches(')'), None),
        };
        if let Some(function) = function {
            names.insert(id, function);
        }
        if is_callee {
            callee_matches = names.get(id).is_some_and(|f| f.contains(name));
        }
    }
    (calls, cost)
}

fn report_instructions(instructions: Result<Instructions, String>) {
    match instructions {
        Ok(i) => {
            // Throughput is the inverse of the cost per document.
            let ratio = i.hand_written.per_document / i.relay.per_document;
            println!(
                "instructions per document: relay {:.0}, hand-written loop {:.0} (callgrind, \
                 {CALLGRIND_DOCUMENTS} outbox documents per side after a warm-up of {WARM_UP} \
                 drained by each; setup alone {} instructions)",
                i.relay.per_document, i.hand_written.per_document, i.setup
            );
            for (side, f) in [("relay", &i.relay), ("hand-written", &i.hand_written)] {
                println!(
                    "  {side}: {} change-feed page reads, {:.0} instructions per document in the \
                     emulator serving them; {:.1} SDK errors created per document",
                    f.reads, f.read_per_document, f.errors_per_document
                );
            }
            println!(
                "ratio relay/hand-written throughput (instructions, hand-written/relay): \
                 {ratio:.3}x; target >= {TARGET:.2}x ({})",
                if ratio >= TARGET { "met" } else { "NOT met" }
            );
        }
        Err(why) => println!("instructions per document: not counted ({why})"),
    }
}

/// One wall-clock round of each side.
struct WallClock {
    relay: Vec<Run>,
    hand_written: Vec<Duration>,
    ranges: usize,
}

async fn wall_clock() -> Result<WallClock, BoxError> {
    let mut relay = Vec::new();
    let mut hand_written = Vec::new();
    let mut ranges = 0;
    for round in 0..=ROUNDS {
        // Alternate which side runs first so drift on a shared machine hits both alike.
        let first = if round % 2 == 0 {
            Side::Relay
        } else {
            Side::HandWritten
        };
        let (r, b) = wall_clock_round(first).await?;
        ranges = b.ranges;
        // Round 0 warms both paths up and is not counted.
        if round > 0 {
            relay.push(r);
            hand_written.push(b.total);
        }
    }
    Ok(WallClock {
        relay,
        hand_written,
        ranges,
    })
}

/// One round: each side drains a fresh store, `first` first; (relay, hand-written).
async fn wall_clock_round(first: Side) -> Result<(Run, Run), BoxError> {
    let second = match first {
        Side::Relay => Side::HandWritten,
        Side::HandWritten => Side::Relay,
    };
    let mut relay = None;
    let mut hand_written = None;
    for side in [first, second] {
        let store = Store::seeded(PER_ROUND).await?;
        let run = store.drain(side).await?;
        store.verify(side).await?;
        match side {
            Side::Relay => relay = Some(run),
            Side::HandWritten => hand_written = Some(run),
        }
    }
    Ok((relay.expect("drained"), hand_written.expect("drained")))
}

fn report_wall_clock(wall: &WallClock) {
    let rate = |d: &Duration| PER_ROUND as f64 / d.as_secs_f64();
    let median = |mut values: Vec<f64>| {
        values.sort_by(f64::total_cmp);
        values[values.len() / 2]
    };
    let mut ratios: Vec<f64> = wall
        .relay
        .iter()
        .zip(&wall.hand_written)
        .map(|(r, b)| rate(&r.total) / rate(b))
        .collect();
    ratios.sort_by(f64::total_cmp);
    let ms = |d: &Duration| d.as_secs_f64() * 1e3;
    println!(
        "wall clock: relay {:.0} docs/s, hand-written loop {:.0} docs/s (medians of {ROUNDS} \
         rounds x {PER_ROUND} outbox documents, {} feed ranges)",
        median(wall.relay.iter().map(|r| rate(&r.total)).collect()),
        median(wall.hand_written.iter().map(rate).collect()),
        wall.ranges,
    );
    println!(
        "relay time includes start() {:.1} ms and shutdown() {:.1} ms (medians)",
        median(wall.relay.iter().map(|r| ms(&r.start)).collect()),
        median(wall.relay.iter().map(|r| ms(&r.shutdown)).collect()),
    );
    println!(
        "ratio relay/hand-written (wall clock): median {:.3}x (min {:.3}x, max {:.3}x); target \
         >= {TARGET:.2}x, noisy on a shared machine: the instruction ratio decides",
        ratios[ratios.len() / 2],
        ratios[0],
        ratios[ratios.len() - 1]
    );
}

/// An `InMemoryBroker` that wakes [`CountingBroker::all_published`] once `expected` messages
/// were published, so neither side's end is found by polling (which callgrind would count).
#[derive(Clone)]
struct CountingBroker {
    inner: InMemoryBroker,
    count: Arc<Count>,
}

struct Count {
    published: AtomicUsize,
    expected: usize,
    all: Notify,
}

impl CountingBroker {
    fn new(expected: usize) -> Self {
        Self {
            inner: InMemoryBroker::new(),
            count: Arc::new(Count {
                published: AtomicUsize::new(0),
                expected,
                all: Notify::new(),
            }),
        }
    }

    /// Resolves once `expected` messages were published.
    async fn all_published(&self) {
        while self.count.published.load(Ordering::Acquire) < self.count.expected {
            self.count.all.notified().await;
        }
    }
}

impl Broker for CountingBroker {
    fn publish(&self, message: BrokeredMessage) -> BoxFuture<'_, Result<(), BrokerError>> {
        async move {
            self.inner.publish(message).await?;
            let published = self.count.published.fetch_add(1, Ordering::AcqRel) + 1;
            if published >= self.count.expected {
                self.count.all.notify_one();
            }
            Ok(())
        }
        .boxed()
    }

    fn subscribe<'a>(
        &'a self,
        destination: &'a str,
    ) -> BoxFuture<'a, Result<Subscription, BrokerError>> {
        self.inner.subscribe(destination)
    }

    fn check(&self, message: &BrokeredMessage) -> Result<(), BrokerError> {
        self.inner.check(message)
    }
}

/// A fresh store holding `documents` dispatched commands, none relayed yet, and the broker
/// its drain publishes to.
struct Store {
    cosmos: CosmosConnection,
    orders: Arc<ContainerClient>,
    broker: CountingBroker,
    documents: usize,
}

/// One timed drain: the whole of it, the relay's parts spent in `start()` and `shutdown()`,
/// and the number of feed ranges the hand-written loop drained.
struct Run {
    total: Duration,
    start: Duration,
    shutdown: Duration,
    ranges: usize,
}

impl Store {
    async fn seeded(documents: usize) -> Result<Self, BoxError> {
        let cosmos = CosmosConnection::embedded().await?;
        let orders =
            provisioned_with_leases(&cosmos, "bench", "orders", &["/orderId"], "orders-leases")
                .await;
        seed(
            &cosmos,
            (0..documents).map(|n| (order(n), format!("m-{n}"))),
        )
        .await?;
        Ok(Self {
            cosmos,
            orders,
            broker: CountingBroker::new(documents),
            documents,
        })
    }

    async fn drain(&self, side: Side) -> Result<Run, BoxError> {
        match side {
            Side::Relay => self.relay().await,
            Side::HandWritten => self.hand_written().await,
        }
    }

    async fn relay(&self) -> Result<Run, BoxError> {
        let start = Instant::now();
        let runtime = Runtime::builder()
            .cosmos(self.cosmos.clone())
            .broker(self.broker.clone())
            .consume(false)
            .relay_options(RelayOptions::default())
            .start()
            .await?;
        let started = start.elapsed();
        self.broker.all_published().await;
        // Lets the page in flight stamp its last document and checkpoint.
        let stopping = Instant::now();
        runtime.shutdown().await;
        Ok(Run {
            total: start.elapsed(),
            start: started,
            shutdown: stopping.elapsed(),
            ranges: 0,
        })
    }

    async fn hand_written(&self) -> Result<Run, BoxError> {
        let start = Instant::now();
        let ranges = self.orders.read_feed_ranges(None).await?;
        let count = ranges.len();
        let drains = ranges.into_iter().map(|range| self.drain_range(range));
        for result in futures::future::join_all(drains).await {
            result?;
        }
        Ok(Run {
            total: start.elapsed(),
            start: Duration::ZERO,
            shutdown: Duration::ZERO,
            ranges: count,
        })
    }

    /// The hand-written relay of one feed range: read pages from the beginning until one comes
    /// back empty (its own stamps read back on the way), publish each pending outbox document,
    /// then stamp it.
    async fn drain_range(&self, range: FeedRange) -> Result<(), BoxError> {
        let options = ChangeFeedOptions::default()
            .with_max_item_count(MaxItemCountHint::Limit(PAGE.try_into()?));
        let mut pages = self
            .orders
            .query_change_feed::<Value>(
                FeedScope::range(range),
                ChangeFeedStartFrom::Beginning,
                Some(options),
            )
            .await?;
        while let Some(page) = pages.next().await {
            let page = page?;
            if page.items().is_empty() {
                break;
            }
            for doc in page.items().iter().filter_map(|item| item.current()) {
                let text = |field: &str| doc.get(field).and_then(Value::as_str);
                if text("_chatterType") != Some("outbox") || text("status") != Some("pending") {
                    continue;
                }
                let (Some(id), Some(order_id)) = (text("id"), text("orderId")) else {
                    return Err("a pending outbox document without id or orderId".into());
                };
                let context = match text("MessageContext") {
                    Some(context) => serde_json::from_str::<Map<String, Value>>(context)?,
                    None => Map::new(),
                };
                let message = BrokeredMessage {
                    message_id: text("MessageId").ok_or("no MessageId")?.to_owned(),
                    destination: text("Destination").ok_or("no Destination")?.to_owned(),
                    body: text("MessageBody").ok_or("no MessageBody")?.to_owned(),
                    content_type: text("MessageContentType")
                        .unwrap_or("application/json")
                        .to_owned(),
                    context,
                };
                self.broker.publish(message).await?;
                let patch = PatchInstructions::new()
                    .with_operation(PatchOperation::set(
                        "/status".to_owned(),
                        json!("delivered"),
                    ))
                    .with_operation(PatchOperation::set("/ttl".to_owned(), json!(DELIVERED_TTL)));
                let options = PatchItemOptions::default().with_strategy(PatchStrategy::ServerSide);
                self.orders
                    .patch_item(
                        cosmos::partition_key(&[json!(order_id)])?,
                        id,
                        patch,
                        Some(options),
                    )
                    .await?;
            }
        }
        Ok(())
    }

    /// Every document of the change feed: (Outbox Documents, of which stamped delivered with
    /// the ttl).
    async fn read_back(&self) -> Result<(usize, usize), BoxError> {
        let (mut outbox, mut delivered) = (0, 0);
        chatter_tests::store::for_each_change(&self.orders, None, |doc| {
            if doc["_chatterType"] == "outbox" {
                outbox += 1;
                if doc["status"] == "delivered" && doc["ttl"] == DELIVERED_TTL {
                    delivered += 1;
                }
            }
        })
        .await?;
        Ok((outbox, delivered))
    }

    /// Outside the clock: every Outbox Document is delivered with its ttl, and the broker
    /// holds each message once.
    async fn verify(&self, side: Side) -> Result<(), BoxError> {
        let side = side.name();
        let expected = self.documents;
        let published = self.broker.inner.published_count(destination());
        if published != expected {
            return Err(
                format!("{side}: {published} messages published, expected {expected}").into(),
            );
        }
        let (outbox, delivered) = self.read_back().await?;
        if outbox != expected || delivered != expected {
            return Err(format!(
                "{side}: {delivered} of {outbox} outbox documents stamped delivered, expected {expected}"
            )
            .into());
        }
        Ok(())
    }
}
