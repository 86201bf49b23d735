//! An operator's repairs of a container's Outbox Documents: an `undeliverable` one back to
//! `pending` once its cause is fixed (requeue), a `pending` one the relay cannot get past
//! stamped `undeliverable` (give up). Each is planned first (what will change, what is refused,
//! what was not found), shown, and applied only then, every patch conditional on the ETag read
//! with the plan, so a document the relay stamped meanwhile is left as the relay left it.

use serde::Serialize;
use serde_json::Value;

use super::outbox::MessageSource;
use crate::cosmos::outbox_query::outbox_query;
use crate::cosmos::store::{PatchOp, patch_item_if_match, query_each, read_container_properties};
use crate::cosmos::{CosmosConnection, CosmosStoreError};
use crate::document::is_pending_outbox;
use crate::document::outbox::{
    DESTINATION_FIELD, ID_FIELD, MESSAGE_ID_FIELD, STATUS_PATH, STATUS_PENDING,
    STATUS_UNDELIVERABLE,
};
use crate::partition_key;

pub use crate::document::outbox::OPERATOR_REASON_FIELD;

/// Which documents a repair takes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Selection {
    /// These document ids or message ids.
    Ids(Vec<String>),
    /// Every candidate with this `Destination`.
    Destination(String),
    /// Every candidate one of whose contract violations contains this text (ignoring ASCII
    /// case): a requeue of those is refused unless forced.
    Violation(String),
}

/// What a repair does to one document.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PlannedChange {
    /// The document id.
    pub id: String,
    /// Its `MessageId`.
    pub message_id: String,
    /// Its `Destination`.
    pub destination: String,
    /// Its `status` now.
    pub from: String,
    /// Its `status` after the change.
    pub to: String,
    /// The contract violations found in it now (a forced requeue carries some: the relay will
    /// stamp it undeliverable again unless they no longer apply).
    pub violations: Vec<String>,
    /// Its partition-key values.
    pub partition_key: Vec<Value>,
    #[serde(skip)]
    etag: String,
    #[serde(skip)]
    operations: Vec<PatchOp>,
}

/// A selected document a repair will not touch, and why.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RefusedChange {
    /// The document id.
    pub id: String,
    /// Its `MessageId`.
    pub message_id: String,
    /// Its partition-key values.
    pub partition_key: Vec<Value>,
    /// Why it is left alone.
    pub why: String,
}

/// A repair, planned: nothing is written until [`apply`].
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct RepairPlan {
    /// What will change.
    pub changes: Vec<PlannedChange>,
    /// Selected documents left alone.
    pub refused: Vec<RefusedChange>,
    /// Ids asked for that are no candidate (no such document, or not in the state the repair
    /// starts from).
    pub not_found: Vec<String>,
}

/// What [`apply`] did to one planned change.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct AppliedChange {
    /// The document id.
    pub id: String,
    /// `None` when written; else why not (e.g. it changed since the plan read it).
    pub failed: Option<String>,
}

/// Plans putting the `undeliverable` documents `selection` takes back to `pending`. With
/// [`MessageSource::Document`], one that still violates the Outbox Document Contract is refused
/// unless `force` (the relay checks it again and would stamp it `undeliverable` again); with
/// [`MessageSource::BodyResolver`] the contract is not checked (that relay does not evaluate
/// it) and nothing is refused for it.
///
/// # Errors
///
/// [`CosmosStoreError`]: the container cannot be read.
pub async fn plan_requeue(
    cosmos: &CosmosConnection,
    database: &str,
    container: &str,
    selection: &Selection,
    source: MessageSource,
    force: bool,
) -> Result<RepairPlan, CosmosStoreError> {
    let candidates = candidates(cosmos, database, container, STATUS_UNDELIVERABLE, source).await?;
    let mut plan = RepairPlan::default();
    for candidate in select(candidates, selection, &mut plan) {
        if !candidate.violations.is_empty() && !force {
            plan.refused.push(RefusedChange {
                why: format!(
                    "it still violates the contract ({}); fix the document, or force it (a \
                     relay that publishes the document as its message checks it again); a \
                     container whose relay has a body resolver (thin triggers): pass \
                     --body-resolver, that relay does not check the contract",
                    candidate.violations.join("; ")
                ),
                id: candidate.id,
                message_id: candidate.message_id,
                partition_key: candidate.key,
            });
            continue;
        }
        let mut operations = vec![PatchOp::Set(STATUS_PATH.to_owned(), STATUS_PENDING.into())];
        if candidate.has_reason {
            operations.push(PatchOp::Remove(format!("/{OPERATOR_REASON_FIELD}")));
        }
        plan.changes
            .push(candidate.into_change(STATUS_PENDING, operations));
    }
    Ok(plan)
}

/// Plans stamping the `pending` documents `selection` takes (as the relay sees them: one that
/// only looks pending is no candidate) `undeliverable`, leaving `reason` in
/// [`OPERATOR_REASON_FIELD`]: the way out of a range a document blocks.
///
/// # Errors
///
/// [`CosmosStoreError`]: the container cannot be read.
pub async fn plan_give_up(
    cosmos: &CosmosConnection,
    database: &str,
    container: &str,
    selection: &Selection,
    reason: &str,
) -> Result<RepairPlan, CosmosStoreError> {
    // Giving up takes no account of the contract.
    let candidates = candidates(
        cosmos,
        database,
        container,
        STATUS_PENDING,
        MessageSource::BodyResolver,
    )
    .await?;
    let mut plan = RepairPlan::default();
    for candidate in select(candidates, selection, &mut plan) {
        let operations = vec![
            PatchOp::Set(STATUS_PATH.to_owned(), STATUS_UNDELIVERABLE.into()),
            PatchOp::Set(format!("/{OPERATOR_REASON_FIELD}"), reason.into()),
        ];
        plan.changes
            .push(candidate.into_change(STATUS_UNDELIVERABLE, operations));
    }
    Ok(plan)
}

