//! Starting a runtime, phase by phase: the settings before anything connects, the store and
//! the relay's identities, the commands' containers, the brokers, the relay, the consumers.

use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::broker::{Broker, InMemoryBroker, MessagingSystems, dead_letter_destination};
use crate::cosmos::CosmosConnection;
use crate::cosmos::charge::RequestMeter;
use crate::pipeline::Pipeline;
use crate::registry::Registry;
use crate::relay::RelayOptions;
use crate::relay::host::{RelayHost, RelaySpec};
use crate::relay::identity;
use crate::relay::in_flight::InFlightLimit;
use crate::relay::standalone::StandaloneRelay;
use crate::telemetry::Telemetry;

use super::builder::RuntimeBuilder;
use super::consumer::DEFAULT_MAX_DELIVERY_ATTEMPTS;
use super::{Inner, Runtime, StartError, consumer, health, idle};

/// Starts chatter from every registration in the binary, with settings from the environment.
///
/// Equivalent to `Runtime::builder().start()`: Cosmos from `CHATTER_COSMOS_ENDPOINT` /
/// `CHATTER_COSMOS_KEY` (or the embedded emulator when unset and the `embedded` feature is on),
/// and the in-memory broker.
///
/// # Examples
///
/// ```no_run
/// # async fn run() -> Result<(), chatter_runtime::Report> {
/// // Every command the binary's `#[derive(DocumentReliable)]`s registered is consumed, and the
/// // relay publishes what their handlers send.
/// let runtime = chatter_runtime::start().await?;
/// // ... until the service is asked to stop; the work in flight then finishes:
/// runtime.shutdown().await;
/// # Ok(()) }
/// ```
pub async fn start() -> Result<Runtime, StartError> {
    Runtime::builder().start().await
}

impl RuntimeBuilder {
    /// Validates the registrations, connects, derives every command's container, subscribes to
    /// every command's destination and starts consuming.
    ///
    /// Every registration problem is reported in one [`StartError::Registry`]; a missing container
    /// fails the start ([`StartError::Container`]): chatter never creates containers. A
    /// [consumer concurrency](Self::consumer_concurrency) out of range, a zero
    /// [delivery timeout](Self::delivery_timeout) and [relay options](Self::relay_options) that
    /// cannot work fail it before anything connects ([`StartError::ConsumerConcurrency`],
    /// [`StartError::ZeroDeliveryTimeout`], [`StartError::Relay`]). Each container check is
    /// bounded by the relay's `store_timeout` (30 s without the relay). The brokers are then
    /// checked against what chatter needs of them ([`Broker::verify`]: RabbitMQ declares every
    /// command's queue and dead-letter queue, NATS checks the server and the streams), bounded by
    /// the relay's publish timeout ([`StartError::Broker`]).
    pub async fn start(self) -> Result<Runtime, StartError> {
        // Settings, before anything connects.
        let concurrency = self.checked_settings()?;
        let registry = self.registry.map_or_else(Registry::from_inventory, Ok)?;
        check_state(&registry, &self.state)?;
        // The store, and every relay processor's identity against the others, before any
        // container is read.
        let cosmos = match self.cosmos {
            Some(cosmos) => cosmos,
            None => CosmosConnection::resolve().await?,
        };
        let relay_specs = relay_specs(&registry, &cosmos, self.relay.as_ref(), &self.standalone)?;
        let bounds = Bounds::of(self.relay.as_ref());
        let inboxes = check_command_containers(
            &registry,
            &cosmos,
            bounds.store,
            self.delivery_timeout,
            &InboxClaims {
                clock_margin: self.inbox_clock_margin,
                period: self.inbox_claim_period,
                renewal: self.inbox_renewal_interval,
            },
        )
        .await?;
        let broker = self
            .broker
            .unwrap_or_else(|| Arc::new(InMemoryBroker::new()));
        // The relay, and a handler's sends (`ctx.send`'s check, a keyless command's direct
        // publishes), go through the broker each message names; the consumers (and their retry
        // copies and dead letters, which keep the delivery's context) use the default.
        let relay_broker = by_messaging_system(broker.clone(), self.brokers_by_system);
        let consume = self.consume.then_some(broker.as_ref());
        verify_brokers(
            &registry,
            consume,
            &relay_broker,
            relay_specs.as_deref(),
            bounds,
        )
        .await?;
        // The global providers are read now: set them before `start()`.
        let telemetry = Telemetry::resolve(self.meter, self.tracer);
        let charges = Arc::new(RequestMeter::default());
        let (relay, watched) =
            start_relay(relay_specs, &relay_broker, &charges, &telemetry).await?;
        if self.relay.is_none() {
            say_where_outbox_documents_go(&registry, &cosmos);
        }
        let after_commit = match &relay {
            Some(relay) if self.publish_after_commit => relay.after_commit().clone(),
            _ => std::collections::HashMap::new(),
        };
        let state = Arc::new(self.state);
        let pipeline = Pipeline::new(cosmos.clone(), relay_broker, Arc::clone(&charges), state)
            .with_inboxes(inboxes)
            .with_after_commit(after_commit);
        let plan = ConsumerPlan {
            broker: &broker,
            pipeline: &pipeline,
            concurrency,
            redelivery_delay: self.redelivery_delay,
            delivery_timeout: self.delivery_timeout,
            lane_wait_limit: self.lane_wait_limit,
            publish_timeout: bounds.publish,
            tracer: &telemetry.tracer,
        };
        let (consumers, relay) = consume_or_stop(&registry, self.consume, plan, relay).await?;
        Ok(Runtime {
            inner: Arc::new(Inner {
                registry,
                cosmos,
                broker,
                pipeline,
                cancel: consumers.cancel,
                tracker: consumers.tracker,
                relay: tokio::sync::Mutex::new(relay),
                consumers: consumers.statuses,
                charges,
                shutdown_drain: self.shutdown_drain,
                watched,
            }),
        })
    }

