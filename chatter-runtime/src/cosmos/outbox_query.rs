//! The one query over a container's Outbox Documents by status, shared by the relay's sweep,
//! publish after commit's pending check, the runtime's idle count and the operator's survey.

use azure_data_cosmos::Query;

use super::CosmosStoreError;
use crate::document::id;
use crate::document::outbox::{DISCRIMINATOR_FIELD, ID_FIELD, MESSAGE_ID_FIELD, STATUS_FIELD};

/// What the pending gate ([`is_pending_outbox`](crate::document::is_pending_outbox)) reads of a
/// document, as a query's `SELECT` list.
pub(crate) fn gate_fields() -> String {
    format!("c.{ID_FIELD}, c.{MESSAGE_ID_FIELD}, c.{DISCRIMINATOR_FIELD}, c.{STATUS_FIELD}")
}

/// The Outbox Documents with `status`, `select`ing what the caller reads (`*`: everything).
pub(crate) fn outbox_query(select: &str, status: &str) -> Result<Query, CosmosStoreError> {
    Query::from(format!(
        "SELECT {select} FROM c WHERE c.{DISCRIMINATOR_FIELD} = @kind AND c.{STATUS_FIELD} = @status"
    ))
    .with_parameter("@kind", id::OUTBOX_KIND)
    .and_then(|q| q.with_parameter("@status", status.to_owned()))
    .map_err(|e| CosmosStoreError::codec("query_items", e))
}
