//! Benchmark (not a test): how much store latency the relay hides. The drain rate of the same
//! backlog at 5 ms and 20 ms per store round trip, divided by the rate at 0 ms, in one run, for
//! two shapes of backlog:
//!
//! - **spread**: 1,000 commands on 1,000 order ids, one pending Outbox Document each, over the
//!   container's four physical partitions (four leases; a page holds one document per key);
//! - **one partition**: the container merged into one physical partition (one lease carries the
//!   whole outbox, as for most containers: under 50 GB and 10,000 RU/s), 100 commands on 33
//!   tenant keys (round robin), each emitting 10 events: 1,000 pending documents, about 30 per
//!   key, so a page holds a chain of 10 documents for each of about 8 keys. Not 3,000: the
//!   emulator scans and clones its whole partition for every page it serves, so with 3,000
//!   documents in one partition each read cost about 50 ms of CPU and the emulator's reads,
//!   not the relay, set every rate on this 2-core machine.
//!
//! Targets: **>= 0.9 at 5 ms** and **>= 0.8 at 20 ms** on both shapes.
//!
//! `cargo bench -p chatter-tests --features rabbitmq --bench relay_store_latency`
//! (`-- spread` or `-- one-partition` runs one shape).
//!
//! Each round and each delay gets a fresh `chatter-emulator` server (served over HTTP by this
//! process), seeded with no delay: the commands dispatched with the relay off, each writing
//! its document, an inbox marker and its pending Outbox Documents. Then the delay is set on every
//! store request (the emulator's latency option) and a runtime with the relay on at
//! `RelayOptions::default()` drains the backlog to RabbitMQ (127.0.0.1:5672, a queue of its own
//! per run, deleted at the end), where a subscription of this process counts the events. The
//! drain rate is events over the time from the first event to the last: start-up (the container
//! check and the lease handshake, a fixed number of round trips) is printed beside it, not in
//! the rate. Delays alternate their order across rounds so drift on a shared machine hits each
//! alike; the medians are compared.
//! `CHATTER_BENCH_MAX_IN_FLIGHT=N` runs it with another `RelayOptions::max_in_flight`.

use std::sync::OnceLock;
use std::time::{Duration, Instant};

use chatter_emulator::RunningEmulator;
use chatter_runtime::cosmos::CosmosConnection;
use chatter_runtime::relay::RelayOptions;
use chatter_runtime::{BoxError, DocumentReliable, HandlerContext, Runtime, handler};
use chatter_tests::rabbitmq;
use chatter_tests::runtime::seed;
use chatter_tests::store::{emulator_server, provisioned_with_leases};
use serde::{Deserialize, Serialize};
use serde_json::json;

include!("../src/relay_commands/bench_place_order.rs");

/// This run's queue: other runs may use the same RabbitMQ at the same time.
fn destination() -> &'static str {
    static DESTINATION: OnceLock<String> = OnceLock::new();
    DESTINATION.get_or_init(|| format!("bench-relay-latency-{}", uuid::Uuid::new_v4()))
}

/// A backlog to drain.
#[derive(Debug, Clone, Copy)]
enum Shape {
    /// One document per order id, over the container's four physical partitions.
    Spread,
    /// One physical partition, chains of documents per tenant key.
    OnePartition,
}

impl Shape {
    const ALL: [Shape; 2] = [Shape::Spread, Shape::OnePartition];

    fn name(self) -> &'static str {
        match self {
            Shape::Spread => "spread",
            Shape::OnePartition => "one-partition",
        }
    }

    /// The pending Outbox Documents the backlog holds.
    fn backlog(self) -> usize {
        match self {
            Shape::Spread => 1_000,
            Shape::OnePartition => TENANT_COMMANDS * LINES_PER_COMMAND as usize,
        }
    }
}

/// The one-partition shape: 100 commands over 33 tenant keys, 10 events each.
const TENANT_COMMANDS: usize = 100;
const TENANTS: usize = 33;
const LINES_PER_COMMAND: u32 = 10;

