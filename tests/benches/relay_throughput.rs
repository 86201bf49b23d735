//! Benchmark (not a test): the relay's throughput (Outbox Documents published and stamped per
//! second) against a hand-written change-feed loop on the same in-memory emulator, in one run.
//! Prints both rates and the ratio relay/hand-written; the target is at least 0.95x.
//!
//! `cargo bench -p chatter-tests --bench relay_throughput`
//!
//! Each side of each round gets a fresh store seeded with the same documents: `PER_ROUND`
//! commands dispatched with the relay off, each writing an order, an inbox marker and one pending
//! Outbox Document (so the change feed holds three documents per message, two of them for the
//! gate to skip). The clock runs from the start of the drain to the last stamp:
//!
//! - relay: `Runtime::builder().relay_options(RelayOptions::default()).start()` (contract check,
//!   leases, change-feed processor) until every message reached the broker, then `shutdown()`,
//!   which lets the page in flight finish its last stamp and checkpoint;
//! - hand-written: per feed range, one `query_change_feed` stream from the beginning (pages of
//!   100, like the relay), keep the pending outbox documents, publish each to the same kind of
//!   `InMemoryBroker`, then one server-side patch `[/status, /ttl]`; no leases, no checkpoints.
//!
//! `PER_ROUND` stays at 1 000 because the emulator's page reads and patches get slower as the
//! container grows (seeding 2 000 commands takes about four times as long as 1 000), which would
//! push the run past two minutes without telling more about the relay.
//!
//! Both sides run on one thread (a current-thread runtime), so the ratio is CPU per document.
//! Rounds alternate which side runs first so drift on a shared machine hits both alike. After
//! each side the store is read back (outside the clock): every Outbox Document must be delivered
//! with its ttl, and the broker must hold each message exactly once.

use std::cell::Cell;
use std::time::{Duration, Instant};

use azure_data_cosmos::feed::{FeedRange, FeedScope};
use azure_data_cosmos::models::{PatchInstructions, PatchOperation};
use azure_data_cosmos::options::{
    ChangeFeedOptions, ChangeFeedStartFrom, MaxItemCountHint, PatchItemOptions, PatchStrategy,
};
use chatter_runtime::BrokeredMessage;
use chatter_runtime::RelayOptions;
use chatter_runtime::broker::{Broker, InMemoryBroker};
use chatter_runtime::cosmos::{self, ContainerClient, CosmosConnection, provision};
use chatter_runtime::{BoxError, DocumentReliable, HandlerContext, Runtime, handler};
use futures::StreamExt;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value, json};

/// The seeding command: one order, one event.
#[derive(Serialize, Deserialize, DocumentReliable)]
#[cosmos(database = "bench", container = "orders", lease = "orders-leases")]
#[partition_key(path = "/orderId")]
#[serde(rename_all = "camelCase")]
pub struct PlaceOrder {
    pub order_id: String,
}

#[handler]
async fn place_order(command: PlaceOrder, ctx: &mut HandlerContext) -> Result<(), BoxError> {
    ctx.upsert(json!({ "id": command.order_id, "orderId": command.order_id, "status": "placed" }))?;
    ctx.send_json(
        &format!("{}:created", ctx.message_id()),
        DESTINATION,
        &json!({ "orderId": command.order_id }),
    )?;
    Ok(())
}

const DESTINATION: &str = "order-events";
const ROUNDS: usize = 7;
const PER_ROUND: usize = 1_000;
/// The relay's default page size, used by the hand-written loop too.
const PAGE: u32 = 100;
const DELIVERED_TTL: i64 = 86_400;

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), BoxError> {
    let mut relay = Vec::new();
    let mut baseline = Vec::new();
    let mut ranges = 0;
    for round in 0..=ROUNDS {
        let (r, b) = if round % 2 == 0 {
            let r = run_relay().await?;
            (r, run_baseline().await?)
        } else {
            let b = run_baseline().await?;
            (run_relay().await?, b)
        };
        ranges = b.1;
        // Round 0 warms both paths up and is not counted.
        if round > 0 {
            relay.push(r);
            baseline.push(b.0);
        }
    }

    let rate = |d: &Duration| PER_ROUND as f64 / d.as_secs_f64();
    let median = |mut values: Vec<f64>| {
        values.sort_by(f64::total_cmp);
        values[values.len() / 2]
    };
    let mut ratios: Vec<f64> = relay
        .iter()
        .zip(&baseline)
        .map(|(r, b)| rate(&r.total) / rate(b))
        .collect();
    ratios.sort_by(f64::total_cmp);
    let ms = |d: &Duration| d.as_secs_f64() * 1e3;
    println!(
        "relay {:.0} docs/s, hand-written loop {:.0} docs/s (medians of {ROUNDS} rounds x {PER_ROUND} \
         outbox documents, {ranges} feed ranges)",
        median(relay.iter().map(|r| rate(&r.total)).collect()),
        median(baseline.iter().map(rate).collect()),
    );
    println!(
        "relay time includes start() {:.1} ms and shutdown() {:.1} ms (medians)",
        median(relay.iter().map(|r| ms(&r.start)).collect()),
        median(relay.iter().map(|r| ms(&r.shutdown)).collect()),
    );
    println!(
        "ratio relay/hand-written: median {:.3}x (min {:.3}x, max {:.3}x); target >= 0.95x",
        ratios[ROUNDS / 2],
        ratios[0],
        ratios[ROUNDS - 1]
    );
    Ok(())
}

