//! Benchmark (not a test): the peak memory (RSS) of a relay process draining a backlog of
//! [`BACKLOG`] pending Outbox Documents, against the same process idle. A relay reads the change
//! feed page by page, so the backlog must not be held in memory beyond the pages in flight: the
//! draining peak should stay close to the idle one, whatever the backlog.
//!
//! `cargo bench -p chatter-tests --features rabbitmq --bench relay_memory` (RabbitMQ at
//! 127.0.0.1:5672, guest/guest; about two and a half minutes).
//!
//! The relay is `relay_worker` (`tests/src/bin/relay_worker.rs`) in its own process, so its RSS
//! is its own: the store is a `chatter-emulator` server this process hosts (the in-memory
//! emulator holding the backlog would dominate a process it lived in), and the broker is the
//! real RabbitMQ, on a queue named uniquely for the run and deleted at the end (an in-memory
//! broker in the relay process would keep every published message). This process consumes the
//! queue, counting what arrives.
//!
//! 1. **idle**: a worker on a fresh, empty monitored container, read [`SETTLE`] after it
//!    printed `started` (its leases taken, its feed polled a few dozen times);
//! 2. **draining**: a fresh store seeded with the backlog, then a worker started on it and read
//!    once every message arrived on the queue and the store holds no pending Outbox Document
//!    any more. Seeding goes through the real pipeline (`Runtime::dispatch` with the relay off,
//!    so the documents have exactly the shape chatter writes): [`SeedBacklog`] commands of
//!    [`PER_COMMAND`] messages each, one partition per command, 250 batches in about five
//!    seconds. One command per message (the worker's `PlaceOrder`: an order, an inbox marker
//!    and an Outbox Document, 20,000 batches and 60,000 documents) had not finished seeding
//!    after 13 minutes, because the emulator's writes get slower as a container grows.
//!
//! Read from `/proc/<pid>/status`: `VmHWM`, the peak resident set of the process's life, and
//! `VmRSS` now. While draining both are sampled every 200 ms and the largest value seen is the
//! peak (Linux updates `VmHWM` lazily, so it can miss a peak that a sample of `VmRSS` caught). The worker runs with the same relay options in both phases (`fast_relay`: pages
//! of 100, polled every 100 ms). Printed: both peaks in MiB, the ratio draining/idle, and the
//! growth per 1,000 documents of backlog that the difference would mean if it grew with the
//! backlog (an upper bound: part of the difference is the working set of a busy relay, which a
//! larger backlog would not enlarge).

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use chatter_runtime::BrokeredMessage;
use chatter_runtime::cosmos::{ContainerClient, CosmosConnection};
use chatter_runtime::{BoxError, DocumentReliable, HandlerContext, handler};
use chatter_tests::broker::Received;
use chatter_tests::process::ChildProcess;
use chatter_tests::rabbitmq::{self, URI};
use chatter_tests::runtime::writer;
use chatter_tests::store::{emulator_server, provisioned_with_leases};
use futures::StreamExt;
use serde::{Deserialize, Serialize};
use serde_json::json;

/// The seeding command: [`PER_COMMAND`] events of one order, each a pending Outbox Document in
/// the order's partition, committed in one batch. `relay_worker` monitors the same container
/// (its own `PlaceOrder` registers it); the relay publishes whatever Outbox Documents it finds.
#[derive(Serialize, Deserialize, DocumentReliable)]
#[cosmos(database = "relay-kill", container = "orders", lease = "orders-leases")]
#[partition_key(path = "/orderId")]
#[serde(rename_all = "camelCase")]
pub struct SeedBacklog {
    pub order_id: String,
    pub events: String,
}

#[handler]
async fn seed_backlog(command: SeedBacklog, ctx: &mut HandlerContext) -> Result<(), BoxError> {
    let body = json!({ "orderId": command.order_id }).to_string();
    for n in 0..PER_COMMAND {
        let event = format!("{}:OrderPlaced:{n}", command.order_id);
        ctx.send(BrokeredMessage::json(event, &command.events, body.clone()))?;
    }
    Ok(())
}

