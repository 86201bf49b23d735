//! Benchmark (not a test): the document tier's cost per command against a hand-written SDK
//! TransactionalBatch with the same three operations (inbox marker, order upsert, outbox create)
//! on the same in-process emulator (`CosmosConnection::embedded()`), in one run. Prints two
//! ratios pipeline/hand-written, each beside its target of at most 1.05x:
//!
//! - **instructions per command** (valgrind's callgrind), the figure that decides: instruction
//!   counts repeat from run to run (the setup-only totals of two runs differed by less than 0.01 %)
//!   where wall time on a shared machine does not;
//! - **wall-clock time per command** (alternating rounds), for reference.
//!
//! `cargo bench -p chatter-tests --bench pipeline_vs_sdk_batch` (two to three minutes, most of
//! it under valgrind; without valgrind on the `PATH` only the wall-clock ratio is printed).
//!
//! # How the instructions are counted
//!
//! The binary has three measuring modes, `setup <n>`, `pipeline <n>` and `sdk <n>`; its default
//! mode (what `cargo bench` runs) is the driver, which runs itself once per mode under
//! `valgrind --tool=callgrind --callgrind-out-file=<target>/tmp/pipeline_vs_sdk_batch/<mode>.callgrind`
//! and reads the `totals:` line (every instruction of every thread, from exec to exit) of each
//! output file. Every mode does the same setup: the Tokio runtime, the embedded store, the
//! container, a started chatter `Runtime` (relay off, no consumers) and [`WARM_UP`] commands of
//! *each* side, so one-time costs (lazy statics, the first container lookup, first allocations)
//! are paid before anything is measured. Then `pipeline` runs [`CALLGRIND_COMMANDS`] commands
//! through `Runtime::dispatch`, `sdk` the same number of hand-written batches, and `setup` none;
//! all three shut down alike. So
//!
//! ```text
//! per command (side) = (totals(side) - totals(setup)) / CALLGRIND_COMMANDS
//! ```
//!
//! counts everything one command costs on that side, the emulator's work included (nearly all
//! of it), and nothing else. Counting whole processes rather than one function
//! (`--toggle-collect`) is deliberate: a command's work runs in futures polled by the runtime,
//! not under one stack frame a function pattern could select, and the difference cancels the
//! setup exactly because it is the same code with the same inputs in every mode. Both sides
//! write the same documents into containers of the same size at the same moment (the `p`/`b`
//! ids have equal lengths), so the emulator's cost, which grows with the container, is the same
//! on both.
//!
//! The output files stay in place for `callgrind_annotate --inclusive=yes <file> | head -60`;
//! the difference between the `pipeline` and `sdk` profiles (exclusive costs, function by
//! function) is where the pipeline spends its extra instructions.
//!
//! # Backtraces are off in the children
//!
//! Every child runs with `RUST_LIB_BACKTRACE=0`. The SDK and its emulator build and drop about
//! twenty `azure_core` errors per command on the success path, each calling
//! `std::backtrace::Backtrace::capture`; with `RUST_BACKTRACE=1` in the environment (as on this
//! project's machines) each capture unwinds the whole stack, which was more than half of all
//! instructions, and costs more under the pipeline's deeper futures than under the hand-written
//! loop (1.04x instead of 1.00x, all of it in the unwinder). That measures the environment, not
//! the pipeline. `RUST_LIB_BACKTRACE=0` turns `Backtrace::capture` off and leaves panic
//! backtraces as `RUST_BACKTRACE` says.
//!
//! # Wall clock
//!
//! A child runs rounds that alternate the two sides so drift on a shared machine hits both
//! alike; round 0 warms up and is not counted. Every command, on both sides and in both
//! measurements, gets its own partition because the emulator's batch cost grows with partition
//! size.

use std::path::Path;
use std::time::{Duration, Instant};

use azure_data_cosmos::TransactionalBatch;
use chatter_runtime::BrokeredMessage;
use chatter_runtime::broker::InMemoryBroker;
use chatter_runtime::cosmos::{self, ContainerClient, CosmosConnection};
use chatter_runtime::provision;
use chatter_runtime::{BoxError, DocumentReliable, HandlerContext, Runtime, handler};
use chatter_tests::callgrind::{self, Invocation};
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

