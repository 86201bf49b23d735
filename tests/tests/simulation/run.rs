//! One run: a seed's workload and fault schedule through real chatter instances, then the
//! invariants ([`super::check`]).
//!
//! 1. A `chatter-emulator` server (the SDK's in-memory emulator over loopback HTTP, with an
//!    injector drawing the store's faults from the seed) and the in-memory broker behind the
//!    seed's broker faults.
//! 2. 2 to 3 instances (threads, each with its own Tokio runtime) start and share the leases.
//! 3. **Fault phase:** the workload's commands are published at random moments, some of them
//!    twice (the same message id); store and broker faults are on; instances crash and come
//!    back.
//! 4. **Heal:** faults off, every instance up. Everything must settle within [`SETTLE_BOUND`]:
//!    a run that does not is a stall, reported as a violation.
//! 5. The invariants are checked on what the store holds and what the broker carried.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use chatter_emulator::EmulatorServer;
use chatter_runtime::broker::{Broker, InMemoryBroker};
use chatter_runtime::cosmos::CosmosConnection;
use chatter_runtime::provision;
use chatter_runtime::{BrokeredMessage, DocumentReliable, broker::dead_letter_destination};
use serde_json::{Value, json};

use super::broker::SimBroker;
use super::commands::{
    DATABASE, EVENTS, IDEMPOTENCY, ORDERS, RESERVED, Recorder, SimPlace, SimPoison, SimReserve,
};

/// The containers the relays read the change feed of.
const MONITORED: [&str; 3] = [ORDERS, IDEMPOTENCY, TRIGGERS];
use super::faults::{Schedule, store_injector};
use super::instance::{Instance, Setup};
use super::rng::Rng;
use super::triggers::{TRIGGERED, TRIGGERS};

/// How long a healed run may take to publish and settle everything.
/// Generous: the instances share a machine that may be busy with other tests.
pub const SETTLE_BOUND: Duration = Duration::from_secs(120);

/// How long after healing a run may take to settle without a word: past it, an instance must
/// have logged at Error why (after healing), or the run fails. Well above a healthy run's
/// slowest recovery (a crashed instance's leases expire in 3 s; runs settle in a few seconds).
pub const STALL_BOUND: Duration = Duration::from_secs(30);

/// What a seed draws: the shape of its workload and of its faults.
#[derive(Debug, Clone)]
pub struct Plan {
    pub seed: u64,
    pub instances: usize,
    pub keys: usize,
    pub places: usize,
    pub poisons: usize,
    pub reserves: usize,
    /// Commands published a second time, under the same message id.
    pub duplicates: usize,
    pub store_per_mille: u32,
    pub publish_per_mille: u32,
    pub delivery_per_mille: u32,
    pub fault_phase: Duration,
    /// (when, which instance, down for how long)
    pub crashes: Vec<(Duration, usize, Duration)>,
    /// When the monitored containers' one partition splits in two, if it does.
    pub split_at: Option<Duration>,
    /// Each instance's clock skew, in milliseconds, within the inbox's clock margin.
    pub skews: Vec<i64>,
    /// Whether each instance publishes after commit (a fleet mid-rollout mixes both).
    pub after_commit: Vec<bool>,
    /// The other service's tenants, triggers per tenant, and the wait between two of them.
    pub tenants: usize,
    pub triggers_per_tenant: usize,
    pub trigger_gap: Duration,
}

impl Plan {
    pub fn draw(seed: u64) -> Self {
        let mut rng = Rng::new(seed);
        let instances = rng.between(2, 3) as usize;
        let fault_phase = rng.millis(300, 900);
        let crash_count = rng.below(3) as usize;
        let mut crashes: Vec<_> = (0..crash_count)
            .map(|_| {
                (
                    Duration::from_millis(rng.below(fault_phase.as_millis() as u64)),
                    rng.below(instances as u64) as usize,
                    rng.millis(0, 300),
                )
            })
            .collect();
        crashes.sort_by_key(|(at, ..)| *at);
        let split_at = rng
            .chance(300)
            .then(|| Duration::from_millis(rng.below(fault_phase.as_millis() as u64)));
        let tenants = rng.between(1, 3) as usize;
        let triggers_per_tenant = rng.between(2, 6) as usize;
        let trigger_gap = rng.millis(0, 80);
        let margin = super::instance::CLOCK_MARGIN.as_millis() as u64;
        let skews = (0..instances)
            .map(|_| rng.between(0, 2 * margin) as i64 - margin as i64)
            .collect();
        // From a stream of its own: the other draws stay what they were before it existed.
        let mut own = Rng::new(seed).fork(0xAF7E);
        let after_commit = (0..instances).map(|_| own.chance(750)).collect();
        Self {
            skews,
            after_commit,
            tenants,
            triggers_per_tenant,
            trigger_gap,
            split_at,
            seed,
            instances,
            keys: rng.between(1, 4) as usize,
            places: rng.between(4, 16) as usize,
            poisons: rng.below(2) as usize,
            reserves: rng.between(2, 5) as usize,
            duplicates: rng.between(0, 4) as usize,
            store_per_mille: *rng.pick(&[0, 20, 50, 100]),
            publish_per_mille: *rng.pick(&[0, 30, 80]),
            delivery_per_mille: *rng.pick(&[0, 30, 80]),
            fault_phase,
            crashes,
        }
    }
}

