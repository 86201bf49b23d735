//! The invariants every run must keep, checked once it has healed and settled. Each violation
//! names the seed and what broke.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use chatter_runtime::constants::DEFAULT_MAX_DELIVERY_ATTEMPTS;
use chatter_runtime::cosmos::CosmosConnection;
use chatter_runtime::testing::query_all;
use serde_json::Value;

use super::commands::{
    DATABASE, EVENTS, IDEMPOTENCY, LEDGER_ID, NOTICES, ORDERS, POISON_ATTEMPTS, RESERVED, Recorder,
    RunEnd,
};
use super::errors::Logged;
use super::history::{Event, Who, outbox_message_id};
use super::run::{Kind, Plan, Published, Report, STALL_BOUND, Seen};
use super::triggers::{TRIGGERED, TRIGGERS};

/// Outbox Documents still `pending`, in both containers.
pub async fn pending_outbox(cosmos: &CosmosConnection) -> Result<usize, String> {
    let mut pending = 0;
    for container in [ORDERS, IDEMPOTENCY, TRIGGERS] {
        pending += outbox(cosmos, container)
            .await?
            .iter()
            .filter(|doc| doc["status"] == "pending")
            .count();
    }
    Ok(pending)
}

async fn outbox(cosmos: &CosmosConnection, container: &str) -> Result<Vec<Value>, String> {
    all(
        cosmos,
        container,
        "SELECT * FROM c WHERE IS_DEFINED(c.status) AND IS_DEFINED(c.MessageId)",
    )
    .await
}

async fn all(cosmos: &CosmosConnection, container: &str, sql: &str) -> Result<Vec<Value>, String> {
    let client = cosmos
        .container(DATABASE, container)
        .await
        .map_err(|e| format!("container {container}: {e}"))?;
    query_all(&client, sql)
        .await
        .map_err(|e| format!("query {container}: {e}"))
}

/// Per group (a key, a tenant), the ids of `publications` (`(group, id)` in arrival order) in
/// the order of their first publication; and how many distinct ids were published.
fn first_publications(publications: &[(String, String)]) -> (BTreeMap<&str, Vec<&str>>, usize) {
    let mut first: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    let mut counted = BTreeSet::new();
    for (group, id) in publications {
        if counted.insert(id.as_str()) {
            first.entry(group.as_str()).or_default().push(id.as_str());
        }
    }
    (first, counted.len())
}

/// A violation for each group whose first publications are not in the `expected` order.
fn order_breaks(
    what: &str,
    verb: &str,
    expected: &BTreeMap<String, Vec<String>>,
    first: &BTreeMap<&str, Vec<&str>>,
) -> Vec<String> {
    let mut broken = Vec::new();
    for (group, order) in expected {
        let published: Vec<&str> = first.get(group.as_str()).cloned().unwrap_or_default();
        let expected: Vec<&str> = order.iter().map(String::as_str).collect();
        if published != expected {
            broken.push(format!(
                "{what} {group} {verb} {expected:?} but first published {published:?}"
            ));
        }
    }
    broken
}

/// How a run ended: its instances' Error logs, how long it took to settle after healing,
/// whether it stayed quiet after, what the sweep counted as stranded, and its history.
pub struct Ended {
    pub logged: Vec<Logged>,
    pub settled_in: Duration,
    /// What was published after everything settled, if anything was.
    pub quiet: Option<String>,
    /// How the lease containers failed to tile the key space, if they did not in time.
    pub leases: Vec<String>,
    pub stranded: u64,
    pub history: Vec<(Instant, Event)>,
}

/// The Error logs after healing that can say why something stalls: not the poison command's
/// failed attempts, which are its handler's and expected.
pub fn said_after(logged: &[Logged], healed: Instant) -> Vec<&Logged> {
    logged
        .iter()
        .filter(|l| l.at >= healed && !l.text.contains("SimPoison"))
        .collect()
}

