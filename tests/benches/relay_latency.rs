//! Benchmark (not a test): write-to-publish latency of the relay at its default options, on the
//! in-memory emulator. Prints p50 / p99 / max, also as multiples of the poll interval (the
//! baseline: a quiet lease reads its feed range once per poll interval, so a document waits for
//! the next read, on average half an interval).
//!
//! `cargo bench -p chatter-tests --bench relay_latency`
//!
//! Commands are dispatched one at a time at a steady rate through a runtime whose relay is on
//! with `RelayOptions::default()`; each sample is the time from `dispatch` returning (the
//! document batch committed) to the event arriving on a subscription of its destination. The
//! period is not a divisor of the poll interval, so the samples land at every phase of the
//! pollers' cycles.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use chatter_runtime::broker::{Broker, InMemoryBroker};
use chatter_runtime::cosmos::CosmosConnection;
use chatter_runtime::relay::RelayOptions;
use chatter_runtime::{BoxError, DocumentReliable, HandlerContext, Runtime, handler};
use chatter_tests::store::provisioned_with_leases;
use serde::{Deserialize, Serialize};
use serde_json::json;

include!("../src/relay_commands/bench_place_order.rs");

/// The events' queue.
fn destination() -> &'static str {
    "order-events"
}

/// Dispatched first and not counted.
const WARMUP: usize = 5;
const SAMPLES: usize = 100;
/// Not a divisor of the default 1 s poll interval.
const PERIOD: Duration = Duration::from_millis(237);
/// The .NET change-feed processor's default poll delay.
const DOTNET_POLL_INTERVAL: Duration = Duration::from_secs(5);

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), BoxError> {
    let options = RelayOptions::default();
    // RelayOptions keeps the change-feed processor's default poll interval.
    let poll = cosmos_change_feed::ChangeFeedProcessorOptions::default().poll_interval;
    let cosmos = CosmosConnection::embedded().await?;
    let ranges =
        provisioned_with_leases(&cosmos, "bench", "orders", &["/orderId"], "orders-leases")
            .await
            .read_feed_ranges(None)
            .await?
            .len();

    let broker = InMemoryBroker::new();
    let mut subscription = broker.subscribe(destination()).await?;
    let (arrivals_tx, mut arrivals) = tokio::sync::mpsc::unbounded_channel();
    let receiver = tokio::spawn(async move {
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
        .broker(broker.clone())
        .consume(false)
        .relay_options(options)
        .start()
        .await?;
    // Every lease is polled before the first sample.
    chatter_tests::relay::owning(&runtime, ranges).await;

    let mut sent: HashMap<String, (usize, Instant)> = HashMap::new();
    let mut ticks = tokio::time::interval(PERIOD);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    for n in 0..WARMUP + SAMPLES {
        ticks.tick().await;
        let message_id = format!("m-{n}");
        runtime.dispatch(order(n), message_id.clone()).await?;
        sent.insert(format!("{message_id}:created"), (n, Instant::now()));
    }

    let mut latencies = Vec::with_capacity(SAMPLES);
    let deadline = tokio::time::Instant::now() + poll * 5 + Duration::from_secs(10);
    for received in 0..WARMUP + SAMPLES {
        let (id, at) = tokio::time::timeout_at(deadline, arrivals.recv())
            .await
            .map_err(|_| format!("only {received} events arrived"))?
            .ok_or("the subscription ended")?;
        let Some(&(n, dispatched)) = sent.get(&id) else {
            return Err(format!("unexpected event `{id}`").into());
        };
        if n >= WARMUP {
            latencies.push(at.saturating_duration_since(dispatched));
        }
    }
    runtime.shutdown().await;
    receiver.abort();
    if broker.published_count(destination()) != WARMUP + SAMPLES {
        return Err("an event was published more than once".into());
    }

    latencies.sort();
    let quantile = |q: f64| {
        let rank = (latencies.len() as f64 * q).ceil() as usize;
        latencies[rank.clamp(1, latencies.len()) - 1]
    };
    let (p50, p99) = (quantile(0.50), quantile(0.99));
    let (min, max) = (latencies[0], latencies[latencies.len() - 1]);
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    let of = |d: Duration, interval: Duration| d.as_secs_f64() / interval.as_secs_f64();
    println!(
        "write-to-publish latency, {SAMPLES} samples, one dispatch every {} ms, {ranges} feed \
         ranges, poll interval {} ms (RelayOptions::default()):",
        PERIOD.as_millis(),
        poll.as_millis()
    );
    println!(
        "p50 {:.1} ms ({:.2}x poll), p99 {:.1} ms ({:.2}x poll), max {:.1} ms ({:.2}x poll), \
         min {:.1} ms",
        ms(p50),
        of(p50, poll),
        ms(p99),
        of(p99, poll),
        ms(max),
        of(max, poll),
        ms(min)
    );
    // A quiet processor's latency is the wait for the next poll: the same multiples of the .NET
    // default give what it would show.
    println!(
        "at the .NET processor's default poll delay ({} ms) the same multiples would be p50 \
         ~{:.0} ms, p99 ~{:.0} ms: {:.1}x what the default here gives",
        DOTNET_POLL_INTERVAL.as_millis(),
        ms(DOTNET_POLL_INTERVAL) * of(p50, poll),
        ms(DOTNET_POLL_INTERVAL) * of(p99, poll),
        of(DOTNET_POLL_INTERVAL, poll),
    );
    Ok(())
}
