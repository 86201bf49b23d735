//! Benchmark (not a test): publish after commit against the relay alone, in one run.
//!
//! `cargo bench -p chatter-tests --bench publish_after_commit` (the in-memory broker), and with
//! `--features rabbitmq` the machine's RabbitMQ too.
//!
//! - **Write-to-publish latency**: commands dispatched one at a time, every 237 ms (not a
//!   divisor of the poll interval, so the relay alone is sampled at every phase of its poll),
//!   through a runtime with the relay at `RelayOptions::default()` (1 s poll); each sample is
//!   from `dispatch` being called to the event arriving on a subscription. Printed: p50 and p99
//!   with publish after commit off (the relay alone) and on, and the ratio of the p50s. Targets:
//!   p50 at least 20 times lower with it on, p99 under 100 ms.
//! - **Commands per second**: 400 commands of distinct keys dispatched by 16 tasks at once,
//!   from the first dispatch to the last event's arrival, with it on over with it off (three
//!   rounds alternating which side runs first; the median ratio). Target: at least 0.9.
//!
//! Each side gets a fresh embedded store (the SDK's in-memory emulator in this process), so one
//! side's documents do not weigh on the other's.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use chatter_runtime::broker::{Broker, InMemoryBroker};
use chatter_runtime::cosmos::CosmosConnection;
use chatter_runtime::relay::RelayOptions;
use chatter_runtime::{BoxError, DocumentReliable, HandlerContext, Runtime, handler};
use chatter_tests::store::provisioned_with_leases;
use serde::{Deserialize, Serialize};
use serde_json::json;

include!("../src/relay_commands/bench_place_order.rs");

/// The events' queue: unique to this run and side (other runs share the machine's RabbitMQ,
/// and a side's subscription must not take another side's events).
fn destination() -> &'static str {
    *DESTINATION.lock().unwrap()
}

static DESTINATION: Mutex<&'static str> = Mutex::new("after-commit-bench");

/// Gives the next side a queue of its own.
fn next_destination() {
    static SIDES: AtomicUsize = AtomicUsize::new(0);
    let side = SIDES.fetch_add(1, Ordering::Relaxed);
    let name = format!("after-commit-bench-{}-{side}", std::process::id());
    *DESTINATION.lock().unwrap() = Box::leak(name.into_boxed_str());
}

const WARMUP: usize = 5;
const SAMPLES: usize = 60;
const PERIOD: Duration = Duration::from_millis(237);
const THROUGHPUT_COMMANDS: usize = 400;
const DISPATCHERS: usize = 16;
const ROUNDS: usize = 3;

/// Which broker a side publishes to.
#[derive(Clone, Copy, Debug)]
enum Kind {
    InMemory,
    #[cfg(feature = "rabbitmq")]
    RabbitMq,
}

/// A runtime on a fresh embedded store, with publish after commit `on`, and the arrivals of
/// the events (message id, when) on `kind`'s broker.
async fn side(
    kind: Kind,
    on: bool,
) -> Result<
    (
        Runtime,
        tokio::sync::mpsc::UnboundedReceiver<(String, Instant)>,
    ),
    BoxError,
> {
    let cosmos = CosmosConnection::embedded().await?;
    let ranges =
        provisioned_with_leases(&cosmos, "bench", "orders", &["/orderId"], "orders-leases")
            .await
            .read_feed_ranges(None)
            .await?
            .len();
    let broker: Arc<dyn Broker> = match kind {
        Kind::InMemory => Arc::new(InMemoryBroker::new()),
        #[cfg(feature = "rabbitmq")]
        Kind::RabbitMq => Arc::new(chatter_tests::rabbitmq::connect(Duration::from_secs(30)).await),
    };
    next_destination();
    let mut subscription = broker.subscribe(destination()).await?;
    let (arrivals_tx, arrivals) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        while let Some(Ok(delivery)) = subscription.next().await {
            let at = Instant::now();
            let id = delivery.message.message_id.clone();
            if delivery.ack().await.is_err() || arrivals_tx.send((id, at)).is_err() {
                break;
            }
        }
    });
    let runtime = Runtime::builder()
        .cosmos(cosmos)
        .broker(broker)
        .consume(false)
        .relay_options(RelayOptions::default())
        .publish_after_commit(on)
        .without_metrics()
        .without_tracing()
        .start()
        .await?;
    // Every lease is owned (and so polled) before the first sample.
    chatter_tests::relay::owning(&runtime, ranges).await;
    Ok((runtime, arrivals))
}

