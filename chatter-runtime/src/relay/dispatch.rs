//! One piece of code publishes and stamps an Outbox Document, whichever path found it: the
//! relay's drain (a change-feed page) and publish after commit (the process that committed the
//! batch, right after the commit).
//!
//! [`Dispatch::publish`] verifies the document (the Outbox Document Contract, or a standalone
//! relay's body resolver) and publishes it under a `send` span; [`Dispatch::settle`] writes the
//! one stamp that calls for: `delivered` with the TTL, `undeliverable` (no TTL, logged at
//! Error), or `delivered` without a publish (the resolver built no message). Every stamp is
//! conditional on the version it was decided for, and a 412 reads the document before deciding,
//! so no stamp overwrites another writer's verdict (the simulation found one that did: seed 139).

use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;

use super::delivery::DeliverySettings;
use super::diagnostics;
use super::error::DrainError;
use super::resolver::{DrainContext, ResolverFactory};
use super::suspension::ConfirmationReceipt;
use crate::broker::{self, Broker, BrokerError};
use crate::cosmos::charge::RequestMeter;
use crate::cosmos::store::{PatchOp, patch_item_if_match};
use crate::cosmos::{self, ContainerClient, CosmosStoreError};
use crate::document::outbox::{STATUS_PENDING, STATUS_UNDELIVERABLE};
use crate::document::{ContractViolations, outbox, outbox_contract};
use crate::error_chain::ErrorChain;
use crate::message::BrokeredMessage;
use crate::partition_key::{self, PartitionKeyPath};
use crate::telemetry::metrics::{DrainOutcome, SourceMetrics};
use crate::telemetry::trace_context::{self, SharedTracer};

/// Why a pending Outbox Document was stamped `undeliverable`.
#[derive(Debug, Clone, thiserror::Error)]
pub(crate) enum UndeliverableReason {
    /// The document's own fields violate the Outbox Document Contract.
    #[error(transparent)]
    Contract(ContractViolations),
    /// The broker refuses the message every time.
    #[error(
        "The broker refuses outbox document '{message_id}' every time it is published: {refusal}. \
         The document's own persisted fields prove this, so redraining it would fail identically; \
         correct the writer that produced it."
    )]
    BrokerRefusal {
        /// The document's `MessageId`.
        message_id: String,
        /// The broker's permanent refusal.
        refusal: Arc<BrokerError>,
    },
}

/// What one pending document did. A receipt only where a stamp of it landed (written now, or
/// found written by this stamp's own earlier attempt): a verdict of another writer that stood
/// proves nothing of the status write path (the Drain Suspension resumes on landed stamps only).
pub(super) enum Processed {
    /// Published, and stamped delivered over `version` (the pending version the stamp was
    /// written over), or found decided (`version` `None`: another writer's verdict stands, or
    /// this very stamp is found written, its answer lost).
    Published {
        receipt: Option<ConfirmationReceipt>,
        version: Option<String>,
        /// The versions newer than the one the stamp was for that it met pending after a 412,
        /// each the same message, and tried to write over in turn (a rewrite: the sweep's, an
        /// operator's requeue), oldest first: versions of a message this process published,
        /// which a page read before the stamp may hold pending, and must not publish again.
        rewrites: Vec<String>,
    },
    Undeliverable(ConfirmationReceipt),
    Dropped(Option<ConfirmationReceipt>),
    /// Judged undeliverable, but a newer version another writer decided (a delivered stamp, a
    /// requeue, a new message) stands: nothing was stamped or logged.
    Superseded,
}

/// How many conditional writes a stamp makes at most: the first, then one over each newer
/// pending version of the same message it meets (the sweep's rewrite, an operator's requeue);
/// past them it fails as the 412 it last met.
const STAMP_ROUNDS: usize = 3;

