//! The standalone outbox relay: drains the pending Outbox Documents of a container chatter's
//! commands do not write (documents another service wrote: a .NET or Python service, a stored
//! procedure), often thin triggers whose message a [`BodyResolver`] builds.
//!
//! Built and validated by [`StandaloneRelayBuilder::build`]; runs inside a
//! [`Runtime`](crate::Runtime) ([`RuntimeBuilder::standalone_relay`](crate::RuntimeBuilder::standalone_relay)),
//! or on its own ([`StandaloneRelay::start_all`]) in a process that only relays.

use std::sync::Arc;

use serde_json::Value;

use super::error::RelayError;
use super::host::{RelayHost, RelaySpec};
use super::identity::SourceIdentity;
use super::in_flight::InFlightLimit;
use super::options::RelayOptions;
use super::resolver::{self, BodyResolver, PendingFilter, ResolverFactory};
use crate::broker::Broker;
use crate::cosmos::CosmosConnection;
use crate::cosmos::charge::RequestMeter;
use crate::partition_key::{self, PartitionKeyPath};
use crate::telemetry::Telemetry;

/// A validated standalone relay over one monitored container and its lease container. Build one
/// with [`StandaloneRelay::builder`].
#[derive(Clone)]
pub struct StandaloneRelay {
    pub(crate) cosmos: CosmosConnection,
    pub(crate) database: String,
    pub(crate) container: String,
    pub(crate) lease_database: String,
    pub(crate) lease_container: String,
    pub(crate) partition_key_paths: &'static [PartitionKeyPath],
    pub(crate) declared: Option<(String, String)>,
    pub(crate) options: RelayOptions,
    pub(crate) resolver: Option<Arc<dyn ResolverFactory>>,
    pub(crate) pending_filter: Option<PendingFilter>,
}

impl std::fmt::Debug for StandaloneRelay {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StandaloneRelay")
            .field(
                "monitored",
                &format!("{}/{}", self.database, self.container),
            )
            .field(
                "leases",
                &format!("{}/{}", self.lease_database, self.lease_container),
            )
            .field("partition_key_paths", &self.partition_key_paths)
            .field("declared", &self.declared)
            .field("resolver", &self.resolver.is_some())
            .field("pending_filter", &self.pending_filter.is_some())
            .finish_non_exhaustive()
    }
}

impl StandaloneRelay {
    /// Starts configuring a relay of `database/container`'s change feed, with its leases in
    /// `lease_database/lease_container` (partition key `/id`), both reached through `cosmos`.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// use chatter_runtime::cosmos::CosmosConnection;
    /// use chatter_runtime::relay::StandaloneRelay;
    /// use chatter_runtime::{Report, Runtime};
    ///
    /// # async fn run(cosmos: CosmosConnection) -> Result<(), Report> {
    /// // Publishes the Outbox Documents another service writes to `billing/invoices`.
    /// let relay = StandaloneRelay::builder(&cosmos, ("billing", "invoices"), ("billing", "invoices-leases"))
    ///     .partition_key_paths(&["/tenantId"])
    ///     .build()?;
    /// let runtime = Runtime::builder().cosmos(cosmos).standalone_relay(relay).start().await?;
    /// runtime.shutdown().await;
    /// # Ok(()) }
    /// ```
    pub fn builder(
        cosmos: &CosmosConnection,
        (database, container): (&str, &str),
        (lease_database, lease_container): (&str, &str),
    ) -> StandaloneRelayBuilder {
        StandaloneRelayBuilder {
            cosmos: cosmos.clone(),
            database: database.to_owned(),
            container: container.to_owned(),
            lease_database: lease_database.to_owned(),
            lease_container: lease_container.to_owned(),
            partition_key_paths: Vec::new(),
            declared: None,
            options: RelayOptions::default(),
            resolver: None,
            pending_filter: None,
        }
    }

