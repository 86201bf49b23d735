//! The invariants every run must keep, checked once it has healed and settled. Each violation
//! names the seed and what broke.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use chatter_runtime::cosmos::CosmosConnection;
use chatter_runtime::testing::query_all;
use serde_json::Value;

use super::commands::{
    DATABASE, IDEMPOTENCY, LEDGER_ID, ORDERS, POISON_ATTEMPTS, Recorder, RunEnd,
};
use super::errors::Logged;
use super::run::{Kind, Plan, Published, Report, STALL_BOUND, Seen};
use super::triggers::TRIGGERS;

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

/// How a run ended: its instances' Error logs, and when it healed and settled.
pub struct Ended {
    pub logged: Vec<Logged>,
    pub healed: Instant,
    pub settled_in: Duration,
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
        commit_order.insert(key, list);
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
    for container in [ORDERS, IDEMPOTENCY, TRIGGERS] {
        for doc in outbox(cosmos, container).await? {
            if doc["status"] != "delivered" {
                broken.push(format!(
                    "outbox: {container} document {} is `{}`, not delivered",
                    doc["MessageId"], doc["status"]
                ));
            }
        }
    }
    let published: BTreeSet<&str> = seen.events.iter().map(|(_, c)| c.as_str()).collect();
    for id in &places {
        if !published.contains(id.as_str()) {
            broken.push(format!(
                "at-least-once: the event of {id} was never published"
            ));
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
    for id in recorder.overlaps.lock().unwrap().iter() {
        broken.push(format!("inbox: {id}'s handler ran twice at the same time"));
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

    // 5. Dead letters only of commands whose handler failed every attempt.
    for (id, copies) in &seen.dead_letters {
        if !poisons.contains(id) {
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

    // 6. Nothing stalls without a word: a run slower than STALL_BOUND to settle after healing
    //    logged at Error why, after healing. And no document was stranded: a lease's
    //    checkpoint passed a pending document, which the sweep found (and logged, and
    //    repaired): nothing in a run skips a document, so that is a drain's defect.
    if ended.settled_in > STALL_BOUND && said_after(&ended.logged, ended.healed).is_empty() {
        broken.push(format!(
            "stall: settled {:?} after healing (more than {STALL_BOUND:?}) without an Error log",
            ended.settled_in
        ));
    }
    for log in ended
        .logged
        .iter()
        .filter(|l| l.text.contains("behind the checkpoint"))
    {
        broken.push(format!(
            "stranded: the sweep found a document a lease read past ({}: {})",
            log.instance, log.text
        ));
    }

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