/// The first few of `logged`, one per line, for a violation's text.
pub fn listed(logged: Vec<&Logged>) -> String {
    if logged.is_empty() {
        return "none".to_owned();
    }
    let mut text = format!("{}", logged.len());
    for log in logged.iter().take(5) {
        text.push_str(&format!("\n    {}: {}", log.instance, log.text));
    }
    text
}

pub async fn invariants(
    plan: &Plan,
    commands: &[Published],
    triggers: &BTreeMap<String, Vec<String>>,
    cosmos: &CosmosConnection,
    recorder: &Arc<Recorder>,
    seen: &Seen,
    ended: &Ended,
) -> Result<Report, String> {
    let mut broken = Vec::new();
    let ids = |kind: Kind| -> BTreeSet<String> {
        commands
            .iter()
            .filter(|c| c.kind == kind)
            .map(|c| c.message.message_id.clone())
            .collect()
    };
    let places = ids(Kind::Place);
    let poisons = ids(Kind::Poison);
    let reserves = ids(Kind::Reserve);
    let events_of: BTreeMap<&str, &[String]> = commands
        .iter()
        .filter(|c| c.kind == Kind::Place)
        .map(|c| (c.message.message_id.as_str(), c.events.as_slice()))
        .collect();

    // 1. A handled command's batched writes applied exactly once; a failed one's never.
    let ledgers = all(
        cosmos,
        ORDERS,
        &format!("SELECT * FROM c WHERE c.id = '{LEDGER_ID}'"),
    )
    .await?;
    let mut applied: BTreeMap<String, usize> = BTreeMap::new();
    let mut commit_order: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for ledger in &ledgers {
        let key = ledger["orderId"].as_str().unwrap_or_default().to_owned();
        let list: Vec<String> = ledger["applied"]
            .as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|v| v.as_str().map(str::to_owned))
                    .collect()
            })
            .unwrap_or_default();
        for id in &list {
            *applied.entry(id.clone()).or_default() += 1;
        }
        // A batch's events in the order its handler sent them, batches in commit order.
        let events = list
            .iter()
            .flat_map(|id| events_of.get(id.as_str()).copied().unwrap_or_default())
            .cloned()
            .collect();
        commit_order.insert(key, events);
    }
    for id in &places {
        match applied.get(id).copied().unwrap_or(0) {
            1 => {}
            n => broken.push(format!("exactly-once: command {id} applied {n} times")),
        }
    }
    for id in applied.keys().filter(|id| !places.contains(*id)) {
        broken.push(format!(
            "exactly-once: {id} applied, though it never succeeds"
        ));
    }

    // 2. Every committed Outbox Document published and stamped delivered: none pending, none
    //    undeliverable (every document of the workload can be delivered).
    // Read once: the orders container's documents also say what each event committed.
    let mut committed: BTreeMap<String, String> = BTreeMap::new();
    for container in [ORDERS, IDEMPOTENCY, TRIGGERS] {
        for doc in outbox(cosmos, container).await? {
            if doc["status"] != "delivered" {
                let message_id = doc["MessageId"].as_str().unwrap_or_default();
                broken.push(format!(
                    "outbox: {container} document {message_id} is `{}`, not delivered{}",
                    doc["status"],
                    verdict_story(&ended.history, message_id)
                ));
            }
            if container == ORDERS
                && let (Some(id), Some(body)) =
                    (doc["MessageId"].as_str(), doc["MessageBody"].as_str())
            {
                committed.insert(id.to_owned(), body.to_owned());
            }
        }
    }
    let published: BTreeSet<&str> = seen.events.iter().map(|(_, e)| e.as_str()).collect();
    for (id, events) in &events_of {
        for event in *events {
            if !published.contains(event.as_str()) {
                broken.push(format!(
                    "at-least-once: the event {event} of {id} was never published"
                ));
            }
        }
    }

    // Every published event was committed, and carried the body committed.
    for (event, body) in &seen.event_bodies {
        match committed.get(event) {
            None => broken.push(format!(
                "committed: {event} was published but no Outbox Document of it exists"
            )),
            Some(stored) if stored != body => broken.push(format!(
                "committed: {event} was published with {body}, committed with {stored}"
            )),
            Some(_) => {}
        }
    }
    for id in &reserves {
        if !seen.reserved.contains_key(id) {
            broken.push(format!(
                "at-least-once: the message {id} sent was never published"
            ));
        }
    }

    // 3. Per key, first publications in commit order; the standalone relay's, per tenant, in
    //    the order the other service wrote them.
    let (first, published_events) = first_publications(&seen.events);
    broken.extend(order_breaks(
        "order: key",
        "committed",
        &commit_order,
        &first,
    ));
    let (first_triggered, published_triggers) = first_publications(&seen.triggered);
    broken.extend(order_breaks(
        "order (standalone relay): tenant",
        "wrote",
        triggers,
        &first_triggered,
    ));

    // 4. No inbox handler twice at once; every one completed; reruns only after a run that
    //    did not finish, or (the README's edge) one whose completion was not written.
    // The inbox assumes no process pauses past its claim while its handler runs (its
    // chapter says so): an overlap where an instance running it was paused is that edge.
    for overlap in recorder.overlaps.lock().unwrap().iter() {
        let paused = overlap
            .running
            .iter()
            .any(|slot| paused_before(&ended.history, *slot, overlap.at));
        if !paused {
            broken.push(format!(
                "inbox: {}'s handler ran twice at the same time (running on {:?}, started \
                 again on {})",
                overlap.id, overlap.running, overlap.started_on
            ));
        }
    }
    let markers = all(
        cosmos,
        IDEMPOTENCY,
        "SELECT * FROM c WHERE IS_DEFINED(c.Completed)",
    )
    .await?;
    let completed: BTreeSet<String> = markers
        .iter()
        .filter(|m| m["Completed"] == true)
        .filter_map(|m| m["MessageId"].as_str().map(str::to_owned))
        .collect();
    let mut reruns_after_finish = 0;
    {
        let inbox = recorder.inbox.lock().unwrap();
        for id in &reserves {
            if !completed.contains(id) {
                broken.push(format!("inbox: {id}'s marker is not completed"));
            }
            let ends = inbox.get(id).map(|r| r.ends.clone()).unwrap_or_default();
            if !ends.contains(&RunEnd::Finished) {
                broken.push(format!("inbox: {id}'s handler never finished ({ends:?})"));
            }
            let finished_before_last = ends
                .iter()
                .take(ends.len().saturating_sub(1))
                .filter(|e| **e == RunEnd::Finished)
                .count();
            reruns_after_finish += finished_before_last;
        }
    }

    // 5. Dead letters only of commands whose handler failed every attempt, or, of SimPlace
    //    (at the default attempt limit), whose attempts faults failed: the operator replays
    //    those, and 1 holds for them all the same.
    for id in &seen.replayed_early {
        broken.push(format!(
            "dead letter: {id} dead-lettered before its {DEFAULT_MAX_DELIVERY_ATTEMPTS} attempts"
        ));
    }
    for (id, copies) in &seen.dead_letters {
        if !poisons.contains(id) && !seen.replayed.contains_key(id) {
            broken.push(format!(
                "dead letter: {id} ({copies} copies), which never fails"
            ));
        }
    }
    {
        let runs = recorder.poison_runs.lock().unwrap();
        for id in &poisons {
            let ran = runs.get(id).copied().unwrap_or(0);
            if seen.dead_letters.contains_key(id) && ran < POISON_ATTEMPTS {
                broken.push(format!(
                    "dead letter: {id} dead-lettered after {ran} runs, not {POISON_ATTEMPTS}"
                ));
            }
        }
    }

    // 6. Nothing stalls: a healed run settles within STALL_BOUND, whatever it logged; and
    //    stays quiet once settled. No document was stranded: a lease's checkpoint passed a
    //    pending document, which the sweep found (counted in health, logged, repaired):
    //    nothing in a run skips a document, so that is a drain's defect.
    if ended.settled_in > STALL_BOUND {
        broken.push(format!(
            "stall: settled {:?} after healing (more than {STALL_BOUND:?})",
            ended.settled_in
        ));
    }
    broken.extend(ended.quiet.clone());
    let stranded_logs = ended
        .logged
        .iter()
        .filter(|l| l.text.contains("behind the checkpoint"))
        .count() as u64;
    // The counter, polled, can miss a crashed incarnation's last finding; its log cannot.
    if ended.stranded.max(stranded_logs) > 0 {
        let said: Vec<&Logged> = ended
            .logged
            .iter()
            .filter(|l| l.text.contains("behind the checkpoint"))
            .collect();
        broken.push(format!(
            "stranded: the sweep counted {} document(s) a lease read past; its logs: {}",
            ended.stranded.max(stranded_logs),
            listed(said)
        ));
    }

    // 7. One incarnation of one instance publishes a document once, unless its own attempt
    //    failed in a way that leaves the outcome unknown to it: its publish's confirm was lost
    //    or held, or it was paused or cut off meanwhile (its timeouts then fire on calls that
    //    took effect); or its relay's stamp of the document failed (a Confirmation Failure, by
    //    its Error log, the store showing that stamp failed or never answered: the catalog's
    //    Drain Suspension rows republish then); or an operator requeued it meanwhile. Publish
    //    after commit keeps what it published: its own failed stamp is no excuse.
    broken.extend(same_process_duplicates(&ended.history, &ended.logged).0);

    // 8. The lease containers' end state: per processor and monitored container, the live
    //    leases tile the key space, one per range (none left of a parent after a split).
    broken.extend(ended.leases.iter().cloned());

    if !broken.is_empty() {
        return Err(format!("seed {}: {}", plan.seed, broken.join("\n  ")));
    }
    Ok(Report {
        duplicate_publications: seen.events.len() - published_events + seen.triggered.len()
            - published_triggers,
        inbox_reruns_after_finish: reruns_after_finish,
        ..Report::default()
    })
}