/// What a run saw, for the report.
#[derive(Debug, Default)]
pub struct Report {
    pub faults: BTreeMap<&'static str, u64>,
    pub crashes: usize,
    /// Event publications beyond the first of each (at-least-once's duplicates).
    pub duplicate_publications: usize,
    /// Inbox handlers run again after a run that finished (the README's at-least-once edge).
    pub inbox_reruns_after_finish: usize,
    pub commands: usize,
    pub took: Duration,
    /// From healing to everything settled.
    pub settled_in: Duration,
}

/// What the broker carried to the world outside chatter.
#[derive(Debug, Default)]
pub struct Seen {
    /// `(key, command id)` of every event publication, in arrival order.
    pub events: Vec<(String, String)>,
    /// Every reserved message, by the command id it came from.
    pub reserved: BTreeMap<String, usize>,
    /// Dead letters by message id.
    pub dead_letters: BTreeMap<String, usize>,
    /// `(tenant, trigger message id)` of every message the standalone relay published, in
    /// arrival order.
    pub triggered: Vec<(String, String)>,
}

/// One command of the workload, as published.
#[derive(Debug, Clone)]
pub struct Published {
    pub kind: Kind,
    pub message: BrokeredMessage,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Place,
    Poison,
    Reserve,
}

/// Runs `seed`: `Ok` with its report, or `Err` with every invariant that broke.
pub fn run(seed: u64) -> Result<Report, String> {
    let tokio = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a Tokio runtime");
    tokio.block_on(run_async(Plan::draw(seed)))
}

fn workload(plan: &Plan, rng: &mut Rng) -> Vec<Published> {
    let key = |rng: &mut Rng| format!("k{}", rng.below(plan.keys as u64));
    let seed = plan.seed;
    let command = |kind, name: &str, i, destination: &str, body: Value| Published {
        kind,
        message: BrokeredMessage::json(
            format!("s{seed}-{name}-{i}"),
            destination,
            body.to_string(),
        ),
    };
    let mut commands = Vec::new();
    for i in 0..plan.places {
        let body = json!({ "orderId": key(rng) });
        commands.push(command(
            Kind::Place,
            "place",
            i,
            SimPlace::registration().destination,
            body,
        ));
    }
    for i in 0..plan.poisons {
        let body = json!({ "orderId": key(rng) });
        commands.push(command(
            Kind::Poison,
            "poison",
            i,
            SimPoison::registration().destination,
            body,
        ));
    }
    for i in 0..plan.reserves {
        let body = json!({ "item": format!("item-{i}"), "workMs": rng.between(100, 500) });
        commands.push(command(
            Kind::Reserve,
            "reserve",
            i,
            SimReserve::registration().destination,
            body,
        ));
    }
    commands
}

/// A step of the fault phase, at its moment.
enum Step {
    Publish(BrokeredMessage),
    Crash(usize, Duration),
    Split,
}

