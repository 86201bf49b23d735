//! The pipeline-integrated relay host: one change-feed processor per distinct change-feed source
//! identity, each draining its monitored container to the broker.
//!
//! Start is two-pass: every monitored container is verified against the Monitored
//! Container Contract before any processor is built, so the relay never starts degraded.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use cosmos_change_feed::{ChangeFeedProcessor, LeaseFault, LeaseStatus, RunningProcessor};
use futures::FutureExt;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::after_commit::AfterCommit;
use super::backlog;
use super::contract;
use super::diagnostics;
use super::drain::Drain;
use super::error::RelayError;
use super::identity::{self, RelaySource, SourceIdentity};
use super::in_flight::InFlightLimit;
use super::options::RelayOptions;
use super::resolver::{PendingFilter, ResolverFactory};
use super::suspension::DrainGate;
use super::sweep::{SweepFinding, SweepFindings, Sweeper};
use crate::broker::Broker;
use crate::cosmos::charge::RequestMeter;
use crate::cosmos::{ContainerClient, CosmosConnection};
use crate::partition_key::PartitionKeyPath;
use crate::telemetry::Telemetry;

/// The running relays.
#[derive(Debug)]
pub(crate) struct RelayHost {
    processors: Vec<Running>,
    /// The in-flight limits of the relays: one the pipeline relay's processors share, one of
    /// each standalone relay.
    in_flight: Vec<InFlightLimit>,
    /// Publish after commit of each container the commands write, by database and container.
    after_commit: HashMap<(String, String), AfterCommit>,
    /// Stops the backlog estimates and the stranded-document sweeps.
    estimates: CancellationToken,
    estimators: TaskTracker,
}

/// One change-feed processor to start: its source, its containers, how it drains.
#[derive(Clone)]
pub(crate) struct RelaySpec {
    pub(crate) cosmos: CosmosConnection,
    pub(crate) identity: SourceIdentity,
    pub(crate) processor_name: String,
    pub(crate) database: String,
    pub(crate) container: String,
    pub(crate) lease_database: String,
    pub(crate) lease_container: String,
    pub(crate) partition_key_paths: &'static [PartitionKeyPath],
    pub(crate) options: RelayOptions,
    /// The standalone relay's body resolver (`None`: the verbatim path).
    pub(crate) resolver: Option<Arc<dyn ResolverFactory>>,
    /// The standalone relay's additional pending filter.
    pub(crate) pending_filter: Option<PendingFilter>,
    /// The limit of the relay this processor belongs to (`options.max_in_flight` documents),
    /// shared by that relay's processors only.
    pub(crate) in_flight: InFlightLimit,
    /// The pipeline relay's processor of a container commands write: publish after commit
    /// answers to it (a standalone relay's never, whatever container it monitors).
    pub(crate) pipeline: bool,
}

impl RelaySpec {
    /// The pipeline relay's processor of `source` (the verbatim path, `options` and
    /// `in_flight` shared by every source).
    pub(crate) fn of_source(
        cosmos: &CosmosConnection,
        source: &RelaySource,
        options: &RelayOptions,
        in_flight: &InFlightLimit,
    ) -> Self {
        Self {
            cosmos: cosmos.clone(),
            identity: source.identity.clone(),
            processor_name: source.processor_name.clone(),
            database: source.database.to_owned(),
            container: source.container.to_owned(),
            lease_database: source.database.to_owned(),
            lease_container: source.lease.to_owned(),
            partition_key_paths: source.partition_key_paths,
            options: options.clone(),
            resolver: None,
            pending_filter: None,
            in_flight: in_flight.clone(),
            pipeline: true,
        }
    }
}