/// What the history says of a document that did not end delivered: a publish the broker
/// accepted, and the operator's requeue, mean a later stamp overwrote that verdict.
fn verdict_story(history: &[(Instant, Event)], message_id: &str) -> String {
    let accepted = history.iter().any(|(_, event)| {
        matches!(event, Event::Publish { message_id: m, outcome, .. }
            if m == message_id && outcome.starts_with("published"))
    });
    let requeued = history.iter().any(|(_, event)| {
        matches!(event, Event::Harness { what, .. }
            if what.starts_with(&format!("the operator requeued {message_id}:")))
    });
    match (accepted, requeued) {
        (true, true) => " (requeued by the operator and published since: a stamp overwrote \
                          the delivered verdict)"
            .to_owned(),
        (true, false) => {
            " (the broker accepted a publish of it: a stamp overwrote that verdict)".to_owned()
        }
        _ => String::new(),
    }
}

/// Whether instance `slot` was paused shortly before `at`: within a claim and the longest pause
/// (its handler could have been stopped by it past its claim).
fn paused_before(history: &[(Instant, Event)], slot: usize, at: Instant) -> bool {
    let reach = Duration::from_secs(12);
    history.iter().any(|(when, event)| {
        *when <= at
            && at.duration_since(*when) <= reach
            && matches!(event, Event::Harness { slot: s, what } if *s == slot
                && what.starts_with("paused"))
    })
}