    /// The relay's change-feed source identity: the declared pair when one was given, else the
    /// containers' ground truth (account endpoint, database, container of each).
    pub(crate) fn source_identity(&self) -> SourceIdentity {
        match &self.declared {
            Some((monitored, lease)) => SourceIdentity::Declared {
                monitored: monitored.clone(),
                lease: lease.clone(),
            },
            None => SourceIdentity::GroundTruth {
                monitored_endpoint: self.cosmos.endpoint().to_owned(),
                monitored_database: self.database.clone(),
                monitored_container: self.container.clone(),
                lease_endpoint: self.cosmos.endpoint().to_owned(),
                lease_database: self.lease_database.clone(),
                lease_container: self.lease_container.clone(),
            },
        }
    }

    /// Its change-feed processor name: `chatter-cosmos-outbox-relay:` and a hash of its source
    /// identity (the declared pair, or the containers' account endpoint, database and name), the
    /// same in every process that relays the same source.
    pub fn processor_name(&self) -> String {
        self.source_identity().processor_name()
    }

    /// Starts `relays` in a process that only relays (no commands, no registry): the same
    /// checks as inside a runtime (identities, then every monitored container, then every
    /// processor), publishing on `broker`.
    ///
    /// # Errors
    ///
    /// As [`RuntimeBuilder::start`](crate::RuntimeBuilder::start) for its relays: options that
    /// cannot work, two relays with one identity, a broker whose setup does not meet the relay's
    /// needs ([`Broker::verify`]), a container that breaks the Monitored
    /// Container Contract or cannot be reached, a processor that does not start (what started
    /// is stopped first).
    pub async fn start_all(
        relays: Vec<StandaloneRelay>,
        broker: impl Broker,
    ) -> Result<RunningRelays, RelayError> {
        let charges = Arc::new(RequestMeter::default());
        let telemetry = Telemetry::resolve(
            crate::telemetry::Source::Global,
            crate::telemetry::Source::Global,
        );
        let specs = specs(&[], &relays)?;
        // As `start()` does for a runtime's relay: how late a republish can come.
        let contract = crate::broker::BrokerContract {
            destinations: Vec::new(),
            republish_within: relays
                .iter()
                .map(|relay| relay.options.republish_within())
                .max()
                .unwrap_or_default(),
            max_delivery_attempts: Default::default(),
        };
        let bound = relays
            .iter()
            .map(|relay| relay.options.publish_timeout)
            .max()
            .unwrap_or_default();
        crate::broker::bounded(|| "verify".to_owned(), bound, broker.verify(&contract))
            .await
            .map_err(RelayError::Broker)?;
        let host = RelayHost::start_specs(Arc::new(broker), specs, &charges, &telemetry).await?;
        Ok(RunningRelays { host })
    }
}

/// The relay specs of `relays`, refusing two with one identity, or one with the identity of a
/// processor in `others` (checked before any container is read).
pub(crate) fn specs(
    others: &[RelaySpec],
    relays: &[StandaloneRelay],
) -> Result<Vec<RelaySpec>, RelayError> {
    let mut seen: Vec<SourceIdentity> = others.iter().map(|o| o.identity.clone()).collect();
    let mut specs = Vec::with_capacity(relays.len());
    for relay in relays {
        relay.options.validate()?;
        // Two relays over one container, on lease containers of their own, publish each of
        // its documents twice (and publish after commit would wait for the wrong one).
        if let Some(pipeline) = others.iter().find(|other| {
            other.pipeline
                && other.cosmos.endpoint() == relay.cosmos.endpoint()
                && other.database == relay.database
                && other.container == relay.container
        }) {
            return Err(RelayError::OverPipelineContainer {
                database: relay.database.clone(),
                container: relay.container.clone(),
                processor_name: pipeline.processor_name.clone(),
            });
        }
        let identity = relay.source_identity();
        if seen.contains(&identity) {
            return Err(match identity {
                SourceIdentity::Declared { monitored, lease } => {
                    RelayError::DuplicateDeclaredIdentity { monitored, lease }
                }
                SourceIdentity::GroundTruth { .. } => RelayError::SameGroundTruth {
                    processor_name: identity.processor_name(),
                },
            });
        }
        specs.push(relay.spec(&identity));
        seen.push(identity);
    }
    Ok(specs)
}