const DB: &str = "relay-kill";
const CONTAINER: &str = "orders";
const LEASES: &str = "orders-leases";
/// Pending Outbox Documents the draining relay starts with.
const BACKLOG: usize = 20_000;
/// Outbox Documents per seeding command (a batch holds at most 100 operations, the inbox
/// marker included).
const PER_COMMAND: usize = 80;
/// Seeding commands in flight.
const SEED_CONCURRENCY: usize = 4;
/// How long the idle worker runs after `started` before it is read.
const SETTLE: Duration = Duration::from_secs(5);
/// Bound of every wait: a worker start, the seeding, the drain.
const WAIT: Duration = Duration::from_secs(300);
const MIB: f64 = 1024.0 * 1024.0;

/// A process's memory, in bytes, from `/proc/<pid>/status`.
#[derive(Clone, Copy, Debug)]
struct Memory {
    /// `VmHWM`: the peak resident set.
    peak: u64,
    /// `VmRSS`: the resident set now.
    now: u64,
}

impl Memory {
    fn of(pid: u32) -> Result<Self, BoxError> {
        let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
        let kib = |field: &str| -> Result<u64, BoxError> {
            let line = status
                .lines()
                .find(|line| line.starts_with(field))
                .ok_or_else(|| format!("no {field} in /proc/{pid}/status"))?;
            let kib: u64 = line
                .split_whitespace()
                .nth(1)
                .ok_or_else(|| format!("an empty {line:?}"))?
                .parse()?;
            Ok(kib * 1024)
        };
        Ok(Self {
            peak: kib("VmHWM:")?,
            now: kib("VmRSS:")?,
        })
    }
}

