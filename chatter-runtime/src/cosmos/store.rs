//! Thin, concrete item operations over the SDK's [`ContainerClient`], in the shapes the
//! pipeline and the relay need: raw JSON documents, partition keys built from JSON values,
//! transactional batches with per-operation status codes, set-only patches, container
//! properties.
//!
//! Every failure keeps the HTTP status code (see [`CosmosStoreError::status`]).

use azure_data_cosmos::clients::ContainerClient;
use azure_data_cosmos::feed::FeedScope;
use azure_data_cosmos::models::{PartitionKey, PatchInstructions, PatchOperation};
use azure_data_cosmos::options::{
    BatchDeleteOptions, BatchReplaceOptions, FeedOptions, PatchItemOptions, PatchStrategy,
    Precondition, QueryOptions,
};
use azure_data_cosmos::{Query, TransactionalBatch};
use futures::StreamExt;
use serde_json::Value;

use super::error::CosmosStoreError;

#[cfg(any(test, feature = "test-support"))]
/// HTTP status of a transactional-batch operation that was not applied because another
/// operation of the same batch failed.
pub(crate) const FAILED_DEPENDENCY: u16 = 424;

/// Runs one store call, failing it with [`CosmosStoreError::Timeout`] past `timeout` (the call
/// is cancelled).
pub(crate) async fn bounded<T>(
    operation: &'static str,
    timeout: std::time::Duration,
    call: impl std::future::Future<Output = Result<T, CosmosStoreError>>,
) -> Result<T, CosmosStoreError> {
    tokio::time::timeout(timeout, call)
        .await
        .unwrap_or_else(|_| Err(CosmosStoreError::timeout(operation, timeout)))
}

/// One operation of a transactional batch.
#[derive(Debug, Clone, PartialEq)]
pub enum BatchOperation {
    /// Create the document (409 if its id exists in the partition).
    Create(Value),
    /// Create or replace the document.
    Upsert(Value),
    /// Replace the document `id` (404 if missing).
    Replace {
        /// Id of the document to replace.
        id: String,
        /// The new document.
        doc: Value,
        /// Only while the stored document's ETag is this one (412 otherwise).
        if_match: Option<String>,
    },
    /// Delete the document `id` (404 if missing).
    Delete {
        /// Id of the document to delete.
        id: String,
        /// Only while the stored document's ETag is this one (412 otherwise).
        if_match: Option<String>,
    },
}

impl BatchOperation {
    /// The operation's name, as errors say it (`create`, `upsert`, `replace`, `delete`).
    pub fn kind(&self) -> &'static str {
        match self {
            Self::Create(_) => "create",
            Self::Upsert(_) => "upsert",
            Self::Replace { .. } => "replace",
            Self::Delete { .. } => "delete",
        }
    }

    /// The id of the document it writes (empty when the document has none).
    pub fn id(&self) -> &str {
        match self {
            Self::Create(doc) | Self::Upsert(doc) => {
                doc.get("id").and_then(Value::as_str).unwrap_or_default()
            }
            Self::Replace { id, .. } | Self::Delete { id, .. } => id,
        }
    }
}

/// The result of one operation of a transactional batch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BatchOperationOutcome {
    /// HTTP status of the operation: 2xx when applied, the failing operation's own status
    /// (e.g. 409), and `FAILED_DEPENDENCY` (424) for the operations rolled back with it.
    pub status: u16,
    /// Cosmos sub-status, when given.
    pub sub_status: Option<u32>,
    /// ETag of the written document, when given.
    pub etag: Option<String>,
}

/// The result of a transactional batch the service answered.
///
/// A batch is all-or-nothing: when one operation fails the service rolls back the others and
/// answers with a non-2xx batch status (HTTP 207 Multi-Status for an operation failure such as
/// a conflict) and per-operation codes such as `[409, 424, 424]`.
#[derive(Debug, Clone, PartialEq)]
pub struct BatchOutcome {
    /// HTTP status of the batch request.
    pub status: u16,
    /// One outcome per operation, in the order the operations were given.
    pub operations: Vec<BatchOperationOutcome>,
    /// The Request Units the service billed for the batch (0 when it did not say).
    pub request_charge: f64,
}

impl BatchOutcome {
    /// Whether the batch committed (every operation applied).
    pub fn is_success(&self) -> bool {
        (200..300).contains(&self.status)
            && self.status != 207
            && self
                .operations
                .iter()
                .all(|op| (200..300).contains(&op.status))
    }

    /// The per-operation status codes, in operation order.
    pub fn status_codes(&self) -> Vec<u16> {
        self.operations.iter().map(|op| op.status).collect()
    }

