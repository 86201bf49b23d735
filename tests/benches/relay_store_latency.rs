//! Benchmark (not a test): how much store latency the relay hides. The drain rate of the same
//! backlog at 5 ms and 20 ms per store round trip, divided by the rate at 0 ms, in one run.
//! Targets: **>= 0.9 at 5 ms** and **>= 0.8 at 20 ms**.
//!
//! `cargo bench -p chatter-tests --features rabbitmq --bench relay_store_latency`
//!
//! Each round and each delay gets a fresh `chatter-emulator` server (served over HTTP by this
//! process), seeded with no delay: `BACKLOG` commands dispatched with the relay off, each writing
//! an order, an inbox marker and one pending Outbox Document, spread over the container's feed
//! ranges. Then the delay is set on every store request (the emulator's latency option) and a
//! runtime with the relay on at `RelayOptions::default()` drains the backlog to RabbitMQ
//! (127.0.0.1:5672, a queue of its own per run, deleted at the end), where a subscription of
//! this process counts the events. The drain rate is events over the time from the first event
//! to the last: start-up (the container check and the lease handshake, a fixed number of round
//! trips) is printed beside it, not in the rate. Delays alternate their order across rounds so
//! drift on a shared machine hits each alike; the medians are compared.
//! `CHATTER_BENCH_MAX_IN_FLIGHT=N` runs it with another `RelayOptions::max_in_flight`.

use std::sync::OnceLock;
use std::time::{Duration, Instant};

use chatter_runtime::RelayOptions;
use chatter_runtime::cosmos::CosmosConnection;
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

const BACKLOG: usize = 1_000;
const ROUNDS: usize = 3;
const DELAYS_MS: [u64; 3] = [0, 5, 20];
const WAIT: Duration = Duration::from_secs(300);

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let broker = rabbitmq::connect(Duration::from_secs(10)).await;
    let mut rates: Vec<Vec<f64>> = vec![Vec::new(); DELAYS_MS.len()];
    let mut starts: Vec<Vec<f64>> = vec![Vec::new(); DELAYS_MS.len()];
    for round in 0..ROUNDS {
        let mut order: Vec<usize> = (0..DELAYS_MS.len()).collect();
        order.rotate_left(round % DELAYS_MS.len());
        for at in order {
            let run = drain_once(&broker, Duration::from_millis(DELAYS_MS[at])).await?;
            println!(
                "round {round}: {:>2} ms store delay: {:.0} events/s (start-up {:.0} ms, {:.2} RU \
                 per relayed message)",
                DELAYS_MS[at], run.rate, run.start_ms, run.ru_per_message
            );
            rates[at].push(run.rate);
            starts[at].push(run.start_ms);
        }
    }
    rabbitmq::delete_queue(&broker, destination(), Duration::from_secs(10)).await;

    let median = |values: &[f64]| {
        let mut values = values.to_vec();
        values.sort_by(f64::total_cmp);
        values[values.len() / 2]
    };
    let base = median(&rates[0]);
    println!(
        "drain rate of {BACKLOG} outbox documents, medians of {ROUNDS} rounds (start-up not included):"
    );
    for (at, delay) in DELAYS_MS.iter().enumerate() {
        let target = match delay {
            0 => String::new(),
            5 => "; target >= 0.9".to_owned(),
            _ => "; target >= 0.8".to_owned(),
        };
        println!(
            "  {delay:>2} ms: {:.0} events/s, start-up {:.0} ms, ratio to 0 ms {:.3}{target}",
            median(&rates[at]),
            median(&starts[at]),
            median(&rates[at]) / base,
        );
    }
    Ok(())
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
    delay: Duration,
) -> Result<Run, BoxError> {
    let (emulator, cosmos) = emulator_server().await;
    // Ids of their own per run: a duplicate of an earlier run is never counted in this one.
    let run = uuid::Uuid::new_v4();
    seed_backlog(&cosmos, run).await?;
    let mut subscription = rabbitmq::subscribe(broker, destination(), WAIT).await;
    emulator.faults().set_latency(delay);

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
    while seen.len() < BACKLOG {
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
        rate: (BACKLOG - 1) as f64 / elapsed.as_secs_f64(),
        start_ms,
        ru_per_message: charges.per_relayed_message().unwrap_or_default(),
    })
}

/// `BACKLOG` commands dispatched with the relay off: as many pending Outbox Documents.
async fn seed_backlog(cosmos: &CosmosConnection, run: uuid::Uuid) -> Result<(), BoxError> {
    provisioned_with_leases(cosmos, "bench", "orders", &["/orderId"], "orders-leases").await;
    seed(
        cosmos,
        (0..BACKLOG).map(|n| (order(n), format!("m-{run}-{n}"))),
    )
    .await
}
