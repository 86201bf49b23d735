//! The randomized fault simulation: the real pipeline, consumers, relays and standalone inbox,
//! several instances at once, through store and broker faults and crashes drawn from a seed,
//! with every promise checked at the end of every run.
//!
//! - `ci_seeds_*`: fresh seeds every `.ci/run` runs, within a time budget ([`CHUNK_BUDGET`]
//!   each, in [`CI_CHUNKS`] chunks that nextest runs one at a time): a range of its own each
//!   run, printed (`SIM_CI_FIRST_SEED` runs a given one again). A fresh seed that fails is a
//!   bug: fix it and keep the seed in [`REGRESSION_SEEDS`].
//! - `regression_seeds`: seeds that once found a bug, each named after it.
//! - `probes_are_reached`: [`PROBE_SEEDS`] must hit every named probe (`probes.rs`).
//! - `replay`: `SIM_SEED=<seed>` runs that one seed (with `SIM_LOG=<filter>` its logs,
//!   `SIM_REPEAT=<n>` n times), the command a failing seed prints.
//! - `long_run`: `SIM_SEEDS=<count>` (from `SIM_FIRST_SEED`, default 1,000,000) runs that many;
//!   ignored otherwise. Run it with `cargo test` (`-- --nocapture`): nextest stops this binary's
//!   tests after 10 minutes.
//!
//! What a run is: `run.rs`. Its faults: `faults.rs` (store) and `broker.rs`. Its processes:
//! `instance.rs`. Its workload: `commands.rs` and `triggers.rs` (another service's thin
//! triggers for a standalone relay with a body resolver). Its invariants: `check.rs`, on
//! what `history.rs` recorded. Its probes: `probes.rs`.

mod broker;
mod check;
mod commands;
mod errors;
mod faults;
mod history;
mod instance;
mod probes;
mod rng;
mod run;
mod triggers;

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// How long each CI chunk takes new seeds for (a run under way then finishes).
const CHUNK_BUDGET: Duration = Duration::from_secs(10);
/// Test functions the CI seeds are split over (nextest runs each alone: `.config/nextest.toml`).
const CI_CHUNKS: u64 = 8;
/// Seeds that together hit every probe of `probes.rs` but the rare ones (checked by
/// `probes_are_reached`; most probes are hit by several of them, as a replay differs).
const PROBE_SEEDS: &[u64] = &[1, 5, 6, 13, 23, 109, 139, 6_000_011, 9_000_456];
/// Runs in flight at once inside one test function: most of a run is waiting. A long run alone
/// on the machine takes more (`SIM_AT_ONCE`).
const RUNS_AT_ONCE: u64 = 4;

fn runs_at_once() -> u64 {
    std::env::var("SIM_AT_ONCE")
        .ok()
        .and_then(|n| n.parse().ok())
        .filter(|n| *n >= 1)
        .unwrap_or(RUNS_AT_ONCE)
}

/// Seeds that found a bug once, with what it was. They run side by side like the CI seeds:
/// some bugs show only on a busy machine. The first five were found by the harness before
/// 2026-12-06, whose plans drew other runs from the same seeds: they stay as five more seeds.
const REGRESSION_SEEDS: &[(u64, &str)] = &[
    (
        29,
        "the sweep logged as stranded documents stamped after its query, whose stamps the \
         lease read past before its change-feed read (a false Error, counted in health)",
    ),
    (36, "as seed 29"),
    (
        7,
        "publish after commit took a retry's mark of a document (its command's first batch \
         committed without an answer) for a later batch of the key, and published a later \
         document first: per-key order broken",
    ),
    (77, "as seed 7"),
    (166, "as seed 7"),
    (
        103,
        "with publish after commit's record keeping only the last dispatch of a document \
         (ff00458 undone), the relay here published again a document this process's eager \
         path had published: the same process twice (also seeds 118 and 138; each fails in 2 \
         or 3 runs of 8 with it undone, so every regression seed runs twice)",
    ),
    (118, "as seed 103"),
    (138, "as seed 103"),
    (
        139,
        "an instance paused inside a refused publish stamped its notice `undeliverable` \
         unconditionally once it resumed, over the operator's requeue and another instance's \
         `delivered` stamp (3 runs in 8 before every stamp was conditional)",
    ),
    (
        13,
        "the harness's broker confirmed a publish held by a cut-off when the cut ended, before \
         the held message reached the broker: the publisher's next message overtook it (a false \
         order violation; also seed 82)",
    ),
    (82, "as seed 13"),
    (
        95,
        "publish after commit's stamp failed after the broker confirmed, and the relay in the \
         same process published the document again (before the Published state)",
    ),
    (
        137,
        "as seed 139: a stale `undeliverable` stamp over a requeued and delivered notice (also \
         seed 148)",
    ),
    (148, "as seed 137"),
    (
        7_000_121,
        "one relay published a notice that another's earlier refusal then stamped \
         `undeliverable` (its delivered stamp met the verdict, which stands); the operator \
         requeued it and the first relay published it again: the same-process check took the \
         requeue for no reason",
    ),
    (
        7_001_070,
        "two pauses of one instance overlapped: the second began when the first ended, but the \
         harness took it to end 200 ms sooner, so the zombie it released published inside the \
         quiet second (a false quiescence violation)",
    ),
    (
        6_000_156,
        "the SDK's emulator replicated each document of a batch to the read region on a timer \
         of its own: a change feed read there saw part of a batch, and the relay's \
         continuation passed over the rest (the sweep found it stranded); a harness defect, \
         fixed in chatter-emulator",
    ),
    (
        9_079_873,
        "a page waited 5 s for publish after commit's undeliverable stamp (held past the \
         timeout), meanwhile the page read ahead held the operator's requeue of the notice; the \
         first page's delivered stamp met the requeue and landed over it, and the page read ahead \
         published the requeue again: the same process twice (2 runs of 24 before the relay \
         remembered the versions of the message its stamps met)",
    ),
    (
        9_104_127,
        "an inbox handler past its timeout stayed alive (not polled) while its attempt released \
         the claim, a release held by a cut from the store; another instance took the claim \
         over meanwhile: an overlap by the harness's count (3 runs of 24 before the handler's \
         future was dropped as it settled)",
    ),
    (
        9_115_815,
        "an instance paused between a refused publish of a notice and its undeliverable stamp; \
         the broker was fixed, another instance published the notice, and the paused one's \
         stamp landed before that publish's delivered stamp, which met it and let it stand: a \
         delivered message left undeliverable (0 of 32 replays; the delivered stamp now writes \
         over another relay's refusal)",
    ),
];

