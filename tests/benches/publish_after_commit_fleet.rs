//! Benchmark (not a test): publish after commit in a fleet of three processes against the relay
//! alone, in one run.
//!
//! `cargo bench -p chatter-tests --features rabbitmq --bench publish_after_commit_fleet` (a
//! release build; `--profile dev` for a debug one).
//!
//! Each side (publish after commit off, then on) gets a fresh `chatter-emulator` store served
//! by this process and three `fleet_worker` processes (`src/bin/fleet_worker.rs`) on it,
//! publishing through the machine's RabbitMQ to a queue of the side's own, with
//! `RelayOptions::default()` (a 1 s poll). The three share one relay processor (one account
//! endpoint): one of them relays. Each round's commands are dispatched by all three, a key's
//! commands by every process; each sample is from a command's dispatch to its event's arrival
//! here (one machine, one clock).
//!
//! - **spread**: 20 keys at 20 commands a second (300 commands). Targets: p50 at least 20x
//!   lower with it on, p99 under 50 ms.
//! - **hot**: 2 keys at 40 commands a second (400 commands): every key busy across processes.
//!   Target: p99 under 100 ms.
//! - **throughput**: 900 commands of 900 keys, all at once (16 at a time per process):
//!   commands per second, from the round's start to the last dispatch returning, the median of
//!   three rounds. Target: with it on at least 0.9 of off. (The time to the last event is
//!   printed beside it.)
//!
//! A duplicate (another process's relay read a document before its stamp) counts once, at its
//! first arrival; duplicates are counted and printed.

use std::collections::HashMap;
use std::process::{Command, Stdio};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use chatter_runtime::BoxError;
use chatter_runtime::broker::Broker;
use chatter_tests::process::ChildProcess;
use chatter_tests::store::{emulator_server, provisioned_with_leases};
use serde_json::Value;

const WORKERS: usize = 3;

/// One round: its name, keys, commands, commands per second (0: all at once).
struct Round {
    name: &'static str,
    keys: usize,
    count: usize,
    per_second: u64,
}

/// Commands of a throughput round (three rounds a side; the median counts).
const THROUGHPUT: usize = 900;

const ROUNDS: [Round; 6] = [
    // Leases owned, connections warm.
    Round {
        name: "warmup",
        keys: 10,
        count: 40,
        per_second: 20,
    },
    Round {
        name: "spread",
        keys: 20,
        count: 300,
        per_second: 20,
    },
    Round {
        name: "hot",
        keys: 2,
        count: 400,
        per_second: 40,
    },
    Round {
        name: "throughput1",
        keys: THROUGHPUT,
        count: THROUGHPUT,
        per_second: 0,
    },
    Round {
        name: "throughput2",
        keys: THROUGHPUT,
        count: THROUGHPUT,
        per_second: 0,
    },
    Round {
        name: "throughput3",
        keys: THROUGHPUT,
        count: THROUGHPUT,
        per_second: 0,
    },
];

/// What one round measured.
#[derive(Debug, Clone)]
struct Measured {
    p50: Duration,
    p99: Duration,
    /// From the round's start to its last event's first arrival.
    took: Duration,
    /// From the round's start to the last process's last dispatch returning.
    dispatching: Duration,
    duplicates: usize,
}

fn now_micros() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |since| since.as_micros() as u64)
}

