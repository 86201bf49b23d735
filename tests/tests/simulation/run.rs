//! One run: a seed's workload and fault schedule through real chatter instances, then the
//! invariants ([`super::check`]).
//!
//! 1. A `chatter-emulator` server (the SDK's in-memory emulator over loopback HTTP) with a port
//!    per instance, whose injector decides that instance's store faults from the seed, and the
//!    in-memory broker behind each instance's broker faults.
//! 2. 2 to 3 instances (threads, each with its own Tokio runtime) start and share the leases.
//! 3. **Fault phase:** the workload's commands are published at random moments, some of them
//!    twice (the same message id); store and broker faults are on; instances crash and come
//!    back, pause (blocked threads that resume as zombies), are cut off from the store or the
//!    broker, and stop gracefully and start again. A seed of the *recovery* family has a fault
//!    phase of seconds at low rates, so leases and claims expire, are taken over and are
//!    contested while faults go on.
//! 4. **Heal:** faults off; what the plan does after the fault phase (a crash or a pause
//!    during recovery) still happens; then every instance is up. Everything must settle
//!    within [`STALL_BOUND`], whatever was logged.
//! 5. The invariants are checked on what the store holds, what the broker carried and what
//!    each incarnation of each instance published ([`super::history`]).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use chatter_emulator::{ConsistencyLevel, EmulatorServer, RunningEmulator};
use chatter_runtime::broker::{Broker, InMemoryBroker};
use chatter_runtime::cosmos::CosmosConnection;
use chatter_runtime::provision;
use chatter_runtime::{BrokeredMessage, DocumentReliable, broker::dead_letter_destination};
use serde_json::{Value, json};

use super::broker::{Fragile, Redelivery, Schedules, SimBroker};
use super::commands::{
    DATABASE, EVENTS, IDEMPOTENCY, NOTICES, ORDERS, RESERVED, Recorder, SimNotify, SimPlace,
    SimPoison, SimReserve, event_ids,
};
use super::faults::{Cut, Schedule, Tally, store_injector, store_observer};
use super::history::History;
use super::instance::{Instance, Setup};
use super::rng::Rng;
use super::triggers::{TRIGGER_LEASES, TRIGGERED, TRIGGERS};

/// The containers the relays read the change feed of.
const MONITORED: [&str; 3] = [ORDERS, IDEMPOTENCY, TRIGGERS];
/// Their lease containers, as the commands' registrations and the trigger relay name them.
pub fn lease_containers() -> [&'static str; 3] {
    [
        SimPlace::registration().lease,
        SimReserve::registration().lease,
        TRIGGER_LEASES,
    ]
}

/// How long after healing a run may take to publish and settle everything, whatever it logged:
/// past it, the run stalled. A healed run's slowest recovery is a crashed instance's leases
/// expiring (3 s), a claim running out (4 s), a Drain Suspension (1 s on the compressed clock)
/// and store answers held past the timeout (6 s); the rest is margin for a busy machine.
pub const STALL_BOUND: Duration = Duration::from_secs(20);

/// How long the lease containers may take, once everything is published, to tile the key
/// space once each: a half-done split's parent expires (3 s) and is taken and split again.
const LEASES_SETTLE: Duration = Duration::from_secs(12);

/// How long a settled run must stay quiet: nothing published after it settled.
const QUIET_FOR: Duration = Duration::from_millis(1_000);

/// Which kind of fault schedule a seed draws.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Family {
    /// A fault phase under a second at high rates: recovery happens after healing.
    Short,
    /// A fault phase of seconds at low rates, past lease expiry, claim expiry and the sweep:
    /// take-overs, zombies and cut-offs happen while faults go on.
    Recovery,
}

/// A seed's account: one region, or two, the instances reading in the read region, which
/// receives each write after a lag: stale replicas, as the account's consistency level allows.
#[derive(Debug, Clone, Copy)]
pub struct Regions {
    pub consistency: ConsistencyLevel,
    /// The replication lag, drawn per write within these milliseconds.
    pub lag_ms: (u64, u64),
}

/// What a cut-off separates an instance from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CutOf {
    Store,
    Broker,
}

