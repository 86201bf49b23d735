//! Named probes, as FoundationDB's code probes: the windows where a promise is at stake,
//! counted per run from its history, so a harness that stops reaching one is seen
//! (`probes_are_reached` in `main.rs` fails when one of [`PROBES`] is never hit, but for
//! those in [`RARE`]: counted in every chunk's summary, too rare for a few seeds to hit surely).

use std::collections::BTreeMap;
use std::time::Duration;

use super::check::Ended;
use super::commands::{Recorder, RunEnd};
use super::history::Event;
use super::run::{Family, Plan, Published};

/// Every probe, with what it counts.
pub const PROBES: &[(&str, &str)] = &[
    (
        "crash after publish, before stamp",
        "an incarnation published a document and crashed before it wrote that document's stamp",
    ),
    (
        "zombie past its lease",
        "an instance paused past the lease expiry (3 s), so its leases moved, and resumed",
    ),
    (
        "write applied after its client gave up",
        "a store write held past the client's timeout (an answer held, or a cut-off) that \
         took effect later",
    ),
    (
        "claim ran out mid-handler",
        "a standalone-inbox handler still running when its claim ended",
    ),
    (
        "publish held past its timeout",
        "an instance cut off from the broker, its publish reaching the broker after it gave up",
    ),
    (
        "paused between a refusal and its stamp",
        "an instance paused inside a publish the broker refused for good, past the fix, the \
         operator's requeue and another instance's take-over, before its undeliverable stamp",
    ),
    (
        "requeued by the operator",
        "a document stamped undeliverable, requeued through the CLI's code once the broker was \
         fixed, and published",
    ),
    (
        "rolling restart",
        "an instance stopped gracefully and started again while others worked",
    ),
    (
        "second publish after a failed stamp",
        "one incarnation's relay published a document again, its own stamp of it having failed \
         (the catalog's Drain Suspension rows republish then)",
    ),
    (
        "recovery under faults",
        "a recovery-family run: take-overs while faults go on",
    ),
    (
        "split mid-run",
        "the monitored containers' partition split while commands ran",
    ),
    (
        "lease container split mid-run",
        "a partition of every lease container split while the processors held their leases",
    ),
    (
        "delivery taken back by a channel close",
        "a channel closed while it held a delivery (in a key lane or its handler running): \
         the broker delivered it again, the held copy stale",
    ),
    (
        "redelivered past its ack wait while held",
        "on a broker that counts deliveries (JetStream), a delivery whose progress signals were \
         lost, delivered again while its handler ran or waited for its key",
    ),
    (
        "given up by the operator",
        "a pending notice stamped undeliverable by the operator's give-up (the CLI's code) \
         while relays worked, requeued after the fix, and published",
    ),
    (
        "dead letter replayed by the operator",
        "a command that does nothing wrong dead-lettered after faults failed its five attempts, \
         replayed by the operator mid-run (its writes must still apply once)",
    ),
    (
        "settlement lost with its channel",
        "an ack or a nack lost with its channel (heard or not): the message delivered again",
    ),
];

/// Probes reached in about one run in ten or fewer, however the seed is chosen (they need a
/// rare interleaving, not only a plan): reported, not required of the probe seeds.
pub const RARE: &[&str] = &[
    "second publish after a failed stamp",
    // A broker cut-off longer than the publish timeout (3 s) with a publish under way: about
    // one run in sixty.
    "publish held past its timeout",
    // Reached only when a notice is still pending at the give-up's moment, a race with the
    // commands' timing: 315 runs in 4,500 of the long run, but 0 of the probe seeds' 18 runs in
    // one CI run where it had hit 4 beside a long run.
    "given up by the operator",
    // Needs a command that faults made fail all five attempts, dead-lettered while the
    // operator's replay is still due: 6 runs in the long run's 4,500, none in 500 on 5f8c326,
    // and none of the probe seeds' 18 runs in a CI run (2026-12-06) that had hit it before.
    "dead letter replayed by the operator",
];