/// Wall clock: counted rounds (plus one warm-up round) of `PER_ROUND` commands per side.
const ROUNDS: usize = 7;
const PER_ROUND: usize = 300;
/// Callgrind: commands of each side every mode runs before measuring.
const WARM_UP: usize = 25;
/// Callgrind: commands measured per side (valgrind runs the process some 50x slower).
const CALLGRIND_COMMANDS: usize = 200;
/// The targets, pipeline/hand-written.
const INSTRUCTION_TARGET: f64 = 1.05;

/// What one child process of the driver runs after the common setup.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Mode {
    Setup,
    Pipeline,
    Sdk,
}

impl callgrind::Mode for Mode {
    const ALL: [Self; 3] = [Self::Setup, Self::Pipeline, Self::Sdk];

    fn name(self) -> &'static str {
        match self {
            Self::Setup => "setup",
            Self::Pipeline => "pipeline",
            Self::Sdk => "sdk",
        }
    }
}

fn main() -> Result<(), BoxError> {
    let tokio = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    match callgrind::invocation(CALLGRIND_COMMANDS)? {
        Invocation::WallClock => {
            let wall = tokio.block_on(wall_clock())?;
            report_wall_clock(&wall);
            Ok(())
        }
        Invocation::Measure(mode, commands) => tokio.block_on(measured(mode, commands)),
        // The driver: every measurement in a child process of this binary.
        Invocation::Driver => {
            let exe = std::env::current_exe()?;
            report_instructions(count_instructions(&exe)?);
            callgrind::wall_clock_child(&exe)
        }
    }
}

/// The store, the started runtime and the container both sides write to.
struct Bench {
    runtime: Runtime,
    container: std::sync::Arc<ContainerClient>,
}

async fn setup() -> Result<Bench, BoxError> {
    let cosmos = CosmosConnection::embedded().await?;
    provision::ensure_container(&cosmos, "bench", "orders", &["/orderId"]).await?;
    let runtime = chatter_tests::runtime::writer(&cosmos, InMemoryBroker::new()).await;
    let container = cosmos.container("bench", "orders").await?;
    Ok(Bench { runtime, container })
}

/// One child of the driver: the common setup and warm-up, then `commands` of `mode`'s side.
async fn measured(mode: Mode, commands: usize) -> Result<(), BoxError> {
    let bench = setup().await?;
    let mut warm = 0;
    for _ in 0..WARM_UP {
        pipeline_command(&bench.runtime, "w", &mut warm).await?;
        sdk_command(&bench.container, "w", &mut warm).await?;
    }
    let mut next = 0;
    for _ in 0..commands {
        match mode {
            Mode::Setup => break,
            Mode::Pipeline => pipeline_command(&bench.runtime, "m", &mut next).await?,
            Mode::Sdk => sdk_command(&bench.container, "m", &mut next).await?,
        }
    }
    bench.runtime.shutdown().await;
    Ok(())
}

/// Instructions per command of each side, or why they could not be counted.
struct Instructions {
    pipeline: f64,
    sdk: f64,
    setup: u64,
}

fn count_instructions(exe: &Path) -> Result<Result<Instructions, String>, BoxError> {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("pipeline_vs_sdk_batch");
    let profiles = match callgrind::profile_modes::<Mode>(exe, &dir, CALLGRIND_COMMANDS)? {
        Ok(profiles) => profiles,
        Err(why) => return Ok(Err(why)),
    };
    let [(setup, _), (pipeline, _), (sdk, _)] = profiles[..] else {
        unreachable!("three modes")
    };
    let per = |total: u64| (total as f64 - setup as f64) / CALLGRIND_COMMANDS as f64;
    Ok(Ok(Instructions {
        pipeline: per(pipeline),
        sdk: per(sdk),
        setup,
    }))
}

/// Microseconds per command of each side, one entry per counted round.
struct WallClock {
    pipeline: Vec<f64>,
    sdk: Vec<f64>,
}

