//! The state of a container's Outbox Documents, read with two queries: the pending ones (their
//! destination and timestamp only: a backlog can be large) and the undeliverable ones (whole: they
//! are few, and the contract is checked again on each to say why).

use std::collections::BTreeMap;

use serde::Serialize;
use serde_json::Value;

use crate::cosmos::outbox_query::{gate_fields, outbox_query};
use crate::cosmos::store::query_each;
use crate::cosmos::{CosmosConnection, CosmosStoreError};
use crate::document::outbox::id_mismatch;
use crate::document::outbox::{
    DESTINATION_FIELD, ID_FIELD, MESSAGE_ID_FIELD, STATUS_PENDING, STATUS_UNDELIVERABLE,
};
use crate::document::{is_pending_outbox, outbox_contract};

/// Where the relay of a container gets each pending document's message, which says whether the
/// Outbox Document Contract applies to its documents. Nothing in a container tells: the
/// operator says it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum MessageSource {
    /// Each document is its message (a runtime's relay, `chatter relay`, a standalone relay
    /// without a resolver): the relay checks the contract and stamps a document that breaks it
    /// `undeliverable`.
    #[default]
    Document,
    /// A standalone relay's [`BodyResolver`](crate::relay::BodyResolver) builds each message (thin
    /// triggers): the contract is not evaluated, a document needs only its identity and key.
    BodyResolver,
}

impl MessageSource {
    /// The Outbox Document Contract's violations of `doc`, as the relay with this source sees
    /// them: none when a body resolver builds its message.
    pub(crate) fn violations(self, doc: &Value) -> Vec<String> {
        match self {
            Self::BodyResolver => Vec::new(),
            Self::Document => match outbox_contract::verify(doc) {
                Ok(_) => Vec::new(),
                Err(found) => found.violations.iter().map(ToString::to_string).collect(),
            },
        }
    }
}

/// A container's Outbox Documents that are not delivered.
#[derive(Debug, Clone, Default, Serialize, PartialEq)]
pub struct OutboxSurvey {
    /// Where its relay gets each message, as the survey was asked to read it: with
    /// [`MessageSource::BodyResolver`] no document is checked against the contract.
    pub message_source: MessageSource,
    /// The pending documents the relay will publish, by destination (a document without a
    /// readable destination is counted under `""`); one that only looks pending (an id chatter
    /// did not mint for its message id) is not counted here, as the relay skips it: it is in
    /// [`id_mismatches`](Self::id_mismatches).
    pub pending: BTreeMap<String, PendingByDestination>,
    /// The documents that look pending (`_chatterType` `"outbox"`, `status` `"pending"`) under an
    /// id that is not the outbox id of their `MessageId`: the relay never publishes them (and
    /// warns about them); oldest first. Another writer's mistake: each must be written again
    /// under its expected id.
    pub id_mismatches: Vec<IdMismatchedDocument>,
    /// Every `undeliverable` document, oldest first.
    pub undeliverable: Vec<UndeliverableDocument>,
}

impl OutboxSurvey {
    /// The pending documents in all.
    pub fn pending_count(&self) -> u64 {
        self.pending.values().map(|p| p.count).sum()
    }
}

/// The pending Outbox Documents of one destination.
#[derive(Debug, Clone, Default, Serialize, PartialEq)]
pub struct PendingByDestination {
    /// How many.
    pub count: u64,
    /// The oldest one's last write (`_ts`, seconds since the Unix epoch).
    pub oldest_written_at: Option<i64>,
    /// The oldest one's message id.
    pub oldest_message_id: Option<String>,
}

/// A document that looks pending under an id that is not the outbox id of its `MessageId`.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct IdMismatchedDocument {
    /// Its id.
    pub id: String,
    /// Its `MessageId` (empty when it has none).
    pub message_id: String,
    /// The id the relay expects: `outbox:` and the unpadded base64url of the UTF-8 `MessageId`
    /// ([`outbox_id`](crate::cosmos::outbox_id)); `None` when none can be minted (a `MessageId`
    /// missing, empty or too long for an id).
    pub expected_id: Option<String>,
    /// Its `Destination` (empty when it has no readable one).
    pub destination: String,
    /// Its last write (`_ts`, seconds since the Unix epoch).
    pub written_at: Option<i64>,
}