async fn run_async(plan: Plan) -> Result<Report, String> {
    let began = Instant::now();
    // A seed run before in this process leaves no logs to this run.
    super::errors::take(plan.seed);
    let mut rng = Rng::new(plan.seed).fork(0xC0FFEE);
    let store_faults = Schedule::new(rng.fork(1), plan.store_per_mille);
    let publish_faults = Schedule::new(rng.fork(2), plan.publish_per_mille);
    let delivery_faults = Schedule::new(rng.fork(3), plan.delivery_per_mille);

    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .map_err(|e| format!("bind: {e}"))?;
    let server = EmulatorServer::from_listener(listener)
        .map_err(|e| format!("emulator: {e}"))?
        .spawn();
    server
        .faults()
        .inject_with(Some(store_injector(Arc::clone(&store_faults))));
    let cosmos = CosmosConnection::connect(server.endpoint(), None)
        .await
        .map_err(|e| format!("connect: {e}"))?;
    provision::ensure_for::<SimPlace>(&cosmos)
        .await
        .map_err(|e| format!("provision: {e}"))?;
    provision::ensure_for::<SimReserve>(&cosmos)
        .await
        .map_err(|e| format!("provision: {e}"))?;
    super::triggers::provision(&cosmos).await?;
    // One physical partition each (the emulator makes four): a quarter of the leases to poll,
    // and a partition the run may split.
    let store = server.store();
    let mut partitions = Vec::new();
    for container in MONITORED {
        let merge = |a, b| {
            store.merge_partitions_and_wait(DATABASE, container, a, b, Duration::from_millis(1))
        };
        let left = merge(0, 1).await.map_err(|e| format!("merge: {e}"))?;
        let right = merge(2, 3).await.map_err(|e| format!("merge: {e}"))?;
        partitions.push((
            container,
            merge(left, right)
                .await
                .map_err(|e| format!("merge: {e}"))?,
        ));
    }

    let provisioned = began.elapsed();
    let inner = InMemoryBroker::new();
    let seen = Arc::new(Mutex::new(Seen::default()));
    watch(&inner, &seen).await;
    let recorder = Arc::new(Recorder::default());
    *recorder.broker.lock().unwrap() = Some(inner.clone());
    let setup = Setup {
        endpoint: server.endpoint().to_owned(),
        broker: SimBroker::new(
            inner.clone(),
            Arc::clone(&publish_faults),
            Arc::clone(&delivery_faults),
        ),
        recorder: Arc::clone(&recorder),
        skew_ms: 0,
        after_commit: true,
    };
    let name = |i: usize| format!("sim-{}-{i}", plan.seed);
    let setup_of = |i: usize| Setup {
        skew_ms: plan.skews[i],
        after_commit: plan.after_commit[i],
        ..setup.clone()
    };
    let mut instances: Vec<Option<Instance>> = (0..plan.instances)
        .map(|i| Some(Instance::start(name(i), setup_of(i))))
        .collect();
    wait_started(&mut instances, Duration::from_secs(60))
        .await
        .map_err(|e| format!("seed {}: {e}", plan.seed))?;

    let instances_up = began.elapsed();
    // The fault phase's steps, in time order.
    let mut workload_rng = rng.fork(4);
    let commands = workload(&plan, &mut workload_rng);
    let mut steps: Vec<(Duration, Step)> = Vec::new();
    let phase = plan.fault_phase.as_millis() as u64;
    let mut last_of_key: BTreeMap<String, Duration> = BTreeMap::new();
    for command in &commands {
        let mut at = Duration::from_millis(workload_rng.below(phase));
        // Half the commands of a key come in a burst right after the previous one, so a page
        // often holds several documents of one key: the moment per-key order is at stake.
        if command.kind == Kind::Place {
            let key = serde_json::from_str::<Value>(&command.message.body)
                .ok()
                .and_then(|body| body["orderId"].as_str().map(str::to_owned))
                .unwrap_or_default();
            if let Some(previous) = last_of_key.get(&key)
                && workload_rng.chance(500)
            {
                at = *previous + workload_rng.millis(0, 10);
            }
            last_of_key.insert(key, at);
        }
        steps.push((at, Step::Publish(command.message.clone())));
        // A standalone-inbox command's copies often arrive while its first run is still at
        // work (published when it starts): the moment its claim must hold.
        if command.kind == Kind::Reserve && workload_rng.chance(500) {
            recorder.copies_on_start.lock().unwrap().insert(
                command.message.message_id.clone(),
                (command.message.clone(), plan.instances),
            );
        }
    }
    for _ in 0..plan.duplicates.min(commands.len()) {
        let again = workload_rng.pick(&commands).message.clone();
        steps.push((
            Duration::from_millis(workload_rng.below(phase + 200)),
            Step::Publish(again),
        ));
    }
    if let Some(at) = plan.split_at {
        steps.push((at, Step::Split));
    }
    for (at, which, down) in &plan.crashes {
        steps.push((*at, Step::Crash(*which, *down)));
    }
    steps.sort_by_key(|(at, _)| *at);

    store_faults.set(true);
    publish_faults.set(true);
    delivery_faults.set(true);
    let phase_start = tokio::time::Instant::now();
    // The other service writes its triggers meanwhile, through the same faults.
    let writer = tokio::spawn({
        let cosmos = cosmos.clone();
        let plan = plan.clone();
        async move {
            super::triggers::write(
                &cosmos,
                plan.seed,
                plan.tenants,
                plan.triggers_per_tenant,
                plan.trigger_gap,
            )
            .await
        }
    });
    let mut restarts: Vec<(tokio::time::Instant, usize)> = Vec::new();
    let mut crashes = 0;
    for (at, step) in steps {
        tokio::time::sleep_until(phase_start + at).await;
        restart_due(&mut instances, &mut restarts, &setup_of, &name);
        match step {
            // The harness publishes to the broker itself: its own publishes are not faulted.
            Step::Publish(message) => inner
                .publish(message)
                .await
                .map_err(|e| format!("publish: {e}"))?,
            Step::Split => {
                for (container, partition) in &partitions {
                    store.split_partition(
                        DATABASE,
                        container,
                        *partition,
                        Duration::from_millis(10),
                    );
                }
            }
            Step::Crash(which, down) => {
                if let Some(instance) = instances[which].take() {
                    crashes += 1;
                    instance.crash();
                    restarts.push((tokio::time::Instant::now() + down, which));
                }
            }
        }
    }
    tokio::time::sleep_until(phase_start + plan.fault_phase).await;
    let triggers = writer
        .await
        .map_err(|e| format!("the trigger writer: {e}"))??;

    // Heal.
    store_faults.set(false);
    publish_faults.set(false);
    delivery_faults.set(false);
    restarts
        .iter_mut()
        .for_each(|(at, _)| *at = tokio::time::Instant::now());
    restart_due(&mut instances, &mut restarts, &setup_of, &name);
    wait_started(&mut instances, Duration::from_secs(60))
        .await
        .map_err(|e| format!("seed {}: {e}", plan.seed))?;

    let healed = Instant::now();
    if std::env::var_os("SIM_VERBOSE").is_some() {
        eprintln!(
            "seed {}: provisioned at {provisioned:?}, instances up at {instances_up:?}, healed at {:?}",
            plan.seed,
            began.elapsed()
        );
    }
    let settled = settle(&plan, &commands, &triggers, &inner, &cosmos, &seen).await;
    let settled_in = healed.elapsed();
    // The instances are done with: crash them (a graceful stop is not what is checked).
    for instance in instances.iter_mut().filter_map(Option::take) {
        instance.crash();
    }
    let logged = super::errors::take(plan.seed);
    if let Err(stall) = settled {
        return Err(format!(
            "{stall}\n  Error logs after healing: {}",
            super::check::listed(super::check::said_after(&logged, healed))
        ));
    }
    let seen = std::mem::take(&mut *seen.lock().unwrap());
    let ended = super::check::Ended {
        logged,
        healed,
        settled_in,
    };
    let mut report = super::check::invariants(
        &plan, &commands, &triggers, &cosmos, &recorder, &seen, &ended,
    )
    .await?;
    report.faults = store_faults.tally.snapshot();
    report.faults.extend(publish_faults.tally.snapshot());
    report.faults.extend(delivery_faults.tally.snapshot());
    report.crashes = crashes;
    report.commands = commands.len();
    report.took = began.elapsed();
    report.settled_in = settled_in;
    Ok(report)
}

