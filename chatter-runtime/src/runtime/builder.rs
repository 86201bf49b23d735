//! [`RuntimeBuilder`]: what a runtime is given and how it is set, before it starts.

use std::sync::Arc;
use std::time::Duration;

use crate::broker::Broker;
use crate::cosmos::CosmosConnection;
use crate::registry::Registry;
use crate::relay::RelayOptions;
use crate::relay::standalone::StandaloneRelay;
use crate::telemetry;

use super::consumer::{
    DEFAULT_CONSUMER_CONCURRENCY, DEFAULT_DELIVERY_TIMEOUT, DEFAULT_LANE_WAIT_LIMIT,
};

/// Configures a [`Runtime`](super::Runtime) before starting it.
///
/// # Examples
///
/// A store and a broker of your own, and settings the defaults do not fit:
///
/// ```no_run
/// use std::time::Duration;
///
/// use chatter_runtime::broker::InMemoryBroker;
/// use chatter_runtime::cosmos::CosmosConnection;
/// use chatter_runtime::relay::RelayOptions;
/// use chatter_runtime::{Report, Runtime};
///
/// # async fn run() -> Result<(), Report> {
/// let cosmos = CosmosConnection::connect("https://my-account.documents.azure.com:443/", None).await?;
/// let runtime = Runtime::builder()
///     .cosmos(cosmos)
///     // `RabbitMqBroker` (feature `rabbitmq`) or `NatsBroker` (feature `nats`) in production.
///     .broker(InMemoryBroker::new())
///     .consumer_concurrency(16)
///     .relay_options(RelayOptions::default().poll_interval(Duration::from_millis(500)))
///     .shutdown_drain(Duration::from_secs(20))
///     .start()
///     .await?;
/// runtime.shutdown().await;
/// # Ok(()) }
/// ```
#[must_use = "a builder does nothing until `.start().await`"]
pub struct RuntimeBuilder {
    pub(super) registry: Option<Registry>,
    pub(super) cosmos: Option<CosmosConnection>,
    pub(super) broker: Option<Arc<dyn Broker>>,
    /// The brokers named by messaging system, in the order given.
    pub(super) brokers_by_system: Vec<(String, Arc<dyn Broker>)>,
    pub(super) consume: bool,
    pub(super) consumer_concurrency: usize,
    pub(super) redelivery_delay: Duration,
    pub(super) delivery_timeout: Duration,
    pub(super) lane_wait_limit: Duration,
    pub(super) inbox_clock_margin: Duration,
    pub(super) inbox_claim_period: Option<Duration>,
    pub(super) inbox_renewal_interval: Option<Duration>,
    pub(super) relay: Option<RelayOptions>,
    pub(super) publish_after_commit: bool,
    pub(super) meter: telemetry::Source<opentelemetry::metrics::Meter>,
    pub(super) tracer: telemetry::Source<opentelemetry::global::BoxedTracer>,
    pub(super) state: crate::state::AppState,
    pub(super) shutdown_drain: Duration,
    pub(super) standalone: Vec<StandaloneRelay>,
}

