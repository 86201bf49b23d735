//! `outbox requeue` and `outbox give-up`: the change is planned and shown first, applied only
//! once confirmed (or `--yes`), never with `--dry-run`.

use chatter_runtime::cosmos::CosmosConnection;
use chatter_runtime::operator::{
    AppliedChange, RepairPlan, Selection, apply, plan_give_up, plan_requeue,
};
use clap::Args;
use serde::Serialize;

use super::Source;
use crate::commands::{Confirm, Container, confirmed, read_failed};
use crate::failure::Failure;
use crate::tables::{columns, counted};

#[derive(Debug, Args)]
pub(crate) struct Requeue {
    #[command(flatten)]
    pub(super) at: Container,
    #[command(flatten)]
    select: RequeueSelection,
    /// Requeue documents that still violate the contract too (a relay that publishes each
    /// document as its message checks them again and stamps them `undeliverable` again unless
    /// the violation no longer applies).
    #[arg(long, conflicts_with = "body_resolver")]
    force: bool,
    #[command(flatten)]
    source: Source,
    #[command(flatten)]
    confirm: Confirm,
}

#[derive(Debug, Args)]
#[group(required = true, multiple = false)]
struct RequeueSelection {
    /// These documents (document id or message id; repeat the flag for several).
    #[arg(long = "id")]
    ids: Vec<String>,
    /// Every undeliverable document for this destination.
    #[arg(long)]
    destination: Option<String>,
    /// Every undeliverable document with a violation containing this text (needs `--force`:
    /// they still violate it).
    #[arg(long, conflicts_with = "body_resolver")]
    violation: Option<String>,
}

#[derive(Debug, Args)]
pub(crate) struct GiveUp {
    #[command(flatten)]
    pub(super) at: Container,
    #[command(flatten)]
    select: GiveUpSelection,
    /// Why, kept in the document (`chatterOperatorReason`) for whoever looks next.
    #[arg(long)]
    reason: String,
    #[command(flatten)]
    confirm: Confirm,
}

#[derive(Debug, Args)]
#[group(required = true, multiple = false)]
struct GiveUpSelection {
    /// These documents (document id or message id; repeat the flag for several).
    #[arg(long = "id")]
    ids: Vec<String>,
    /// Every pending document for this destination.
    #[arg(long)]
    destination: Option<String>,
}

/// `outbox requeue`: plans the requeue of the selected documents, then runs the plan.
pub(super) async fn requeue(
    cosmos: &CosmosConnection,
    requeue: &Requeue,
    json: bool,
) -> Result<u8, Failure> {
    let selection = match &requeue.select {
        RequeueSelection {
            destination: Some(d),
            ..
        } => Selection::Destination(d.clone()),
        RequeueSelection {
            violation: Some(v), ..
        } => Selection::Violation(v.clone()),
        RequeueSelection { ids, .. } => Selection::Ids(ids.clone()),
    };
    let at = &requeue.at;
    let plan = plan_requeue(
        cosmos,
        &at.database,
        &at.container,
        &selection,
        requeue.source.message_source(),
        requeue.force,
    )
    .await
    .map_err(|error| read_failed("the outbox", at, &error))?;
    run_plan(cosmos, at, json, "requeue", plan, &requeue.confirm).await
}

/// `outbox give-up`: refuses an empty reason, plans giving up the selected documents, then runs
/// the plan.
pub(super) async fn give_up(
    cosmos: &CosmosConnection,
    give_up: &GiveUp,
    json: bool,
) -> Result<u8, Failure> {
    if give_up.reason.trim().is_empty() {
        return Err(Failure::Input(
            "--reason must say why (it is kept in the document)".into(),
        ));
    }
    let selection = match &give_up.select {
        GiveUpSelection {
            destination: Some(d),
            ..
        } => Selection::Destination(d.clone()),
        GiveUpSelection { ids, .. } => Selection::Ids(ids.clone()),
    };
    let at = &give_up.at;
    let plan = plan_give_up(
        cosmos,
        &at.database,
        &at.container,
        &selection,
        give_up.reason.trim(),
    )
    .await
    .map_err(|error| read_failed("the outbox", at, &error))?;
    run_plan(cosmos, at, json, "give-up", plan, &give_up.confirm).await
}