/// Writes each planned change: one patch per document, only if it is unchanged since the plan
/// read it. A failure of one does not stop the others.
///
/// # Errors
///
/// [`CosmosStoreError`]: the container cannot be reached at all.
pub async fn apply(
    cosmos: &CosmosConnection,
    database: &str,
    container: &str,
    plan: &RepairPlan,
) -> Result<Vec<AppliedChange>, CosmosStoreError> {
    let container = cosmos.container(database, container).await?;
    let mut applied = Vec::with_capacity(plan.changes.len());
    for change in &plan.changes {
        let failed = match partition_key::sdk_key(&change.partition_key) {
            Err(error) => Some(format!("its partition key cannot be used: {error}")),
            Ok(key) => {
                match patch_item_if_match(&container, key, &change.id, &change.operations, &change.etag)
                    .await
                {
                    Ok(_) => None,
                    Err(error) if error.is_status(412) => Some(
                        "it changed since it was read (the relay may have stamped it): read it again"
                            .to_owned(),
                    ),
                    Err(error) if error.is_status(404) => {
                        Some("it no longer exists (a delivered document's ttl expired?)".to_owned())
                    }
                    Err(error) => Some(crate::error_chain::ErrorChain(&error).to_string()),
                }
            }
        };
        applied.push(AppliedChange {
            id: change.id.clone(),
            failed,
        });
    }
    Ok(applied)
}

/// An Outbox Document a repair may take.
struct Candidate {
    id: String,
    message_id: String,
    destination: String,
    status: String,
    violations: Vec<String>,
    has_reason: bool,
    key: Vec<Value>,
    etag: String,
}

impl Candidate {
    fn into_change(self, to: &str, operations: Vec<PatchOp>) -> PlannedChange {
        PlannedChange {
            id: self.id,
            message_id: self.message_id,
            destination: self.destination,
            from: self.status,
            to: to.to_owned(),
            violations: self.violations,
            partition_key: self.key,
            etag: self.etag,
            operations,
        }
    }
}

/// Every Outbox Document with `status` (a pending one only when the relay's gate takes it),
/// whole, with its partition key read back at the container's paths, its ETag, and its contract
/// violations as the relay with `source` sees them.
async fn candidates(
    cosmos: &CosmosConnection,
    database: &str,
    container: &str,
    status: &str,
    source: MessageSource,
) -> Result<Vec<Candidate>, CosmosStoreError> {
    let container = cosmos.container(database, container).await?;
    let paths = read_container_properties(&container)
        .await?
        .partition_key_paths;
    let mut found = Vec::new();
    query_each(&container, outbox_query("*", status)?, |doc| {
        if status == STATUS_PENDING && !is_pending_outbox(&doc) {
            return;
        }
        let Some(etag) = doc.get("_etag").and_then(Value::as_str).map(str::to_owned) else {
            return;
        };
        let violations = source.violations(&doc);
        found.push(Candidate {
            id: text(&doc, ID_FIELD),
            message_id: text(&doc, MESSAGE_ID_FIELD),
            destination: text(&doc, DESTINATION_FIELD),
            status: text(&doc, "status"),
            violations,
            has_reason: doc.get(OPERATOR_REASON_FIELD).is_some(),
            key: partition_key::read_back_or_null(&doc, &paths),
            etag,
        });
    })
    .await?;
    found.sort_by(|a, b| a.id.cmp(&b.id));
    Ok(found)
}

/// The candidates `selection` takes. An id asked for that none is goes to `plan.not_found`; one
/// that several documents have (one message id in several logical partitions) is refused for
/// each of them: an id must name one document.
fn select(
    candidates: Vec<Candidate>,
    selection: &Selection,
    plan: &mut RepairPlan,
) -> Vec<Candidate> {
    match selection {
        Selection::Ids(ids) => {
            let named = |c: &Candidate| ids.iter().any(|id| c.id == *id || c.message_id == *id);
            for id in ids {
                if !candidates
                    .iter()
                    .any(|c| c.id == *id || c.message_id == *id)
                {
                    plan.not_found.push(id.clone());
                }
            }
            let taken: Vec<Candidate> = candidates.into_iter().filter(named).collect();
            // Document ids are minted from message ids: documents that share one are in other
            // logical partitions, and an id must name one document.
            let mut sharing = std::collections::BTreeMap::<String, usize>::new();
            for candidate in &taken {
                *sharing.entry(candidate.message_id.clone()).or_default() += 1;
            }
            let mut unique = Vec::with_capacity(taken.len());
            for candidate in taken {
                if sharing.get(&candidate.message_id).copied().unwrap_or(0) > 1 {
                    plan.refused.push(RefusedChange {
                        why: "several documents (in other logical partitions) have this id: \
                              select them by destination, or change them one at a time in the \
                              store"
                            .to_owned(),
                        id: candidate.id,
                        message_id: candidate.message_id,
                        partition_key: candidate.key,
                    });
                } else {
                    unique.push(candidate);
                }
            }
            unique
        }
        Selection::Destination(destination) => candidates
            .into_iter()
            .filter(|c| c.destination == *destination)
            .collect(),
        Selection::Violation(text) => {
            let text = text.to_ascii_lowercase();
            candidates
                .into_iter()
                .filter(|c| {
                    c.violations
                        .iter()
                        .any(|v| v.to_ascii_lowercase().contains(&text))
                })
                .collect()
        }
    }
}

/// A string field, or `""`.
fn text(doc: &Value, field: &str) -> String {
    doc.get(field)
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_owned()
}