impl RelayHost {
    /// Verifies every monitored container, then starts one processor per spec, each draining
    /// under its relay's in-flight limit (the pipeline relay's processors share one, each
    /// standalone relay has its own `max_in_flight`). Options were validated before, ahead of
    /// any container check. A processor that does not start stops the ones that did; its error
    /// is the one returned.
    pub(crate) async fn start_specs(
        broker: Arc<dyn Broker>,
        specs: Vec<RelaySpec>,
        charges: &Arc<RequestMeter>,
        telemetry: &Telemetry,
    ) -> Result<Self, RelayError> {
        let timeout = specs
            .iter()
            .map(|spec| spec.options.processor.store_timeout)
            .max()
            .unwrap_or_default();
        contract::verify_targets(
            specs.iter().map(|spec| contract::Target {
                connection: &spec.cosmos,
                database: &spec.database,
                container: &spec.container,
                partition_key_paths: spec.partition_key_paths,
            }),
            timeout,
        )
        .await?;

        let instance = identity::instance_name();
        let in_flight = specs.iter().map(|spec| spec.in_flight.clone()).collect();
        let mut processors = Vec::with_capacity(specs.len());
        for spec in &specs {
            let shared = Shared {
                instance: &instance,
                charges,
                telemetry,
            };
            match start_one(&broker, spec, &shared).await {
                Ok(processor) => processors.push(processor),
                Err(error) => {
                    // Stop what already started; the original error is what the caller sees.
                    for started in processors {
                        started.processor.shutdown().await;
                    }
                    return Err(error);
                }
            }
        }
        // Publish after commit, for the containers chatter's commands write: the pipeline
        // relay's (a standalone relay over such a container, with the pipeline relay off, does
        // not turn it on).
        let after_commit = specs
            .iter()
            .zip(&processors)
            .filter(|(spec, _)| spec.pipeline)
            .map(|(spec, started)| {
                (
                    (spec.database.clone(), spec.container.clone()),
                    started.after_commit.clone(),
                )
            })
            .collect();
        let estimates = CancellationToken::new();
        let estimators = TaskTracker::new();
        let processors = processors
            .into_iter()
            .map(|started| {
                let Companions {
                    backlogs,
                    estimator,
                    state,
                    sweeper,
                } = started.companions;
                if let Some(estimator) = estimator {
                    estimators.spawn(estimator.run(estimates.clone()));
                }
                estimators.spawn(state.run(estimates.clone()));
                let sweeps = sweeper.findings.clone();
                estimators.spawn(sweeper.run(estimates.clone()));
                Running {
                    processor: started.processor,
                    gate: started.gate,
                    backlogs,
                    sweeps,
                }
            })
            .collect();
        estimators.close();
        Ok(Self {
            processors,
            in_flight,
            after_commit,
            estimates,
            estimators,
        })
    }

    /// Publish after commit of each container the commands write, by database and container.
    pub(crate) fn after_commit(&self) -> &HashMap<(String, String), AfterCommit> {
        &self.after_commit
    }

    /// The in-flight limits of the relays: whether documents are in flight.
    pub(crate) fn in_flight(&self) -> &[InFlightLimit] {
        &self.in_flight
    }

    /// The lease tokens this instance drains now, per processor.
    pub(crate) fn owned_leases(&self) -> Vec<(String, Vec<String>)> {
        self.processors
            .iter()
            .map(|running| {
                let p = &running.processor;
                (p.processor_name().to_owned(), p.owned_leases())
            })
            .collect()
    }

    /// Every lease this instance owns: its processor, its progress and fault, and whether it is
    /// under a Drain Suspension.
    pub(crate) fn lease_statuses(&self) -> Vec<LeaseState> {
        let mut statuses = Vec::new();
        for Running {
            processor,
            gate,
            backlogs,
            sweeps,
        } in &self.processors
        {
            for status in processor.lease_statuses() {
                let suspended = gate.is_suspended(&status.lease_token);
                let blocked = gate.blocked(&status.lease_token);
                let backlog = backlogs.of(&status.lease_token);
                let sweep = sweeps.of(&status.lease_token);
                statuses.push(LeaseState {
                    processor: processor.processor_name().to_owned(),
                    status,
                    suspended,
                    blocked,
                    backlog,
                    sweep,
                });
            }
        }
        statuses
    }

    /// The leases this instance owns that are under a Drain Suspension now, per processor (only
    /// processors with one).
    pub(crate) fn suspended_leases(&self) -> Vec<(String, Vec<String>)> {
        self.processors
            .iter()
            .filter_map(
                |Running {
                     processor: p, gate, ..
                 }| {
                    let owned = p.owned_leases();
                    let mut suspended = gate.suspended_leases();
                    // A lease released a moment ago may still be forgotten by its gate.
                    suspended.retain(|lease| owned.contains(lease));
                    (!suspended.is_empty()).then(|| (p.processor_name().to_owned(), suspended))
                },
            )
            .collect()
    }

    /// Stops every processor, finishing pages in flight and releasing leases.
    pub(crate) async fn shutdown(self) {
        // What is being published after its commit finishes first: the drains wait for it.
        for after_commit in self.after_commit.values() {
            after_commit.finish().await;
        }
        self.estimates.cancel();
        self.estimators.wait().await;
        for running in self.processors {
            running.processor.shutdown().await;
        }
    }
}