/// Publications of one document by one incarnation beyond its first without a reason for it in
/// the history (see invariant 7), and how many had no reason but a failed stamp of the relay's
/// own (the Confirmation Failure its Error log names, or a page cancelled after publishing).
pub fn same_process_duplicates(
    history: &[(Instant, Event)],
    logged: &[Logged],
) -> (Vec<String>, u64) {
    let outbox_destinations = [EVENTS, RESERVED, TRIGGERED, NOTICES];
    type ByDocument = BTreeMap<(Who, String), Vec<Instant>>;
    // (who, message id) -> the moments it was handed to the broker.
    let mut publishes = ByDocument::new();
    // Publishes whose outcome the publisher could not know (a lost or held confirm).
    let mut ambiguous = ByDocument::new();
    // Writes of the document by the incarnation that failed: a stamp's fault, or a status
    // other than 412 (which counts as stamped by someone).
    let mut stamp_failed = ByDocument::new();
    // Stamps that landed (or met another's, 412): a failed attempt before one of them, a retry
    // inside the SDK, was no failure its client heard.
    let mut stamp_landed = ByDocument::new();
    let mut zombie: BTreeMap<usize, Vec<Instant>> = BTreeMap::new();
    // The operator's requeues, by message id: each asks for a publish again, whatever
    // published it before (a notice published after the broker was fixed, while a publish
    // refused before the fix stamped it `undeliverable`: the verdict stands, and the operator
    // requeues it; seed 7000121).
    let mut requeued: BTreeMap<String, Vec<Instant>> = BTreeMap::new();
    for (at, event) in history {
        match event {
            Event::Publish {
                who,
                message_id,
                destination,
                outcome,
            } if outbox_destinations.contains(&destination.as_str()) => {
                if outcome.starts_with("refused") {
                    continue;
                }
                let key = (*who, message_id.clone());
                if outcome.contains("confirm lost") || outcome.contains("held") {
                    ambiguous.entry(key.clone()).or_default().push(*at);
                }
                publishes.entry(key).or_default().push(*at);
            }
            // A write of an Outbox Document (`.../docs/outbox:<base64url of its id>`) that met a
            // fault the client hears as a failure (a delay is none).
            Event::StoreFault {
                who,
                method,
                path,
                fault,
            } if method != "GET" && *fault != "store delay" => {
                if let Some(message_id) = outbox_message_id(path) {
                    stamp_failed
                        .entry((*who, message_id))
                        .or_default()
                        .push(*at);
                }
            }
            Event::Stamp {
                who,
                message_id,
                status,
                ..
            } => {
                let key = (*who, message_id.clone());
                if *status >= 400 && *status != 412 {
                    stamp_failed.entry(key).or_default().push(*at);
                } else {
                    stamp_landed.entry(key).or_default().push(*at);
                }
            }
            Event::Harness { slot, what }
                if what.starts_with("paused") || what.starts_with("cut off") =>
            {
                zombie.entry(*slot).or_default().push(*at);
            }
            // Only a requeue that was applied (the CLI's outcome without a failure).
            Event::Harness { what, .. }
                if what.starts_with("the operator requeued ") && what.contains("failed: None") =>
            {
                if let Some(message_id) = what
                    .strip_prefix("the operator requeued ")
                    .and_then(|rest| rest.split(": ").next())
                {
                    requeued.entry(message_id.to_owned()).or_default().push(*at);
                }
            }
            _ => {}
        }
    }
    let mut broken = Vec::new();
    let mut by_failed_stamp = 0;
    for (key, times) in &publishes {
        let ((slot, incarnation), message_id) = key;
        for pair in times.windows(2) {
            let (first, again) = (pair[0], pair[1]);
            // Since the first publish, before this one (its own outcome is not its excuse).
            let between = |at: &ByDocument| {
                at.get(key)
                    .is_some_and(|t| t.iter().any(|t| *t >= first && *t < again))
            };
            let unknown_outcome = between(&ambiguous)
                || zombie
                    .get(slot)
                    .is_some_and(|t| t.iter().any(|t| *t >= first && *t <= again));
            let asked_again = requeued
                .get(message_id)
                .is_some_and(|t| t.iter().any(|t| *t >= first && *t < again));
            if unknown_outcome || asked_again {
                continue;
            }
            let failed = stamp_failed.get(key).is_some_and(|failures| {
                failures.iter().any(|failed| {
                    *failed >= first
                        && *failed < again
                        && !stamp_landed
                            .get(key)
                            .is_some_and(|landed| landed.iter().any(|l| l > failed && *l < again))
                })
            });
            // The relay's own stamp failed: its page failed with a Confirmation Failure of this
            // message (logged at Error, by the instance's thread), or was cancelled after
            // publishing; it publishes the document again. The store shows the failed stamp; or,
            // for the Confirmation Failure that names this message, shows no answer to any
            // stamp of it at all: a stamp that timed out unanswered (its instance starved, its
            // request held) leaves no trace there (seed 9000295 of the long run: unanswered for
            // the 5 s store timeout, no fault injected). A cancelled page names no message: it
            // excuses only a failure the store shows.
            let unanswered = !stamp_landed
                .get(key)
                .is_some_and(|landed| landed.iter().any(|l| *l >= first && *l < again));
            let said_by_it = |text: &str| {
                logged.iter().any(|log| {
                    log.at >= first
                        && log.at < again
                        && log.instance.rsplit('-').next() == Some(slot.to_string().as_str())
                        && log.text.contains(text)
                })
            };
            let confirmation =
                format!("'{message_id}' was published but stamping it delivered failed");
            let relay_stamp_failed = ((failed || unanswered) && said_by_it(&confirmation))
                || (failed && said_by_it("was cancelled after publishing"));
            if relay_stamp_failed {
                by_failed_stamp += 1;
                continue;
            }
            broken.push(format!(
                "same process: instance {slot}#{incarnation} published {message_id} again {:?} \
                 after its first publish, though its publish did not fail{}",
                again.duration_since(first),
                if failed {
                    " (a stamp failed, but not the relay's: publish after commit keeps what it \
                     published, and its relay only stamps it)"
                } else {
                    " and neither did its stamp"
                }
            ));
            // What the instance said meanwhile: the attribution above reads these.
            let said: Vec<&str> = logged
                .iter()
                .filter(|log| {
                    log.at >= first
                        && log.at <= again
                        && log.instance.rsplit('-').next() == Some(slot.to_string().as_str())
                })
                .map(|log| log.text.as_str())
                .collect();
            if let Some(last) = broken.last_mut() {
                last.push_str(&format!("\n  its Error logs meanwhile: {said:?}"));
            }
        }
    }
    (broken, by_failed_stamp)
}

