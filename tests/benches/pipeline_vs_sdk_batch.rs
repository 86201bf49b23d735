//! Benchmark (not a test): the document tier's cost per command against a hand-written SDK
//! TransactionalBatch with the same three operations (inbox marker, order upsert, outbox create)
//! on the same in-memory emulator, in one run. Prints the ratio; the target is at most 1.15x.
//!
//! `cargo bench -p chatter-tests --bench pipeline_vs_sdk_batch`
//!
//! Rounds alternate the two sides so drift on a shared machine hits both alike; each command gets
//! its own partition because the emulator's batch cost grows with partition size.

use std::time::{Duration, Instant};

use azure_data_cosmos::TransactionalBatch;
use chatter_runtime::BrokeredMessage;
use chatter_runtime::cosmos::{self, ContainerClient, CosmosConnection, provision};
use chatter_runtime::{BoxError, DocumentReliable, HandlerContext, Runtime, handler};
use serde::{Deserialize, Serialize};
use serde_json::json;

/// The benchmarked command.
#[derive(Serialize, Deserialize, DocumentReliable)]
#[cosmos(database = "bench", container = "orders", lease = "orders-leases")]
#[partition_key(path = "/orderId")]
#[serde(rename_all = "camelCase")]
pub struct PlaceOrder {
    pub order_id: String,
    pub quantity: u32,
}

#[handler]
async fn place_order(command: PlaceOrder, ctx: &mut HandlerContext) -> Result<(), BoxError> {
    ctx.upsert(json!({ "id": command.order_id, "orderId": command.order_id, "quantity": command.quantity }))?;
    let event = BrokeredMessage::json(
        format!("{}:created", ctx.message_id()),
        "order-events",
        json!({ "orderId": command.order_id }).to_string(),
    );
    ctx.send(event)?;
    Ok(())
}

const ROUNDS: usize = 7;
const PER_ROUND: usize = 300;

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), BoxError> {
    let cosmos = CosmosConnection::embedded().await?;
    provision::ensure_container(&cosmos, "bench", "orders", &["/orderId"]).await?;
    let runtime = Runtime::builder()
        .cosmos(cosmos.clone())
        .consume(false)
        .without_relay()
        .start()
        .await?;
    let container = cosmos.container("bench", "orders").await?;

    let mut pipeline = Vec::new();
    let mut baseline = Vec::new();
    let mut next = 0usize;
    for round in 0..=ROUNDS {
        // Alternate which side runs first: the container grows during a round.
        let (p, b) = if round % 2 == 0 {
            let p = run_pipeline(&runtime, &mut next).await?;
            (p, run_baseline(&container, &mut next).await?)
        } else {
            let b = run_baseline(&container, &mut next).await?;
            (run_pipeline(&runtime, &mut next).await?, b)
        };
        // Round 0 warms both paths up and is not counted.
        if round > 0 {
            pipeline.push(p);
            baseline.push(b);
        }
    }
    runtime.shutdown().await;

    let per = |d: Duration| d.as_secs_f64() * 1e6 / PER_ROUND as f64;
    let mut ratios: Vec<f64> = pipeline
        .iter()
        .zip(&baseline)
        .map(|(p, b)| per(*p) / per(*b))
        .collect();
    ratios.sort_by(f64::total_cmp);
    let median = ratios[ratios.len() / 2];
    let mut p_us: Vec<f64> = pipeline.iter().map(|d| per(*d)).collect();
    let mut b_us: Vec<f64> = baseline.iter().map(|d| per(*d)).collect();
    p_us.sort_by(f64::total_cmp);
    b_us.sort_by(f64::total_cmp);
    println!(
        "pipeline {:.1} us/command, hand-written SDK batch {:.1} us/command (medians of {ROUNDS} rounds x {PER_ROUND})",
        p_us[ROUNDS / 2],
        b_us[ROUNDS / 2]
    );
    println!(
        "ratio pipeline/baseline: median {median:.3}x (min {:.3}x, max {:.3}x); target <= 1.15x",
        ratios[0],
        ratios[ROUNDS - 1]
    );
    Ok(())
}

async fn run_pipeline(runtime: &Runtime, next: &mut usize) -> Result<Duration, BoxError> {
    let start = Instant::now();
    for _ in 0..PER_ROUND {
        *next += 1;
        let order_id = format!("p-{next}");
        runtime
            .dispatch(
                PlaceOrder {
                    order_id,
                    quantity: 1,
                },
                format!("pm-{next}"),
            )
            .await?;
    }
    Ok(start.elapsed())
}

async fn run_baseline(container: &ContainerClient, next: &mut usize) -> Result<Duration, BoxError> {
    let start = Instant::now();
    for _ in 0..PER_ROUND {
        *next += 1;
        let order_id = format!("b-{next}");
        let message_id = format!("bm-{next}");
        // What a careful hand-written port would send: the same three documents.
        let marker = json!({
            "id": chatter_runtime::cosmos::inbox_id(&message_id)?,
            "_chatterType": "inbox",
            "MessageId": message_id,
            "ReceivedAtUtc": "2026-11-30T00:00:00Z",
            "orderId": order_id,
        });
        let event_id = format!("{message_id}:created");
        let outbox = json!({
            "id": chatter_runtime::cosmos::outbox_id(&event_id)?,
            "_chatterType": "outbox",
            "status": "pending",
            "MessageId": event_id,
            "Destination": "order-events",
            "MessageBody": json!({ "orderId": order_id }).to_string(),
            "MessageContentType": "application/json",
            "MessageContext": "{}",
            "orderId": order_id,
        });
        let order = json!({ "id": order_id, "orderId": order_id, "quantity": 1 });
        let batch = TransactionalBatch::new(cosmos::partition_key(&[json!(order_id)])?)
            .create_item(marker)?
            .upsert_item(order, None)?
            .create_item(outbox)?;
        let response = container.execute_transactional_batch(batch, None).await?;
        let results = response.into_model()?;
        if results.results().iter().any(|r| r.status_code() >= 300) {
            return Err("baseline batch failed".into());
        }
    }
    Ok(start.elapsed())
}