/// An Outbox Document stamped `undeliverable`, and why.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct UndeliverableDocument {
    /// The document id.
    pub id: String,
    /// Its `MessageId` (empty when it has none).
    pub message_id: String,
    /// Its `Destination` (empty when it has no readable one).
    pub destination: String,
    /// When it was stamped (`_ts`, seconds since the Unix epoch).
    pub stamped_at: Option<i64>,
    /// The Outbox Document Contract's violations found in it now (the relay does not persist
    /// its reason: the document keeps the .NET shape). Empty when it passes the contract today,
    /// e.g. one stamped by an operator or another tool, which can be requeued as it is, and
    /// always for a container whose relay has a body resolver ([`MessageSource::BodyResolver`]:
    /// the contract does not apply there).
    pub violations: Vec<String>,
    /// The reason an operator gave when giving it up (`chatter outbox give-up`); `None` for one
    /// the relay stamped.
    pub operator_reason: Option<String>,
}

/// Reads the Outbox Documents of `database`/`container` that are `pending` or `undeliverable`,
/// checking each `undeliverable` one against the contract unless `source` is
/// [`MessageSource::BodyResolver`].
///
/// # Errors
///
/// [`CosmosStoreError`]: the container cannot be reached or a query fails.
pub async fn survey_outbox(
    cosmos: &CosmosConnection,
    database: &str,
    container: &str,
    source: MessageSource,
) -> Result<OutboxSurvey, CosmosStoreError> {
    let container = cosmos.container(database, container).await?;
    let mut survey = OutboxSurvey {
        message_source: source,
        ..OutboxSurvey::default()
    };

    // Counted as the relay's gate sees them: a document that only looks pending is never
    // relayed, so it is no backlog.
    let pending = outbox_query(
        &format!("{}, c.{DESTINATION_FIELD}, c._ts", gate_fields()),
        STATUS_PENDING,
    )?;
    query_each(&container, pending, |item| {
        let written_at = item.get("_ts").and_then(Value::as_i64);
        if let Some(mismatch) = id_mismatch(&item) {
            survey.id_mismatches.push(IdMismatchedDocument {
                id: mismatch.id.to_owned(),
                message_id: mismatch.message_id.unwrap_or_default().to_owned(),
                expected_id: mismatch.expected,
                destination: text(&item, DESTINATION_FIELD),
                written_at,
            });
            return;
        }
        if !is_pending_outbox(&item) {
            return;
        }
        let entry = survey
            .pending
            .entry(text(&item, DESTINATION_FIELD))
            .or_default();
        entry.count += 1;
        let older = match (written_at, entry.oldest_written_at) {
            (Some(at), Some(oldest)) => at < oldest,
            (Some(_), None) => true,
            (None, _) => entry.oldest_message_id.is_none(),
        };
        if older {
            entry.oldest_written_at = written_at;
            entry.oldest_message_id = Some(text(&item, MESSAGE_ID_FIELD));
        }
    })
    .await?;

    let undeliverable = outbox_query("*", STATUS_UNDELIVERABLE)?;
    query_each(&container, undeliverable, |doc| {
        let violations = source.violations(&doc);
        survey.undeliverable.push(UndeliverableDocument {
            id: text(&doc, ID_FIELD),
            message_id: text(&doc, MESSAGE_ID_FIELD),
            destination: text(&doc, DESTINATION_FIELD),
            stamped_at: doc.get("_ts").and_then(Value::as_i64),
            violations,
            operator_reason: doc
                .get(super::OPERATOR_REASON_FIELD)
                .and_then(Value::as_str)
                .map(str::to_owned),
        });
    })
    .await?;
    survey
        .undeliverable
        .sort_by(|a, b| (a.stamped_at, &a.id).cmp(&(b.stamped_at, &b.id)));
    survey
        .id_mismatches
        .sort_by(|a, b| (a.written_at, &a.id).cmp(&(b.written_at, &b.id)));
    Ok(survey)
}

/// A string field, or `""`.
fn text(doc: &Value, field: &str) -> String {
    doc.get(field)
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_owned()
}