    #[cfg(any(test, feature = "test-support"))]
    /// The operation that made the batch fail: the first one whose status is neither 2xx nor
    /// `FAILED_DEPENDENCY`, with its index.
    pub fn failed_operation(&self) -> Option<(usize, &BatchOperationOutcome)> {
        self.operations
            .iter()
            .enumerate()
            .find(|(_, op)| !(200..300).contains(&op.status) && op.status != FAILED_DEPENDENCY)
    }
}

/// Executes `operations` as one transactional batch in partition `partition_key`.
///
/// A batch the service answered comes back `Ok`, also when it failed and was rolled back
/// (inspect [`BatchOutcome::is_success`] and the per-operation codes). `Err` means no
/// per-operation answer exists (the request was rejected as a whole or not answered).
pub async fn execute_batch(
    container: &ContainerClient,
    partition_key: PartitionKey,
    operations: Vec<BatchOperation>,
) -> Result<BatchOutcome, CosmosStoreError> {
    const OPERATION: &str = "execute_batch";
    let mut batch = TransactionalBatch::new(partition_key);
    for operation in operations {
        batch = match operation {
            BatchOperation::Create(doc) => batch.create_item(doc),
            BatchOperation::Upsert(doc) => batch.upsert_item(doc, None),
            BatchOperation::Replace { id, doc, if_match } => {
                let options = if_match.map(|etag| {
                    BatchReplaceOptions::default().with_precondition(Precondition::if_match(etag))
                });
                batch.replace_item(id, doc, options)
            }
            BatchOperation::Delete { id, if_match } => {
                let options = if_match.map(|etag| {
                    BatchDeleteOptions::default().with_precondition(Precondition::if_match(etag))
                });
                Ok(batch.delete_item(id, options))
            }
        }
        .map_err(|e| CosmosStoreError::codec(OPERATION, e))?;
    }
    let response = container
        .execute_transactional_batch(batch, None)
        .await
        .map_err(|e| CosmosStoreError::request(OPERATION, e))?;
    let status = u16::from(response.status().status_code());
    let request_charge = charge(response.headers());
    let results = response
        .into_model()
        .map_err(|e| CosmosStoreError::codec(OPERATION, e))?;
    let operations = results
        .results()
        .iter()
        .map(|result| BatchOperationOutcome {
            status: result.status_code(),
            sub_status: result.substatus_code(),
            etag: result.etag().map(str::to_owned),
        })
        .collect();
    Ok(BatchOutcome {
        status,
        operations,
        request_charge,
    })
}

/// The Request Units a response says it was billed (0 when it does not say).
pub(crate) fn charge(headers: &azure_data_cosmos::models::ResponseHeaders) -> f64 {
    headers
        .request_charge()
        .map_or(0.0, |charge| charge.value())
}

/// The result of a point read.
#[derive(Debug, Clone, PartialEq)]
pub enum ReadOutcome {
    /// 200: the document, as stored (system properties `_rid`, `_etag`, `_ts`... included).
    Found {
        /// The document.
        document: Value,
        /// Its ETag.
        etag: Option<String>,
    },
    /// 404: no document with that id in that partition.
    NotFound,
}

impl ReadOutcome {
    /// The HTTP status of the read: 200 or 404.
    pub fn status(&self) -> u16 {
        match self {
            Self::Found { .. } => 200,
            Self::NotFound => 404,
        }
    }

    /// The document, if found.
    pub fn into_document(self) -> Option<Value> {
        match self {
            Self::Found { document, .. } => Some(document),
            Self::NotFound => None,
        }
    }
}

/// Reads document `id` in `partition_key`. A 404 is [`ReadOutcome::NotFound`]; any other
/// failure is an error carrying its status.
pub async fn read_item(
    container: &ContainerClient,
    partition_key: PartitionKey,
    id: &str,
) -> Result<ReadOutcome, CosmosStoreError> {
    read_item_charged(container, partition_key, id)
        .await
        .map(|(outcome, _)| outcome)
}

/// [`read_item`] with the Request Units the read was billed (0 for a 404, whose charge the
/// SDK's error does not carry).
pub(crate) async fn read_item_charged(
    container: &ContainerClient,
    partition_key: PartitionKey,
    id: &str,
) -> Result<(ReadOutcome, f64), CosmosStoreError> {
    const OPERATION: &str = "read_item";
    match container.read_item(partition_key, id, None).await {
        Ok(response) => {
            let etag = response.headers().etag().map(ToString::to_string);
            let request_charge = charge(response.headers());
            let document = response
                .into_model::<Value>()
                .map_err(|e| CosmosStoreError::codec(OPERATION, e))?;
            Ok((ReadOutcome::Found { document, etag }, request_charge))
        }
        Err(e) => {
            let error = CosmosStoreError::request(OPERATION, e);
            if error.is_status(404) {
                Ok((ReadOutcome::NotFound, 0.0))
            } else {
                Err(error)
            }
        }
    }
}