    /// The consumer concurrency as the prefetch a broker is asked for, after checking the
    /// settings that cannot work: the concurrency, the delivery timeout, the lane wait limit,
    /// the relay options and the brokers' messaging-system names.
    fn checked_settings(&self) -> Result<u16, StartError> {
        let concurrency = u16::try_from(self.consumer_concurrency)
            .ok()
            .filter(|n| *n >= 1)
            .ok_or(StartError::ConsumerConcurrency {
                concurrency: self.consumer_concurrency,
            })?;
        if self.delivery_timeout.is_zero() {
            return Err(StartError::ZeroDeliveryTimeout);
        }
        if self.lane_wait_limit.is_zero() {
            return Err(StartError::ZeroLaneWaitLimit);
        }
        if let Some(options) = &self.relay {
            options.validate()?;
        }
        check_messaging_systems(&self.brokers_by_system)?;
        Ok(concurrency)
    }
}

/// How long start-time calls may take: store calls like the relay's, and every broker wait of
/// the consumers (subscribing, retry copies, dead letters) like its publishes.
#[derive(Clone, Copy)]
struct Bounds {
    store: Duration,
    publish: Duration,
}

impl Bounds {
    fn of(relay: Option<&RelayOptions>) -> Self {
        let defaults = RelayOptions::default();
        let options = relay.unwrap_or(&defaults);
        Self {
            store: options.processor.store_timeout,
            publish: options.publish_timeout,
        }
    }
}

/// The brokers' own setup, before anything publishes or consumes: first what no setting could
/// fix (a dead-letter destination the protocol cannot name, checked on the consumers' broker
/// when the runtime consumes), then the settings, bounded by the publish timeout.
async fn verify_brokers(
    registry: &Registry,
    consumers: Option<&dyn Broker>,
    relay_broker: &Arc<dyn Broker>,
    relays: Option<&[RelaySpec]>,
    bounds: Bounds,
) -> Result<(), StartError> {
    if let Some(broker) = consumers {
        check_dead_letters(registry, broker)?;
    }
    let contract = broker_contract(registry, consumers.is_some(), relays);
    let verifying = relay_broker.verify(&contract);
    crate::broker::bounded(|| "verify".to_owned(), bounds.publish, verifying)
        .await
        .map_err(|source| StartError::Broker { source })
}