/// How many times a stamp that met a 412 reads the document back before it takes the read for
/// a replica that has not caught up with the write the 412 saw (the read shows the version
/// the stamp was conditional on) and fails as that 412; with a pause that grows between reads.
const READS_AFTER_CONFLICT: u32 = 4;

/// What a stamp came to.
enum Stamped {
    /// Written over this version (`None`: unconditionally, the target having no version).
    Over(Option<String>),
    /// A newer version already holds this very stamp, on the same message: this stamp's own
    /// earlier attempt (an answer lost, a retry of the SDK's) or another's identical verdict.
    Found,
    /// Another writer's version stands (another verdict, a new message, a document gone).
    Stood,
}

impl Stamped {
    fn receipt(&self) -> Option<ConfirmationReceipt> {
        matches!(self, Self::Over(_) | Self::Found).then_some(ConfirmationReceipt)
    }
}

/// What a published (or never publishable) document still needs: its one stamp.
pub(super) enum Stamp {
    /// Published: stamped delivered with the TTL.
    Delivered {
        message_id: String,
        destination: String,
    },
    /// Never publishable: stamped `undeliverable`.
    Undeliverable(UndeliverableReason),
    /// The resolver built no message: stamped delivered, nothing published.
    Dropped,
}

/// The document a stamp is for: its id and partition key, the version it is written over (the
/// ETag of the version read or committed) and that version's fields (to tell a newer version of
/// the same message from another writer's).
#[derive(Clone, Copy)]
pub(super) struct Target<'a> {
    pub(super) id: &'a str,
    pub(super) key: &'a [Value],
    pub(super) version: Option<&'a str>,
    pub(super) doc: &'a Value,
}

/// What a read after a 412 found.
enum Newer {
    /// A version other than the one the stamp was conditional on.
    Version(Value),
    /// The document is gone (deleted, or expired after a delivered stamp).
    Gone,
    /// Every read still showed the version the stamp was conditional on.
    NotSeen,
}

/// What publishes and stamps the Outbox Documents of one monitored container.
#[derive(Clone)]
pub(super) struct Dispatch {
    pub(super) source_identity: Arc<str>,
    pub(super) broker: Arc<dyn Broker>,
    pub(super) container: Arc<ContainerClient>,
    pub(super) partition_key_paths: &'static [PartitionKeyPath],
    pub(super) settings: DeliverySettings,
    pub(super) publish_timeout: Duration,
    pub(super) store_timeout: Duration,
    pub(super) charges: Arc<RequestMeter>,
    pub(super) metrics: Option<Arc<SourceMetrics>>,
    pub(super) tracer: SharedTracer,
    /// The standalone relay's body resolver: without one, the verbatim path (the document is
    /// the message, under the Outbox Document Contract).
    pub(super) resolver: Option<Arc<dyn ResolverFactory>>,
}

impl Dispatch {
    /// Verifies and publishes one pending document `id` of partition key `key`: what it still
    /// needs is its stamp.
    pub(super) async fn publish(
        &self,
        doc: &Value,
        id: &str,
        key: &[Value],
    ) -> Result<Stamp, DrainError> {
        // Admitted past the pending gate: its age is taken now, before the contract, so an
        // undeliverable document and a publish that fails still report it.
        if let Some(metrics) = &self.metrics {
            metrics.lag(doc);
        }
        let message = match self.message_of(doc, key).await? {
            Ok(message) => message,
            Err(stamp) => return Ok(stamp),
        };
        let message_id = message.message_id.clone();
        let destination = message.destination.clone();
        let published = self.send(message, &message_id, &destination).await;
        self.stamp_for(id, message_id, destination, published)
    }