/// What a seed draws: the shape of its workload and of its faults.
#[derive(Debug, Clone)]
pub struct Plan {
    pub seed: u64,
    pub family: Family,
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
    /// Settlements lost with their channel, and deliveries taken back while held (channels
    /// closed; on a counting broker, progress lost past the ack wait).
    pub settle_per_mille: u32,
    /// Whether the broker counts deliveries and redelivers on its own, as NATS JetStream does,
    /// rather than as RabbitMQ does.
    pub counting: bool,
    /// On a counting broker, deliveries whose progress signals are lost (delivered again past
    /// their ack wait).
    pub progress_per_mille: u32,
    pub fault_phase: Duration,
    /// (when, which instance, down for how long); some after the fault phase (in recovery).
    pub crashes: Vec<(Duration, usize, Duration)>,
    /// (when, which instance, blocked for how long).
    pub pauses: Vec<(Duration, usize, Duration)>,
    /// (when, which instance, from what, for how long).
    pub cuts: Vec<(Duration, usize, CutOf, Duration)>,
    /// (when, which instance): a graceful stop and a start, as a rolling restart does.
    pub restarts: Vec<(Duration, usize)>,
    /// When the monitored containers' one partition splits in two, if it does.
    pub split_at: Option<Duration>,
    /// When one of the four partitions of every lease container splits, if it does.
    pub lease_split_at: Option<Duration>,
    /// Notices, to a destination the broker refuses for good until `fixed_at`; the first
    /// refusal pauses its publisher for `refusal_pause`, if set.
    pub notices: usize,
    pub fixed_at: Option<Duration>,
    pub refusal_pause: Option<Duration>,
    /// When the operator gives up the pending notices (through the CLI's code, `chatter outbox
    /// give-up --destination`), before the fix: relays racing it hold pages that read them
    /// pending, and their stamps meet the operator's verdict.
    pub gave_up_at: Option<Duration>,
    /// Physical partitions per monitored container: 1, 2 or 4 (a lease each). None merge
    /// mid-run: the SDK's emulator restarts a merged partition's LSNs, so a continuation from
    /// before the merge skips what is written after it (`emulator_merge_departure.rs`), which
    /// Cosmos DB does not; a merge would fail runs for the emulator's sake.
    pub partitions: u32,
    /// Each instance's clock skew, in milliseconds, within the inbox's clock margin.
    pub skews: Vec<i64>,
    /// Whether each instance publishes after commit (a fleet mid-rollout mixes both).
    pub after_commit: Vec<bool>,
    /// The other service's tenants, triggers per tenant, and the wait between two of them.
    pub tenants: usize,
    pub triggers_per_tenant: usize,
    pub trigger_gap: Duration,
    /// A read region the instances read in, if the account has one.
    pub regions: Option<Regions>,
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
        // From streams of their own: the other draws stay what they were before they existed.
        let mut own = Rng::new(seed).fork(0xAF7E);
        // `SIM_AFTER_COMMIT=on|off` sets it for every instance (to tell the relay's part in a
        // family's failures from publish after commit's).
        let forced = std::env::var("SIM_AFTER_COMMIT").ok().map(|v| v == "on");
        let after_commit = (0..instances)
            .map(|_| {
                let drawn = own.chance(750);
                forced.unwrap_or(drawn)
            })
            .collect();
        let mut plan = Self {
            skews,
            after_commit,
            tenants,
            triggers_per_tenant,
            trigger_gap,
            split_at,
            lease_split_at: None,
            seed,
            family: Family::Short,
            instances,
            keys: rng.between(1, 4) as usize,
            places: rng.between(4, 16) as usize,
            poisons: rng.below(2) as usize,
            reserves: rng.between(2, 5) as usize,
            duplicates: rng.between(0, 4) as usize,
            store_per_mille: *rng.pick(&[0, 20, 50, 100]),
            publish_per_mille: *rng.pick(&[0, 30, 80]),
            delivery_per_mille: *rng.pick(&[0, 30, 80]),
            settle_per_mille: 0,
            counting: false,
            progress_per_mille: 0,
            fault_phase,
            crashes: Vec::new(),
            pauses: Vec::new(),
            cuts: Vec::new(),
            restarts: Vec::new(),
            regions: None,
            partitions: 1,
            notices: 0,
            fixed_at: None,
            refusal_pause: None,
            gave_up_at: None,
        };
        // A destination the broker refuses until an operator fixes it mid-run, in 4 seeds of
        // 10 (seed 139 found an unconditional `undeliverable` stamp, retried after a pause,
        // overwriting a later `delivered`; every stamp is conditional since).
        let mut verdicts = Rng::new(seed).fork(0x7E8D);
        if verdicts.chance(400) {
            plan.notices = verdicts.between(2, 6) as usize;
            let phase = plan.fault_phase.as_millis() as u64;
            plan.fixed_at = Some(Duration::from_millis(
                verdicts.between(phase / 4, phase / 2),
            ));
            // Past a lease expiry (3 s): another instance takes the paused one's leases, and
            // the fix, over.
            plan.refusal_pause = verdicts.chance(500).then(|| verdicts.millis(3_500, 6_000));
            // From a stream of its own: the other draws stay what they were before it existed.
            // Not in a regression seed: each is kept for a window its run reached before the
            // give-up existed, which an operator's verdict landing first could close.
            let mut operator = Rng::new(seed).fork(0x61FE);
            let kept = super::REGRESSION_SEEDS
                .iter()
                .any(|(kept, _)| *kept == seed);
            if let Some(fixed) = plan.fixed_at
                && !kept
                && operator.chance(500)
            {
                let fixed = fixed.as_millis() as u64;
                plan.gave_up_at = Some(Duration::from_millis(operator.between(fixed / 2, fixed)));
            }
        }
        let mut shape = Rng::new(seed).fork(0x5A9E);
        plan.partitions = *shape.pick(&[1, 1, 1, 2, 2, 4]);
        if plan.partitions > 1 {
            // A split needs the one partition (its id).
            plan.split_at = None;
        }