/// Runs every round on a fresh store and fleet, publish after commit `on`.
async fn side(on: bool) -> Result<HashMap<&'static str, Measured>, BoxError> {
    let (emulator, cosmos) = emulator_server().await;
    provisioned_with_leases(&cosmos, "fleet", "orders", &["/orderId"], "orders-leases").await;
    let destination = format!("fleet-bench-{}-{on}", std::process::id());
    let broker = chatter_tests::rabbitmq::connect(Duration::from_secs(30)).await;
    let mut subscription = broker.subscribe(&destination).await?;
    let (arrivals_tx, mut arrivals) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        while let Some(Ok(delivery)) = subscription.next().await {
            let at = now_micros();
            let id = delivery.message.message_id.clone();
            let body: Value = serde_json::from_str(&delivery.message.body).unwrap_or_default();
            let dispatched = body["dispatchedAtMicros"].as_u64().unwrap_or(0);
            if delivery.ack().await.is_err() || arrivals_tx.send((id, dispatched, at)).is_err() {
                break;
            }
        }
    });
    let mut workers: Vec<ChildProcess> = (0..WORKERS)
        .map(|index| {
            let mut command = Command::new(env!("CARGO_BIN_EXE_fleet_worker"));
            command
                .env("CHATTER_COSMOS_ENDPOINT", emulator.endpoint())
                .env("FLEET_DESTINATION", &destination)
                .env("FLEET_INDEX", index.to_string())
                .env("FLEET_WORKERS", WORKERS.to_string())
                .env("FLEET_AFTER_COMMIT", if on { "1" } else { "0" })
                .stdin(Stdio::piped());
            ChildProcess::spawn("fleet_worker", &mut command)
        })
        .collect();
    for worker in &mut workers {
        worker
            .line_starting_with("started", Duration::from_secs(120))
            .await;
    }
    let mut measured = HashMap::new();
    for round in &ROUNDS {
        let start_ms = (now_micros() / 1000) + 500;
        for worker in &mut workers {
            worker.tell(&format!(
                "{} {} {} {} {start_ms}",
                round.name, round.keys, round.count, round.per_second
            ));
        }
        let mut first: HashMap<String, (u64, u64)> = HashMap::new();
        let mut duplicates = 0;
        let deadline = tokio::time::Instant::now() + Duration::from_secs(180);
        while first.len() < round.count {
            let (id, dispatched, at) = tokio::time::timeout_at(deadline, arrivals.recv())
                .await
                .map_err(|_| {
                    format!(
                        "{}: only {} of {} events arrived",
                        round.name,
                        first.len(),
                        round.count
                    )
                })?
                .ok_or("the subscription ended")?;
            if !id.starts_with(&format!("{}-", round.name)) {
                // A late duplicate of an earlier round.
                duplicates += 1;
                continue;
            }
            if first.insert(id, (dispatched, at)).is_some() {
                duplicates += 1;
            }
        }
        let mut dispatching = Duration::ZERO;
        for worker in &mut workers {
            let line = worker
                .line_starting_with("dispatched", Duration::from_secs(60))
                .await;
            let fields: Vec<&str> = line.split_whitespace().collect();
            if fields.get(2) != Some(&"0") {
                return Err(format!("{}: a worker's dispatches failed: {line}", round.name).into());
            }
            let ms: u64 = fields.get(3).and_then(|ms| ms.parse().ok()).unwrap_or(0);
            dispatching = dispatching.max(Duration::from_millis(ms));
        }
        let mut latencies: Vec<Duration> = first
            .values()
            .map(|(dispatched, at)| Duration::from_micros(at.saturating_sub(*dispatched)))
            .collect();
        latencies.sort();
        let quantile = |q: f64| {
            let rank = (latencies.len() as f64 * q).ceil() as usize;
            latencies[rank.clamp(1, latencies.len()) - 1]
        };
        let last = first.values().map(|(_, at)| *at).max().unwrap_or(0);
        let took = Duration::from_micros(last.saturating_sub(start_ms * 1000));
        let round_measured = Measured {
            p50: quantile(0.5),
            p99: quantile(0.99),
            took,
            dispatching,
            duplicates,
        };
        eprintln!(
            "  after commit {}: {:<10} p50 {:>9.1?} p99 {:>9.1?} dispatched in {:>9.1?}, \
             published in {:>9.1?} ({} duplicates)",
            if on { "on " } else { "off" },
            round.name,
            round_measured.p50,
            round_measured.p99,
            round_measured.dispatching,
            round_measured.took,
            duplicates
        );
        measured.insert(round.name, round_measured);
    }
    for worker in &mut workers {
        if !worker.close_and_wait(Duration::from_secs(40)).await {
            eprintln!("  a fleet_worker did not shut down gracefully");
        }
    }
    drop(emulator);
    Ok(measured)
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    eprintln!(
        "publish after commit, {WORKERS} processes, RabbitMQ, a chatter-emulator store ({} build)",
        if cfg!(debug_assertions) {
            "debug"
        } else {
            "release"
        }
    );
    let off = side(false).await?;
    let on = side(true).await?;
    let spread = (&off["spread"], &on["spread"]);
    let hot = &on["hot"];
    // Commands per second: the dispatches' time (the median of a side's three rounds), on
    // over off.
    let median = |side: &HashMap<&str, Measured>| {
        let mut rounds: Vec<&Measured> = ["throughput1", "throughput2", "throughput3"]
            .iter()
            .map(|name| &side[name])
            .collect();
        rounds.sort_by_key(|round| round.dispatching);
        rounds[1].clone()
    };
    let (throughput_off, throughput_on) = (median(&off), median(&on));
    let throughput =
        throughput_off.dispatching.as_secs_f64() / throughput_on.dispatching.as_secs_f64();
    let ratio = spread.0.p50.as_secs_f64() / spread.1.p50.as_secs_f64();
    let verdict = |met: bool| if met { "met" } else { "NOT MET" };
    println!(
        "spread (20 keys, 20/s): p50 {:.1?} against the relay alone's {:.1?}: {ratio:.1}x lower \
         (target 20x: {}); p99 {:.1?} (target under 50 ms: {})",
        spread.1.p50,
        spread.0.p50,
        verdict(ratio >= 20.0),
        spread.1.p99,
        verdict(spread.1.p99 < Duration::from_millis(50)),
    );
    println!(
        "hot (2 keys, 40/s): p50 {:.1?}, p99 {:.1?} (target under 100 ms: {}); the relay alone: \
         p99 {:.1?}",
        hot.p50,
        hot.p99,
        verdict(hot.p99 < Duration::from_millis(100)),
        off["hot"].p99,
    );
    println!(
        "duplicates (a second arrival of an event) with it on: spread {} of 300, hot {} of 400, \
         throughput {} of {THROUGHPUT} (the median round)",
        spread.1.duplicates, hot.duplicates, throughput_on.duplicates
    );
    println!(
        "throughput ({THROUGHPUT} commands at once, median of 3 rounds): commands per second on \
         over off {throughput:.3} (target 0.9: {}); dispatched in {:.1?} on, {:.1?} off; every \
         event published in {:.1?} on, {:.1?} off",
        verdict(throughput >= 0.9),
        throughput_on.dispatching,
        throughput_off.dispatching,
        throughput_on.took,
        throughput_off.took,
    );
    Ok(())
}