// Seeds that showed the publish-after-commit issue's breaks before their fixes, replayed with
// the settings they need (not run by CI: their families are drawn in the default seeds now):
// - per-key order, a stale pending check: `SIM_CONSISTENCY=eventual SIM_AFTER_COMMIT=on`, seeds
//   5013 (on today's harness), 5016 and 5039 (before the instances shared one processor); the
//   test `a_pending_check_read_in_a_lagging_region_at_eventual_consistency_keeps_the_keys_order`
//   shows it every run;
// - the same process publishing twice after its eager stamp failed: seed 214 under the strict
//   check (4 runs in 24, before the instances shared one processor; 0 in 24 since, whose
//   timings differ); the test `a_document_published_after_commit_whose_stamp_failed_is_only_
//   stamped_by_the_relay_here` shows it every run.

fn replay_command(seed: u64) -> String {
    format!(
        "SIM_SEED={seed} SIM_LOG=chatter_runtime=debug cargo nextest run -p chatter-tests \
         --all-features --test simulation replay --no-capture"
    )
}

/// Runs `seeds`, [`runs_at_once`] at a time (taking no new one once `budget` is spent);
/// panics listing every failing seed with the command that replays it. Returns the totals.
fn run_seeds(seeds: impl Iterator<Item = u64> + Send, budget: Option<Duration>) -> Totals {
    logs();
    let seeds = Mutex::new(seeds);
    let failures = Mutex::new(Vec::new());
    let totals = Mutex::new(Totals::default());
    let started = Instant::now();
    std::thread::scope(|scope| {
        for _ in 0..runs_at_once() {
            scope.spawn(|| {
                loop {
                    if budget.is_some_and(|budget| started.elapsed() > budget) {
                        return;
                    }
                    let Some(seed) = seeds.lock().unwrap().next() else {
                        return;
                    };
                    match run::run(seed) {
                        Ok(report) => {
                            if std::env::var_os("SIM_VERBOSE").is_some() {
                                eprintln!(
                                    "seed {seed}: {:?} in all, settled {:?} after healing, {} faults, {} crashes, probes {:?}",
                                    report.took,
                                    report.settled_in,
                                    report.faults.values().sum::<u64>(),
                                    report.crashes,
                                    report.probes.iter().filter(|(_, n)| **n > 0).collect::<Vec<_>>()
                                );
                            }
                            totals.lock().unwrap().add(&report);
                        }
                        Err(violation) => failures
                            .lock()
                            .unwrap()
                            .push(format!("{violation}\n  replay: {}", replay_command(seed))),
                    }
                }
            });
        }
    });
    let totals = totals.into_inner().unwrap();
    eprintln!("{} in {:?}", totals.summary(), started.elapsed());
    let failures = failures.into_inner().unwrap();
    assert!(
        failures.is_empty(),
        "{} seed(s) broke an invariant:\n{}",
        failures.len(),
        failures.join("\n")
    );
    totals
}

#[derive(Default)]
struct Totals {
    runs: u64,
    commands: u64,
    crashes: u64,
    faults: BTreeMap<&'static str, u64>,
    duplicate_publications: u64,
    inbox_reruns_after_finish: u64,
    slowest: Duration,
    probes: BTreeMap<&'static str, u64>,
}

impl Totals {
    fn add(&mut self, report: &run::Report) {
        self.runs += 1;
        self.commands += report.commands as u64;
        self.crashes += report.crashes as u64;
        for (kind, n) in &report.faults {
            *self.faults.entry(kind).or_default() += n;
        }
        self.duplicate_publications += report.duplicate_publications as u64;
        self.inbox_reruns_after_finish += report.inbox_reruns_after_finish as u64;
        self.slowest = self.slowest.max(report.took);
        for (probe, n) in &report.probes {
            *self.probes.entry(probe).or_default() += n;
        }
    }