/// The relay: every monitored container verified, then every processor started; and what
/// `relay_idle` and the shutdown drain watch (the containers it drains, its in-flight limits).
async fn start_relay(
    specs: Option<Vec<RelaySpec>>,
    broker: &Arc<dyn Broker>,
    charges: &Arc<RequestMeter>,
    telemetry: &Telemetry,
) -> Result<(Option<RelayHost>, idle::Watched), StartError> {
    let drained: Vec<idle::Drained> = specs
        .iter()
        .flatten()
        .map(|spec| idle::Drained {
            cosmos: spec.cosmos.clone(),
            database: spec.database.clone(),
            container: spec.container.clone(),
            pending_filter: spec.pending_filter.clone(),
        })
        .collect();
    let relay = match specs {
        Some(specs) => {
            Some(RelayHost::start_specs(broker.clone(), specs, charges, telemetry).await?)
        }
        None => None,
    };
    let in_flight = relay
        .as_ref()
        .map(|relay| relay.in_flight().to_vec())
        .unwrap_or_default();
    Ok((relay, idle::Watched { drained, in_flight }))
}

/// The consumers, when the runtime consumes. A failure stops the relay: nothing runs behind a
/// failed start.
async fn consume_or_stop(
    registry: &Registry,
    consume: bool,
    plan: ConsumerPlan<'_>,
    relay: Option<RelayHost>,
) -> Result<(Consumers, Option<RelayHost>), StartError> {
    if !consume {
        return Ok((Consumers::none(), relay));
    }
    match start_consumers(registry, plan).await {
        Ok(consumers) => Ok((consumers, relay)),
        Err(error) => {
            if let Some(relay) = relay {
                relay.shutdown().await;
            }
            Err(error)
        }
    }
}

/// Refuses a handler whose application state the runtime was not given.
fn check_state(registry: &Registry, state: &crate::state::AppState) -> Result<(), StartError> {
    for command in registry.commands() {
        let handler = command.handler;
        if let Some(needed) = handler.state
            && !state.contains((needed.type_id)())
        {
            return Err(StartError::MissingState {
                handler: handler.handler_name,
                location: handler.location,
                state_type: (needed.type_name)(),
            });
        }
    }
    Ok(())
}

/// How the standalone-inbox commands' claims are judged and kept (the builder's settings).
struct InboxClaims {
    clock_margin: Duration,
    period: Option<Duration>,
    renewal: Option<Duration>,
}

/// Derives every command's container (chatter never creates one), each bounded by
/// `store_timeout`, and logs the registration. A standalone-inbox command's gate is built
/// instead: its idempotency container must exist and be partitioned by its path.
async fn check_command_containers(
    registry: &Registry,
    cosmos: &CosmosConnection,
    store_timeout: Duration,
    delivery_timeout: Duration,
    claims: &InboxClaims,
) -> Result<std::collections::HashMap<&'static str, crate::inbox::StandaloneInbox>, StartError> {
    let mut inboxes = std::collections::HashMap::new();
    // Markers are keyed by message id alone: two commands sharing one idempotency container
    // would take each other's handled ids for their own.
    let mut idempotency: Vec<(&'static str, &'static str, &'static str)> = Vec::new();
    for command in registry.commands() {
        let r = command.registration;
        if let Some(declared) = r.standalone_inbox {
            if let Some((first, ..)) = idempotency.iter().find(|(_, database, container)| {
                (*database, *container) == (r.database, r.container)
            }) {
                return Err(StartError::SharedIdempotencyContainer {
                    first,
                    second: r.command_name,
                    database: r.database,
                    container: r.container,
                });
            }
            idempotency.push((r.command_name, r.database, r.container));
            let inbox = start_inbox(
                command,
                declared,
                cosmos,
                store_timeout,
                delivery_timeout,
                claims,
            )
            .await?;
            inboxes.insert(r.command_name, inbox);
            continue;
        }
        cosmos
            .container_within(r.database, r.container, store_timeout)
            .await
            .map_err(|source| StartError::Container {
                command: r.command_name,
                database: r.database,
                container: r.container,
                source: Box::new(source),
            })?;
        tracing::info!(
            command = r.command_name,
            destination = r.destination,
            database = r.database,
            container = r.container,
            lease = r.lease,
            handler = command.handler.handler_name,
            "chatter registered command"
        );
    }
    Ok(inboxes)
}