/// How many times `plan`'s run hit each probe.
pub fn count(
    plan: &Plan,
    commands: &[Published],
    recorder: &Recorder,
    ended: &Ended,
) -> BTreeMap<&'static str, u64> {
    let mut hits: BTreeMap<&'static str, u64> = PROBES.iter().map(|(name, _)| (*name, 0)).collect();
    let mut hit = |name: &'static str, n: u64| *hits.get_mut(name).expect("a named probe") += n;
    let lease_expiry = Duration::from_secs(3);
    let history = &ended.history;

    // Published, then crashed without a stamp write of it by the same incarnation.
    let mut open: BTreeMap<(usize, u64), Vec<String>> = BTreeMap::new();
    for (_, event) in history {
        match event {
            Event::Publish {
                who,
                message_id,
                outcome,
                ..
            } if outcome.starts_with("published") => {
                open.entry(*who).or_default().push(message_id.clone());
            }
            Event::Stamp {
                who, message_id, ..
            } => {
                if let Some(list) = open.get_mut(who) {
                    list.retain(|m| m != message_id);
                }
            }
            Event::Harness { slot, what } if what.starts_with("crashed") => {
                let unstamped: usize = open
                    .iter()
                    .filter(|((s, _), _)| s == slot)
                    .map(|(_, list)| list.len())
                    .sum();
                hit("crash after publish, before stamp", unstamped as u64);
                open.retain(|(s, _), _| s != slot);
            }
            Event::StoreFault { fault, method, .. }
                if method != "GET"
                    && (*fault == "cut off" || fault.contains("held past the timeout")) =>
            {
                hit("write applied after its client gave up", 1);
            }
            Event::Settle { what, .. } if what.starts_with("taken back by a channel") => {
                hit("delivery taken back by a channel close", 1);
            }
            Event::Settle { what, .. } if what.starts_with("taken back past its ack wait") => {
                hit("redelivered past its ack wait while held", 1);
            }
            Event::Settle { .. } => hit("settlement lost with its channel", 1),
            Event::Publish { outcome, .. } if outcome.contains("past the publish timeout") => {
                hit("publish held past its timeout", 1);
            }
            // One line may hit two probes (a pause inside a refusal, past the lease expiry).
            Event::Harness { what, .. } => {
                if what.starts_with("paused for ")
                    && pause_of(what).is_some_and(|p| p > lease_expiry)
                {
                    hit("zombie past its lease", 1);
                }
                if what.contains("inside a refused publish") {
                    hit("paused between a refusal and its stamp", 1);
                }
                if what.starts_with("stops gracefully") {
                    hit("rolling restart", 1);
                }
                if what.starts_with("the operator requeued") {
                    hit("requeued by the operator", 1);
                }
                if what.starts_with("the operator gave up ") {
                    hit("given up by the operator", 1);
                }
                if what.starts_with("the operator replayed the dead letter") {
                    hit("dead letter replayed by the operator", 1);
                }
            }
            _ => {}
        }
    }
    let outrunning: Vec<&str> = commands
        .iter()
        .filter(|c| c.message.body.contains("firstRunMs"))
        .map(|c| c.message.message_id.as_str())
        .collect();
    let cut_runs = recorder
        .inbox
        .lock()
        .unwrap()
        .iter()
        .filter(|(id, _)| outrunning.contains(&id.as_str()))
        .map(|(_, runs)| runs.ends.iter().filter(|e| **e == RunEnd::Cut).count() as u64)
        .sum();
    hit("claim ran out mid-handler", cut_runs);
    let (_, excused) = super::check::same_process_duplicates(history, &ended.logged);
    hit("second publish after a failed stamp", excused);
    if plan.family == Family::Recovery {
        hit("recovery under faults", 1);
    }
    if plan.split_at.is_some_and(|at| at < plan.fault_phase) {
        hit("split mid-run", 1);
    }
    if plan.lease_split_at.is_some() {
        hit("lease container split mid-run", 1);
    }

    hits
}

/// The pause a history line such as `paused for 3.5s ...` names.
fn pause_of(what: &str) -> Option<Duration> {
    let text = what.strip_prefix("paused for ")?.split(' ').next()?;
    if let Some(ms) = text.strip_suffix("ms") {
        return ms
            .parse::<f64>()
            .ok()
            .map(|ms| Duration::from_secs_f64(ms / 1000.0));
    }
    text.strip_suffix('s')?
        .parse::<f64>()
        .ok()
        .map(Duration::from_secs_f64)
}