        // A read region, in 3 seeds of 10, at a level drawn from the five (`SIM_CONSISTENCY=
        // <level>` gives every seed one at that level): every instance reads there, replicas
        // behind the write region. No split then: the SDK's emulator, splitting a partition of
        // a two-region account, left the read region serving a document's older version for
        // seconds (seeds 5134 and 5336, each with a split in its first 110 ms; see
        // docs/testing.md), which no Cosmos region does.
        let mut stale = Rng::new(seed).fork(0x2E61);
        let forced = std::env::var("SIM_CONSISTENCY").ok().map(|level| {
            match level.to_ascii_lowercase().as_str() {
                "session" => ConsistencyLevel::Session,
                "eventual" => ConsistencyLevel::Eventual,
                "consistentprefix" | "consistent-prefix" => ConsistencyLevel::ConsistentPrefix,
                "boundedstaleness" | "bounded-staleness" => ConsistencyLevel::BoundedStaleness,
                "strong" => ConsistencyLevel::Strong,
                other => panic!("SIM_CONSISTENCY={other}: not a consistency level"),
            }
        });
        let drawn = stale.chance(300).then(|| {
            *stale.pick(&[
                ConsistencyLevel::Session,
                ConsistencyLevel::Eventual,
                ConsistencyLevel::ConsistentPrefix,
                ConsistencyLevel::BoundedStaleness,
                ConsistencyLevel::Strong,
            ])
        });
        if let Some(consistency) = forced.or(drawn) {
            // Within what the emulator replicates in order without falling behind (its 64
            // replications in flight at once, each for its lag).
            let low = stale.between(10, 20);
            plan.regions = Some(Regions {
                consistency,
                lag_ms: (low, low + stale.between(10, 40)),
            });
            plan.split_at = None;
        }
        let mut deeper = Rng::new(seed).fork(0xDEE9);
        let which = |rng: &mut Rng| rng.below(instances as u64) as usize;
        if deeper.chance(500) {
            plan.family = Family::Recovery;
            let phase = deeper.millis(4_000, 9_000);
            plan.fault_phase = phase;
            let at = |rng: &mut Rng| Duration::from_millis(rng.below(phase.as_millis() as u64));
            plan.store_per_mille = *deeper.pick(&[5, 10, 20]);
            plan.publish_per_mille = *deeper.pick(&[0, 10, 30]);
            plan.delivery_per_mille = *deeper.pick(&[0, 10, 30]);
            crashes = (0..deeper.below(4))
                .map(|_| (at(&mut deeper), which(&mut deeper), deeper.millis(0, 3_000)))
                .collect();
            // Often past the lease expiry (3 s) and the claim (3 s plus the margin): a zombie.
            plan.pauses = (0..deeper.below(3))
                .map(|_| {
                    (
                        at(&mut deeper),
                        which(&mut deeper),
                        deeper.millis(1_000, 5_500),
                    )
                })
                .collect();
            plan.cuts = (0..deeper.below(2))
                .map(|_| {
                    let of = if deeper.chance(500) {
                        CutOf::Store
                    } else {
                        CutOf::Broker
                    };
                    (
                        at(&mut deeper),
                        which(&mut deeper),
                        of,
                        deeper.millis(1_000, 6_000),
                    )
                })
                .collect();
            plan.restarts = (0..deeper.below(3))
                .map(|_| (at(&mut deeper), which(&mut deeper)))
                .collect();
            if let Some(split) = &mut plan.split_at {
                *split = at(&mut deeper);
            }
        } else {
            // Recovery is not fault-free: a crash or a pause while it runs.
            let phase = fault_phase.as_millis() as u64;
            if deeper.chance(300) {
                crashes.push((
                    Duration::from_millis(phase + deeper.below(2_000)),
                    which(&mut deeper),
                    deeper.millis(0, 1_500),
                ));
            }
            if deeper.chance(200) {
                plan.pauses.push((
                    Duration::from_millis(deeper.below(phase + 1_000)),
                    which(&mut deeper),
                    deeper.millis(1_000, 4_500),
                ));
            }
        }
        crashes.sort_by_key(|(at, ..)| *at);
        plan.crashes = crashes;
        // RabbitMQ's channel faults on settlements, at the family's rates.
        let mut settle = Rng::new(seed).fork(0x5E77);
        plan.settle_per_mille = *settle.pick(match plan.family {
            Family::Short => &[0, 30, 80],
            Family::Recovery => &[0, 10, 30],
        });
        // A broker that counts deliveries, in 3 seeds of 10 (`SIM_BROKER=counting|channels`
        // gives every seed one).
        let drawn = settle.chance(300);
        plan.counting = match std::env::var("SIM_BROKER").as_deref() {
            Ok("counting") => true,
            Ok("channels") => false,
            _ => drawn,
        };
        if plan.counting {
            plan.progress_per_mille = *settle.pick(&[50, 150, 300]);
        }
        // The lease containers split too, in 2 seeds of 10 (not on two regions, as above): the
        // processors' lease queries, reads and writes meet 410/1002 and a new routing map.
        let mut leases = Rng::new(seed).fork(0x1EA5);
        if leases.chance(200) && plan.regions.is_none() {
            plan.lease_split_at = Some(Duration::from_millis(
                leases.below(plan.fault_phase.as_millis() as u64),
            ));
        }
        plan
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
    /// The windows that matter, each counted when the run reached it ([`super::probes`]).
    pub probes: BTreeMap<&'static str, u64>,
}

/// What the broker carried to the world outside chatter.
#[derive(Debug, Default)]
pub struct Seen {
    /// `(key, event id)` of every event publication, in arrival order.
    pub events: Vec<(String, String)>,
    /// The body of every event publication, by event id.
    pub event_bodies: Vec<(String, String)>,
    /// Every reserved message, by the command id it came from.
    pub reserved: BTreeMap<String, usize>,
    /// Dead letters by message id.
    pub dead_letters: BTreeMap<String, usize>,
    /// Dead letters the operator replayed, by message id (each time it did).
    pub replayed: BTreeMap<String, usize>,
    /// Replayed dead letters that carried fewer attempts than the limit (or none).
    pub replayed_early: Vec<String>,
    /// `(tenant, trigger message id)` of every message the standalone relay published, in
    /// arrival order.
    pub triggered: Vec<(String, String)>,
    /// Every notice published, by the command id it came from.
    pub notices: BTreeMap<String, usize>,
}

impl Seen {
    fn publications(&self) -> usize {
        self.events.len()
            + self.reserved.values().sum::<usize>()
            + self.triggered.len()
            + self.dead_letters.values().sum::<usize>()
            + self.notices.values().sum::<usize>()
    }
}

/// One command of the workload, as published.
#[derive(Debug, Clone)]
pub struct Published {
    pub kind: Kind,
    pub message: BrokeredMessage,
    /// The event ids a place command sends (none for the others).
    pub events: Vec<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Place,
    Poison,
    Reserve,
    Notice,
}