/// The Standalone Inbox Gate of a standalone-inbox command, its idempotency container
/// checked. Its handlers run at most the delivery timeout less the store timeout (at least a
/// second): the gate stops a handler then, so the completion (or the release) still has its
/// store timeout before the consumer's delivery timeout stops the whole attempt. Their claims
/// last the claim period and are renewed while they run.
async fn start_inbox(
    command: &crate::registry::RegisteredCommand,
    declared: crate::registry::InboxDeclaration,
    cosmos: &CosmosConnection,
    store_timeout: Duration,
    delivery_timeout: Duration,
    claims: &InboxClaims,
) -> Result<crate::inbox::StandaloneInbox, StartError> {
    let r = command.registration;
    let mut options = crate::inbox::InboxOptions::new(r.database, r.container)
        .partition_key_path(declared.partition_key_path)
        .claim_timeout(
            delivery_timeout
                .saturating_sub(store_timeout)
                .max(Duration::from_secs(1)),
        )
        .clock_margin(claims.clock_margin);
    options.claim_period = claims.period;
    options.renewal_interval = claims.renewal;
    options.marker_ttl_seconds = declared.marker_ttl_seconds;
    options.store_timeout = store_timeout;
    let inbox = crate::inbox::StandaloneInbox::new(cosmos, options)
        .await
        .map_err(|source| StartError::Inbox {
            command: r.command_name,
            source: Box::new(source),
        })?;
    tracing::info!(
        command = r.command_name,
        destination = r.destination,
        database = r.database,
        idempotency_container = r.container,
        handler = command.handler.handler_name,
        "chatter registered standalone-inbox command"
    );
    Ok(inbox)
}

/// What every consumer of a runtime shares.
struct ConsumerPlan<'a> {
    broker: &'a Arc<dyn Broker>,
    pipeline: &'a Pipeline,
    concurrency: u16,
    redelivery_delay: Duration,
    delivery_timeout: Duration,
    lane_wait_limit: Duration,
    publish_timeout: Duration,
    tracer: &'a crate::telemetry::trace_context::SharedTracer,
}

/// The running consumers: what stops them, and their health.
struct Consumers {
    cancel: CancellationToken,
    tracker: TaskTracker,
    statuses: Vec<health::ConsumerStatus>,
}

impl Consumers {
    /// No consumer (a runtime that does not consume).
    fn none() -> Self {
        Self {
            cancel: CancellationToken::new(),
            tracker: TaskTracker::new(),
            statuses: Vec::new(),
        }
    }
}

/// Checks that every command's dead letters could be carried: one the broker never could would
/// loop forever.
fn check_dead_letters(registry: &Registry, broker: &dyn Broker) -> Result<(), StartError> {
    for command in registry.commands() {
        let dead_letters = dead_letter_destination(command.registration.destination);
        let probe =
            crate::message::BrokeredMessage::json("dead-letter-check", dead_letters.clone(), "{}");
        if let Err(source) = broker.check(&probe) {
            return Err(StartError::DeadLetters {
                command: command.registration.command_name,
                dead_letters,
                source,
            });
        }
    }
    Ok(())
}

/// Subscribes to every command's destination and starts its consumer. A failed subscription
/// stops the consumers already started.
async fn start_consumers(
    registry: &Registry,
    plan: ConsumerPlan<'_>,
) -> Result<Consumers, StartError> {
    let consumers = Consumers::none();
    let mut statuses = Vec::new();
    for command in registry.commands() {
        let destination = command.registration.destination;
        let subscribing = plan
            .broker
            .subscribe_with_prefetch(destination, plan.concurrency);
        let operation = || format!("subscribe to `{destination}`");
        let subscription =
            match crate::broker::bounded(operation, plan.publish_timeout, subscribing).await {
                Ok(subscription) => subscription,
                Err(source) => {
                    consumers.cancel.cancel();
                    consumers.tracker.close();
                    consumers.tracker.wait().await;
                    return Err(StartError::Subscribe {
                        destination,
                        source,
                    });
                }
            };
        let status = health::ConsumerStatus::new(command.registration.command_name, destination);
        statuses.push(status.clone());
        let consumer = consumer::Consumer {
            command: *command,
            broker: plan.broker.clone(),
            pipeline: plan.pipeline.clone(),
            cancel: consumers.cancel.clone(),
            redelivery_delay: plan.redelivery_delay,
            delivery_timeout: plan.delivery_timeout,
            publish_timeout: plan.publish_timeout,
            lane_wait_limit: plan.lane_wait_limit,
            status,
            concurrency: plan.concurrency,
            tracer: plan.tracer.clone(),
        };
        consumers.tracker.spawn(consumer.run(subscription));
    }
    Ok(Consumers {
        statuses,
        ..consumers
    })
}