/// The result of a successful write.
#[derive(Debug, Clone, PartialEq)]
pub struct WriteOutcome {
    /// HTTP status (201 created, 200 replaced/patched).
    pub status: u16,
    /// ETag of the written document, when given.
    pub etag: Option<String>,
    /// The Request Units the service billed for the write (0 when it did not say).
    pub request_charge: f64,
}

fn write_outcome(response: &azure_data_cosmos::models::ItemResponse) -> WriteOutcome {
    WriteOutcome {
        status: u16::from(response.status().status_code()),
        etag: response.headers().etag().map(ToString::to_string),
        request_charge: charge(response.headers()),
    }
}

fn document_id<'a>(operation: &'static str, doc: &'a Value) -> Result<&'a str, CosmosStoreError> {
    doc.get("id")
        .and_then(Value::as_str)
        .ok_or(CosmosStoreError::MissingDocumentId { operation })
}

/// Creates `doc` (its `id` field names it) in `partition_key`; 409 if it exists.
pub async fn create_item(
    container: &ContainerClient,
    partition_key: PartitionKey,
    doc: &Value,
) -> Result<WriteOutcome, CosmosStoreError> {
    const OPERATION: &str = "create_item";
    let id = document_id(OPERATION, doc)?;
    container
        .create_item(partition_key, id, doc, None)
        .await
        .map(|response| write_outcome(&response))
        .map_err(|e| CosmosStoreError::request(OPERATION, e))
}

/// Creates or replaces `doc` (its `id` field names it) in `partition_key`.
pub async fn upsert_item(
    container: &ContainerClient,
    partition_key: PartitionKey,
    doc: &Value,
) -> Result<WriteOutcome, CosmosStoreError> {
    const OPERATION: &str = "upsert_item";
    let id = document_id(OPERATION, doc)?;
    container
        .upsert_item(partition_key, id, doc, None)
        .await
        .map(|response| write_outcome(&response))
        .map_err(|e| CosmosStoreError::request(OPERATION, e))
}

/// Deletes document `id` of `partition_key`; `Ok(false)` when there was none.
pub(crate) async fn delete_item(
    container: &ContainerClient,
    partition_key: PartitionKey,
    id: &str,
) -> Result<bool, CosmosStoreError> {
    const OPERATION: &str = "delete_item";
    match container.delete_item(partition_key, id, None).await {
        Ok(_) => Ok(true),
        Err(error) => {
            let error = CosmosStoreError::request(OPERATION, error);
            if error.is_status(404) {
                Ok(false)
            } else {
                Err(error)
            }
        }
    }
}

/// Patches document `id` with one server-side PATCH request made of `Set` operations, applied
/// in the given order (e.g. `[("/status", "delivered"), ("/ttl", 86400)]`). 404 if the
/// document does not exist.
pub async fn patch_item(
    container: &ContainerClient,
    partition_key: PartitionKey,
    id: &str,
    set_operations: &[(&str, Value)],
) -> Result<WriteOutcome, CosmosStoreError> {
    const OPERATION: &str = "patch_item";
    let instructions =
        set_operations
            .iter()
            .fold(PatchInstructions::new(), |instructions, (path, value)| {
                instructions.with_operation(PatchOperation::set(path.to_string(), value.clone()))
            });
    // Server-side: one PATCH request, no client-side read-modify-write (which would also add
    // a tracking property to the document).
    let options = PatchItemOptions::default().with_strategy(PatchStrategy::ServerSide);
    container
        .patch_item(partition_key, id, instructions, Some(options))
        .await
        .map(|response| write_outcome(&response))
        .map_err(|e| CosmosStoreError::request(OPERATION, e))
}

/// One operation of [`patch_item_if_match`].
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum PatchOp {
    /// Set the property at the path (a JSON Pointer) to the value.
    Set(String, Value),
    /// Remove the property at the path (the request fails if it is absent).
    Remove(String),
}