const ROUNDS: usize = 5;
const DELAYS_MS: [u64; 3] = [0, 5, 20];
const WAIT: Duration = Duration::from_secs(300);

/// A tenant's order of several lines, one event per line: an aggregate that emits several
/// messages per command, all under the tenant's key.
#[derive(Serialize, Deserialize, DocumentReliable)]
#[cosmos(database = "bench", container = "orders", lease = "orders-leases")]
#[partition_key(path = "/orderId")]
#[serde(rename_all = "camelCase")]
pub struct PlaceTenantOrder {
    /// The tenant's key (the container's partition-key path is `/orderId`).
    pub order_id: String,
    pub lines: u32,
}

#[handler]
async fn place_tenant_order(
    command: PlaceTenantOrder,
    ctx: &mut HandlerContext,
) -> Result<(), BoxError> {
    ctx.upsert(json!({ "id": command.order_id, "orderId": command.order_id, "status": "placed" }))?;
    for line in 0..command.lines {
        ctx.send_json(
            &format!("{}:line-{line}", ctx.message_id()),
            destination(),
            &json!({ "orderId": command.order_id, "line": line }),
        )?;
    }
    Ok(())
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let only = std::env::args().skip(1).find(|arg| !arg.starts_with('-'));
    let shapes: Vec<Shape> = Shape::ALL
        .into_iter()
        .filter(|shape| only.as_deref().is_none_or(|name| name == shape.name()))
        .collect();
    let broker = rabbitmq::connect(Duration::from_secs(10)).await;
    let mut summary = Vec::new();
    for shape in shapes {
        summary.push(measure(&broker, shape).await?);
    }
    rabbitmq::delete_queue(&broker, destination(), Duration::from_secs(10)).await;
    for lines in summary {
        println!("{lines}");
    }
    Ok(())
}

/// Drains `shape` at every delay for `ROUNDS` rounds; the summary of its medians.
async fn measure(
    broker: &chatter_runtime::broker::RabbitMqBroker,
    shape: Shape,
) -> Result<String, BoxError> {
    let mut rates: Vec<Vec<f64>> = vec![Vec::new(); DELAYS_MS.len()];
    let mut starts: Vec<Vec<f64>> = vec![Vec::new(); DELAYS_MS.len()];
    for round in 0..ROUNDS {
        let mut order: Vec<usize> = (0..DELAYS_MS.len()).collect();
        order.rotate_left(round % DELAYS_MS.len());
        for at in order {
            let run = drain_once(broker, shape, Duration::from_millis(DELAYS_MS[at])).await?;
            println!(
                "{} round {round}: {:>2} ms store delay: {:.0} events/s (start-up {:.0} ms, \
                 {:.2} RU per relayed message)",
                shape.name(),
                DELAYS_MS[at],
                run.rate,
                run.start_ms,
                run.ru_per_message
            );
            rates[at].push(run.rate);
            starts[at].push(run.start_ms);
        }
    }
    let median = |values: &[f64]| {
        let mut values = values.to_vec();
        values.sort_by(f64::total_cmp);
        values[values.len() / 2]
    };
    let base = median(&rates[0]);
    let mut summary = format!(
        "{}: drain rate of {} outbox documents, medians of {ROUNDS} rounds (start-up not included):",
        shape.name(),
        shape.backlog()
    );
    for (at, delay) in DELAYS_MS.iter().enumerate() {
        let target = match delay {
            0 => String::new(),
            5 => "; target >= 0.9".to_owned(),
            _ => "; target >= 0.8".to_owned(),
        };
        summary.push_str(&format!(
            "\n  {delay:>2} ms: {:.0} events/s, start-up {:.0} ms, ratio to 0 ms {:.3}{target}",
            median(&rates[at]),
            median(&starts[at]),
            median(&rates[at]) / base,
        ));
    }
    Ok(summary)
}

