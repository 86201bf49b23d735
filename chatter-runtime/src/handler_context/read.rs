//! Reads in the handler: a point read and a query within the delivery's partition, the only one
//! its batch can write. Reads are not part of the batch: they see what is committed when they
//! run, and a write conditioned on the [`ETag`] a read returned makes the batch fail if the
//! document changed in between (the delivery is then tried again and reads the new state).

use std::sync::Arc;

use azure_data_cosmos::feed::FeedScope;
use futures::StreamExt;
use serde::de::DeserializeOwned;
use serde_json::Value;

use crate::cosmos::charge::RequestMeter;
use crate::cosmos::store::{self, ReadOutcome};
use crate::cosmos::{ContainerClient, CosmosStoreError, PartitionKey};

pub use azure_data_cosmos::Query;

/// A document's version as the store gave it (`_etag`): hand it back to
/// [`replace_if_match`](super::HandlerContext::replace_if_match) or
/// [`delete_if_match`](super::HandlerContext::delete_if_match) to write only if nobody changed
/// the document since.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ETag(pub(crate) String);

impl ETag {
    /// The ETag as the store wrote it.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Display for ETag {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// A document read in the handler, with its version.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct Versioned<T> {
    /// The document.
    pub document: T,
    /// Its ETag when it was read.
    pub etag: ETag,
}

/// A read in the handler that failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ReadError {
    /// No batch is active (a standalone-inbox command, or a command whose partition key did not
    /// resolve), so there is no partition to read.
    #[error(
        "no Cosmos batch is active for this delivery (a standalone-inbox command, or a partition key that did not resolve), so there is no partition to read"
    )]
    NoActiveBatch,
    /// The store refused or did not answer.
    #[error(transparent)]
    Store(#[from] CosmosStoreError),
    /// A document read does not deserialize into the type asked for.
    #[error("document '{id}' is not a {type_name}")]
    Decode {
        /// The document's id.
        id: String,
        /// The type asked for.
        type_name: &'static str,
        /// Why.
        #[source]
        source: serde_json::Error,
    },
    /// A document read carries no ETag (the store always gives one).
    #[error("document '{id}' was read without an ETag")]
    MissingEtag {
        /// The document's id.
        id: String,
    },
}

/// Where a handler's reads go: its delivery's container and partition; what they are billed is
/// counted to the command.
#[derive(Clone)]
pub(crate) struct ReadScope {
    pub(crate) container: Arc<ContainerClient>,
    pub(crate) partition_key: PartitionKey,
    pub(crate) charges: Arc<RequestMeter>,
}

impl std::fmt::Debug for ReadScope {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReadScope").finish_non_exhaustive()
    }
}

impl ReadScope {
    pub(crate) async fn read<T: DeserializeOwned>(
        &self,
        id: &str,
    ) -> Result<Option<Versioned<T>>, ReadError> {
        let (read, charge) =
            store::read_item_charged(&self.container, self.partition_key.clone(), id).await?;
        self.charges.command_extra(charge);
        match read {
            ReadOutcome::NotFound => Ok(None),
            ReadOutcome::Found { document, etag } => {
                let etag = etag.or_else(|| {
                    document
                        .get("_etag")
                        .and_then(Value::as_str)
                        .map(str::to_owned)
                });
                versioned(document, etag).map(Some)
            }
        }
    }

    pub(crate) async fn query<T: DeserializeOwned>(
        &self,
        query: Query,
    ) -> Result<Vec<Versioned<T>>, ReadError> {
        const OPERATION: &str = "query_items";
        let mut pages = self
            .container
            .query_items::<Value>(
                query,
                FeedScope::partition(self.partition_key.clone()),
                None,
            )
            .await
            .map_err(|e| CosmosStoreError::request(OPERATION, e))?
            .into_pages();
        let mut items = Vec::new();
        while let Some(page) = pages.next().await {
            let page = page.map_err(|e| CosmosStoreError::request(OPERATION, e))?;
            self.charges
                .command_extra(page.headers().request_charge().map_or(0.0, |c| c.value()));
            for document in page.into_items() {
                let etag = document
                    .get("_etag")
                    .and_then(Value::as_str)
                    .map(str::to_owned);
                items.push(versioned(document, etag)?);
            }
        }
        Ok(items)
    }
}

fn versioned<T: DeserializeOwned>(
    document: Value,
    etag: Option<String>,
) -> Result<Versioned<T>, ReadError> {
    let id = || {
        document
            .get("id")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_owned()
    };
    let Some(etag) = etag else {
        return Err(ReadError::MissingEtag { id: id() });
    };
    let id = id();
    let document = T::deserialize(document).map_err(|source| ReadError::Decode {
        id,
        type_name: std::any::type_name::<T>(),
        source,
    })?;
    Ok(Versioned {
        document,
        etag: ETag(etag),
    })
}