/// A fresh store holding `PER_ROUND` dispatched commands, none relayed yet.
async fn seeded_store() -> Result<(CosmosConnection, std::sync::Arc<ContainerClient>), BoxError> {
    let cosmos = CosmosConnection::embedded().await?;
    provision::ensure_container(&cosmos, "bench", "orders", &["/orderId"]).await?;
    provision::ensure_lease_container(&cosmos, "bench", "orders-leases").await?;
    let seeder = Runtime::builder()
        .cosmos(cosmos.clone())
        .consume(false)
        .without_relay()
        .start()
        .await?;
    for n in 0..PER_ROUND {
        seeder
            .dispatch(
                PlaceOrder {
                    order_id: format!("order-{n}"),
                },
                format!("m-{n}"),
            )
            .await?;
    }
    seeder.shutdown().await;
    let orders = cosmos.container("bench", "orders").await?;
    Ok((cosmos, orders))
}

/// One timed relay drain: the whole of it, and the parts spent in `start()` and `shutdown()`.
struct RelayRun {
    total: Duration,
    start: Duration,
    shutdown: Duration,
}

async fn run_relay() -> Result<RelayRun, BoxError> {
    let (cosmos, orders) = seeded_store().await?;
    let broker = InMemoryBroker::new();
    let start = Instant::now();
    let runtime = Runtime::builder()
        .cosmos(cosmos.clone())
        .broker(broker.clone())
        .consume(false)
        .relay_options(RelayOptions::default())
        .start()
        .await?;
    let started = start.elapsed();
    while broker.published_count(DESTINATION) < PER_ROUND {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    // Lets the page in flight stamp its last document and checkpoint.
    let stopping = Instant::now();
    runtime.shutdown().await;
    let run = RelayRun {
        total: start.elapsed(),
        start: started,
        shutdown: stopping.elapsed(),
    };
    verify("relay", &orders, &broker).await?;
    Ok(run)
}

/// Returns the elapsed time and the number of feed ranges drained.
async fn run_baseline() -> Result<(Duration, usize), BoxError> {
    let (_cosmos, orders) = seeded_store().await?;
    let broker = InMemoryBroker::new();
    let stamped = Cell::new(0usize);
    let start = Instant::now();
    let ranges = orders.read_feed_ranges(None).await?;
    let count = ranges.len();
    let drains = ranges
        .into_iter()
        .map(|range| drain_range(&orders, range, &broker, &stamped));
    for result in futures::future::join_all(drains).await {
        result?;
    }
    let elapsed = start.elapsed();
    verify("hand-written", &orders, &broker).await?;
    Ok((elapsed, count))
}

/// The hand-written relay of one feed range: read pages from the beginning until one comes back
/// empty (or every message is stamped), publish each pending outbox document, then stamp it.
async fn drain_range(
    orders: &ContainerClient,
    range: FeedRange,
    broker: &InMemoryBroker,
    stamped: &Cell<usize>,
) -> Result<(), BoxError> {
    let options =
        ChangeFeedOptions::default().with_max_item_count(MaxItemCountHint::Limit(PAGE.try_into()?));
    let mut pages = orders
        .query_change_feed::<Value>(
            FeedScope::range(range),
            ChangeFeedStartFrom::Beginning,
            Some(options),
        )
        .await?;
    while stamped.get() < PER_ROUND {
        let Some(page) = pages.next().await else {
            break;
        };
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
            broker.publish(message).await?;
            let patch = PatchInstructions::new()
                .with_operation(PatchOperation::set(
                    "/status".to_owned(),
                    json!("delivered"),
                ))
                .with_operation(PatchOperation::set("/ttl".to_owned(), json!(DELIVERED_TTL)));
            let options = PatchItemOptions::default().with_strategy(PatchStrategy::ServerSide);
            orders
                .patch_item(
                    cosmos::partition_key(&[json!(order_id)])?,
                    id,
                    patch,
                    Some(options),
                )
                .await?;
            stamped.set(stamped.get() + 1);
        }
    }
    Ok(())
}

/// Outside the clock: every Outbox Document is delivered with its ttl, and the broker holds each
/// message once.
async fn verify(
    side: &str,
    orders: &ContainerClient,
    broker: &InMemoryBroker,
) -> Result<(), BoxError> {
    let published = broker.published_count(DESTINATION);
    if published != PER_ROUND {
        return Err(format!("{side}: {published} messages published, expected {PER_ROUND}").into());
    }
    let mut delivered = 0;
    let mut outbox = 0;
    for range in orders.read_feed_ranges(None).await? {
        let mut pages = orders
            .query_change_feed::<Value>(
                FeedScope::range(range),
                ChangeFeedStartFrom::Beginning,
                None,
            )
            .await?;
        while let Some(page) = pages.next().await {
            let page = page?;
            if page.items().is_empty() {
                break;
            }
            for doc in page.items().iter().filter_map(|item| item.current()) {
                if doc["_chatterType"] == "outbox" {
                    outbox += 1;
                    if doc["status"] == "delivered" && doc["ttl"] == DELIVERED_TTL {
                        delivered += 1;
                    }
                }
            }
        }
    }
    if outbox != PER_ROUND || delivered != PER_ROUND {
        return Err(format!(
            "{side}: {delivered} of {outbox} outbox documents stamped delivered, expected {PER_ROUND}"
        )
        .into());
    }
    Ok(())
}