    fn summary(&self) -> String {
        let faults: u64 = self.faults.values().sum();
        format!(
            "simulation: {} runs passed, {} commands, {} crashes, {faults} faults injected \
             {:?}, {} duplicate publications, {} inbox reruns after a finished run, slowest run \
             {:?}, probes {:?}, violations: 0 (of the passed runs)",
            self.runs,
            self.commands,
            self.crashes,
            self.faults,
            self.duplicate_publications,
            self.inbox_reruns_after_finish,
            self.slowest,
            self.probes
        )
    }
}

/// Installs the binary's `tracing` subscriber: the instances' Error logs always go to
/// [`errors`] (the stall and stranding checks read them); `SIM_LOG=<filter>` also shows the
/// instances' logs (best with one seed: runs side by side mix).
fn logs() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        use tracing_subscriber::Layer as _;
        use tracing_subscriber::filter::LevelFilter;
        use tracing_subscriber::prelude::*;
        let shown = std::env::var("SIM_LOG").ok().map(|filter| {
            let targets: tracing_subscriber::filter::Targets = filter
                .parse()
                .expect("SIM_LOG is a filter like `chatter_runtime=debug`");
            tracing_subscriber::fmt::layer()
                .with_test_writer()
                .with_thread_names(true)
                .with_filter(targets)
        });
        let _ = tracing_subscriber::registry()
            .with(shown)
            .with(errors::Recorder.with_filter(LevelFilter::ERROR))
            .try_init();
    });
}

/// The first seed of this CI run's fresh range: `SIM_CI_FIRST_SEED`, or drawn from the time
/// (the same for every chunk of one run started within the same hour).
fn ci_first_seed() -> u64 {
    if let Some(first) = std::env::var("SIM_CI_FIRST_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
    {
        return first;
    }
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    // Hours since the epoch, spread out: ranges of different hours do not meet.
    10_000_000 + (now.as_secs() / 3600 % 100_000) * CI_CHUNKS * 10_000
}

fn chunk(n: u64) {
    let first = ci_first_seed() + n * 10_000;
    eprintln!(
        "CI chunk {n}: fresh seeds from {first} for {CHUNK_BUDGET:?} (SIM_CI_FIRST_SEED={} \
         runs this range again)",
        ci_first_seed()
    );
    let totals = run_seeds(first.., Some(CHUNK_BUDGET));
    eprintln!("CI chunk {n}: seeds {first}..{}", first + totals.runs);
}

#[test]
fn ci_seeds_0() {
    chunk(0);
}

#[test]
fn ci_seeds_1() {
    chunk(1);
}

#[test]
fn ci_seeds_2() {
    chunk(2);
}

#[test]
fn ci_seeds_3() {
    chunk(3);
}

#[test]
fn ci_seeds_4() {
    chunk(4);
}

#[test]
fn ci_seeds_5() {
    chunk(5);
}

#[test]
fn ci_seeds_6() {
    chunk(6);
}

#[test]
fn ci_seeds_7() {
    chunk(7);
}

#[test]
fn regression_seeds() {
    for (seed, what) in REGRESSION_SEEDS {
        eprintln!("regression seed {seed}: {what}");
    }
    // Twice each: a replay repeats a failure often, not always.
    run_seeds(
        REGRESSION_SEEDS.iter().flat_map(|(seed, _)| [*seed, *seed]),
        None,
    );
}

#[test]
fn probes_are_reached() {
    // Twice each: a window a replay misses (an interleaving) the other run often hits.
    let totals = run_seeds(PROBE_SEEDS.iter().flat_map(|seed| [*seed, *seed]), None);
    let missed: Vec<&str> = probes::PROBES
        .iter()
        .filter(|(name, _)| !probes::RARE.contains(name))
        .filter(|(name, _)| totals.probes.get(name).copied().unwrap_or(0) == 0)
        .map(|(name, what)| {
            eprintln!("probe never hit: {name}: {what}");
            *name
        })
        .collect();
    assert!(
        missed.is_empty(),
        "seeds {PROBE_SEEDS:?} hit no {missed:?}: the harness no longer reaches them"
    );
}

#[test]
fn replay() {
    let Ok(seed) = std::env::var("SIM_SEED") else {
        return;
    };
    let seed: u64 = seed.parse().expect("SIM_SEED is a number");
    eprintln!("{:#?}", run::Plan::draw(seed));
    // `SIM_REPEAT=<n>`: that many runs of it, side by side (a failure that needs a rare
    // interleaving shows in some of them).
    let repeat: usize = std::env::var("SIM_REPEAT")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(1);
    run_seeds(std::iter::repeat_n(seed, repeat), None);
}

#[test]
fn long_run() {
    let Ok(count) = std::env::var("SIM_SEEDS") else {
        return;
    };
    let count: u64 = count.parse().expect("SIM_SEEDS is a number");
    let first: u64 = std::env::var("SIM_FIRST_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(1_000_000);
    run_seeds(first..first + count, None);
}