/// What a repair command prints with `--json`.
#[derive(Serialize)]
struct Report<'a> {
    plan: &'a RepairPlan,
    dry_run: bool,
    /// `None` when nothing was written (a dry run, declined, nothing to change).
    applied: Option<Vec<AppliedChange>>,
}

/// Shows `plan` (what `verb` changes), asks, applies it. Exit code 0 when every selected document
/// was changed (or would be, in a dry run), 1 when one was refused, not found or failed, or the
/// change was declined.
async fn run_plan(
    cosmos: &CosmosConnection,
    at: &Container,
    json: bool,
    verb: &str,
    plan: RepairPlan,
    confirm: &Confirm,
) -> Result<u8, Failure> {
    let problems = !plan.refused.is_empty() || !plan.not_found.is_empty();
    let report = |applied: Option<Vec<AppliedChange>>| {
        if json {
            let report = Report {
                plan: &plan,
                dry_run: confirm.dry_run,
                applied,
            };
            match serde_json::to_string_pretty(&report) {
                Ok(text) => println!("{text}"),
                Err(error) => eprintln!("chatter: cannot write JSON: {error}"),
            }
        } else if let Some(applied) = applied {
            print!("{}", applied_table(&applied));
        }
    };
    let asking = !plan.changes.is_empty() && !confirm.yes && !confirm.dry_run;
    if !json {
        print!("{}", plan_table(verb, &plan));
    } else if asking {
        // Nobody is asked about a change they were not shown.
        eprint!("{}", plan_table(verb, &plan));
    }
    if plan.changes.is_empty() {
        report(None);
        return Ok(u8::from(problems));
    }
    if confirm.dry_run {
        if !json {
            println!("dry run: nothing was written");
        }
        report(None);
        return Ok(u8::from(problems));
    }
    if !confirm.yes && !confirmed(plan.changes.len())? {
        eprintln!("chatter: nothing was changed");
        report(None);
        return Ok(1);
    }
    let applied = apply(cosmos, &at.database, &at.container, &plan)
        .await
        .map_err(|error| read_failed("the outbox", at, &error))?;
    let failed = applied.iter().any(|change| change.failed.is_some());
    report(Some(applied));
    Ok(u8::from(problems || failed))
}

fn plan_table(verb: &str, plan: &RepairPlan) -> String {
    let mut out = String::new();
    if plan.changes.is_empty() {
        out.push_str(&format!("{verb}: no document to change\n"));
    } else {
        let mut rows = vec![[
            "MESSAGE ID".to_owned(),
            "PARTITION KEY".to_owned(),
            "DESTINATION".to_owned(),
            "STATUS".to_owned(),
            "VIOLATIONS".to_owned(),
        ]];
        for change in &plan.changes {
            rows.push([
                change.message_id.clone(),
                serde_json::to_string(&change.partition_key).unwrap_or_default(),
                change.destination.clone(),
                format!("{} -> {}", change.from, change.to),
                if change.violations.is_empty() {
                    "none".to_owned()
                } else {
                    format!("{} (forced)", change.violations.join("; "))
                },
            ]);
        }
        out.push_str(&format!(
            "{verb} will change {}:\n",
            counted(plan.changes.len(), "document", "documents")
        ));
        out.push_str(&columns(&rows));
    }
    for refused in &plan.refused {
        out.push_str(&format!(
            "refused {} {}: {}\n",
            refused.message_id,
            serde_json::to_string(&refused.partition_key).unwrap_or_default(),
            refused.why
        ));
    }
    for id in &plan.not_found {
        out.push_str(&format!(
            "not found: {id} (no such document in the state {verb} starts from)\n"
        ));
    }
    out
}

fn applied_table(applied: &[AppliedChange]) -> String {
    let mut out = String::new();
    let written = applied.iter().filter(|c| c.failed.is_none()).count();
    for change in applied {
        if let Some(why) = &change.failed {
            out.push_str(&format!("not changed {}: {why}\n", change.id));
        }
    }
    out.push_str(&format!(
        "{written} of {} changed\n",
        counted(applied.len(), "document", "documents")
    ));
    out
}