/// How long [`Runtime::shutdown`](super::Runtime::shutdown) waits by default for the relay to
/// publish what is pending.
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
            inbox_claim_period: None,
            inbox_renewal_interval: None,
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

    /// How long [`Runtime::shutdown`](super::Runtime::shutdown) lets the relay publish the Outbox
    /// Documents still pending before it stops (default [`DEFAULT_SHUTDOWN_DRAIN`]; zero: not at
    /// all; `Duration::MAX`: until nothing is pending, however long). What is left stays pending
    /// for another instance or the next start: nothing is lost either way.
    pub fn shutdown_drain(mut self, within: Duration) -> Self {
        self.shutdown_drain = within;
        self
    }

    /// Adds a standalone relay ([`StandaloneRelay`]): it drains its container beside the commands'
    /// pipeline relay, sharing the broker, `health()` and the shutdown. It keeps its own options:
    /// its [`max_in_flight`](RelayOptions::max_in_flight) bounds its own documents in flight, and
    /// the start checks derived from relay options (the broker's duplicate window against how late
    /// a relay may publish again) take the longest bound over every relay of the runtime. Add
    /// several for several containers (each its own change-feed processor); `start()` refuses two
    /// with one source identity, or one with a pipeline source's.
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

    /// Uses this broker instead of a new [`InMemoryBroker`](crate::broker::InMemoryBroker): the
    /// consumers' broker, and the relay's for every message unless brokers are also given by
    /// messaging system ([`broker_for`](Self::broker_for)).
    pub fn broker(mut self, broker: impl Broker) -> Self {
        self.broker = Some(Arc::new(broker));
        self
    }

    /// The relay publishes the messages whose context names `messaging_system` (its
    /// `Chatter.Infrastructure.Type`, compared ignoring ASCII case) through `broker`, as the .NET
    /// module chooses its dispatcher per message; a message naming none, or the default
    /// [`broker`](Self::broker)'s own [`messaging_system`](Broker::messaging_system) (unless it was
    /// given here too: a name given here wins), goes through the default broker, which the
    /// consumers use. Once any broker is given here, a message naming a messaging system no broker
    /// is given for is refused
    /// ([`Refusal::UnknownMessagingSystem`](crate::broker::Refusal::UnknownMessagingSystem)): its
    /// document stays pending and its lease shows as blocked, naming the missing system. A blank
    /// name, or one given twice, fails [`start`](Self::start)
    /// ([`StartError::MessagingSystem`](super::StartError::MessagingSystem)). See
    /// [`MessagingSystems`](crate::broker::MessagingSystems).
    pub fn broker_for(mut self, messaging_system: impl Into<String>, broker: impl Broker) -> Self {
        self.brokers_by_system
            .push((messaging_system.into(), Arc::new(broker)));
        self
    }

    /// Whether to consume each command's destination from the broker (default `true`). With
    /// `false` commands are only handled through [`Runtime::dispatch`](super::Runtime::dispatch).
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
    /// [`StartError::ConsumerConcurrency`](super::StartError::ConsumerConcurrency).
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
    /// committing (default [`DEFAULT_DELIVERY_TIMEOUT`], 5 minutes). An attempt that takes longer
    /// (a handler that hangs, a store that does not answer) fails with
    /// [`PipelineError::TimedOut`](crate::error::PipelineError::TimedOut), logged at `error`, and
    /// is retried like any failure, so its partition-key value's later deliveries are not held
    /// behind it for long. The handler's future is dropped where it waits: a handler that calls
    /// other services should not leave half-done work behind at an `.await` (its staged writes and
    /// messages are discarded with it). An attempt that timed out may still have committed: the
    /// retry finds its inbox marker, and a last attempt asks the marker before it is dead-lettered.
    /// [`Runtime::dispatch`](super::Runtime::dispatch) is not bounded: its caller awaits it.
    ///
    /// [`start`](Self::start) refuses zero with
    /// [`StartError::ZeroDeliveryTimeout`](super::StartError::ZeroDeliveryTimeout). A huge value
    /// (`Duration::MAX`) leaves attempts unbounded (a last attempt's marker read too, saturating at
    /// about 100 years).
    pub fn delivery_timeout(mut self, timeout: Duration) -> Self {
        self.delivery_timeout = timeout;
        self
    }

    /// How long a consumer lets a delivery wait behind the delivery of its partition-key value in
    /// progress (default [`DEFAULT_LANE_WAIT_LIMIT`], 25 minutes) before it publishes it again as a
    /// copy at the back of its queue, its attempt not counted, and acks it; logged at `warn` (on
    /// JetStream, which has no such timeout, it keeps waiting). Keep it below the broker's own
    /// limit on an unsettled delivery (RabbitMQ's `consumer_timeout`, 30 minutes by default), past
    /// which the broker closes the channel and requeues every delivery on it. A returned delivery
    /// loses its place: its key's deliveries queued behind it may be handled first.
    ///
    /// [`start`](Self::start) refuses zero with
    /// [`StartError::ZeroLaneWaitLimit`](super::StartError::ZeroLaneWaitLimit).
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

    /// How long a standalone-inbox command's claim lasts unless renewed (default
    /// [`DEFAULT_CLAIM_PERIOD`](crate::inbox::DEFAULT_CLAIM_PERIOD), 20 s, or the delivery
    /// timeout less the store timeout when shorter; see
    /// [`InboxOptions::claim_period`](crate::inbox::InboxOptions::claim_period)). Its handler's
    /// claim is renewed while it runs, so a process that crashes mid-handler frees the message
    /// within this period, a second and the clock margin. [`start`](Self::start) refuses one
    /// under a second.
    pub fn inbox_claim_period(mut self, period: Duration) -> Self {
        self.inbox_claim_period = Some(period);
        self
    }

    /// How often a running standalone-inbox handler's claim is renewed (default a third of the
    /// claim period; see
    /// [`InboxOptions::renewal_interval`](crate::inbox::InboxOptions::renewal_interval)).
    /// [`start`](Self::start) refuses one that is not below the claim period.
    pub fn inbox_renewal_interval(mut self, interval: Duration) -> Self {
        self.inbox_renewal_interval = Some(interval);
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
}