/// What every processor of one relay host shares.
struct Shared<'a> {
    instance: &'a str,
    charges: &'a Arc<RequestMeter>,
    telemetry: &'a Telemetry,
}

/// Starts one processor: its containers opened, its drain built, its companions (backlog
/// estimator, state publisher, stranded-document sweep) made from the same containers.
async fn start_one(
    broker: &Arc<dyn Broker>,
    source: &RelaySpec,
    shared: &Shared<'_>,
) -> Result<Started, RelayError> {
    let (monitored, leases) = open_containers(source).await?;
    let drain = build_drain(broker, source, &monitored, shared);
    let companions = Companions::of(source, shared.instance, &drain, &monitored, &leases);
    let after_commit = drain.after_commit();
    let gate = Arc::clone(drain.gate());
    let processor = start_processor(source, shared, drain, monitored, leases).await?;
    tracing::info!(processor = source.processor_name, instance = shared.instance, container = %format!("{}/{}", source.database, source.container), "chatter relay started");
    Ok(Started {
        processor,
        gate,
        companions,
        after_commit,
    })
}

/// The monitored and lease containers of `source`, each bounded by the store timeout.
async fn open_containers(
    source: &RelaySpec,
) -> Result<(Arc<ContainerClient>, Arc<ContainerClient>), RelayError> {
    let store_timeout = source.options.processor.store_timeout;
    let container = |database: &str, name: &str| {
        let (database, name) = (database.to_owned(), name.to_owned());
        async move {
            source
                .cosmos
                .container_within(&database, &name, store_timeout)
                .await
                .map_err(|e| RelayError::Container {
                    database: source.database.clone(),
                    container: source.container.clone(),
                    missing: format!("{database}/{name}"),
                    source: Box::new(e),
                })
        }
    };
    let monitored = container(&source.database, &source.container).await?;
    let leases = container(&source.lease_database, &source.lease_container).await?;
    Ok((monitored, leases))
}

/// The drain of `source`'s pages: its resolver, pending filter, timeouts, in-flight limit,
/// request meter and telemetry.
fn build_drain(
    broker: &Arc<dyn Broker>,
    source: &RelaySpec,
    monitored: &Arc<ContainerClient>,
    shared: &Shared<'_>,
) -> Drain {
    let options = &source.options;
    let drain = Drain::new(
        source.processor_name.clone(),
        broker.clone(),
        monitored.clone(),
        source.partition_key_paths,
        options.delivery.clone(),
    )
    .with_resolver(source.resolver.clone())
    .with_pending_filter(source.pending_filter.clone())
    .with_after_commit_remembered_for(options.after_commit_remembered_for())
    .with_timeouts(options.publish_timeout, options.processor.store_timeout)
    .with_in_flight_limit(source.in_flight.clone())
    .with_request_meter(Arc::clone(shared.charges))
    .with_telemetry(shared.telemetry);
    #[cfg(feature = "test-support")]
    let drain = match &options.suspension_clock {
        Some(clock) => drain.with_clock(std::sync::Arc::clone(&clock.0)),
        None => drain,
    };
    drain
}

/// What runs beside a processor, over the same containers and options.
struct Companions {
    backlogs: Backlogs,
    estimator: Option<backlog::Estimator>,
    state: super::state::StatePublisher,
    sweeper: Sweeper,
}

impl Companions {
    fn of(
        source: &RelaySpec,
        instance: &str,
        drain: &Drain,
        monitored: &Arc<ContainerClient>,
        leases: &Arc<ContainerClient>,
    ) -> Self {
        let options = &source.options;
        let backlogs = Backlogs::default();
        // With metrics on, the backlog is estimated from the same containers and options.
        let estimator = drain.metrics().map(|metrics| backlog::Estimator {
            processor_name: source.processor_name.clone(),
            instance: instance.to_owned(),
            monitored: Arc::clone(monitored),
            leases: Arc::clone(leases),
            options: options.clone(),
            metrics: Arc::clone(metrics),
            last: Arc::clone(&backlogs.last),
        });
        let state = super::state::StatePublisher {
            processor_name: source.processor_name.clone(),
            instance: instance.to_owned(),
            leases: Arc::clone(leases),
            gate: Arc::clone(drain.gate()),
            every: options.processor.lease_renew_interval,
            store_timeout: options.processor.store_timeout,
        };
        // Always on, metrics or not: a stranded document is repaired whatever is exported.
        let sweeper = Sweeper {
            processor_name: source.processor_name.clone(),
            instance: instance.to_owned(),
            monitored: Arc::clone(monitored),
            leases: Arc::clone(leases),
            partition_key_paths: source.partition_key_paths,
            pending_filter: source.pending_filter.clone(),
            options: options.clone(),
            metrics: drain.metrics().cloned(),
            findings: SweepFindings::default(),
        };
        Self {
            backlogs,
            estimator,
            state,
            sweeper,
        }
    }
}