/// Waits up to `within` for every lease container to tile the key space once per processor
/// and monitored container; what still does not, once that time is up.
pub async fn leases_tile(
    cosmos: &CosmosConnection,
    within: Duration,
) -> Result<Vec<String>, String> {
    let deadline = Instant::now() + within;
    loop {
        let mut broken = Vec::new();
        for container in super::run::lease_containers() {
            broken.extend(lease_tiling(cosmos, container).await?);
        }
        if broken.is_empty() || Instant::now() > deadline {
            return Ok(broken
                .into_iter()
                .map(|b| format!("{b} ({within:?} after everything was published)"))
                .collect());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Violations of the lease container's end state: per (processor, monitored container), the
/// leases' feed ranges must tile `""..FF` exactly.
async fn lease_tiling(cosmos: &CosmosConnection, container: &str) -> Result<Vec<String>, String> {
    let leases = all(
        cosmos,
        container,
        "SELECT * FROM c WHERE IS_DEFINED(c.feedRange)",
    )
    .await?;
    let mut groups: BTreeMap<(String, String), Vec<(String, String)>> = BTreeMap::new();
    for lease in &leases {
        let group = (
            lease["processorName"]
                .as_str()
                .unwrap_or_default()
                .to_owned(),
            lease["monitoredContainer"]
                .as_str()
                .unwrap_or_default()
                .to_owned(),
        );
        let range = (
            lease["feedRange"]["min"]
                .as_str()
                .unwrap_or_default()
                .to_owned(),
            lease["feedRange"]["max"]
                .as_str()
                .unwrap_or_default()
                .to_owned(),
        );
        groups.entry(group).or_default().push(range);
    }
    let mut broken = Vec::new();
    for ((processor, scope), mut ranges) in groups {
        ranges.sort();
        let mut at = String::new();
        let mut tiles = true;
        for (min, max) in &ranges {
            tiles &= *min == at;
            at.clone_from(max);
        }
        if !tiles || !at.eq_ignore_ascii_case("FF") {
            broken.push(format!(
                "leases: {container}'s leases of {processor} on {scope} do not tile the key \
                 space once each: {ranges:?}"
            ));
        }
    }
    Ok(broken)
}