    /// Whether the document `id` the page read as `doc` is provably decided since: read back
    /// no longer pending, holding the same message (a new body under the id is a message of its
    /// own, still to publish), at a version written after the page's. Anything less certain
    /// says no, and the document is published as the page read it (a duplicate at worst, never
    /// a skip): a read that fails or finds nothing (a replica that has not caught up, or a
    /// 404/1002). `_ts` counts whole seconds, so a version of the page's second is after it
    /// only when it is a delivered stamp (not `undeliverable`, with a positive `ttl`): chatter
    /// turns no delivered document pending again, so a replica behind the page cannot show one
    /// older than the page's pending version. An `undeliverable` version of the same second
    /// proves nothing (a ttl another writer gave the document included): a replica behind the
    /// page may still show the verdict a requeue the page read undid.
    pub(super) async fn decided_since(&self, doc: &Value, id: &str, key: &[Value]) -> bool {
        let Ok(sdk_key) = partition_key::sdk_key(key) else {
            return false;
        };
        let reading = cosmos::store::read_item_charged(&self.container, sdk_key, id);
        let bounded = cosmos::store::bounded("read_item", self.store_timeout, Box::pin(reading));
        let Ok((outcome, charge)) = bounded.await else {
            return false;
        };
        self.charges.relay(charge);
        let Some(now) = outcome.into_document() else {
            return false;
        };
        let status = now.get(outbox::STATUS_FIELD).and_then(Value::as_str);
        if status == Some(STATUS_PENDING) || !outbox::same_message(&now, doc) {
            return false;
        }
        let written = |doc: &Value| doc.get("_ts").and_then(Value::as_i64);
        let (Some(written_now), Some(read)) = (written(&now), written(doc)) else {
            return false;
        };
        let ttl = now.get(outbox::TTL_FIELD).and_then(Value::as_i64);
        let delivered =
            status != Some(STATUS_UNDELIVERABLE) && ttl.is_some_and(|seconds| seconds > 0);
        written_now > read || (written_now == read && delivered)
    }

    /// The message of a document: the document itself under the Outbox Document Contract, or
    /// what the body resolver makes of it. A stamp instead when there is nothing to publish
    /// (a contract violation: undeliverable; a resolver that answers none: dropped).
    async fn message_of(
        &self,
        doc: &Value,
        key: &[Value],
    ) -> Result<Result<BrokeredMessage, Stamp>, DrainError> {
        Ok(match &self.resolver {
            None => match outbox_contract::verify(doc) {
                Ok(verified) => Ok(verified.into_message()),
                Err(violations) => Err(Stamp::Undeliverable(UndeliverableReason::Contract(
                    violations,
                ))),
            },
            Some(factory) => match self.resolve(factory.as_ref(), doc, key).await? {
                Some(message) => Ok(message),
                None => Err(Stamp::Dropped),
            },
        })
    }

    /// Publishes `message` (whose id and destination label the operation) within the publish
    /// timeout, in a `send` span when tracing is on.
    async fn send(
        &self,
        mut message: BrokeredMessage,
        message_id: &str,
        destination: &str,
    ) -> Result<(), BrokerError> {
        let span = self.tracer.as_ref().map(|tracer| {
            trace_context::start_send(
                tracer,
                &mut message,
                &opentelemetry::Context::current(),
                self.broker.as_ref(),
            )
        });
        // `Broker::publish` refuses what `Broker::check` would, with the same permanent error.
        let operation = || format!("publish `{message_id}` to `{destination}`");
        let publishing = self.broker.publish(message);
        let published = broker::bounded(operation, self.publish_timeout, publishing).await;
        if let Some(span) = span {
            let failure = published
                .as_ref()
                .err()
                .map(|error| (error.type_name(), ErrorChain(error).to_string()));
            trace_context::end(&span, failure);
        }
        published
    }