impl StandaloneRelay {
    fn spec(&self, identity: &SourceIdentity) -> RelaySpec {
        RelaySpec {
            cosmos: self.cosmos.clone(),
            identity: identity.clone(),
            processor_name: identity.processor_name(),
            database: self.database.clone(),
            container: self.container.clone(),
            lease_database: self.lease_database.clone(),
            lease_container: self.lease_container.clone(),
            partition_key_paths: self.partition_key_paths,
            options: self.options.clone(),
            resolver: self.resolver.clone(),
            pending_filter: self.pending_filter.clone(),
            // Its own, not the pipeline relay's nor another standalone relay's.
            in_flight: InFlightLimit::new(self.options.max_in_flight),
            pipeline: false,
        }
    }
}

/// Standalone relays started on their own ([`StandaloneRelay::start_all`]).
#[derive(Debug)]
pub struct RunningRelays {
    host: RelayHost,
}

impl RunningRelays {
    /// The processor names and the lease tokens this instance drains now.
    pub fn owned_leases(&self) -> Vec<(String, Vec<String>)> {
        self.host.owned_leases()
    }

    /// The leases under a Drain Suspension now, per processor.
    pub fn suspended_leases(&self) -> Vec<(String, Vec<String>)> {
        self.host.suspended_leases()
    }

    /// Stops every processor: pages in flight finish, leases are released.
    pub async fn shutdown(self) {
        self.host.shutdown().await;
    }
}

/// Configures a [`StandaloneRelay`]; [`build`](Self::build) validates it.
#[must_use = "a builder does nothing until `.build()`"]
pub struct StandaloneRelayBuilder {
    cosmos: CosmosConnection,
    database: String,
    container: String,
    lease_database: String,
    lease_container: String,
    partition_key_paths: Vec<String>,
    declared: Option<(String, String)>,
    options: RelayOptions,
    resolver: Option<Arc<dyn ResolverFactory>>,
    pending_filter: Option<PendingFilter>,
}

impl std::fmt::Debug for StandaloneRelayBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StandaloneRelayBuilder")
            .field(
                "monitored",
                &format!("{}/{}", self.database, self.container),
            )
            .field("partition_key_paths", &self.partition_key_paths)
            .finish_non_exhaustive()
    }
}

impl StandaloneRelayBuilder {
    /// The monitored container's partition-key path(s), in order (one for a plain key, up to
    /// three for a hierarchical one): the relay reads each document's key at them to stamp it,
    /// and checks at start that the container has exactly these.
    pub fn partition_key_paths(mut self, paths: &[&str]) -> Self {
        self.partition_key_paths = paths.iter().map(|p| (*p).to_owned()).collect();
        self
    }

    /// Declares the relay's change-feed source identity (both non-blank), instead of keying it
    /// on the containers' ground truth: two relays over the same containers with distinct
    /// declared pairs are distinct processors.
    pub fn source_identities(
        mut self,
        monitored: impl Into<String>,
        lease: impl Into<String>,
    ) -> Self {
        self.declared = Some((monitored.into(), lease.into()));
        self
    }

    /// The relay's settings (delivered status and ttl, timings, in-flight limit); default
    /// [`RelayOptions::default`].
    pub fn options(mut self, options: RelayOptions) -> Self {
        self.options = options;
        self
    }

    /// Admits only the pending documents `filter` also accepts. Evaluated exactly once per
    /// pending document of a page; it can only narrow (a document that is not a pending Outbox
    /// Document is never admitted, whatever it says). A filter that panics fails the page, as a
    /// throwing filter fails the batch in .NET: nothing of the page is published, it is not
    /// checkpointed and is read again (each time logged at Error as a fault of its lease, which
    /// does not advance until the filter stops panicking).
    ///
    /// [`Runtime::relay_idle`](crate::Runtime::relay_idle) and the shutdown drain count the
    /// relay's pending documents with the same filter, so what it turns away is no backlog: it
    /// is evaluated there too, on each pending document counted. Keep it a function of the
    /// document alone.
    pub fn pending_filter(
        mut self,
        filter: impl Fn(&Value) -> bool + Send + Sync + 'static,
    ) -> Self {
        self.pending_filter = Some(Arc::new(filter));
        self
    }

