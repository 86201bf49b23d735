//! A command process of the fleet benchmark (`benches/publish_after_commit_fleet.rs`), which
//! runs three of them on one `chatter-emulator` store and the machine's RabbitMQ:
//! `cargo build -p chatter-tests --features rabbitmq --bin fleet_worker`.
//!
//! Registers `FleetOrder` (one order upserted, one `{message id}:placed` event carrying the
//! moment its command was dispatched), runs the relay with `RelayOptions::default()` (a 1 s
//! poll), and dispatches commands as told on stdin, one line a round:
//! `<round> <keys> <count> <per second> <start, ms since the epoch>`. Of the round's `count`
//! commands, numbered from 0, it dispatches those whose number is its index modulo the
//! number of workers, command `n` on key `order-{n % keys}`: each key's commands come from
//! every process. At `per second` across the fleet from the start (command `n` at
//! `n / per second`), or with `per second` 0 all at once, 16 at a time. Prints `started` once
//! the runtime runs and `dispatched <round> <failures> <ms from the start>` after each round; shuts down gracefully
//! when stdin closes.
//!
//! Environment: `CHATTER_COSMOS_ENDPOINT` (the store), `FLEET_DESTINATION` (the events'
//! queue), `FLEET_INDEX` and `FLEET_WORKERS`, `FLEET_AFTER_COMMIT` (`1`: publish after commit
//! on, else off).

use std::io::BufRead;
use std::process::ExitCode;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use chatter_runtime::broker::RabbitMqBroker;
use chatter_runtime::cosmos::CosmosConnection;
use chatter_runtime::relay::RelayOptions;
use chatter_runtime::{BoxError, DocumentReliable, HandlerContext, Runtime, handler};
use chatter_tests::process::env;
use chatter_tests::rabbitmq::URI;
use serde::{Deserialize, Serialize};
use serde_json::json;

/// One order of the fleet benchmark.
#[derive(Serialize, Deserialize, DocumentReliable)]
#[cosmos(database = "fleet", container = "orders", lease = "orders-leases")]
#[partition_key(path = "/orderId")]
#[serde(rename_all = "camelCase")]
pub struct FleetOrder {
    pub order_id: String,
    /// When it was dispatched, in microseconds since the epoch (every process of the benchmark
    /// runs on one machine, one clock).
    pub dispatched_at_micros: u64,
}

static DESTINATION: OnceLock<String> = OnceLock::new();

#[handler]
async fn fleet_order(command: FleetOrder, ctx: &mut HandlerContext) -> Result<(), BoxError> {
    ctx.upsert(json!({ "id": command.order_id, "orderId": command.order_id, "status": "placed" }))?;
    let destination = DESTINATION.get().ok_or("FLEET_DESTINATION is not set")?;
    ctx.send_json(
        &format!("{}:placed", ctx.message_id()),
        destination,
        &json!({ "orderId": command.order_id, "dispatchedAtMicros": command.dispatched_at_micros }),
    )?;
    Ok(())
}

fn now_micros() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |since| since.as_micros() as u64)
}

#[tokio::main]
async fn main() -> ExitCode {
    match run().await {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("fleet_worker: {error}");
            ExitCode::FAILURE
        }
    }
}

fn required<T: std::str::FromStr>(name: &str) -> Result<T, BoxError> {
    env(name)
        .ok_or_else(|| format!("{name} is not set"))?
        .parse()
        .map_err(|_| format!("{name} does not parse").into())
}

async fn run() -> Result<(), BoxError> {
    let endpoint: String = required("CHATTER_COSMOS_ENDPOINT")?;
    let _ = DESTINATION.set(required("FLEET_DESTINATION")?);
    let index: usize = required("FLEET_INDEX")?;
    let workers: usize = required("FLEET_WORKERS")?;
    let after_commit = env("FLEET_AFTER_COMMIT").as_deref() == Some("1");
    let runtime = Runtime::builder()
        .cosmos(CosmosConnection::connect(&endpoint, None).await?)
        .broker(RabbitMqBroker::connect_retrying(URI, Duration::from_secs(60)).await?)
        .consume(false)
        .relay_options(RelayOptions::default())
        .publish_after_commit(after_commit)
        .without_metrics()
        .without_tracing()
        .start()
        .await?;
    let runtime = Arc::new(runtime);
    println!("started");

    let (lines_tx, mut lines) = tokio::sync::mpsc::unbounded_channel();
    std::thread::spawn(move || {
        for line in std::io::stdin().lock().lines() {
            let Ok(line) = line else { break };
            if lines_tx.send(line).is_err() {
                break;
            }
        }
    });
    while let Some(line) = lines.recv().await {
        let fields: Vec<&str> = line.split_whitespace().collect();
        let [round, keys, count, per_second, start_ms] = fields[..] else {
            return Err(format!("not a round: `{line}`").into());
        };
        let (keys, count, per_second, start_ms): (usize, usize, u64, u64) = (
            keys.parse()?,
            count.parse()?,
            per_second.parse()?,
            start_ms.parse()?,
        );
        let mine: Vec<usize> = (index..count).step_by(workers).collect();
        let round: Arc<str> = Arc::from(round);
        let dispatch = {
            let runtime = Arc::clone(&runtime);
            let round = Arc::clone(&round);
            move |n: usize| {
                let runtime = Arc::clone(&runtime);
                let message_id = format!("{round}-{n}");
                async move {
                    let command = FleetOrder {
                        order_id: format!("order-{}", n % keys),
                        dispatched_at_micros: now_micros(),
                    };
                    runtime.dispatch(command, message_id).await.is_err()
                }
            }
        };
        let start = UNIX_EPOCH + Duration::from_millis(start_ms);
        let until_start = start.duration_since(SystemTime::now()).unwrap_or_default();
        tokio::time::sleep(until_start).await;
        let failures = if per_second == 0 {
            let queue = Arc::new(std::sync::Mutex::new(mine.into_iter()));
            let tasks: Vec<_> = (0..16)
                .map(|_| {
                    let queue = Arc::clone(&queue);
                    let dispatch = dispatch.clone();
                    tokio::spawn(async move {
                        let mut failures = 0;
                        loop {
                            let next = queue.lock().unwrap().next();
                            let Some(n) = next else { break failures };
                            failures += usize::from(dispatch(n).await);
                        }
                    })
                })
                .collect();
            let mut failures = 0;
            for task in tasks {
                failures += task.await?;
            }
            failures
        } else {
            let began = tokio::time::Instant::now();
            let tasks: Vec<_> = mine
                .into_iter()
                .map(|n| {
                    let at = began + Duration::from_micros(n as u64 * 1_000_000 / per_second);
                    let dispatch = dispatch.clone();
                    tokio::spawn(async move {
                        tokio::time::sleep_until(at).await;
                        dispatch(n).await
                    })
                })
                .collect();
            let mut failures = 0;
            for task in tasks {
                failures += usize::from(task.await?);
            }
            failures
        };
        let took = SystemTime::now().duration_since(start).unwrap_or_default();
        println!("dispatched {round} {failures} {}", took.as_millis());
    }
    let runtime = Arc::try_unwrap(runtime).map_err(|_| "a dispatch outlived its round")?;
    tokio::time::timeout(Duration::from_secs(30), runtime.shutdown())
        .await
        .map_err(|_| "the runtime did not shut down within 30 s")?;
    Ok(())
}