fn restart_due(
    instances: &mut [Option<Instance>],
    restarts: &mut Vec<(tokio::time::Instant, usize)>,
    setup_of: &impl Fn(usize) -> Setup,
    name: &impl Fn(usize) -> String,
) {
    let now = tokio::time::Instant::now();
    restarts.retain(|(at, which)| {
        if *at > now {
            return true;
        }
        if instances[*which].is_none() {
            instances[*which] = Some(Instance::start(name(*which), setup_of(*which)));
        }
        false
    });
}

async fn wait_started(instances: &mut [Option<Instance>], within: Duration) -> Result<(), String> {
    let deadline = Instant::now() + within;
    let mut started = vec![false; instances.len()];
    loop {
        for (i, instance) in instances.iter().enumerate() {
            if let Some(instance) = instance {
                started[i] |= instance.has_started();
            }
        }
        if started.iter().all(|s| *s) {
            return Ok(());
        }
        if Instant::now() > deadline {
            let errors: Vec<_> = instances
                .iter()
                .flatten()
                .map(|i| i.last_start_error.lock().unwrap().clone())
                .collect();
            return Err(format!(
                "instances did not start within {within:?}: started {started:?}, the last \
                 start errors {errors:?}"
            ));
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Records what the world outside chatter receives: the events, the reserved messages and the
/// dead letters (acked at once; duplicates counted).
async fn watch(broker: &InMemoryBroker, seen: &Arc<Mutex<Seen>>) {
    let destinations = [
        EVENTS.to_owned(),
        RESERVED.to_owned(),
        TRIGGERED.to_owned(),
        dead_letter_destination(SimPlace::registration().destination),
        dead_letter_destination(SimPoison::registration().destination),
        dead_letter_destination(SimReserve::registration().destination),
    ];
    for destination in destinations {
        let mut subscription = broker.subscribe(&destination).await.expect("subscribes");
        let seen = Arc::clone(seen);
        tokio::spawn(async move {
            while let Some(Ok(delivery)) = subscription.next().await {
                let message = delivery.message.clone();
                {
                    let mut seen = seen.lock().unwrap();
                    let body: Value = serde_json::from_str(&message.body).unwrap_or(Value::Null);
                    let command = body["command"].as_str().unwrap_or_default().to_owned();
                    if message.destination == EVENTS {
                        let key = body["orderId"].as_str().unwrap_or_default().to_owned();
                        seen.events.push((key, command));
                    } else if message.destination == TRIGGERED {
                        let tenant = body["tenant"].as_str().unwrap_or_default().to_owned();
                        let trigger = body["trigger"].as_str().unwrap_or_default().to_owned();
                        seen.triggered.push((tenant, trigger));
                    } else if message.destination == RESERVED {
                        *seen.reserved.entry(command).or_default() += 1;
                    } else {
                        *seen.dead_letters.entry(message.message_id).or_default() += 1;
                    }
                }
                let _ = delivery.ack().await;
            }
        });
    }
}

/// Waits until every command is settled and every Outbox Document published and stamped; a
/// run that does not within [`SETTLE_BOUND`] stalled.
async fn settle(
    plan: &Plan,
    commands: &[Published],
    triggers: &BTreeMap<String, Vec<String>>,
    broker: &InMemoryBroker,
    cosmos: &CosmosConnection,
    seen: &Arc<Mutex<Seen>>,
) -> Result<(), String> {
    let deadline = Instant::now() + SETTLE_BOUND;
    let destinations = [
        SimPlace::registration().destination,
        SimPoison::registration().destination,
        SimReserve::registration().destination,
    ];
    loop {
        let queued: usize = destinations.iter().map(|d| broker.pending_count(d)).sum();
        let missing = {
            let seen = seen.lock().unwrap();
            let published: BTreeSet<&str> = seen.events.iter().map(|(_, c)| c.as_str()).collect();
            let triggered: BTreeSet<&str> =
                seen.triggered.iter().map(|(_, t)| t.as_str()).collect();
            let triggers_missing = triggers
                .values()
                .flatten()
                .filter(|t| !triggered.contains(t.as_str()))
                .cloned();
            commands
                .iter()
                .filter(|c| match c.kind {
                    Kind::Place => !published.contains(c.message.message_id.as_str()),
                    Kind::Reserve => !seen.reserved.contains_key(&c.message.message_id),
                    Kind::Poison => !seen.dead_letters.contains_key(&c.message.message_id),
                })
                .map(|c| c.message.message_id.clone())
                .chain(triggers_missing)
                .collect::<Vec<_>>()
        };
        // The store is asked only once the broker says all is done (a query costs more).
        let pending = if queued == 0 && missing.is_empty() {
            match super::check::pending_outbox(cosmos).await {
                Ok(0) => return Ok(()),
                Ok(n) => format!("{n} Outbox Documents pending"),
                Err(e) => format!("the pending Outbox Documents unread: {e}"),
            }
        } else {
            "the pending Outbox Documents not read (commands are unsettled)".to_owned()
        };
        if Instant::now() > deadline {
            return Err(format!(
                "seed {}: stalled: {SETTLE_BOUND:?} after healing, {queued} command deliveries \
                 still queued or unsettled, {pending}, not yet published or dead-lettered: \
                 {missing:?}",
                plan.seed
            ));
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}
