//! `start()`: collect the registrations, validate them, connect, build the pipeline, consume.

mod consumer;
mod error;
mod health;
mod idle;

pub use consumer::{
    DEFAULT_CONSUMER_CONCURRENCY, DEFAULT_DELIVERY_TIMEOUT, DEFAULT_LANE_WAIT_LIMIT,
    DEFAULT_MAX_DELIVERY_ATTEMPTS,
};
pub use error::{DispatchError, StartError};
pub use health::{ConsumerHealth, ConsumerState, Health, LeaseHealth};
pub use idle::RelayNotIdle;

use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::broker::{Broker, InMemoryBroker, MessagingSystems, dead_letter_destination};
use crate::cosmos::charge::RequestMeter;
use crate::cosmos::{CosmosConnection, RequestCharges};
use crate::error_chain::ErrorChain;
use crate::pipeline::{Outcome, Pipeline};
use crate::registry::{CommandRegistration, DocumentReliable, Registry};
use crate::relay::RelayOptions;
use crate::relay::host::{RelayHost, RelaySpec};
use crate::relay::identity;
use crate::relay::in_flight::InFlightLimit;
use crate::relay::standalone::StandaloneRelay;
use crate::telemetry::{self, Telemetry};

/// Starts chatter from every registration in the binary, with settings from the environment.
///
/// Equivalent to `Runtime::builder().start()`: Cosmos from `CHATTER_COSMOS_ENDPOINT` /
/// `CHATTER_COSMOS_KEY` (or the embedded emulator when unset and the `embedded` feature is on),
/// and the in-memory broker.
pub async fn start() -> Result<Runtime, StartError> {
    Runtime::builder().start().await
}

/// Configures a [`Runtime`] before starting it.
#[must_use = "a builder does nothing until `.start().await`"]
pub struct RuntimeBuilder {
    registry: Option<Registry>,
    cosmos: Option<CosmosConnection>,
    broker: Option<Arc<dyn Broker>>,
    /// The brokers named by messaging system, in the order given.
    brokers_by_system: Vec<(String, Arc<dyn Broker>)>,
    consume: bool,
    consumer_concurrency: usize,
    redelivery_delay: Duration,
    delivery_timeout: Duration,
    lane_wait_limit: Duration,
    inbox_clock_margin: Duration,
    relay: Option<RelayOptions>,
    publish_after_commit: bool,
    meter: telemetry::Source<opentelemetry::metrics::Meter>,
    tracer: telemetry::Source<opentelemetry::global::BoxedTracer>,
    state: crate::state::AppState,
    shutdown_drain: Duration,
    standalone: Vec<StandaloneRelay>,
}

/// How long [`Runtime::shutdown`] waits by default for the relay to publish what is pending.
pub const DEFAULT_SHUTDOWN_DRAIN: Duration = Duration::from_secs(5);

impl Default for RuntimeBuilder {
    fn default() -> Self {
        Self {
            registry: None,
            cosmos: None,
            broker: None,
            brokers_by_system: Vec::new(),
            consume: true,
            consumer_concurrency: DEFAULT_CONSUMER_CONCURRENCY,
            redelivery_delay: Duration::from_millis(500),
            delivery_timeout: DEFAULT_DELIVERY_TIMEOUT,
            lane_wait_limit: DEFAULT_LANE_WAIT_LIMIT,
            inbox_clock_margin: crate::inbox::DEFAULT_CLOCK_MARGIN,
            relay: Some(RelayOptions::default()),
            publish_after_commit: true,
            meter: telemetry::Source::Global,
            tracer: telemetry::Source::Global,
            state: crate::state::AppState::default(),
            shutdown_drain: DEFAULT_SHUTDOWN_DRAIN,
            standalone: Vec::new(),
        }
    }
}

impl std::fmt::Debug for RuntimeBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RuntimeBuilder")
            .field("cosmos", &self.cosmos)
            .field("consume", &self.consume)
            .field("consumer_concurrency", &self.consumer_concurrency)
            .field("redelivery_delay", &self.redelivery_delay)
            .field("delivery_timeout", &self.delivery_timeout)
            .field("lane_wait_limit", &self.lane_wait_limit)
            .finish_non_exhaustive()
    }
}