    /// What a publish's result calls for: a stamp, or a failure of the page.
    // `publish` returns this error as it is (clippy does not look at the async caller).
    #[allow(clippy::result_large_err)]
    fn stamp_for(
        &self,
        id: &str,
        message_id: String,
        destination: String,
        published: Result<(), BrokerError>,
    ) -> Result<Stamp, DrainError> {
        match published {
            // Admitted and published: counted whether or not its stamp then lands.
            Ok(()) => {
                if let Some(metrics) = &self.metrics {
                    metrics.document(DrainOutcome::Admitted);
                }
                Ok(Stamp::Delivered {
                    message_id,
                    destination,
                })
            }
            // A protocol limit no broker setting lifts. The resolver built this message, not
            // the document's persisted fields: the resolver is at fault, and a fixed resolver
            // publishes the document, so it blocks the lease as a refusing setting does.
            Err(source) if source.is_permanent() && self.resolver.is_some() => {
                Err(DrainError::ResolvedMessageRefused {
                    id: id.to_owned(),
                    message_id,
                    destination,
                    source,
                })
            }
            // Only a protocol limit on the document's own fields: no broker setting lifts it.
            Err(refusal) if refusal.is_permanent() => {
                Ok(Stamp::Undeliverable(UndeliverableReason::BrokerRefusal {
                    message_id,
                    refusal: Arc::new(refusal),
                }))
            }
            // A setting an operator changes: the document waits for it, pending.
            Err(source) if source.refusal().is_some() => Err(DrainError::Refused {
                message_id,
                destination,
                source,
            }),
            Err(source) => Err(DrainError::Publish {
                message_id,
                destination,
                source,
            }),
        }
    }

    /// Writes the stamp a document's publish step called for, over `version`: the document
    /// `doc` as the caller read or wrote it (a change-feed page, or the batch whose ETag publish
    /// after commit holds). Every stamp is conditional on that version; a 412 reads the document
    /// before deciding ([`stamp_over`](Self::stamp_over)), so no stamp overwrites another
    /// writer's verdict.
    pub(super) async fn settle(
        &self,
        lease_token: &str,
        target: Target<'_>,
        stamp: Stamp,
    ) -> Result<Processed, DrainError> {
        let (message_id, destination) = match stamp {
            Stamp::Undeliverable(reason) => {
                return self.give_up(lease_token, target, &reason).await;
            }
            Stamp::Dropped => return self.drop_document(target).await,
            Stamp::Delivered {
                message_id,
                destination,
            } => (message_id, destination),
        };
        let delivered = outbox::delivered_stamp(
            &self.settings.delivered_status,
            self.settings.delivered_ttl_seconds,
        );
        let (stamped, rewrites) =
            self.stamp_over(target, &delivered, true)
                .await
                .map_err(|source| DrainError::Confirmation {
                    message_id: message_id.clone(),
                    source,
                })?;
        tracing::debug!(
            message_id,
            destination,
            "chatter relay published outbox message"
        );
        Ok(Processed::Published {
            receipt: stamped.receipt(),
            version: match stamped {
                Stamped::Over(version) => version,
                Stamped::Found | Stamped::Stood => None,
            },
            rewrites,
        })
    }

    /// The resolver path: builds a resolver for the document and asks it for the message
    /// (the Outbox Document Contract is not evaluated: thin documents are fine). Its error
    /// fails the page with nothing published or stamped.
    async fn resolve(
        &self,
        factory: &dyn ResolverFactory,
        doc: &Value,
        key: &[Value],
    ) -> Result<Option<BrokeredMessage>, DrainError> {
        let message_id = doc
            .get(outbox::MESSAGE_ID_FIELD)
            .and_then(Value::as_str)
            .unwrap_or_default();
        let context = DrainContext {
            document: doc,
            message_id,
            partition_key: key,
            partition_key_paths: self.partition_key_paths,
        };
        factory
            .resolve(&context)
            .await
            .map_err(|source| DrainError::Resolver {
                message_id: message_id.to_owned(),
                source,
            })
    }