/// The change-feed processor of `source`, each of its pages handed to `drain`.
async fn start_processor(
    source: &RelaySpec,
    shared: &Shared<'_>,
    drain: Drain,
    monitored: Arc<ContainerClient>,
    leases: Arc<ContainerClient>,
) -> Result<RunningProcessor, RelayError> {
    let fault_metrics = drain.metrics().cloned();
    let read_metrics = drain.metrics().cloned();
    let page_charges = Arc::clone(shared.charges);
    let label = format!("{}/{}", source.database, source.container);
    let fault_source = source.processor_name.clone();
    let released_gate = Arc::clone(drain.gate());
    ChangeFeedProcessor::builder(&source.processor_name, shared.instance, monitored, leases)
        .options(source.options.processor.clone())
        .on_fault(move |fault: &LeaseFault<'_>| {
            diagnostics::change_feed_fault(
                fault_metrics.as_deref(),
                &fault_source,
                fault.lease_token,
                fault.error,
            );
        })
        // Suspension and refusal state belongs to the owner: a lease that leaves this
        // instance is forgotten, and one that comes back starts with a clean record.
        .on_lease_released(move |lease_token: &str| released_gate.forget(lease_token))
        // An empty read is lease progress too: counted as a batch of 0, so an idle lease
        // is told apart from a stalled one.
        .on_empty_read(move |lease_token: &str| {
            if let Some(metrics) = &read_metrics {
                metrics.batch(lease_token, 0);
            }
        })
        .start(move |batch| {
            let drain = drain.clone();
            let label = label.clone();
            // The read that returned documents is part of what relaying them costs.
            page_charges.relay(batch.request_charge);
            async move {
                // A lease lost mid-page stops the page: never two instances drain it.
                let report = drain
                    .drain_leased(&batch.lease_token, &batch.documents, &batch.lease_lost)
                    .await?;
                if report.published > 0 || report.undeliverable > 0 {
                    tracing::info!(
                        container = label,
                        lease = batch.lease_token,
                        published = report.published,
                        skipped = report.skipped,
                        undeliverable = report.undeliverable,
                        read_request_charge = batch.request_charge,
                        "chatter relay drained a page"
                    );
                }
                Ok(())
            }
            .boxed()
        })
        .await
        .map_err(|e| RelayError::Processor {
            database: source.database.clone(),
            container: source.container.clone(),
            source: e,
        })
}

/// A processor just started: its drain's gate and publish after commit, and its companions,
/// not yet running.
struct Started {
    processor: RunningProcessor,
    gate: Arc<DrainGate>,
    companions: Companions,
    after_commit: AfterCommit,
}

/// A running processor and what the runtime's health reads beside it: its drain's gate, its
/// backlog estimates and its stranded-document sweep's findings.
#[derive(Debug)]
struct Running {
    processor: RunningProcessor,
    gate: Arc<DrainGate>,
    backlogs: Backlogs,
    sweeps: SweepFindings,
}

/// One owned lease as the runtime's health reports it.
pub(crate) struct LeaseState {
    pub(crate) processor: String,
    pub(crate) status: LeaseStatus,
    pub(crate) suspended: bool,
    pub(crate) blocked: Option<String>,
    pub(crate) backlog: Option<u64>,
    /// What the last stranded-document sweep found; `None` before the first.
    pub(crate) sweep: Option<SweepFinding>,
}

/// The last backlog estimate of each owned lease of one processor (empty with metrics off).
#[derive(Debug, Default)]
struct Backlogs {
    last: Arc<Mutex<HashMap<String, u64>>>,
}

impl Backlogs {
    fn of(&self, lease_token: &str) -> Option<u64> {
        self.last
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(lease_token)
            .copied()
    }
}