fn mib(bytes: u64) -> f64 {
    bytes as f64 / MIB
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<(), BoxError> {
    let idle = idle().await?;
    println!(
        "idle relay: peak RSS (VmHWM) {:.1} MiB, RSS {:.1} MiB, {SETTLE:?} after start on an empty container",
        mib(idle.peak),
        mib(idle.now)
    );
    let draining = draining().await?;
    println!(
        "draining relay: peak RSS (VmHWM) {:.1} MiB, RSS {:.1} MiB at the end, after relaying a backlog of {BACKLOG} Outbox Documents",
        mib(draining.peak),
        mib(draining.now)
    );
    let growth = draining.peak.saturating_sub(idle.peak);
    println!(
        "ratio draining/idle (peak RSS): {:.2}x; {:.1} MiB more, {:.3} MiB per 1,000 documents of backlog if it grew with it",
        draining.peak as f64 / idle.peak as f64,
        mib(growth),
        mib(growth) * 1000.0 / BACKLOG as f64
    );
    Ok(())
}

/// Starts a `relay_worker` on the store at `endpoint` and waits for `started`; it is killed
/// when the guard drops.
async fn worker(endpoint: &str) -> ChildProcess {
    let mut command = Command::new(env!("CARGO_BIN_EXE_relay_worker"));
    command
        .env("CHATTER_COSMOS_ENDPOINT", endpoint)
        .env("CHATTER_RABBITMQ_URI", URI)
        .env_remove("CHATTER_COSMOS_KEY")
        .env_remove("CHATTER_TEST_HANG_AFTER_PUBLISH")
        .env_remove("CHATTER_TEST_LEASE_EXPIRY_MS")
        .stdin(Stdio::piped())
        .stderr(Stdio::inherit());
    let mut worker = ChildProcess::spawn("relay_worker", &mut command);
    worker.line_starting_with("started", WAIT).await;
    worker
}

async fn idle() -> Result<Memory, BoxError> {
    let (emulator, cosmos) = emulator_server().await;
    provisioned_with_leases(&cosmos, DB, CONTAINER, &["/orderId"], LEASES).await;
    let worker = worker(emulator.endpoint()).await;
    tokio::time::sleep(SETTLE).await;
    let memory = Memory::of(worker.id())?;
    worker.kill();
    Ok(memory)
}

async fn draining() -> Result<Memory, BoxError> {
    let (emulator, cosmos) = emulator_server().await;
    let orders = provisioned_with_leases(&cosmos, DB, CONTAINER, &["/orderId"], LEASES).await;
    let broker = rabbitmq::connect(WAIT).await;
    let queue = format!("chatter-bench-relay-memory-{}", uuid::Uuid::new_v4());
    let received = Received::consume(rabbitmq::subscribe(&broker, &queue, WAIT).await);
    let result = async {
        seed(&cosmos, &broker, &queue).await?;
        drain(emulator.endpoint(), &orders, &received).await
    }
    .await;
    let left = rabbitmq::delete_queue(&broker, &queue, WAIT).await;
    if left > 0 {
        eprintln!("{left} messages were still on {queue} when it was deleted");
    }
    result
}

/// Dispatches `BACKLOG / PER_COMMAND` seeding commands with the relay off: [`BACKLOG`] pending
/// Outbox Documents.
async fn seed(
    cosmos: &CosmosConnection,
    broker: &chatter_runtime::broker::RabbitMqBroker,
    queue: &str,
) -> Result<(), BoxError> {
    let writer = writer(cosmos, broker.clone()).await;
    let started = Instant::now();
    let mut dispatches = futures::stream::iter(0..BACKLOG / PER_COMMAND)
        .map(|n| {
            writer.dispatch(
                SeedBacklog {
                    order_id: format!("order-{n}"),
                    events: queue.to_owned(),
                },
                format!("order-{n}:seed"),
            )
        })
        .buffer_unordered(SEED_CONCURRENCY);
    let mut done = 0;
    while let Some(outcome) = dispatches.next().await {
        outcome?;
        done += PER_COMMAND;
        if done % 2_000 == 0 {
            eprintln!(
                "seeded {done} of {BACKLOG} in {:.1} s",
                started.elapsed().as_secs_f64()
            );
        }
    }
    drop(dispatches);
    writer.shutdown().await;
    eprintln!(
        "seeding {BACKLOG} Outbox Documents took {:.1} s",
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

/// Runs a worker on the seeded store until every message arrived and every Outbox Document is
/// stamped; returns its memory then.
async fn drain(
    endpoint: &str,
    orders: &ContainerClient,
    received: &Received,
) -> Result<Memory, BoxError> {
    let worker = worker(endpoint).await;
    let pid = worker.id();
    let started = Instant::now();
    let mut reported = Instant::now();
    let mut peak = 0;
    while received.distinct() < BACKLOG {
        let memory = Memory::of(pid)?;
        peak = peak.max(memory.peak).max(memory.now);
        if started.elapsed() > WAIT {
            return Err(format!(
                "{} of {BACKLOG} messages arrived within {WAIT:?}",
                received.distinct()
            )
            .into());
        }
        if reported.elapsed() >= Duration::from_secs(10) {
            reported = Instant::now();
            eprintln!(
                "{:>5.1} s: {} of {BACKLOG} arrived; relay RSS {:.1} MiB, peak {:.1} MiB",
                started.elapsed().as_secs_f64(),
                received.distinct(),
                mib(memory.now),
                mib(peak)
            );
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // A message is stamped right after RabbitMQ confirmed it: wait for the last stamps.
    loop {
        let memory = Memory::of(pid)?;
        peak = peak.max(memory.peak).max(memory.now);
        let (outbox, delivered) = stamped(orders).await?;
        if outbox == BACKLOG && delivered == BACKLOG {
            break;
        }
        if started.elapsed() > WAIT {
            return Err(format!(
                "{delivered} of {outbox} Outbox Documents stamped delivered within {WAIT:?}"
            )
            .into());
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let memory = Memory::of(pid)?;
    let memory = Memory {
        peak: peak.max(memory.peak).max(memory.now),
        now: memory.now,
    };
    eprintln!(
        "drained {BACKLOG} in {:.1} s",
        started.elapsed().as_secs_f64()
    );
    worker.kill();
    Ok(memory)
}

/// Outbox Documents in the store, and how many of them are stamped delivered.
async fn stamped(orders: &ContainerClient) -> Result<(usize, usize), BoxError> {
    let (mut outbox, mut delivered) = (0, 0);
    chatter_tests::store::for_each_change(orders, Some(1000), |doc| {
        if doc["_chatterType"] == "outbox" {
            outbox += 1;
            if doc["status"] == "delivered" {
                delivered += 1;
            }
        }
    })
    .await?;
    Ok((outbox, delivered))
}