/// Patches document `id` with `operations` in one server-side PATCH request, only if its ETag is
/// still `if_match` (else 412: the document changed since it was read).
pub(crate) async fn patch_item_if_match(
    container: &ContainerClient,
    partition_key: PartitionKey,
    id: &str,
    operations: &[PatchOp],
    if_match: &str,
) -> Result<WriteOutcome, CosmosStoreError> {
    const OPERATION: &str = "patch_item";
    let instructions =
        operations
            .iter()
            .fold(PatchInstructions::new(), |instructions, operation| {
                instructions.with_operation(match operation {
                    PatchOp::Set(path, value) => PatchOperation::set(path.clone(), value.clone()),
                    PatchOp::Remove(path) => PatchOperation::remove(path.clone()),
                })
            });
    let options = PatchItemOptions::default()
        .with_strategy(PatchStrategy::ServerSide)
        .with_precondition(Precondition::if_match(if_match.to_owned()));
    container
        .patch_item(partition_key, id, instructions, Some(options))
        .await
        .map(|response| write_outcome(&response))
        .map_err(|e| CosmosStoreError::request(OPERATION, e))
}

/// The container properties chatter checks (the Monitored Container Contract).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ContainerSettings {
    /// `defaultTtl`: `None` when TTL is off (absent), `Some(-1)` when on without a default
    /// expiry, `Some(n)` for a default expiry of `n` seconds.
    pub default_ttl: Option<i64>,
    /// The partition-key paths, in order (several for a hierarchical key).
    pub partition_key_paths: Vec<String>,
}

/// Reads the container's `defaultTtl` and partition-key paths in one request: the one reader
/// of container properties (provisioning and the Monitored Container Contract both use it).
///
/// Every integer `defaultTtl` is taken as the service reports it (the SDK's own model refuses
/// `0` and values below `-1`), so such a container is reported as the TTL violation it is
/// rather than as unreadable.
pub async fn read_container_properties(
    container: &ContainerClient,
) -> Result<ContainerSettings, CosmosStoreError> {
    const OPERATION: &str = "read_container";
    let resource: ContainerResource = container
        .read(None)
        .await
        .map_err(|e| CosmosStoreError::request(OPERATION, e))?
        .into_body()
        .into_single()
        .map_err(|e| CosmosStoreError::codec(OPERATION, e))?;
    Ok(ContainerSettings {
        default_ttl: resource.default_ttl,
        partition_key_paths: resource
            .partition_key
            .and_then(|pk| pk.paths)
            .unwrap_or_default(),
    })
}

/// The container resource as chatter reads it: only the two properties it checks.
#[derive(serde::Deserialize)]
struct ContainerResource {
    #[serde(rename = "defaultTtl", default)]
    default_ttl: Option<i64>,
    #[serde(rename = "partitionKey", default)]
    partition_key: Option<PartitionKeyResource>,
}

#[derive(serde::Deserialize)]
struct PartitionKeyResource {
    #[serde(default)]
    paths: Option<Vec<String>>,
}

/// Options of a query over every physical partition of a container, however many it has. The
/// SDK refuses a fresh cross-partition query past 100 (400/20118) unless told a higher
/// fan-out; chatter's are filters without `ORDER BY`, which the SDK drains one partition
/// after another, so memory stays flat. Each costs at least one request per physical
/// partition.
pub(crate) fn every_partition() -> QueryOptions {
    QueryOptions::default().with_feed_options(FeedOptions::default().with_max_fan_out(u32::MAX))
}

/// Runs `query` over every partition of `container` and hands each result to `each` as it
/// arrives (nothing is collected: a backlog can be large).
pub(crate) async fn query_each(
    container: &ContainerClient,
    query: Query,
    mut each: impl FnMut(Value),
) -> Result<(), CosmosStoreError> {
    const OPERATION: &str = "query_items";
    let mut items = container
        .query_items::<Value>(query, FeedScope::full_container(), Some(every_partition()))
        .await
        .map_err(|e| CosmosStoreError::request(OPERATION, e))?;
    while let Some(item) = items.next().await {
        each(item.map_err(|e| CosmosStoreError::request(OPERATION, e))?);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_failed_operation_is_the_first_non_dependency_failure() {
        let outcome = BatchOutcome {
            status: 207,
            operations: [424, 409, 424]
                .into_iter()
                .map(|status| BatchOperationOutcome {
                    status,
                    sub_status: None,
                    etag: None,
                })
                .collect(),
            request_charge: 0.0,
        };
        assert!(!outcome.is_success());
        assert_eq!(
            outcome.failed_operation().map(|(i, op)| (i, op.status)),
            Some((1, 409))
        );
        assert_eq!(outcome.status_codes(), vec![424, 409, 424]);
    }
}