    /// The resolver built no message: publishes nothing and stamps the document delivered
    /// (outcome `dropped`). A failed stamp fails the page as itself: nothing was published, so
    /// it is no Confirmation Failure.
    async fn drop_document(&self, target: Target<'_>) -> Result<Processed, DrainError> {
        let delivered = outbox::delivered_stamp(
            &self.settings.delivered_status,
            self.settings.delivered_ttl_seconds,
        );
        // Nothing was published: a newer version (a requeue) is not this stamp's to decide.
        let (stamped, _) = self
            .stamp_over(target, &delivered, false)
            .await
            .map_err(|source| DrainError::DroppedStamp {
                id: target.id.to_owned(),
                source,
            })?;
        if let Some(metrics) = &self.metrics {
            metrics.document(DrainOutcome::Dropped);
        }
        tracing::debug!(
            id = target.id,
            "chatter relay dropped an outbox document its resolver built no message for"
        );
        Ok(Processed::Dropped(stamped.receipt()))
    }

    /// Stamps `undeliverable` (one op, no ttl: the document is kept for a person to inspect),
    /// then logs. Only over the version judged: a newer one (a requeue after the broker was
    /// fixed, another relay's delivered stamp) stands, as the judgement may be out of date for
    /// it. A failed stamp propagates as itself, with nothing logged.
    async fn give_up(
        &self,
        lease_token: &str,
        target: Target<'_>,
        reason: &UndeliverableReason,
    ) -> Result<Processed, DrainError> {
        let stamp = outbox::undeliverable_stamp();
        let (stamped, _) = self
            .stamp_over(target, &stamp, false)
            .await
            .map_err(|source| DrainError::UndeliverableStamp {
                id: target.id.to_owned(),
                source,
            })?;
        if let Stamped::Stood = stamped {
            tracing::info!(
                source_identity = %self.source_identity,
                lease_token,
                id = target.id,
                "an outbox document judged undeliverable was written since by another (a \
                 delivered stamp, a requeue, a new message): that version stands"
            );
            return Ok(Processed::Superseded);
        }
        diagnostics::undeliverable(
            self.metrics.as_deref(),
            &self.source_identity,
            lease_token,
            target.id,
            reason,
        );
        Ok(Processed::Undeliverable(ConfirmationReceipt))
    }

    /// Writes stamp `ops` on the document `target` names, over its version, within the store
    /// timeout as one stamp was before it was conditional. A 412 reads the document back: a
    /// newer version that already holds this stamp on the same message is this stamp found
    /// written (its own earlier attempt, whose answer was lost); a newer pending version of
    /// the same message (the sweep's rewrite, an operator's requeue) is stamped in turn when
    /// `again` (a delivered stamp records a publish, which holds for every version of the
    /// message), and so is another relay's `undeliverable` verdict on it (this relay's broker
    /// took the message that relay saw refused), up to [`STAMP_ROUNDS`] writes; any other
    /// version stands (an operator's give-up, a new message, a requeue), as does a document
    /// gone. Without a version (a document without an `_etag`, which Cosmos always sends) the
    /// stamp is unconditional.
    /// With what it came to, the newer versions it tried to write over, oldest first (only
    /// when `again`).
    async fn stamp_over(
        &self,
        target: Target<'_>,
        ops: &[(&str, Value)],
        again: bool,
    ) -> Result<(Stamped, Vec<String>), CosmosStoreError> {
        let stamping = async {
            let Some(first) = target.version else {
                self.patch(target.key, target.id, ops, None).await?;
                return Ok((Stamped::Over(None), Vec::new()));
            };
            let mut version = first.to_owned();
            let mut rewrites = Vec::new();
            let mut writes = 0;
            loop {
                let conflict = match self.patch(target.key, target.id, ops, Some(&version)).await {
                    Ok(_) => return Ok((Stamped::Over(Some(version)), rewrites)),
                    Err(error) if error.is_status(412) => error,
                    Err(error) => return Err(error),
                };
                writes += 1;
                let now = match self.read_newer(target, &version).await? {
                    Newer::Version(now) => now,
                    Newer::Gone => return Ok((Stamped::Stood, rewrites)),
                    Newer::NotSeen => return Err(conflict),
                };
                if !outbox::same_message(&now, target.doc) {
                    return Ok((Stamped::Stood, rewrites));
                }
                let holds = |(path, value): &(&str, Value)| {
                    now.get(path.trim_start_matches('/')) == Some(value)
                };
                if ops.iter().all(holds) {
                    return Ok((Stamped::Found, rewrites));
                }
                let status = now.get(outbox::STATUS_FIELD).and_then(Value::as_str);
                let pending = status == Some(STATUS_PENDING);
                // Another relay's refusal of this message (an operator's give-up carries a
                // reason): its publish was refused, this one's broker took the message, so
                // `delivered` is the truth, and no requeue must publish it again (seed 9115815).
                let refused = status == Some(STATUS_UNDELIVERABLE)
                    && now.get(outbox::OPERATOR_REASON_FIELD).is_none();
                match now.get("_etag").and_then(Value::as_str) {
                    Some(etag) if again && refused && writes < STAMP_ROUNDS => {
                        version = etag.to_owned();
                    }
                    Some(etag) if again && pending && writes < STAMP_ROUNDS => {
                        version = etag.to_owned();
                        rewrites.push(version.clone());
                    }
                    // Rewritten again each time: it fails as the 412, and is judged again.
                    Some(_) if again && pending => return Err(conflict),
                    _ => return Ok((Stamped::Stood, rewrites)),
                }
            }
        };
        // Boxed: the patches' futures are large (see `patch`).
        Box::pin(cosmos::store::bounded(
            "patch_item",
            self.store_timeout,
            stamping,
        ))
        .await
    }