/// Runs `seed`: `Ok` with its report, or `Err` with every invariant that broke (and where its
/// history was written).
pub fn run(seed: u64) -> Result<Report, String> {
    let tokio = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a Tokio runtime");
    // Runs of one seed side by side (a replay's repeats) keep their threads and histories apart.
    static RUNS: AtomicU64 = AtomicU64::new(0);
    let run = RUNS.fetch_add(1, Ordering::SeqCst);
    let history = Arc::new(History::default());
    let plan = Plan::draw(seed);
    let ran = tokio.block_on(run_async(plan.clone(), run, Arc::clone(&history)));
    ran.map_err(|violation| {
        let path = std::env::temp_dir().join(format!("chatter-sim-{seed}-{run}.history"));
        let written = std::fs::write(&path, format!("{plan:#?}\n\n{}", history.text()));
        match written {
            Ok(()) => format!("{violation}\n  history: {}", path.display()),
            Err(e) => format!("{violation}\n  (its history could not be written: {e})"),
        }
    })
}

fn workload(plan: &Plan, rng: &mut Rng) -> Vec<Published> {
    // Drawn from a stream of their own: the other draws stay what they were.
    let mut extra = Rng::new(plan.seed).fork(0xE7E7);
    let key = |rng: &mut Rng| format!("k{}", rng.below(plan.keys as u64));
    let seed = plan.seed;
    let command = |kind, name: &str, i, destination: &str, body: Value| {
        let message =
            BrokeredMessage::json(format!("s{seed}-{name}-{i}"), destination, body.to_string());
        let events = match body["events"].as_u64() {
            Some(n) => event_ids(&message.message_id, n as u8),
            None => Vec::new(),
        };
        Published {
            kind,
            message,
            events,
        }
    };
    let mut commands = Vec::new();
    for i in 0..plan.places {
        let body = json!({ "orderId": key(rng), "events": extra.between(1, 3) });
        commands.push(command(
            Kind::Place,
            "place",
            i,
            SimPlace::registration().destination,
            body,
        ));
    }
    for i in 0..plan.notices {
        let body = json!({ "orderId": format!("n{i}") });
        commands.push(command(
            Kind::Notice,
            "notice",
            i,
            SimNotify::registration().destination,
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
        let mut body = json!({ "item": format!("item-{i}"), "workMs": rng.between(100, 500) });
        // Its first run outruns its claim (3 s): stopped when the claim is up.
        if extra.chance(150) {
            body["firstRunMs"] = json!(extra.between(3_200, 4_000));
        }
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

/// A step of the run, at its moment.
enum Step {
    Publish(BrokeredMessage),
    Crash(usize, Duration),
    Pause(usize, Duration),
    Cut(usize, CutOf, Duration),
    Restart(usize),
    Split,
    SplitLeases,
    /// The broker takes notices again.
    Fix,
    /// The operator gives up the pending notices.
    GiveUp,
    Heal,
}

/// One instance slot: its own port of the store, its faults, and its incarnations.
struct Slot {
    endpoint: String,
    _port: RunningEmulator,
    store: Arc<Schedule>,
    broker: Schedules,
    store_cut: Arc<Cut>,
    broker_cut: Arc<Cut>,
    incarnation: Arc<AtomicU64>,
    instance: Option<Instance>,
}

/// What every instance of the run shares.
struct Fleet {
    plan: Plan,
    /// This process's count of runs so far: instance thread names carry it.
    run: u64,
    /// The account's endpoint, as every instance names it (each dials a port of its own).
    account: String,
    slots: Vec<Slot>,
    inner: InMemoryBroker,
    recorder: Arc<Recorder>,
    history: Arc<History>,
    stranded: Arc<AtomicU64>,
    fragile: Arc<Fragile>,
    /// Crashed instances to start again, and when.
    restarts: Vec<(tokio::time::Instant, usize)>,
}

impl Fleet {
    /// Starts a new incarnation of instance `slot`.
    fn start(&mut self, slot: usize) {
        let plan = &self.plan;
        let s = &mut self.slots[slot];
        let incarnation = s.incarnation.fetch_add(1, Ordering::SeqCst) + 1;
        self.history
            .harness(slot, format!("incarnation {incarnation} starts"));
        let setup = Setup {
            endpoint: s.endpoint.clone(),
            account: self.account.clone(),
            broker: SimBroker::new(
                self.inner.clone(),
                s.broker.clone(),
                Arc::clone(&s.broker_cut),
                (slot, incarnation),
                (Arc::clone(&self.history), Arc::clone(&self.fragile)),
            ),
            recorder: Arc::clone(&self.recorder),
            skew_ms: plan.skews[slot],
            after_commit: plan.after_commit[slot],
            stranded: Arc::clone(&self.stranded),
            read_region: plan.regions.is_some(),
        };
        let name = format!("sim-{}-{}-{slot}", plan.seed, self.run);
        s.instance = Some(Instance::start(name, setup));
    }

    fn set_faults(&self, on: bool) {
        for slot in &self.slots {
            slot.store.set(on);
            slot.broker.publishes.set(on);
            slot.broker.deliveries.set(on);
            slot.broker.settlements.set(on);
            slot.broker.progress.set(on);
        }
    }

    fn restart_due(&mut self) {
        let now = tokio::time::Instant::now();
        let due: Vec<usize> = self
            .restarts
            .iter()
            .filter(|(at, _)| *at <= now)
            .map(|(_, slot)| *slot)
            .collect();
        self.restarts.retain(|(at, _)| *at > now);
        for slot in due {
            if self.slots[slot].instance.is_none() {
                self.start(slot);
            }
        }
    }

    async fn wait_started(&self, within: Duration) -> Result<(), String> {
        let deadline = Instant::now() + within;
        loop {
            let started: Vec<bool> = self
                .slots
                .iter()
                .map(|s| s.instance.as_ref().is_some_and(Instance::has_started))
                .collect();
            if started.iter().all(|s| *s) {
                return Ok(());
            }
            if Instant::now() > deadline {
                let errors: Vec<_> = self
                    .slots
                    .iter()
                    .filter_map(|s| s.instance.as_ref())
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
}

/// A port of `server` for one client, with its faults decided by a schedule of its own.
async fn port(
    server: &RunningEmulator,
    slot: usize,
    schedule: &Arc<Schedule>,
    cut: &Arc<Cut>,
    incarnation: &Arc<AtomicU64>,
    history: &Arc<History>,
) -> Result<RunningEmulator, String> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .map_err(|e| format!("bind: {e}"))?;
    let port = server
        .port(listener)
        .map_err(|e| format!("port: {e}"))?
        .spawn();
    port.faults().inject_with(Some(store_injector(
        slot,
        Arc::clone(schedule),
        Arc::clone(cut),
        Arc::clone(incarnation),
        Arc::clone(history),
    )));
    port.faults().observe_with(Some(store_observer(
        slot,
        Arc::clone(incarnation),
        Arc::clone(history),
    )));
    Ok(port)
}

async fn run_async(plan: Plan, run: u64, history: Arc<History>) -> Result<Report, String> {
    let began = Instant::now();
    let mut rng = Rng::new(plan.seed).fork(0xC0FFEE);
    let tally = Arc::new(Tally::default());
    // Each concern of each instance decides from a base of its own.
    let schedule = |slot: usize, concern: u64, per_mille: u32| {
        let base = Rng::new(plan.seed ^ ((slot as u64 + 1) << 40) ^ (concern << 56)).next_u64();
        Schedule::new(base, per_mille, Arc::clone(&tally))
    };

    let bind = || async {
        tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .map_err(|e| format!("bind: {e}"))
    };
    // The harness's own port: provisioning and the checks, never faulted (and in the write
    // region, where it reads what is committed).
    let (server, _read_region) = match plan.regions {
        None => (
            EmulatorServer::from_listener(bind().await?).map_err(|e| format!("emulator: {e}"))?,
            None,
        ),
        Some(regions) => {
            let (low, high) = regions.lag_ms;
            let (write, read) = EmulatorServer::with_read_region(
                bind().await?,
                bind().await?,
                regions.consistency,
                Duration::from_millis(low)..=Duration::from_millis(high),
                plan.seed,
            )
            .map_err(|e| format!("emulator: {e}"))?;
            (write, Some(read.spawn()))
        }
    };
    let server = server.spawn();
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
    // The emulator makes four physical partitions; merged (before anything is written) into the
    // plan's 1 or 2, or left at 4: fewer leases to poll. A single partition, the one a run may
    // split, is kept by its id.
    let store = server.store();
    let mut single = Vec::new();
    for container in MONITORED.into_iter().filter(|_| plan.partitions < 4) {
        let merge = |a, b| {
            let merged = store.merge_partitions_and_wait(
                DATABASE,
                container,
                a,
                b,
                Duration::from_millis(1),
            );
            async move { merged.await.map_err(|e| format!("merge: {e}")) }
        };
        let (left, right) = (merge(0, 1).await?, merge(2, 3).await?);
        if plan.partitions == 1 {
            single.push((container, merge(left, right).await?));
        }
    }

    let provisioned = began.elapsed();
    let inner = InMemoryBroker::new();
    let seen = Arc::new(Mutex::new(Seen::default()));
    watch(&inner, &seen).await;
    let recorder = Arc::new(Recorder::default());
    *recorder.broker.lock().unwrap() = Some(inner.clone());
    *recorder.history.lock().unwrap() = Some(Arc::clone(&history));
    let redelivery = if plan.counting {
        Redelivery::Counting(Arc::default())
    } else {
        Redelivery::Channels
    };
    let mut slots = Vec::new();
    for slot in 0..plan.instances {
        let store = schedule(slot, 1, plan.store_per_mille);
        let store_cut = Arc::new(Cut::default());
        let incarnation = Arc::new(AtomicU64::new(0));
        let port = port(&server, slot, &store, &store_cut, &incarnation, &history).await?;
        slots.push(Slot {
            endpoint: port.endpoint().to_owned(),
            _port: port,
            store,
            broker: Schedules {
                publishes: schedule(slot, 2, plan.publish_per_mille),
                deliveries: schedule(slot, 3, plan.delivery_per_mille),
                settlements: schedule(slot, 4, plan.settle_per_mille),
                progress: schedule(slot, 5, plan.progress_per_mille),
                redelivery: redelivery.clone(),
            },
            store_cut,
            broker_cut: Arc::new(Cut::default()),
            incarnation,
            instance: None,
        });
    }
    // The other service writing triggers has a port (and faults) of its own.
    let writer_slot = plan.instances;
    let writer_faults = schedule(writer_slot, 1, plan.store_per_mille);
    let writer_port = port(
        &server,
        writer_slot,
        &writer_faults,
        &Arc::new(Cut::default()),
        &Arc::new(AtomicU64::new(1)),
        &history,
    )
    .await?;
    let writer_cosmos = CosmosConnection::connect(writer_port.endpoint(), None)
        .await
        .map_err(|e| format!("connect: {e}"))?;
    let mut fleet = Fleet {
        plan: plan.clone(),
        run,
        account: server.endpoint().to_owned(),
        slots,
        inner: inner.clone(),
        recorder: Arc::clone(&recorder),
        history: Arc::clone(&history),
        stranded: Arc::default(),
        fragile: Arc::new(Fragile {
            refusing: plan.fixed_at.is_some().into(),
            pause_on_refusal: plan.refusal_pause.into(),
        }),
        restarts: Vec::new(),
    };
    for slot in 0..plan.instances {
        fleet.start(slot);
    }
    fleet
        .wait_started(Duration::from_secs(60))
        .await
        .map_err(|e| format!("seed {}: {e}", plan.seed))?;

    let instances_up = began.elapsed();
    // An operator at work the whole run, faults or not.
    let operator = tokio::spawn(replay_dead_letters(
        inner.clone(),
        Arc::clone(&seen),
        Arc::clone(&history),
    ));
    let mut workload_rng = rng.fork(4);
    let commands = workload(&plan, &mut workload_rng);
    let steps = steps(&plan, &commands, &recorder, &mut workload_rng);

    fleet.set_faults(true);
    writer_faults.set(true);
    let phase_start = tokio::time::Instant::now();
    // The other service writes its triggers meanwhile, through faults of its own.
    let writer = tokio::spawn({
        let plan = plan.clone();
        async move {
            super::triggers::write(
                &writer_cosmos,
                plan.seed,
                plan.tenants,
                plan.triggers_per_tenant,
                plan.trigger_gap,
            )
            .await
        }
    });
    let mut crashes = 0;
    let mut giving_up = None;
    let mut steps = steps.into_iter().peekable();
    // Every step in its time order, and crashed instances back when they are due.
    loop {
        let next_step = steps.peek().map(|(at, _)| phase_start + *at);
        let next_restart = fleet.restarts.iter().map(|(at, _)| *at).min();
        let Some(next) = next_step.into_iter().chain(next_restart).min() else {
            break;
        };
        tokio::time::sleep_until(next).await;
        fleet.restart_due();
        if next_step != Some(next) {
            continue;
        }
        let (_, step) = steps.next().expect("peeked");
        match step {
            // The harness publishes to the broker itself: its own publishes are not faulted.
            Step::Publish(message) => inner
                .publish(super::broker::published_anew(&message))
                .await
                .map_err(|e| format!("publish: {e}"))?,
            Step::Split => {
                for (container, partition) in &single {
                    store.split_partition(
                        DATABASE,
                        container,
                        *partition,
                        Duration::from_millis(10),
                    );
                }
            }

            Step::SplitLeases => {
                history.harness(usize::MAX, "the lease containers' partition 0 splits");
                for leases in lease_containers() {
                    store.split_partition(DATABASE, leases, 0, Duration::from_millis(10));
                }
            }
            Step::Crash(which, down) => {
                if let Some(instance) = fleet.slots[which].instance.take() {
                    crashes += 1;
                    history.harness(which, format!("crashed, down for {down:?}"));
                    // Off this thread, which serves the store: a paused instance's thread
                    // finishes its pause before it can be joined.
                    tokio::task::spawn_blocking(move || instance.crash())
                        .await
                        .map_err(|e| format!("crash: {e}"))?;
                    fleet
                        .restarts
                        .push((tokio::time::Instant::now() + down, which));
                }
            }
            Step::Pause(which, period) => {
                if let Some(instance) = &fleet.slots[which].instance {
                    history.paused(which, period, format!("paused for {period:?}"));
                    instance.pause(period);
                }
            }
            Step::Cut(which, of, period) => {
                history.harness(which, format!("cut off from the {of:?} for {period:?}"));
                let slot = &fleet.slots[which];
                let cut = match of {
                    CutOf::Store => &slot.store_cut,
                    CutOf::Broker => &slot.broker_cut,
                };
                cut.until(Instant::now() + period);
            }
            Step::Restart(which) => {
                if let Some(instance) = fleet.slots[which].instance.take() {
                    history.harness(which, "stops gracefully (a rolling restart)");
                    // Off this thread: a shutdown waits on the store and the broker.
                    tokio::task::spawn_blocking(move || instance.stop(Duration::from_secs(15)))
                        .await
                        .map_err(|e| format!("stop: {e}"))?;
                    fleet.start(which);
                }
            }
            Step::GiveUp => {
                // On a task of its own: the steps go on while it reads and writes (awaited
                // before the run settles, so it never gives up a notice the requeue put back).
                giving_up = Some(tokio::spawn(give_up_notices(
                    cosmos.clone(),
                    Arc::clone(&history),
                )));
            }
            Step::Fix => {
                history.harness(usize::MAX, "the broker takes notices again");
                fleet
                    .fragile
                    .refusing
                    .store(false, std::sync::atomic::Ordering::SeqCst);
            }
            Step::Heal => {
                fleet.set_faults(false);
                writer_faults.set(false);
            }
        }
    }
    let triggers = writer
        .await
        .map_err(|e| format!("the trigger writer: {e}"))??;
    fleet
        .wait_started(Duration::from_secs(60))
        .await
        .map_err(|e| format!("seed {}: {e}", plan.seed))?;

    let healed = Instant::now();
    if std::env::var_os("SIM_VERBOSE").is_some() {
        eprintln!(
            "seed {} ({:?}): provisioned at {provisioned:?}, instances up at {instances_up:?}, \
             healed at {:?}",
            plan.seed,
            plan.family,
            began.elapsed()
        );
    }
    if let Some(giving_up) = giving_up {
        let _ = giving_up.await;
    }
    let settled = settle(
        &plan, &commands, &triggers, &inner, &cosmos, &seen, &history,
    )
    .await;
    let settled_in = healed.elapsed();
    // Quiet once settled: nothing more is published (a zombie's publish, a relay acting on an
    // old page). Counted once every answer held past its timeout has arrived and every cut-off
    // and pause ended: a page read before healing and answered after it, a publish held by a
    // cut-off, a zombie resuming, may publish again what was delivered since, as at-least-once
    // allows.
    let cuts_end = fleet
        .slots
        .iter()
        .flat_map(|slot| [slot.store_cut.ends(), slot.broker_cut.ends()])
        .flatten();
    let held_until = history
        .events()
        .iter()
        .filter(|(_, event)| {
            matches!(event, super::history::Event::StoreFault { fault, .. }
                if fault.contains("held past the timeout"))
        })
        .map(|(at, _)| *at + super::faults::LONGEST_HELD_ANSWER)
        .chain(cuts_end)
        .chain(history.pauses_end())
        .max();
    if let Some(held_until) = held_until {
        // And the moment it takes to hand a released publish over.
        tokio::time::sleep_until((held_until + Duration::from_millis(200)).into()).await;
    }
    let quiet = if settled.is_ok() {
        let before = seen.lock().unwrap().publications();
        tokio::time::sleep(QUIET_FOR).await;
        let after = seen.lock().unwrap().publications();
        (after != before).then(|| {
            format!(
                "quiescence: {} publications in the {QUIET_FOR:?} after everything settled",
                after - before
            )
        })
    } else {
        None
    };
    // The lease containers settle too: a split left half done (a child created, the parent
    // not yet replaced: its owner crashed, or a create failed) is finished by whoever takes the
    // parent once it expires.
    let leases_settled = if settled.is_ok() {
        super::check::leases_tile(&cosmos, LEASES_SETTLE).await?
    } else {
        Vec::new()
    };
    operator.abort();
    // The instances are done with: crash them (a graceful stop is not what is checked).
    for slot in &mut fleet.slots {
        if let Some(instance) = slot.instance.take() {
            instance.crash();
        }
    }
    let logged = super::errors::take(plan.seed, run);
    if let Err(stall) = settled {
        return Err(format!(
            "{stall}\n  Error logs after healing: {}",
            super::check::listed(super::check::said_after(&logged, healed))
        ));
    }
    let seen = std::mem::take(&mut *seen.lock().unwrap());
    let ended = super::check::Ended {
        logged,
        settled_in,
        quiet,
        leases: leases_settled,
        stranded: fleet.stranded.load(Ordering::SeqCst),
        history: history.events(),
    };
    let mut report = super::check::invariants(
        &plan, &commands, &triggers, &cosmos, &recorder, &seen, &ended,
    )
    .await?;
    report.faults = tally.snapshot();
    report.crashes = crashes;
    report.commands = commands.len();
    report.took = began.elapsed();
    report.settled_in = settled_in;
    report.probes = super::probes::count(&plan, &commands, &recorder, &ended);
    Ok(report)
}

/// The run's steps in time order: the commands (a key's often in a burst), their duplicates,
/// the split, the crashes, pauses, cut-offs and restarts, and healing.
fn steps(
    plan: &Plan,
    commands: &[Published],
    recorder: &Recorder,
    workload_rng: &mut Rng,
) -> Vec<(Duration, Step)> {
    let mut steps: Vec<(Duration, Step)> = Vec::new();
    let phase = plan.fault_phase.as_millis() as u64;
    let mut last_of_key: BTreeMap<String, Duration> = BTreeMap::new();
    for command in commands {
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
        let again = workload_rng.pick(commands).message.clone();
        steps.push((
            Duration::from_millis(workload_rng.below(phase + 200)),
            Step::Publish(again),
        ));
    }
    if let Some(at) = plan.split_at {
        steps.push((at, Step::Split));
    }
    if let Some(at) = plan.lease_split_at {
        steps.push((at, Step::SplitLeases));
    }
    if let Some(at) = plan.fixed_at {
        steps.push((at, Step::Fix));
    }
    if let Some(at) = plan.gave_up_at {
        steps.push((at, Step::GiveUp));
    }

    for (at, which, down) in &plan.crashes {
        steps.push((*at, Step::Crash(*which, *down)));
    }
    for (at, which, period) in &plan.pauses {
        steps.push((*at, Step::Pause(*which, *period)));
    }
    for (at, which, of, period) in &plan.cuts {
        steps.push((*at, Step::Cut(*which, *of, *period)));
    }
    for (at, which) in &plan.restarts {
        steps.push((*at, Step::Restart(*which)));
    }
    steps.push((plan.fault_phase, Step::Heal));
    // Stable: a step at the same moment as healing keeps its place before or after it.
    steps.sort_by_key(|(at, _)| *at);
    steps
}

/// Records what the world outside chatter receives: the events, the reserved messages and the
/// dead letters (acked at once; duplicates counted).
async fn watch(broker: &InMemoryBroker, seen: &Arc<Mutex<Seen>>) {
    let destinations = [
        EVENTS.to_owned(),
        RESERVED.to_owned(),
        TRIGGERED.to_owned(),
        NOTICES.to_owned(),
        // SimPlace's dead letters are the operator's (`replay_dead_letters`).
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
                        seen.events.push((key, message.message_id.clone()));
                        seen.event_bodies
                            .push((message.message_id.clone(), message.body.clone()));
                    } else if message.destination == TRIGGERED {
                        let tenant = body["tenant"].as_str().unwrap_or_default().to_owned();
                        let trigger = body["trigger"].as_str().unwrap_or_default().to_owned();
                        seen.triggered.push((tenant, trigger));
                    } else if message.destination == RESERVED {
                        *seen.reserved.entry(command).or_default() += 1;
                    } else if message.destination == NOTICES {
                        *seen.notices.entry(command).or_default() += 1;
                    } else {
                        *seen.dead_letters.entry(message.message_id).or_default() += 1;
                    }
                }
                let _ = delivery.ack().await;
            }
        });
    }
}

/// The operator who watches SimPlace's dead letters (at the default attempt limit, faults can
/// exhaust a command's attempts) and replays each one as soon as it is there, through the
/// broker's dead-letter interface, as `chatter dead-letters replay --all` does: listed, then
/// each one taken where it was listed.
async fn replay_dead_letters(
    broker: InMemoryBroker,
    seen: Arc<Mutex<Seen>>,
    history: Arc<History>,
) {
    use chatter_runtime::broker::{DeadLetterAction, DeadLetters};
    let destination = SimPlace::registration().destination;
    loop {
        tokio::time::sleep(Duration::from_millis(150)).await;
        let Ok(listed) = broker.list(destination, 1_000).await else {
            continue;
        };
        if listed.is_empty() {
            continue;
        }
        // Each replay may be delivered as soon as it is sent: recorded from then.
        let sent = Instant::now();
        let Ok(outcome) = broker
            .settle(destination, &listed, DeadLetterAction::Replay)
            .await
        else {
            continue;
        };
        let mut seen = seen.lock().unwrap();
        // A command that does nothing wrong is dead-lettered only past its attempt limit.
        let limit = u64::from(chatter_runtime::constants::DEFAULT_MAX_DELIVERY_ATTEMPTS);
        for letter in &listed {
            if outcome.done.contains(&letter.message_id)
                && letter.attempts.is_none_or(|attempts| attempts < limit)
            {
                seen.replayed_early.push(letter.message_id.clone());
            }
        }
        for id in outcome.done {
            history.harness_at(
                sent,
                usize::MAX,
                format!("the operator replayed the dead letter {id}"),
            );
            *seen.dead_letters.entry(id.clone()).or_default() += 1;
            *seen.replayed.entry(id).or_default() += 1;
        }
    }
}

/// Waits until every command is settled and every Outbox Document published and stamped; a
/// run that does not within [`STALL_BOUND`] stalled.
async fn settle(
    plan: &Plan,
    commands: &[Published],
    triggers: &BTreeMap<String, Vec<String>>,
    broker: &InMemoryBroker,
    cosmos: &CosmosConnection,
    seen: &Arc<Mutex<Seen>>,
    history: &History,
) -> Result<(), String> {
    let deadline = Instant::now() + STALL_BOUND;
    let destinations = [
        SimPlace::registration().destination,
        SimPoison::registration().destination,
        SimReserve::registration().destination,
        SimNotify::registration().destination,
    ];
    let mut operator = Operator::default();
    loop {
        if plan.notices > 0 {
            operator.requeue_notices(cosmos, history).await;
        }
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
                    Kind::Place => c.events.iter().any(|e| !published.contains(e.as_str())),
                    Kind::Reserve => !seen.reserved.contains_key(&c.message.message_id),
                    Kind::Poison => !seen.dead_letters.contains_key(&c.message.message_id),
                    Kind::Notice => !seen.notices.contains_key(&c.message.message_id),
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
                "seed {}: stalled: {STALL_BOUND:?} after healing, {queued} command deliveries \
                 still queued or unsettled, {pending}, not yet published or dead-lettered: \
                 {missing:?}",
                plan.seed
            ));
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

/// The operator gives up every pending notice, as `chatter outbox give-up --destination` does
/// (the CLI's code): each is stamped `undeliverable` with the operator's reason, conditional on
/// the version it read. The requeue after the fix puts them back.
async fn give_up_notices(cosmos: CosmosConnection, history: Arc<History>) {
    use chatter_runtime::operator::{self, Selection};
    let selection = Selection::Destination(NOTICES.to_owned());
    let plan = match operator::plan_give_up(
        &cosmos,
        DATABASE,
        ORDERS,
        &selection,
        "the simulation's operator gave up",
    )
    .await
    {
        Ok(plan) => plan,
        Err(e) => {
            history.harness(
                usize::MAX,
                format!("the operator's give-up read failed: {e}"),
            );
            return;
        }
    };
    // Each write may land as soon as it is sent: recorded from then.
    let sent = Instant::now();
    match operator::apply(&cosmos, DATABASE, ORDERS, &plan).await {
        Ok(applied) => {
            for (change, outcome) in plan.changes.iter().zip(&applied) {
                let what = match &outcome.failed {
                    None => format!("the operator gave up {}", change.message_id),
                    Some(why) => format!(
                        "the operator's give-up of {} failed: {why}",
                        change.message_id
                    ),
                };
                history.harness_at(sent, usize::MAX, what);
            }
        }
        Err(e) => history.harness(usize::MAX, format!("the operator's give-up failed: {e}")),
    }
}

/// The operator of a run with notices: once the broker takes them again, requeues each notice
/// the relays stamped `undeliverable` (through the CLI's code, `chatter outbox requeue
/// --destination`), once: a notice found `undeliverable` again had its verdict overwritten.
#[derive(Default)]
struct Operator {
    requeued: BTreeSet<String>,
    last: Option<Instant>,
}

impl Operator {
    async fn requeue_notices(&mut self, cosmos: &CosmosConnection, history: &History) {
        use chatter_runtime::operator::{self, MessageSource, Selection};
        if self
            .last
            .is_some_and(|at| at.elapsed() < Duration::from_millis(250))
        {
            return;
        }
        self.last = Some(Instant::now());
        let selection = Selection::Destination(NOTICES.to_owned());
        let Ok(mut plan) = operator::plan_requeue(
            cosmos,
            DATABASE,
            ORDERS,
            &selection,
            MessageSource::Document,
            false,
        )
        .await
        else {
            return;
        };
        plan.changes
            .retain(|change| !self.requeued.contains(&change.message_id));
        if plan.changes.is_empty() {
            return;
        }
        // One write at a time, each recorded from when it was sent (it may land at once): a
        // requeue excuses a republish only from its own write on.
        for change in &plan.changes {
            let one = operator::RepairPlan {
                changes: vec![change.clone()],
                ..operator::RepairPlan::default()
            };
            let sent = Instant::now();
            if let Ok(applied) = operator::apply(cosmos, DATABASE, ORDERS, &one).await {
                for outcome in &applied {
                    history.harness_at(
                        sent,
                        usize::MAX,
                        format!("the operator requeued {}: {outcome:?}", change.message_id),
                    );
                }
                self.requeued.insert(change.message_id.clone());
            }
        }
    }
}