    /// Builds each admitted document's message with a [`BodyResolver`] that `factory` makes for
    /// that document (never for one the pending gate, the filter or a suspended lease turns
    /// away). Without one, the document is the message (the verbatim path, under the Outbox
    /// Document Contract).
    pub fn body_resolver<F, R>(mut self, factory: F) -> Self
    where
        F: Fn() -> R + Send + Sync + 'static,
        R: BodyResolver,
    {
        self.resolver = Some(resolver::factory(factory));
        self
    }

    /// Validates the configuration.
    ///
    /// # Errors
    ///
    /// [`StandaloneRelayError`]: a blank container name, no partition-key path or a blank one,
    /// more than three, a declared identity with a blank side, options that cannot work
    /// (delivered status and ttl included).
    pub fn build(self) -> Result<StandaloneRelay, StandaloneRelayError> {
        for (role, name) in [
            ("database", &self.database),
            ("container", &self.container),
            ("lease database", &self.lease_database),
            ("lease container", &self.lease_container),
        ] {
            if name.trim().is_empty() {
                return Err(StandaloneRelayError::BlankName { role });
            }
        }
        if self.partition_key_paths.is_empty() {
            return Err(StandaloneRelayError::NoPartitionKeyPath);
        }
        if self.partition_key_paths.iter().any(|path| {
            partition_key::segments(path).next().is_none()
                || partition_key::segments(path).any(|segment| segment.trim().is_empty())
        }) {
            return Err(StandaloneRelayError::BlankPartitionKeyPath);
        }
        partition_key::check_levels(self.partition_key_paths.len()).map_err(|_| {
            StandaloneRelayError::TooManyPartitionKeyPaths {
                count: self.partition_key_paths.len(),
            }
        })?;
        if let Some((monitored, lease)) = &self.declared
            && (monitored.trim().is_empty() || lease.trim().is_empty())
        {
            return Err(StandaloneRelayError::HalfDeclaredIdentity);
        }
        self.options
            .validate()
            .map_err(|source| StandaloneRelayError::Options(Box::new(source)))?;
        // One per relay configuration, for the life of the process: the drain reads them as
        // `'static` like the derive's.
        let partition_key_paths: &'static [PartitionKeyPath] = Box::leak(
            self.partition_key_paths
                .into_iter()
                .map(|path| {
                    let path: &'static str =
                        Box::leak(partition_key::canonical(&path).into_boxed_str());
                    PartitionKeyPath {
                        path,
                        pointer: path,
                    }
                })
                .collect::<Vec<_>>()
                .into_boxed_slice(),
        );
        Ok(StandaloneRelay {
            cosmos: self.cosmos,
            database: self.database,
            container: self.container,
            lease_database: self.lease_database,
            lease_container: self.lease_container,
            partition_key_paths,
            declared: self.declared,
            options: self.options,
            resolver: self.resolver,
            pending_filter: self.pending_filter,
        })
    }
}

/// Why a standalone relay's configuration was refused (with the .NET module's texts where it
/// has them).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StandaloneRelayError {
    /// A database or container name is blank.
    #[error("A non-null, non-whitespace {role} is required.")]
    BlankName {
        /// Which name.
        role: &'static str,
    },
    /// No partition-key path was given.
    #[error("A container partition-key path is required.")]
    NoPartitionKeyPath,
    /// A partition-key path has no non-blank segment.
    #[error("Every container partition-key path segment must be non-null and non-whitespace.")]
    BlankPartitionKeyPath,
    /// More partition-key paths than Cosmos allows.
    #[error("a Cosmos container has at most 3 partition-key paths, got {count}")]
    TooManyPartitionKeyPaths {
        /// How many were given.
        count: usize,
    },
    /// A declared source identity with a blank side.
    #[error(
        "MonitoredSourceIdentity and LeaseSourceIdentity must be supplied together as non-whitespace values, or both left null to key on the resolved containers' ground-truth identity. Declaring or blanking only one side derives a processor/lease identity from an empty token, which can collide with another standalone relay's lease."
    )]
    HalfDeclaredIdentity,
    /// The relay options cannot work (the source says which).
    #[error("invalid standalone relay options")]
    Options(#[source] Box<RelayError>),
}