/// Waits for the events of `sent` (by event id: the moment its dispatch was called); the
/// latencies of those past the warm-up.
async fn arrivals(
    arrivals: &mut tokio::sync::mpsc::UnboundedReceiver<(String, Instant)>,
    sent: &HashMap<String, (usize, Instant)>,
    warmup: usize,
) -> Result<Vec<Duration>, BoxError> {
    let mut latencies = Vec::new();
    let mut seen = std::collections::HashSet::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while seen.len() < sent.len() {
        let (id, at) = tokio::time::timeout_at(deadline, arrivals.recv())
            .await
            .map_err(|_| format!("only {} of {} events arrived", seen.len(), sent.len()))?
            .ok_or("the subscription ended")?;
        let Some(&(n, dispatched)) = sent.get(&id) else {
            return Err(format!("unexpected event `{id}`").into());
        };
        // A duplicate (the relay of another process) would count once, at its first arrival.
        if seen.insert(id) && n >= warmup {
            latencies.push(at.saturating_duration_since(dispatched));
        }
    }
    Ok(latencies)
}

async fn latency(kind: Kind, on: bool) -> Result<(Duration, Duration), BoxError> {
    let (runtime, mut events) = side(kind, on).await?;
    let mut sent = HashMap::new();
    let mut ticks = tokio::time::interval(PERIOD);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    for n in 0..WARMUP + SAMPLES {
        ticks.tick().await;
        let message_id = format!("m-{n}");
        let called = Instant::now();
        runtime.dispatch(order(n), message_id.clone()).await?;
        sent.insert(format!("{message_id}:created"), (n, called));
    }
    let mut latencies = arrivals(&mut events, &sent, WARMUP).await?;
    runtime.shutdown().await;
    latencies.sort();
    let quantile = |q: f64| {
        let rank = (latencies.len() as f64 * q).ceil() as usize;
        latencies[rank.clamp(1, latencies.len()) - 1]
    };
    Ok((quantile(0.50), quantile(0.99)))
}

/// Commands per second, from the first dispatch to the last event's arrival.
async fn throughput(kind: Kind, on: bool) -> Result<f64, BoxError> {
    let (runtime, mut events) = side(kind, on).await?;
    let started = Instant::now();
    let next = Arc::new(AtomicUsize::new(0));
    let mut dispatchers = Vec::new();
    for _ in 0..DISPATCHERS {
        let runtime = runtime.clone();
        let next = Arc::clone(&next);
        dispatchers.push(tokio::spawn(async move {
            loop {
                let n = next.fetch_add(1, Ordering::Relaxed);
                if n >= THROUGHPUT_COMMANDS {
                    return Ok::<_, BoxError>(());
                }
                runtime.dispatch(order(n), format!("t-{n}")).await?;
            }
        }));
    }
    for dispatcher in dispatchers {
        dispatcher.await??;
    }
    let sent: HashMap<String, (usize, Instant)> = (0..THROUGHPUT_COMMANDS)
        .map(|n| (format!("t-{n}:created"), (n, started)))
        .collect();
    let latencies = arrivals(&mut events, &sent, 0).await?;
    let last = latencies.iter().max().copied().unwrap_or_default();
    runtime.relay_idle(Duration::from_secs(60)).await?;
    let charges = runtime.request_charges();
    println!(
        "{kind:?}, publish after commit {}: {:.2} RU per command (batch, and with it on the \
         pending check), {:.2} RU per relayed message (stamps and change-feed reads)",
        if on { "on" } else { "off" },
        charges.per_command().unwrap_or_default(),
        charges.per_relayed_message().unwrap_or_default(),
    );
    runtime.shutdown().await;
    Ok(THROUGHPUT_COMMANDS as f64 / last.as_secs_f64())
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

async fn compare(kind: Kind) -> Result<(), BoxError> {
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    let (off_p50, off_p99) = latency(kind, false).await?;
    let (on_p50, on_p99) = latency(kind, true).await?;
    println!(
        "{kind:?}: write-to-publish, {SAMPLES} samples, one dispatch every {} ms: relay alone \
         (1 s poll) p50 {:.1} ms p99 {:.1} ms; publish after commit p50 {:.2} ms p99 {:.2} ms; \
         p50 ratio {:.0}x (target >= 20x), p99 {} 100 ms",
        PERIOD.as_millis(),
        ms(off_p50),
        ms(off_p99),
        ms(on_p50),
        ms(on_p99),
        off_p50.as_secs_f64() / on_p50.as_secs_f64(),
        if on_p99 < Duration::from_millis(100) {
            "under"
        } else {
            "NOT under"
        },
    );
    let mut ratios = Vec::new();
    for round in 0..ROUNDS {
        let (on, off) = if round % 2 == 0 {
            let on = throughput(kind, true).await?;
            (on, throughput(kind, false).await?)
        } else {
            let off = throughput(kind, false).await?;
            (throughput(kind, true).await?, off)
        };
        println!(
            "{kind:?}: round {round}: {THROUGHPUT_COMMANDS} commands by {DISPATCHERS} tasks, \
             first dispatch to last event: on {on:.0}/s, off {off:.0}/s, ratio {:.3}",
            on / off
        );
        ratios.push(on / off);
    }
    println!(
        "{kind:?}: commands per second, on over off: median {:.3} (target >= 0.9)",
        median(ratios)
    );
    Ok(())
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), BoxError> {
    compare(Kind::InMemory).await?;
    #[cfg(feature = "rabbitmq")]
    compare(Kind::RabbitMq).await?;
    Ok(())
}