/// The relay's defaults; `CHATTER_BENCH_MAX_IN_FLIGHT=N` tries another in-flight limit.
fn options() -> RelayOptions {
    match std::env::var("CHATTER_BENCH_MAX_IN_FLIGHT").map(|n| n.parse::<usize>()) {
        Ok(Ok(n)) => RelayOptions::default().max_in_flight(n),
        _ => RelayOptions::default(),
    }
}

struct Run {
    rate: f64,
    start_ms: f64,
    /// Nominal on the emulator; the figure an account would bill per relayed message.
    ru_per_message: f64,
}

async fn drain_once(
    broker: &chatter_runtime::broker::RabbitMqBroker,
    shape: Shape,
    delay: Duration,
) -> Result<Run, BoxError> {
    let (emulator, cosmos) = emulator_server().await;
    // Ids of their own per run: a duplicate of an earlier run is never counted in this one.
    let run = uuid::Uuid::new_v4();
    let cosmos = seed_backlog(&emulator, cosmos, shape, run).await?;
    let mut subscription = rabbitmq::subscribe(broker, destination(), WAIT).await;
    emulator.faults().set_latency(delay);

    let backlog = shape.backlog();
    let started = Instant::now();
    let runtime = Runtime::builder()
        .cosmos(cosmos.clone())
        .broker(broker.clone())
        .consume(false)
        .relay_options(options())
        .start()
        .await?;
    let start_ms = started.elapsed().as_secs_f64() * 1e3;
    let mut first = None;
    let mut seen = std::collections::HashSet::new();
    while seen.len() < backlog {
        let delivery = tokio::time::timeout(WAIT, subscription.next())
            .await
            .map_err(|_| format!("the relay stalled after {} events", seen.len()))?
            .ok_or("the subscription ended")??;
        first.get_or_insert_with(Instant::now);
        if delivery.message.message_id.contains(&run.to_string()) {
            seen.insert(delivery.message.message_id.clone());
        }
        delivery.ack().await?;
    }
    let elapsed = first.map_or(Duration::ZERO, |at| at.elapsed());
    let charges = runtime.request_charges();
    runtime.shutdown().await;
    emulator.faults().clear();
    drop(subscription);
    Ok(Run {
        rate: (backlog - 1) as f64 / elapsed.as_secs_f64(),
        start_ms,
        ru_per_message: charges.per_relayed_message().unwrap_or_default(),
    })
}

/// The shape's commands dispatched with the relay off: its pending Outbox Documents. Returns the
/// connection to drain them with: after a merge a new one, which has not cached the four
/// partitions the container started with.
async fn seed_backlog(
    emulator: &RunningEmulator,
    cosmos: CosmosConnection,
    shape: Shape,
    run: uuid::Uuid,
) -> Result<CosmosConnection, BoxError> {
    provisioned_with_leases(&cosmos, "bench", "orders", &["/orderId"], "orders-leases").await;
    match shape {
        Shape::Spread => {
            let commands = (0..shape.backlog()).map(|n| (order(n), format!("m-{run}-{n}")));
            seed(&cosmos, commands).await?;
            Ok(cosmos)
        }
        Shape::OnePartition => {
            emulator.merge_into_one_partition("bench", "orders").await?;
            let cosmos = CosmosConnection::connect(emulator.endpoint(), None).await?;
            let commands = (0..TENANT_COMMANDS).map(|n| {
                let command = PlaceTenantOrder {
                    order_id: format!("tenant-{}", n % TENANTS),
                    lines: LINES_PER_COMMAND,
                };
                (command, format!("m-{run}-{n}"))
            });
            seed(&cosmos, commands).await?;
            if cosmos
                .container("bench", "orders")
                .await?
                .read_feed_ranges(None)
                .await?
                .len()
                != 1
            {
                return Err("the merged container has more than one feed range".into());
            }
            Ok(cosmos)
        }
    }
}
