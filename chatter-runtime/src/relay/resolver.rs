//! The body-resolver seam of the standalone relay: for a container whose pending documents are
//! thin triggers (the message body lives elsewhere), a [`BodyResolver`] builds the message to
//! publish from the document.

use std::future::Future;
use std::sync::Arc;

use futures::future::BoxFuture;
use serde_json::Value;

use crate::message::BrokeredMessage;
use crate::partition_key::PartitionKeyPath;
use crate::registry::BoxError;

/// What a [`BodyResolver`] is given for one admitted pending document.
#[derive(Debug, Clone, Copy)]
#[non_exhaustive]
pub struct DrainContext<'a> {
    /// The document as the change feed handed it over (system properties included).
    pub document: &'a Value,
    /// Its `MessageId`.
    pub message_id: &'a str,
    /// Its partition-key values, read back at the relay's declared path(s) (a missing value is
    /// `null`).
    pub partition_key: &'a [Value],
    /// The relay's declared partition-key path(s).
    pub partition_key_paths: &'a [PartitionKeyPath],
}

/// Builds the message to publish for a pending document of a standalone relay.
///
/// - `Ok(Some(message))`: `message` is published (the document's own `Destination`,
///   `MessageBody` and the rest are not read: the Outbox Document Contract is not evaluated on
///   this path, so thin documents are fine), then the document is stamped delivered.
/// - `Ok(None)`: nothing is published and the document is stamped delivered (outcome
///   `dropped`): the document needs no message.
/// - `Err(_)`: nothing is published or stamped; the page fails and is read again.
///
/// A resolver is built by the relay's factory for each admitted document (never for one the
/// pending gate or a suspended lease turns away), so it may hold per-document state.
pub trait BodyResolver: Send + Sync + 'static {
    /// The message for `context`'s document, or none.
    fn resolve(
        &self,
        context: &DrainContext<'_>,
    ) -> impl Future<Output = Result<Option<BrokeredMessage>, BoxError>> + Send;
}

/// A resolver factory with its resolver type erased: builds one resolver per document and
/// resolves with it.
pub(crate) trait ResolverFactory: Send + Sync {
    fn resolve<'a>(
        &'a self,
        context: &'a DrainContext<'a>,
    ) -> BoxFuture<'a, Result<Option<BrokeredMessage>, BoxError>>;
}

struct Factory<F>(F);

impl<F, R> ResolverFactory for Factory<F>
where
    F: Fn() -> R + Send + Sync,
    R: BodyResolver,
{
    fn resolve<'a>(
        &'a self,
        context: &'a DrainContext<'a>,
    ) -> BoxFuture<'a, Result<Option<BrokeredMessage>, BoxError>> {
        Box::pin(async move {
            let resolver = (self.0)();
            resolver.resolve(context).await
        })
    }
}

/// The erased form of `factory`.
pub(crate) fn factory<F, R>(factory: F) -> Arc<dyn ResolverFactory>
where
    F: Fn() -> R + Send + Sync + 'static,
    R: BodyResolver,
{
    Arc::new(Factory(factory))
}

/// The additional pending filter of a standalone relay: evaluated once per pending document;
/// it can only narrow what the pending gate admits.
pub(crate) type PendingFilter = Arc<dyn Fn(&Value) -> bool + Send + Sync>;