async fn wall_clock() -> Result<WallClock, BoxError> {
    let bench = setup().await?;
    let mut pipeline = Vec::new();
    let mut sdk = Vec::new();
    let mut next = 0usize;
    for round in 0..=ROUNDS {
        // Alternate which side runs first: the container grows during a round.
        let (p, b) = if round % 2 == 0 {
            let p = pipeline_round(&bench.runtime, &mut next).await?;
            (p, sdk_round(&bench.container, &mut next).await?)
        } else {
            let b = sdk_round(&bench.container, &mut next).await?;
            (pipeline_round(&bench.runtime, &mut next).await?, b)
        };
        // Round 0 warms both paths up and is not counted.
        if round > 0 {
            let per = |d: Duration| d.as_secs_f64() * 1e6 / PER_ROUND as f64;
            pipeline.push(per(p));
            sdk.push(per(b));
        }
    }
    bench.runtime.shutdown().await;
    Ok(WallClock { pipeline, sdk })
}

fn report_instructions(instructions: Result<Instructions, String>) {
    match instructions {
        Ok(i) => {
            let ratio = i.pipeline / i.sdk;
            println!(
                "instructions per command: pipeline {:.0}, hand-written SDK batch {:.0} \
                 (callgrind, {CALLGRIND_COMMANDS} commands per side after {WARM_UP} warm-up \
                 commands of each; setup alone {} instructions)",
                i.pipeline, i.sdk, i.setup
            );
            println!(
                "ratio pipeline/baseline (instructions): {ratio:.3}x; target <= {INSTRUCTION_TARGET:.2}x ({})",
                if ratio <= INSTRUCTION_TARGET {
                    "met"
                } else {
                    "NOT met"
                }
            );
        }
        Err(why) => println!("instructions per command: not counted ({why})"),
    }
}

fn report_wall_clock(wall: &WallClock) {
    let median = |values: &[f64]| {
        let mut values = values.to_vec();
        values.sort_by(f64::total_cmp);
        values[values.len() / 2]
    };
    let mut ratios: Vec<f64> = wall
        .pipeline
        .iter()
        .zip(&wall.sdk)
        .map(|(p, b)| p / b)
        .collect();
    ratios.sort_by(f64::total_cmp);
    println!(
        "wall clock per command: pipeline {:.1} us, hand-written SDK batch {:.1} us (medians of \
         {ROUNDS} rounds x {PER_ROUND})",
        median(&wall.pipeline),
        median(&wall.sdk)
    );
    println!(
        "ratio pipeline/baseline (wall clock): median {:.3}x (min {:.3}x, max {:.3}x); target \
         <= {INSTRUCTION_TARGET:.2}x, noisy on a shared machine: the instruction ratio decides",
        median(&ratios),
        ratios[0],
        ratios[ratios.len() - 1]
    );
}

async fn pipeline_round(runtime: &Runtime, next: &mut usize) -> Result<Duration, BoxError> {
    let start = Instant::now();
    for _ in 0..PER_ROUND {
        pipeline_command(runtime, "r", next).await?;
    }
    Ok(start.elapsed())
}

async fn sdk_round(container: &ContainerClient, next: &mut usize) -> Result<Duration, BoxError> {
    let start = Instant::now();
    for _ in 0..PER_ROUND {
        sdk_command(container, "r", next).await?;
    }
    Ok(start.elapsed())
}

/// One command through chatter: order `p{prefix}-{n}`, message `pm{prefix}-{n}`.
async fn pipeline_command(
    runtime: &Runtime,
    prefix: &str,
    next: &mut usize,
) -> Result<(), BoxError> {
    *next += 1;
    runtime
        .dispatch(
            PlaceOrder {
                order_id: format!("p{prefix}-{next}"),
                quantity: 1,
            },
            format!("pm{prefix}-{next}"),
        )
        .await?;
    Ok(())
}

/// The same command as a careful hand-written port would send it: order `b{prefix}-{n}`,
/// message `bm{prefix}-{n}`, the same three documents in one batch.
async fn sdk_command(
    container: &ContainerClient,
    prefix: &str,
    next: &mut usize,
) -> Result<(), BoxError> {
    *next += 1;
    let order_id = format!("b{prefix}-{next}");
    let message_id = format!("bm{prefix}-{next}");
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
    Ok(())
}