/// A runtime built `without_relay()` publishes no Outbox Document itself (not even right after
/// its commits): says so once, naming where its commands' documents wait, so nobody waits for
/// events this process will never send.
fn say_where_outbox_documents_go(registry: &Registry, cosmos: &CosmosConnection) {
    for source in identity::distinct_sources(registry, cosmos.endpoint()) {
        tracing::info!(
            database = source.database,
            container = source.container,
            lease = source.lease,
            processor = source.processor_name,
            commands = ?source.commands,
            "chatter runtime built without its relay: the Outbox Documents of these commands stay \
             pending in their container until a relay publishes them (another process of this \
             service with its relay on, sharing the lease container, or `chatter relay`); this \
             process's pipeline relay is off, and publish after commit with it"
        );
    }
}

/// The processors the runtime's relay runs: one per distinct source of the registry (with
/// `pipeline` options; none without them) and one per standalone relay. `None` when there are
/// none. Two with one identity are refused.
fn relay_specs(
    registry: &Registry,
    cosmos: &CosmosConnection,
    pipeline: Option<&RelayOptions>,
    standalone: &[StandaloneRelay],
) -> Result<Option<Vec<RelaySpec>>, StartError> {
    let mut specs: Vec<RelaySpec> = match pipeline {
        Some(options) => {
            let in_flight = InFlightLimit::new(options.max_in_flight);
            identity::distinct_sources(registry, cosmos.endpoint())
                .iter()
                .map(|source| RelaySpec::of_source(cosmos, source, options, &in_flight))
                .collect()
        }
        None => Vec::new(),
    };
    let standalone = crate::relay::standalone::specs(&specs, standalone)?;
    specs.extend(standalone);
    Ok((!specs.is_empty()).then_some(specs))
}

/// Refuses a blank messaging-system name, or one given twice (ignoring ASCII case, as messages
/// are matched): which broker a message goes to must never depend on the order of the calls.
fn check_messaging_systems(named: &[(String, Arc<dyn Broker>)]) -> Result<(), StartError> {
    for (at, (name, _)) in named.iter().enumerate() {
        let name = name.trim();
        if name.is_empty() {
            return Err(StartError::MessagingSystem {
                name: name.to_owned(),
                problem: "is blank",
            });
        }
        if named[..at]
            .iter()
            .any(|(earlier, _)| earlier.trim().eq_ignore_ascii_case(name))
        {
            return Err(StartError::MessagingSystem {
                name: name.to_owned(),
                problem: "is given a broker twice",
            });
        }
    }
    Ok(())
}

/// What the runtime needs of its brokers: the destinations its consumers read and dead-letter
/// to, and how long after a first publish a relay may publish a message again (the longest of
/// every relay's processors, standalone relays included).
fn broker_contract(
    registry: &Registry,
    consume: bool,
    relays: Option<&[RelaySpec]>,
) -> crate::broker::BrokerContract {
    let mut contract = crate::broker::BrokerContract::default();
    if consume {
        for command in registry.commands() {
            let destination = command.registration.destination;
            contract.destinations.push(destination.to_owned());
            let attempts = command
                .registration
                .max_delivery_attempts
                .unwrap_or(DEFAULT_MAX_DELIVERY_ATTEMPTS);
            contract
                .max_delivery_attempts
                .insert(destination.to_owned(), attempts);
            contract
                .destinations
                .push(dead_letter_destination(destination));
        }
    }
    contract.republish_within = relays
        .unwrap_or_default()
        .iter()
        .map(|spec| spec.options.republish_within())
        .max()
        .unwrap_or_default();
    contract
}

/// The relay's broker: the default alone, or, once brokers were given by messaging system,
/// every one chosen per message (a message naming a system without a broker is then refused).
/// Without `broker_for` every message goes to the default broker whatever it names, as before
/// brokers could be chosen: a .NET writer's system name must not block a relay that has one.
fn by_messaging_system(
    default: Arc<dyn Broker>,
    named: Vec<(String, Arc<dyn Broker>)>,
) -> Arc<dyn Broker> {
    if named.is_empty() {
        return default;
    }
    let systems = named
        .into_iter()
        .fold(MessagingSystems::new(default), |systems, (name, broker)| {
            systems.with(&name, broker)
        });
    Arc::new(systems)
}
