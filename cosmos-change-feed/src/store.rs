//! [`StoreError`] and the few item operations the lease store needs, over the SDK's
//! [`ContainerClient`]: raw JSON documents, ETag preconditions, every failure keeping its HTTP
//! status code.

use std::time::Duration;

use azure_data_cosmos::CosmosError;
use azure_data_cosmos::clients::ContainerClient;
use azure_data_cosmos::models::PartitionKey;
use azure_data_cosmos::options::{ItemWriteOptions, Precondition};
use serde_json::Value;

use crate::request::RequestError;

/// An error reading or writing the monitored or the lease container.
///
/// Errors answered by the service keep their HTTP status code (and Cosmos sub-status): see
/// [`StoreError::status`].
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    /// A Cosmos DB request failed (answered with a non-success status, or not answered at all).
    #[error(transparent)]
    Request(RequestError),

    /// A call did not finish within the processor's
    /// [`store_timeout`](crate::ChangeFeedProcessorOptions::store_timeout); it was cancelled and
    /// is retried.
    #[error("Cosmos DB {operation} timed out after {after:?}")]
    Timeout {
        /// What was attempted.
        operation: &'static str,
        /// The bound that elapsed.
        after: Duration,
    },

    /// The SDK could not encode a request or decode a response body.
    #[error("Cosmos DB {operation}: the SDK could not encode the request or decode the response")]
    Codec {
        /// What was attempted.
        operation: &'static str,
        /// The SDK error.
        #[source]
        source: CosmosError,
    },

    /// A lease document could not be encoded.
    #[error("could not encode the lease document for {operation}")]
    Encode {
        /// What was attempted.
        operation: &'static str,
        /// The JSON error.
        #[source]
        source: serde_json::Error,
    },

    /// A lease write was refused before it was sent: the lease carries no ETag to guard it
    /// with, and an unguarded write could overwrite another instance's.
    #[error("{operation} refused: the lease has no ETag to guard the write with")]
    MissingEtag {
        /// What was attempted.
        operation: &'static str,
    },

    /// The monitored container's properties carry no resource id (`_rid`), which scopes its
    /// leases; the service always gives one.
    #[error(
        "the monitored container's properties carry no resource id (_rid) to scope its leases by"
    )]
    MissingResourceId,

    /// A lease changed between being listed and being deleted: an instance is running.
    #[error(
        "lease {id} changed while it was being deleted (an instance of the processor is running); stop every instance first"
    )]
    LeaseChanged {
        /// The lease document id.
        id: String,
    },
}

impl StoreError {
    /// Wraps an SDK error, keeping its status code.
    pub(crate) fn request(operation: &'static str, source: CosmosError) -> Self {
        Self::Request(RequestError::new(operation, source))
    }

    /// A [`StoreError::Timeout`] of `operation` after `after`.
    pub(crate) fn timeout(operation: &'static str, after: Duration) -> Self {
        Self::Timeout { operation, after }
    }

    /// A [`StoreError::Codec`] of `operation`.
    pub(crate) fn codec(operation: &'static str, source: CosmosError) -> Self {
        Self::Codec { operation, source }
    }

    /// A [`StoreError::Encode`] of `operation`.
    pub(crate) fn encode(operation: &'static str, source: serde_json::Error) -> Self {
        Self::Encode { operation, source }
    }

    /// The failed request, if this error is one: its status, sub-status and retry-after.
    pub fn failed_request(&self) -> Option<&RequestError> {
        match self {
            Self::Request(request) => Some(request),
            _ => None,
        }
    }

    /// The HTTP status code of a failed request, if this error is one.
    pub fn status(&self) -> Option<u16> {
        self.failed_request().map(|request| request.status)
    }

    /// Whether this is a request the service answered with `status`.
    pub fn is_status(&self, status: u16) -> bool {
        matches!(self, Self::Request(request) if request.is_status(status))
    }
}

/// Runs one store call, failing it with [`StoreError::Timeout`] past `timeout` (the call is
/// cancelled).
pub(crate) async fn bounded<T>(
    operation: &'static str,
    timeout: Duration,
    call: impl Future<Output = Result<T, StoreError>>,
) -> Result<T, StoreError> {
    tokio::time::timeout(timeout, call)
        .await
        .unwrap_or_else(|_| Err(StoreError::timeout(operation, timeout)))
}

/// The partition key of a lease document: its id (the lease container is keyed by `/id`).
pub(crate) fn lease_key(id: &str) -> PartitionKey {
    PartitionKey::from(id.to_owned())
}

/// Reads document `id`; `None` on 404.
pub(crate) async fn read_item(
    container: &ContainerClient,
    partition_key: PartitionKey,
    id: &str,
) -> Result<Option<Value>, StoreError> {
    const OPERATION: &str = "read_item";
    match container.read_item(partition_key, id, None).await {
        Ok(response) => response
            .into_model::<Value>()
            .map(Some)
            .map_err(|e| StoreError::codec(OPERATION, e)),
        Err(e) => {
            let error = StoreError::request(OPERATION, e);
            if error.is_status(404) {
                Ok(None)
            } else {
                Err(error)
            }
        }
    }
}

/// Creates document `id` (409 if it exists).
pub(crate) async fn create_item(
    container: &ContainerClient,
    partition_key: PartitionKey,
    id: &str,
    doc: &Value,
) -> Result<(), StoreError> {
    container
        .create_item(partition_key, id, doc, None)
        .await
        .map(|_| ())
        .map_err(|e| StoreError::request("create_item", e))
}

/// Replaces document `id` with `doc`; with `if_match`, only while its ETag is that one (412
/// otherwise). 404 if it does not exist. Returns the new ETag, when given.
pub(crate) async fn replace_item(
    container: &ContainerClient,
    partition_key: PartitionKey,
    id: &str,
    doc: &Value,
    if_match: Option<&str>,
) -> Result<Option<String>, StoreError> {
    let options = if_match.map(|etag| {
        ItemWriteOptions::default().with_precondition(Precondition::if_match(etag.to_owned()))
    });
    container
        .replace_item(partition_key, id, doc, options)
        .await
        .map(|response| response.headers().etag().map(ToString::to_string))
        .map_err(|e| StoreError::request("replace_item", e))
}

/// Deletes document `id` while its ETag is `if_match` (412 otherwise; 404 if it does not
/// exist).
pub(crate) async fn delete_item(
    container: &ContainerClient,
    partition_key: PartitionKey,
    id: &str,
    if_match: &str,
) -> Result<(), StoreError> {
    let options =
        ItemWriteOptions::default().with_precondition(Precondition::if_match(if_match.to_owned()));
    container
        .delete_item(partition_key, id, Some(options))
        .await
        .map(|_| ())
        .map_err(|e| StoreError::request("delete_item", e))
}