impl RuntimeBuilder {
    /// Serves exactly this registry instead of every registration `inventory` collected
    /// (feature `test-support`: for tests that must leave some registrations out).
    #[cfg(feature = "test-support")]
    pub fn registry(mut self, registry: Registry) -> Self {
        self.registry = Some(registry);
        self
    }

    /// Gives the handlers `value` as application state: a handler takes it as a third
    /// parameter, [`State<T>`](crate::State) (shared, never cloned). One value per type; a
    /// second of the same type replaces the first. `start()` refuses a handler whose state type
    /// was not given, naming the handler and where it was written.
    pub fn state<T: Send + Sync + 'static>(mut self, value: T) -> Self {
        self.state.insert(value);
        self
    }

    /// How long [`Runtime::shutdown`] lets the relay publish the Outbox Documents still pending
    /// before it stops (default [`DEFAULT_SHUTDOWN_DRAIN`]; zero: not at all; `Duration::MAX`:
    /// until nothing is pending, however long). What is left stays pending for another
    /// instance or the next start: nothing is lost either way.
    pub fn shutdown_drain(mut self, within: Duration) -> Self {
        self.shutdown_drain = within;
        self
    }

    /// Adds a standalone relay ([`StandaloneRelay`]): it drains its container beside the
    /// commands' pipeline relay, sharing the broker, `health()` and the shutdown. It keeps its
    /// own options: its [`max_in_flight`](RelayOptions::max_in_flight) bounds its own documents
    /// in flight, and the start checks derived from relay options (the broker's duplicate
    /// window against how late a relay may publish again) take the longest bound over every
    /// relay of the runtime. Add several for several containers (each its own change-feed processor);
    /// `start()` refuses two with one source identity, or one with a pipeline source's.
    /// [`without_relay`](Self::without_relay) turns off the pipeline relay only.
    pub fn standalone_relay(mut self, relay: StandaloneRelay) -> Self {
        self.standalone.push(relay);
        self
    }

    /// Uses this Cosmos connection instead of resolving one from the environment.
    pub fn cosmos(mut self, cosmos: CosmosConnection) -> Self {
        self.cosmos = Some(cosmos);
        self
    }

    /// Uses this broker instead of a new [`InMemoryBroker`]: the consumers' broker, and the
    /// relay's for every message unless brokers are also given by messaging system
    /// ([`broker_for`](Self::broker_for)).
    pub fn broker(mut self, broker: impl Broker) -> Self {
        self.broker = Some(Arc::new(broker));
        self
    }

    /// The relay publishes the messages whose context names `messaging_system` (its
    /// `Chatter.Infrastructure.Type`, compared ignoring ASCII case) through `broker`, as the .NET
    /// module chooses its dispatcher per message; a message naming none, or the default
    /// [`broker`](Self::broker)'s own [`messaging_system`](Broker::messaging_system) (unless it
    /// was given here too: a name given here wins), goes through the default broker, which the
    /// consumers use. Once any broker is given here, a message naming a messaging system no
    /// broker is given for is refused
    /// ([`Refusal::UnknownMessagingSystem`](crate::broker::Refusal::UnknownMessagingSystem)):
    /// its document stays pending and its lease shows as blocked, naming the missing system.
    /// A blank name, or one given twice, fails [`start`](Self::start)
    /// ([`StartError::MessagingSystem`]). See [`MessagingSystems`](crate::broker::MessagingSystems).
    pub fn broker_for(mut self, messaging_system: impl Into<String>, broker: impl Broker) -> Self {
        self.brokers_by_system
            .push((messaging_system.into(), Arc::new(broker)));
        self
    }

    /// Whether to consume each command's destination from the broker (default `true`). With
    /// `false` commands are only handled through [`Runtime::dispatch`].
    pub fn consume(mut self, consume: bool) -> Self {
        self.consume = consume;
        self
    }

    /// How many deliveries each command's consumer handles at once (default
    /// [`DEFAULT_CONSUMER_CONCURRENCY`], 16); the consumer asks the broker for a prefetch of as
    /// many ([`Broker::subscribe_with_prefetch`]: `basic.qos` on RabbitMQ), so at most `n`
    /// deliveries per command are held unsettled at a time.
    ///
    /// **Order.** Deliveries whose command bodies have the same partition-key value are handled
    /// one after another, in the order they arrived; different values run concurrently, up to
    /// `n`. A body whose key does not resolve runs on its own, unordered. A failed delivery is
    /// retried by publishing its next attempt to the back of the destination, so a failure can
    /// reorder: the retry runs after the deliveries of its key that arrived behind it. With
    /// `n = 1` every delivery is handled in arrival order, one at a time.
    ///
    /// [`start`](Self::start) refuses 0 and anything above 65535 (the largest prefetch) with
    /// [`StartError::ConsumerConcurrency`].
    pub fn consumer_concurrency(mut self, n: usize) -> Self {
        self.consumer_concurrency = n;
        self
    }

    /// How long a consumer waits before returning a failed delivery to the broker (default
    /// 500 ms), so a message that keeps failing does not spin a core. A huge value keeps a
    /// failed delivery from being retried for that long.
    pub fn redelivery_delay(mut self, delay: Duration) -> Self {
        self.redelivery_delay = delay;
        self
    }

    /// How long a consumer gives one delivery attempt, from decoding its body to the batch
    /// committing (default [`DEFAULT_DELIVERY_TIMEOUT`], 5 minutes). An attempt that takes
    /// longer (a handler that hangs, a store that does not answer) fails with
    /// [`PipelineError::TimedOut`](crate::error::PipelineError::TimedOut), logged at `error`, and is
    /// retried like any failure, so its partition-key value's later deliveries are not held
    /// behind it for long. The handler's future is dropped where it waits: a handler that calls
    /// other services should not leave half-done work behind at an `.await` (its staged writes
    /// and messages are discarded with it). An attempt that timed out may still have committed:
    /// the retry finds its inbox marker, and a last attempt asks the marker before it is
    /// dead-lettered. [`Runtime::dispatch`] is not bounded: its caller awaits it.
    ///
    /// [`start`](Self::start) refuses zero with [`StartError::ZeroDeliveryTimeout`]. A huge value
    /// (`Duration::MAX`) leaves attempts unbounded (a last attempt's marker read too, saturating
    /// at about 100 years).
    pub fn delivery_timeout(mut self, timeout: Duration) -> Self {
        self.delivery_timeout = timeout;
        self
    }

    /// How long a consumer lets a delivery wait behind the delivery of its partition-key value
    /// in progress (default [`DEFAULT_LANE_WAIT_LIMIT`], 25 minutes) before it publishes it again
    /// as a copy at the back of its queue, its attempt not counted, and acks it; logged at
    /// `warn` (on JetStream, which has no such timeout, it keeps waiting). Keep it below the broker's own
    /// limit on an unsettled delivery (RabbitMQ's `consumer_timeout`, 30 minutes by default),
    /// past which the broker closes the channel and requeues every delivery on it. A returned
    /// delivery loses its place: its key's deliveries queued behind it may be handled first.
    ///
    /// [`start`](Self::start) refuses zero with [`StartError::ZeroLaneWaitLimit`].
    pub fn lane_wait_limit(mut self, limit: Duration) -> Self {
        self.lane_wait_limit = limit;
        self
    }

    /// The bound assumed between any instance's clock and the Cosmos service's, by which the
    /// standalone-inbox commands judge whether a claim may still be live (default
    /// [`DEFAULT_CLOCK_MARGIN`](crate::inbox::DEFAULT_CLOCK_MARGIN), 10 s; see
    /// [`InboxOptions::clock_margin`](crate::inbox::InboxOptions::clock_margin)). A smaller
    /// margin lets a crashed attempt's claim be taken over sooner, and is safe only while the
    /// clocks really are that close.
    pub fn inbox_clock_margin(mut self, margin: Duration) -> Self {
        self.inbox_clock_margin = margin;
        self
    }

    /// Whether the process that commits a command's batch publishes its Outbox Documents right
    /// after the commit (default **on**): each is published and stamped delivered at once,
    /// unless another Outbox Document of its partition-key value is pending (then every one of
    /// the batch is left to the relay, which keeps the key's order). It costs one
    /// single-partition query per committed batch that holds Outbox Documents, and it needs this
    /// process to run the relay of the command's container, which remains the safety net for
    /// every document this path does not publish (its publish or stamp failed, or the process
    /// died in between). `false`: every document waits for the relay's next change-feed read,
    /// as in the .NET module.
    pub fn publish_after_commit(mut self, on: bool) -> Self {
        self.publish_after_commit = on;
        self
    }

    /// Runs the change-feed relay with these options (default: on, with default options).
    pub fn relay_options(mut self, options: RelayOptions) -> Self {
        self.relay = Some(options);
        self
    }

    /// Records the relay's metrics on `meter` instead of the global meter provider's (see
    /// [`telemetry`](crate::telemetry) for the instruments). Create it under
    /// [`telemetry::METER_NAME`] so a .NET relay's dashboards read it:
    /// `provider.meter(chatter_runtime::telemetry::METER_NAME)`.
    pub fn meter(mut self, meter: opentelemetry::metrics::Meter) -> Self {
        self.meter = telemetry::Source::Given(meter);
        self
    }

    /// Records no metrics: no instrument is created, and the relay does no metric work at all.
    pub fn without_metrics(mut self) -> Self {
        self.meter = telemetry::Source::Off;
        self
    }

    /// Starts chatter's `process` and `send` spans on `tracer` instead of the global tracer
    /// provider's (see [`telemetry`](crate::telemetry)). Take it from your provider under
    /// [`telemetry::TRACER_NAME`]: `provider.tracer(chatter_runtime::telemetry::TRACER_NAME)`.
    pub fn tracer<T>(mut self, tracer: T) -> Self
    where
        T: opentelemetry::trace::Tracer + Send + Sync + 'static,
        T::Span: Send + Sync + 'static,
    {
        self.tracer =
            telemetry::Source::Given(opentelemetry::global::BoxedTracer::new(Box::new(tracer)));
        self
    }

    /// Starts no spans. Trace context still travels: `ctx.send` persists the current context
    /// and the relay publishes the persisted `traceparent` as it is.
    pub fn without_tracing(mut self) -> Self {
        self.tracer = telemetry::Source::Off;
        self
    }

    /// Turns the change-feed relay off: outbox documents stay pending until a relay elsewhere
    /// (another process sharing the lease containers) publishes them.
    pub fn without_relay(mut self) -> Self {
        self.relay = None;
        self
    }

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
        // 1. Settings, before anything connects.
        let concurrency = self.checked_concurrency()?;
        check_messaging_systems(&self.brokers_by_system)?;
        let registry = match self.registry {
            Some(registry) => registry,
            None => Registry::from_inventory()?,
        };
        check_state(&registry, &self.state)?;
        // 2. The store, and every relay processor's identity against the others, before any
        // container is read.
        let cosmos = match self.cosmos {
            Some(cosmos) => cosmos,
            None => CosmosConnection::resolve().await?,
        };
        let relay_specs = relay_specs(&registry, &cosmos, self.relay.as_ref(), &self.standalone)?;
        // Start-time store calls are bounded like the relay's, and every broker wait of the
        // consumers (subscribing, retry copies, dead letters) like its publishes.
        let defaults = RelayOptions::default();
        let options = self.relay.as_ref().unwrap_or(&defaults);
        let (store_timeout, publish_timeout) =
            (options.processor.store_timeout, options.publish_timeout);
        // 3. The commands' containers, and each standalone-inbox command's gate.
        let inboxes = check_command_containers(
            &registry,
            &cosmos,
            store_timeout,
            self.delivery_timeout,
            self.inbox_clock_margin,
        )
        .await?;
        // 4. The relay: every monitored container verified, then every processor started.
        let broker: Arc<dyn Broker> = match self.broker {
            Some(broker) => broker,
            None => Arc::new(InMemoryBroker::new()),
        };
        // The relay, and a handler's sends (`ctx.send`'s check, a keyless command's direct
        // publishes), go through the broker each message names; the consumers (and their retry
        // copies and dead letters, which keep the delivery's context) use the default.
        let relay_broker = by_messaging_system(broker.clone(), self.brokers_by_system);
        // The brokers' own setup, before anything publishes or consumes: first what no setting
        // could fix (a dead-letter destination the protocol cannot name), then the settings.
        if self.consume {
            check_dead_letters(&registry, broker.as_ref())?;
        }
        let contract = broker_contract(&registry, self.consume, relay_specs.as_deref());
        let verifying = relay_broker.verify(&contract);
        crate::broker::bounded(|| "verify".to_owned(), publish_timeout, verifying)
            .await
            .map_err(|source| StartError::Broker { source })?;
        // The global providers are read now: set them before `start()`.
        let telemetry = Telemetry::resolve(self.meter, self.tracer);
        let charges = Arc::new(RequestMeter::default());
        // What `relay_idle` and the shutdown drain count: the containers the relay drains.
        let drained: Vec<idle::Drained> = relay_specs
            .iter()
            .flatten()
            .map(|spec| idle::Drained {
                cosmos: spec.cosmos.clone(),
                database: spec.database.clone(),
                container: spec.container.clone(),
                pending_filter: spec.pending_filter.clone(),
            })
            .collect();
        let relay = match relay_specs {
            Some(specs) => Some(
                RelayHost::start_specs(relay_broker.clone(), specs, &charges, &telemetry).await?,
            ),
            None => None,
        };
        let watched = idle::Watched {
            drained,
            in_flight: relay
                .as_ref()
                .map(|relay| relay.in_flight().to_vec())
                .unwrap_or_default(),
        };
        let pipeline = Pipeline::new(
            cosmos.clone(),
            relay_broker,
            Arc::clone(&charges),
            Arc::new(self.state),
        )
        .with_inboxes(inboxes)
        .with_after_commit(match &relay {
            Some(relay) if self.publish_after_commit => relay.after_commit().clone(),
            _ => std::collections::HashMap::new(),
        });
        // 5. The consumers. A failure stops the relay: nothing runs behind a failed start.
        let plan = ConsumerPlan {
            broker: &broker,
            pipeline: &pipeline,
            concurrency,
            redelivery_delay: self.redelivery_delay,
            delivery_timeout: self.delivery_timeout,
            lane_wait_limit: self.lane_wait_limit,
            publish_timeout,
            tracer: &telemetry.tracer,
        };
        let started = if self.consume {
            start_consumers(&registry, plan).await
        } else {
            Ok(Consumers::none())
        };
        let consumers = match started {
            Ok(consumers) => consumers,
            Err(error) => {
                if let Some(relay) = relay {
                    relay.shutdown().await;
                }
                return Err(error);
            }
        };
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
    /// settings that cannot work: the concurrency, the delivery timeout, the relay options.
    fn checked_concurrency(&self) -> Result<u16, StartError> {
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
        Ok(concurrency)
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

/// Derives every command's container (chatter never creates one), each bounded by
/// `store_timeout`, and logs the registration. A standalone-inbox command's gate is built
/// instead: its idempotency container must exist and be partitioned by its path.
async fn check_command_containers(
    registry: &Registry,
    cosmos: &CosmosConnection,
    store_timeout: Duration,
    delivery_timeout: Duration,
    clock_margin: Duration,
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
                clock_margin,
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
/// checked. Its claims last the delivery timeout less the store timeout (at least the second a
/// claim is counted in): the gate stops the handler then, so the completion (or the release)
/// still has its store timeout before the consumer's delivery timeout stops the whole attempt.
async fn start_inbox(
    command: &crate::registry::RegisteredCommand,
    declared: crate::registry::InboxDeclaration,
    cosmos: &CosmosConnection,
    store_timeout: Duration,
    delivery_timeout: Duration,
    clock_margin: Duration,
) -> Result<crate::inbox::StandaloneInbox, StartError> {
    let r = command.registration;
    let mut options = crate::inbox::InboxOptions::new(r.database, r.container)
        .partition_key_path(declared.partition_key_path)
        .claim_timeout(
            delivery_timeout
                .saturating_sub(store_timeout)
                .max(Duration::from_secs(1)),
        )
        .clock_margin(clock_margin);
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

/// A started chatter runtime: consumes its commands' destinations, dispatches in process, shuts
/// down gracefully.
#[derive(Debug, Clone)]
pub struct Runtime {
    inner: Arc<Inner>,
}

struct Inner {
    registry: Registry,
    cosmos: CosmosConnection,
    broker: Arc<dyn Broker>,
    pipeline: Pipeline,
    cancel: CancellationToken,
    tracker: TaskTracker,
    relay: tokio::sync::Mutex<Option<RelayHost>>,
    consumers: Vec<health::ConsumerStatus>,
    charges: Arc<RequestMeter>,
    shutdown_drain: Duration,
    /// The containers the relay drains (what `relay_idle` counts) and its in-flight limit.
    watched: idle::Watched,
}

impl std::fmt::Debug for Inner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Runtime")
            .field("commands", &self.registry.commands().len())
            .field("cosmos", &self.cosmos)
            .finish_non_exhaustive()
    }
}

impl Runtime {
    /// A builder for a runtime.
    pub fn builder() -> RuntimeBuilder {
        RuntimeBuilder::default()
    }

    /// The commands this runtime serves, as their derives registered them.
    pub fn commands(&self) -> impl Iterator<Item = &'static CommandRegistration> + '_ {
        self.inner
            .registry
            .commands()
            .iter()
            .map(|command| command.registration)
    }

    /// The validated registrations this runtime serves (feature `test-support`).
    #[cfg(feature = "test-support")]
    pub fn registry(&self) -> &Registry {
        &self.inner.registry
    }

    /// The Cosmos connection.
    pub fn cosmos(&self) -> &CosmosConnection {
        &self.inner.cosmos
    }

    /// The broker.
    pub fn broker(&self) -> &Arc<dyn Broker> {
        &self.inner.broker
    }

    /// Handles `command` in process under the caller-supplied message id, through the same batch
    /// lifecycle as a brokered delivery. A handler that panics returns
    /// [`PipelineError::HandlerPanicked`](crate::error::PipelineError::HandlerPanicked) instead of
    /// unwinding into the caller. No delivery timeout applies: the caller awaits it.
    pub async fn dispatch<T: DocumentReliable>(
        &self,
        command: T,
        message_id: impl Into<String>,
    ) -> Result<Outcome, DispatchError> {
        let registered = self
            .inner
            .registry
            .get::<T>()
            .ok_or(DispatchError::NotRegistered {
                command: std::any::type_name::<T>(),
            })?;
        let json = serde_json::to_value(&command).map_err(DispatchError::Encode)?;
        Ok(self
            .inner
            .pipeline
            .handle(registered, json, &message_id.into(), false)
            .await?)
    }

    /// The relay's change-feed processor names and the lease tokens this instance drains now.
    pub async fn relay_leases(&self) -> Vec<(String, Vec<String>)> {
        self.inner
            .relay
            .lock()
            .await
            .as_ref()
            .map(RelayHost::owned_leases)
            .unwrap_or_default()
    }

    /// What every consumer and every lease this instance owns is doing now: back a liveness or
    /// readiness probe with [`Health::is_healthy`].
    pub async fn health(&self) -> Health {
        let consumers = self
            .inner
            .consumers
            .iter()
            .map(health::ConsumerStatus::health)
            .collect();
        let leases = self
            .inner
            .relay
            .lock()
            .await
            .as_ref()
            .map(RelayHost::lease_statuses)
            .unwrap_or_default()
            .into_iter()
            .map(|state| LeaseHealth {
                processor: state.processor,
                lease_token: state.status.lease_token,
                last_checkpoint_age: state.status.last_checkpoint_age,
                last_error: state.status.last_error,
                needs_operator: state.status.needs_operator,
                suspended: state.suspended,
                blocked: state.blocked,
                backlog: state.backlog,
                oldest_pending_age: state.sweep.and_then(|s| s.oldest_pending_age),
                stranded: state.sweep.map_or(0, |s| s.stranded),
            })
            .collect();
        Health { consumers, leases }
    }

    /// The Request Units this runtime's store requests were billed so far: per command (its
    /// batch) and per relayed message (the page reads that returned it and its stamp), from each
    /// response's request charge. Against an account, RU per relayed message and the 10,000
    /// RU/s of one physical partition bound what the relay can drain.
    pub fn request_charges(&self) -> RequestCharges {
        self.inner.charges.snapshot()
    }

    /// The leases this instance owns that are under a Drain Suspension now (their
    /// confirmations kept failing, so their pages are refused until a probe confirms), per
    /// processor; empty when none is.
    pub async fn relay_suspended_leases(&self) -> Vec<(String, Vec<String>)> {
        self.inner
            .relay
            .lock()
            .await
            .as_ref()
            .map(RelayHost::suspended_leases)
            .unwrap_or_default()
    }

    /// Waits until the relay has published every Outbox Document pending in the containers it
    /// drains (the commands' and the standalone relays'), as a test or an example waits for
    /// its events, at most `within`. It counts them (a query over every such container) every
    /// 100 ms, and only while this process's relay has no document in flight: one in flight is
    /// still pending, so a count then could not come back zero. `Duration::MAX` waits without
    /// a deadline (saturating at about 100 years).
    ///
    /// # Errors
    ///
    /// [`RelayNotIdle`]: the runtime does not relay, or documents were still pending at the
    /// deadline ([`health`](Self::health) says whether a lease is suspended or blocked), or
    /// they could not be counted.
    pub async fn relay_idle(&self, within: Duration) -> Result<(), RelayNotIdle> {
        if self.inner.relay.lock().await.is_none() {
            return Err(RelayNotIdle::NoRelay);
        }
        idle::wait_until_idle(&self.inner.watched, within).await
    }

    /// Stops consuming and waits for deliveries in progress to settle (each at most its
    /// [delivery timeout](RuntimeBuilder::delivery_timeout); one that runs out counts as a
    /// failed attempt and is republished), lets the relay publish what is pending (at most
    /// [`shutdown_drain`](RuntimeBuilder::shutdown_drain); what is left stays pending for
    /// another instance or the next start), then stops the relay: pages in flight finish and
    /// leases are released for other instances.
    ///
    /// Deliveries a consumer holds that have not started (waiting behind another delivery of
    /// their partition-key value) are returned to the broker unsettled, which delivers them
    /// again; a RabbitMQ quorum queue's last delivery among them, which the queue would drop,
    /// is dead-lettered instead (or acked, if it had committed).
    pub async fn shutdown(self) {
        self.inner.cancel.cancel();
        self.inner.tracker.close();
        self.inner.tracker.wait().await;
        let relays = self.inner.relay.lock().await.is_some();
        if relays && !self.inner.shutdown_drain.is_zero() {
            let drained =
                idle::wait_until_idle(&self.inner.watched, self.inner.shutdown_drain).await;
            if let Err(error) = drained {
                tracing::warn!(error = %ErrorChain(&error), "chatter runtime stops with outbox documents still pending; another instance or the next start relays them");
            }
        }
        // Taken out first: the lock is not held while the relay stops, so `health()` answers.
        let relay = self.inner.relay.lock().await.take();
        if let Some(relay) = relay {
            relay.shutdown().await;
        }
        tracing::info!("chatter runtime stopped");
    }
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