    /// Reads the document `target` names until a version other than `version` shows (a 412 on
    /// `version` says one exists; a read that still shows `version` came from a replica that
    /// has not caught up). Within the store timeout [`stamp_over`](Self::stamp_over) bounds the
    /// whole stamp by.
    async fn read_newer(
        &self,
        target: Target<'_>,
        version: &str,
    ) -> Result<Newer, CosmosStoreError> {
        for read in 0..READS_AFTER_CONFLICT {
            if read > 0 {
                tokio::time::sleep(Duration::from_millis(25 << read)).await;
            }
            let key = partition_key::sdk_key(target.key)?;
            let reading = cosmos::store::read_item_charged(&self.container, key, target.id);
            let (outcome, charge) = Box::pin(reading).await?;
            self.charges.relay(charge);
            match outcome.into_document() {
                None => return Ok(Newer::Gone),
                Some(now) if now.get("_etag").and_then(Value::as_str) != Some(version) => {
                    return Ok(Newer::Version(now));
                }
                Some(_) => {}
            }
        }
        Ok(Newer::NotSeen)
    }

    /// One patch keyed by the document's id and `key`, the partition key read back from the
    /// document at the declared path(s) (a missing value is a JSON `null` component);
    /// conditional on `if_match` when given (a 412 then says the document changed).
    async fn patch(
        &self,
        key: &[Value],
        id: &str,
        ops: &[(&str, Value)],
        if_match: Option<&str>,
    ) -> Result<ConfirmationReceipt, CosmosStoreError> {
        let key = partition_key::sdk_key(key)?;
        let patching = async {
            match if_match {
                None => cosmos::store::patch_item(&self.container, key, id, ops).await,
                Some(etag) => {
                    let ops: Vec<PatchOp> = ops
                        .iter()
                        .map(|(path, value)| PatchOp::Set((*path).to_owned(), value.clone()))
                        .collect();
                    patch_item_if_match(&self.container, key, id, &ops, etag).await
                }
            }
        };
        // Boxed: the SDK's patch future is large, and without the box every document's group
        // future would carry it inline, copied each time `drain` moves a group future into its
        // `join_all`.
        let written = Box::pin(cosmos::store::bounded(
            "patch_item",
            self.store_timeout,
            patching,
        ))
        .await?;
        self.charges.relay(written.request_charge);
        Ok(ConfirmationReceipt)
    }
}
