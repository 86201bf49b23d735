//! The message broker: where the relay publishes Brokered Messages and where inboxes consume them.
//!
//! A [`Broker`] publishes a [`BrokeredMessage`] and returns only once the broker has taken
//! responsibility for it (for RabbitMQ: the publisher confirm arrived). [`Broker::subscribe`]
//! opens a [`Subscription`] on a destination; each [`Delivery`] it yields must be settled with
//! [`Delivery::ack`] (done, never delivered again) or [`Delivery::nack`] (delivered again, with
//! [`Delivery::redelivered`] set). A delivery dropped without being settled counts as a nack:
//! no message is ever lost because a handler panicked or a task was cancelled.
//!
//! Several subscriptions on one destination are competing consumers: each message goes to one
//! of them.
//!
//! | implementation | feature | |
//! | --- | --- | --- |
//! | [`InMemoryBroker`] | always | in-process queues, the embedded default |
//! | `RabbitMqBroker` | `rabbitmq` | RabbitMQ through `lapin`: publisher confirms, durable queues, persistent messages, manual ack |
//! | `NatsBroker` | `nats` | NATS JetStream through `async-nats`: publish acks, `Nats-Msg-Id` deduplication, durable pull consumers, explicit ack |
//! | [`MessagingSystems`] | always | several brokers, one chosen per message by the messaging system its context names |
//!
//! A broker that counts a message's deliveries itself and redelivers it after a delay (JetStream)
//! says so through [`Delivery::delivery_count`]: the runtime's consumers then retry a failed
//! delivery with [`Delivery::nack_after`] instead of publishing a copy of it.
//!
#![doc = include_str!("../../docs/brokers.md")]

mod dead_letters;
mod error;
mod in_memory;
mod messaging_systems;
#[cfg(feature = "nats")]
mod nats;
#[cfg(feature = "rabbitmq")]
mod rabbitmq;

use std::fmt;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll};

use futures::Stream;
use futures::future::BoxFuture;
use futures::stream::BoxStream;

pub use dead_letters::{
    DeadLetter, DeadLetterAction, DeadLetterOutcome, DeadLetterSelection, DeadLetters,
};
pub use error::{BrokerError, Refusal, TransportError};
pub use in_memory::InMemoryBroker;
pub use messaging_systems::MessagingSystems;
#[cfg(feature = "nats")]
pub use nats::{
    CONTEXT_HEADER as NATS_CONTEXT_HEADER,
    DEAD_LETTER_REASON_HEADER as NATS_DEAD_LETTER_REASON_HEADER, DEFAULT_ACK_WAIT,
    MESSAGE_ID_HEADER as NATS_MESSAGE_ID_HEADER, MIN_MAX_PAYLOAD, NatsBroker,
};
#[cfg(feature = "rabbitmq")]
pub use rabbitmq::{
    CONTEXT_HEADER, DEAD_LETTER_REASON_HEADER, DEFAULT_CONNECT_TIMEOUT, DEFAULT_PUBLISH_TIMEOUT,
    RabbitMqBroker,
};

use crate::message::BrokeredMessage;

/// `call`, bounded by `after`: past it, a [`BrokerError::Timeout`] of `operation` (named only
/// then). Every broker wait of chatter goes through here, whatever the [`Broker`] does itself.
pub(crate) async fn bounded<T>(
    operation: impl FnOnce() -> String,
    after: std::time::Duration,
    call: impl Future<Output = Result<T, BrokerError>>,
) -> Result<T, BrokerError> {
    tokio::time::timeout(after, call).await.unwrap_or_else(|_| {
        Err(BrokerError::Timeout {
            operation: operation(),
            after,
            source: None,
        })
    })
}

#[cfg(any(feature = "rabbitmq", feature = "nats"))]
/// `uri` without its password (or its token, when the user part is one alone), for logs and
/// error messages: how every message of chatter shows a broker URL (the `chatter` command's
/// too).
///
/// ```
/// use chatter_runtime::broker::redact_uri;
///
/// assert_eq!(
///     redact_uri("amqp://guest:s3cret@host:5672/%2f"),
///     "amqp://guest:***@host:5672/%2f"
/// );
/// assert_eq!(redact_uri("nats://T0KEN@host:4222"), "nats://***@host:4222");
/// ```
pub fn redact_uri(uri: &str) -> String {
    match (uri.find("://"), uri.rfind('@')) {
        (Some(scheme), Some(at)) if at > scheme => {
            let userinfo = &uri[scheme + 3..at];
            match userinfo.split_once(':') {
                Some((user, _password)) => {
                    format!("{}{user}:***{}", &uri[..scheme + 3], &uri[at..])
                }
                // A token alone (`nats://TOKEN@host`) is the secret itself.
                None => format!("{}***{}", &uri[..scheme + 3], &uri[at..]),
            }
        }
        // Without `//` (`amqp:user:password@host`, `user:password@host`) nobody can say where
        // the user ends: everything before the `@` goes.
        (None, Some(at)) => format!("***{}", &uri[at..]),
        _ => uri.to_owned(),
    }
}

#[cfg(all(test, any(feature = "rabbitmq", feature = "nats")))]
mod redact_tests {
    use super::redact_uri;

    #[test]
    fn a_url_without_slashes_loses_everything_before_its_host() {
        assert_eq!(
            redact_uri("amqp:guest:s3cret@127.0.0.1:1/%2f"),
            "***@127.0.0.1:1/%2f"
        );
        assert_eq!(redact_uri("guest:s3cret@host:5672"), "***@host:5672");
        assert_eq!(
            redact_uri("amqp://guest:s3cret@host:5672/%2f"),
            "amqp://guest:***@host:5672/%2f"
        );
        assert_eq!(redact_uri("nats://host:4222"), "nats://host:4222");
    }

    #[test]
    fn redact_hides_the_password_only() {
        assert_eq!(
            redact_uri("amqp://guest:secret@host:5672/%2f"),
            "amqp://guest:***@host:5672/%2f"
        );
        assert_eq!(redact_uri("amqp://host:5672"), "amqp://host:5672");
        assert_eq!(
            redact_uri("nats://s3cr3t-token@host:4222"),
            "nats://***@host:4222"
        );
        // Without `//` whatever stands before the last `@` may be a password: all of it goes.
        assert_eq!(redact_uri("not a uri @ all"), "***@ all");
    }
}

/// `connect()`, retried with backoff while the broker at `url` is unreachable, for up to
/// `give_up_after` (the first failure logged at Error, the recovery at Info; the last failure
/// returned): for a process that may start while its broker restarts.
#[cfg(any(feature = "rabbitmq", feature = "nats"))]
pub(crate) async fn connect_retrying<B, F>(
    system: &str,
    url: &str,
    give_up_after: std::time::Duration,
    mut connect: impl FnMut() -> F,
) -> Result<B, BrokerError>
where
    F: Future<Output = Result<B, BrokerError>>,
{
    let deadline = crate::deadline::deadline_after(give_up_after);
    let mut backoff = crate::backoff::reconnect();
    let mut attempts = 0u32;
    let url = redact_uri(url);
    loop {
        match connect().await {
            Ok(broker) => {
                if attempts > 0 {
                    tracing::info!(%url, attempts, "{system} reachable; connected");
                }
                return Ok(broker);
            }
            Err(error) => {
                let delay = backoff.next_delay();
                if tokio::time::Instant::now() + delay > deadline {
                    return Err(error);
                }
                if attempts == 0 {
                    tracing::error!(%url, error = %crate::error_chain::ErrorChain(&error), "{system} unreachable; retrying the connection with backoff");
                }
                attempts += 1;
                tokio::time::sleep(delay).await;
            }
        }
    }
}

/// A Brokered Message's context as carried in a header named `header` (a JSON object), or why it
/// is not one.
#[cfg(any(feature = "rabbitmq", feature = "nats"))]
pub(crate) fn context_from_header(
    header: &str,
    json: &[u8],
) -> Result<serde_json::Map<String, serde_json::Value>, String> {
    match serde_json::from_slice(json) {
        Ok(serde_json::Value::Object(context)) => Ok(context),
        Ok(other) => Err(format!(
            "its `{header}` header is JSON but not an object: {other}"
        )),
        Err(e) => Err(format!("its `{header}` header is not JSON: {e}")),
    }
}

/// Publishes through `attempt`, made again after each [`BrokerError::Transport`] (after
/// `after_transport`, with backoff) until `bound`; past it, a [`BrokerError::Timeout`] of
/// `operation` carrying the last failure. Any other outcome is returned as it is. The broker never
/// confirmed a failed attempt, so at worst a message is stored twice, which consumers (and
/// JetStream's deduplication) take care of.
#[cfg(any(feature = "rabbitmq", feature = "nats"))]
pub(crate) async fn publish_retrying<F>(
    operation: String,
    bound: std::time::Duration,
    mut attempt: impl FnMut() -> F,
    mut after_transport: impl FnMut(&BrokerError),
) -> Result<(), BrokerError>
where
    F: Future<Output = Result<(), BrokerError>>,
{
    let mut last_error = None;
    let attempts = async {
        let mut backoff = crate::backoff::reconnect();
        loop {
            match attempt().await {
                Err(error @ BrokerError::Transport { .. }) => {
                    after_transport(&error);
                    last_error = Some(Box::new(error));
                    tokio::time::sleep(backoff.next_delay()).await;
                }
                done => return done,
            }
        }
    };
    match tokio::time::timeout(bound, attempts).await {
        Ok(done) => done,
        Err(_) => Err(BrokerError::Timeout {
            operation,
            after: bound,
            source: last_error,
        }),
    }
}

/// The destination the dead letters of `destination` go to: `<destination>.dead-letter` on the
/// same broker.
pub fn dead_letter_destination(destination: &str) -> String {
    format!("{destination}.dead-letter")
}

/// What chatter needs of a broker's setup, checked by [`Broker::verify`] when the runtime starts.
#[derive(Debug, Clone, Default)]
#[non_exhaustive]
pub struct BrokerContract {
    /// The destinations the runtime consumes and dead-letters to: each command's destination
    /// and its [`dead_letter_destination`].
    pub destinations: Vec<String>,
    /// The longest time after a message's first publish at which the relay may publish it again
    /// (a lease taken over after its expiry, then a drain suspension's window).
    pub republish_within: std::time::Duration,
    /// The delivery attempts after which the runtime's consumer of each consumed destination
    /// dead-letters a message: a broker that drops a message after fewer deliveries of its own
    /// (a RabbitMQ quorum queue's delivery limit) would lose it first.
    pub max_delivery_attempts: std::collections::BTreeMap<String, u32>,
}

/// A message broker the runtime publishes to and consumes from.
///
/// Object safe: the runtime holds it as `Arc<dyn Broker>`.
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not a message broker",
    label = "expected something implementing `chatter_runtime::broker::Broker`",
    note = "use `chatter_runtime::broker::InMemoryBroker`, `RabbitMqBroker` (feature `rabbitmq`), \
            or implement `Broker` for `{Self}` (`publish` and `subscribe`, returning boxed futures)"
)]
pub trait Broker: Send + Sync + 'static {
    /// Publish `message` to `message.destination`; resolves only after the broker confirmed it
    /// (an `Err` means the broker did not take the message and it may be published again).
    fn publish(&self, message: BrokeredMessage) -> BoxFuture<'_, Result<(), BrokerError>>;

    /// Start consuming `destination`. Messages published to it before anyone subscribed are
    /// delivered too.
    fn subscribe<'a>(
        &'a self,
        destination: &'a str,
    ) -> BoxFuture<'a, Result<Subscription, BrokerError>>;

    /// Start consuming `destination`, asking the broker to hold at most `prefetch` unsettled
    /// deliveries for this subscription at a time (flow control; AMQP `basic.qos`).
    ///
    /// The runtime's consumers subscribe with this, `prefetch` being their
    /// [consumer concurrency](crate::RuntimeBuilder::consumer_concurrency). The default calls
    /// [`subscribe`](Broker::subscribe): a broker without flow control ignores `prefetch`.
    fn subscribe_with_prefetch<'a>(
        &'a self,
        destination: &'a str,
        prefetch: u16,
    ) -> BoxFuture<'a, Result<Subscription, BrokerError>> {
        let _ = prefetch;
        self.subscribe(destination)
    }

    /// Whether this broker could ever carry `message`, judged on the message alone (no I/O):
    /// `Err` with a [permanent](BrokerError::is_permanent) error when it will refuse it every
    /// time (e.g. a field longer than the protocol allows).
    ///
    /// The document tier calls it when a handler sends a message, so a handler never writes an
    /// Outbox Document the relay could not publish; the relay calls it before publishing. The
    /// default accepts every message. An implementation's `publish` must refuse with the same
    /// permanent error anything this refuses.
    fn check(&self, message: &BrokeredMessage) -> Result<(), BrokerError> {
        let _ = message;
        Ok(())
    }

    /// The `messaging.system` of chatter's `process` and `send` spans for this broker (an
    /// OpenTelemetry messaging-system name such as `rabbitmq`) when a message does not name its
    /// infrastructure itself. The default is `chatter`.
    fn messaging_system(&self) -> &'static str {
        "chatter"
    }

    /// Whether this broker's setup meets `contract`, checked once when the runtime starts:
    /// `Err` (best [`BrokerError::Misconfigured`], naming the setting to change) refuses the
    /// start. The default accepts every setup.
    fn verify<'a>(
        &'a self,
        contract: &'a BrokerContract,
    ) -> BoxFuture<'a, Result<(), BrokerError>> {
        let _ = contract;
        Box::pin(async { Ok(()) })
    }
}

impl<B: Broker + ?Sized> Broker for Arc<B> {
    fn publish(&self, message: BrokeredMessage) -> BoxFuture<'_, Result<(), BrokerError>> {
        (**self).publish(message)
    }

    fn subscribe<'a>(
        &'a self,
        destination: &'a str,
    ) -> BoxFuture<'a, Result<Subscription, BrokerError>> {
        (**self).subscribe(destination)
    }

    fn subscribe_with_prefetch<'a>(
        &'a self,
        destination: &'a str,
        prefetch: u16,
    ) -> BoxFuture<'a, Result<Subscription, BrokerError>> {
        (**self).subscribe_with_prefetch(destination, prefetch)
    }

    fn check(&self, message: &BrokeredMessage) -> Result<(), BrokerError> {
        (**self).check(message)
    }

    fn messaging_system(&self) -> &'static str {
        (**self).messaging_system()
    }

    fn verify<'a>(
        &'a self,
        contract: &'a BrokerContract,
    ) -> BoxFuture<'a, Result<(), BrokerError>> {
        (**self).verify(contract)
    }
}

/// How a broker implementation settles one [`Delivery`]; [`Delivery`] calls exactly one of these
/// methods exactly once.
pub trait Settle: Send + Sync + 'static {
    /// The message was handled: the broker must not deliver it again.
    fn ack(self: Box<Self>) -> BoxFuture<'static, Result<(), BrokerError>>;
    /// The message was not handled: the broker must deliver it again, marked redelivered.
    fn nack(self: Box<Self>) -> BoxFuture<'static, Result<(), BrokerError>>;
    /// The delivery was dropped unsettled (synchronously, from `Drop`): the broker must deliver it
    /// again, as for [`nack`](Settle::nack).
    fn abandon(self: Box<Self>);
    /// Whether the delivery can no longer be settled because the broker already took it back
    /// (its channel closed, so the server requeued it and delivers it again). The default:
    /// never.
    fn is_stale(&self) -> bool {
        false
    }
    /// How many times the broker has delivered this message, this delivery included, when the
    /// broker counts that itself and can deliver it again after a delay
    /// ([`nack_after`](Settle::nack_after)). The default: `None`, the broker does not.
    fn delivery_count(&self) -> Option<u32> {
        None
    }
    /// How many times the broker delivered this copy of the message before, unsettled (its
    /// consumer nacked it, stopped or crashed): a RabbitMQ quorum queue's `x-delivery-count`.
    /// The default: one less than [`delivery_count`](Settle::delivery_count), or 0.
    fn previous_deliveries(&self) -> u32 {
        self.delivery_count()
            .map_or(0, |count| count.saturating_sub(1))
    }
    /// Whether the broker drops the message if this delivery is not settled (a RabbitMQ quorum
    /// queue whose count reached its delivery limit). The default: `false`.
    fn is_last_delivery(&self) -> bool {
        false
    }
    /// The message was not handled: the broker must deliver it again after `delay`. The
    /// default nacks at once.
    fn nack_after(
        self: Box<Self>,
        delay: std::time::Duration,
    ) -> BoxFuture<'static, Result<(), BrokerError>> {
        let _ = delay;
        self.nack()
    }
    /// The message will never be handled (it was dead-lettered): the broker must not deliver it
    /// again. The default acks it.
    fn term(self: Box<Self>) -> BoxFuture<'static, Result<(), BrokerError>> {
        self.ack()
    }
}

/// One delivery of a message from a [`Subscription`], to be settled with [`ack`](Self::ack) or
/// [`nack`](Self::nack). Dropping it unsettled has the broker deliver it again.
pub struct Delivery {
    /// The message as published.
    pub message: BrokeredMessage,
    /// `true` when this message was delivered before and not acked (nacked, dropped unsettled, or
    /// its consumer went away).
    pub redelivered: bool,
    settle: Option<Box<dyn Settle>>,
}

impl Delivery {
    /// A delivery of `message`, settled through `settle` (for [`Broker`] implementations).
    pub fn new(message: BrokeredMessage, redelivered: bool, settle: Box<dyn Settle>) -> Self {
        Self {
            message,
            redelivered,
            settle: Some(settle),
        }
    }

    /// Whether the broker already took this delivery back (e.g. RabbitMQ requeued it when its
    /// channel closed) and delivers the message again: handling this copy would handle the
    /// message twice, and settling it cannot work. The consumers drop such a delivery unhandled
    /// ([`discard`](Self::discard)).
    pub fn is_stale(&self) -> bool {
        self.settle.as_ref().is_some_and(|settle| settle.is_stale())
    }

    /// This delivery, settled through what `wrap` makes of its settlement: for a [`Broker`] that
    /// decorates another (to count or log settlements, say) and must see them. The wrapper must
    /// forward every [`Settle`] method it does not mean to change (`is_stale`,
    /// `delivery_count`, `previous_deliveries`, `is_last_delivery`, `nack_after`, `term`): the
    /// trait's defaults are those of a broker that has none of them, so a wrapper that leaves
    /// one out changes how the consumer treats the broker (on JetStream, retry copies instead
    /// of delayed redeliveries).
    #[must_use]
    pub fn map_settle(mut self, wrap: impl FnOnce(Box<dyn Settle>) -> Box<dyn Settle>) -> Self {
        self.settle = self.settle.take().map(wrap);
        self
    }

    /// Drops a [stale](Self::is_stale) delivery without settling it: the broker already took it
    /// back. (Dropping it would send a settlement that can only fail.)
    pub fn discard(mut self) {
        self.settle = None;
    }

    /// The message was handled: remove it from the broker.
    pub async fn ack(mut self) -> Result<(), BrokerError> {
        match self.settle.take() {
            Some(settle) => settle.ack().await,
            None => Ok(()),
        }
    }

    /// The message was not handled: have the broker deliver it again (with `redelivered` set).
    pub async fn nack(mut self) -> Result<(), BrokerError> {
        match self.settle.take() {
            Some(settle) => settle.nack().await,
            None => Ok(()),
        }
    }

    /// How many times the broker delivered this message, this delivery included, when the
    /// broker counts deliveries itself (NATS JetStream); `None` when it does not (RabbitMQ,
    /// whose retries carry their count in the message's context instead).
    pub fn delivery_count(&self) -> Option<u32> {
        self.settle
            .as_ref()
            .and_then(|settle| settle.delivery_count())
    }

    /// How many times the broker delivered this copy of the message before without its being
    /// settled, where the broker counts that (JetStream; a RabbitMQ quorum queue); 0 elsewhere.
    pub fn previous_deliveries(&self) -> u32 {
        self.settle
            .as_ref()
            .map_or(0, |settle| settle.previous_deliveries())
    }

    /// Whether the broker drops the message unless this delivery settles it (a RabbitMQ quorum
    /// queue whose count reached its delivery limit): the runtime dead-letters such a delivery
    /// without running it, so it is kept.
    pub fn is_last_delivery(&self) -> bool {
        self.settle
            .as_ref()
            .is_some_and(|settle| settle.is_last_delivery())
    }

    /// The message was not handled: have the broker deliver it again once `delay` has passed
    /// (a broker without delayed redelivery delivers it again at once).
    pub async fn nack_after(mut self, delay: std::time::Duration) -> Result<(), BrokerError> {
        match self.settle.take() {
            Some(settle) => settle.nack_after(delay).await,
            None => Ok(()),
        }
    }

    /// The message will never be handled (it was dead-lettered): the broker drops it for good
    /// (JetStream `term`; an ack elsewhere).
    pub async fn term(mut self) -> Result<(), BrokerError> {
        match self.settle.take() {
            Some(settle) => settle.term().await,
            None => Ok(()),
        }
    }
}

impl Drop for Delivery {
    fn drop(&mut self) {
        if let Some(settle) = self.settle.take() {
            settle.abandon();
        }
    }
}

impl fmt::Debug for Delivery {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Delivery")
            .field("message", &self.message)
            .field("redelivered", &self.redelivered)
            .field("settled", &self.settle.is_none())
            .finish()
    }
}

/// The deliveries of one destination to one consumer; a [`Stream`] of
/// `Result<Delivery, BrokerError>`.
///
/// An `Err` item does not end the subscription (e.g. [`BrokerError::Undecodable`]); `None` means
/// the broker ended it (e.g. the broker was closed). A broker that recovers by itself (RabbitMQ)
/// keeps the stream open across an outage and reports it through [`Subscription::liveness`].
pub struct Subscription {
    destination: String,
    deliveries: BoxStream<'static, Result<Delivery, BrokerError>>,
    liveness: Liveness,
    /// Stops the broker from delivering more (see [`Subscription::with_cancel`]).
    cancel: Option<Box<dyn FnOnce() + Send>>,
}

/// Whether a subscription is consuming now (`false` while its broker connection is being
/// re-established). Clones share one flag; set by the [`Broker`] implementation.
#[derive(Debug, Clone)]
pub struct Liveness(Arc<AtomicBool>);

impl Default for Liveness {
    fn default() -> Self {
        Self(Arc::new(AtomicBool::new(true)))
    }
}

impl Liveness {
    /// Whether the subscription is consuming now.
    pub fn is_live(&self) -> bool {
        self.0.load(Ordering::SeqCst)
    }

    /// Records whether the subscription is consuming (for [`Broker`] implementations).
    pub fn set_live(&self, live: bool) {
        self.0.store(live, Ordering::SeqCst);
    }
}

impl Subscription {
    /// A subscription on `destination` yielding `deliveries` (for [`Broker`] implementations),
    /// always live.
    pub fn new(
        destination: impl Into<String>,
        deliveries: BoxStream<'static, Result<Delivery, BrokerError>>,
    ) -> Self {
        Self::with_liveness(destination, deliveries, Liveness::default())
    }

    /// A subscription whose implementation reports through `liveness` whether it consumes now.
    pub fn with_liveness(
        destination: impl Into<String>,
        deliveries: BoxStream<'static, Result<Delivery, BrokerError>>,
        liveness: Liveness,
    ) -> Self {
        Self {
            destination: destination.into(),
            // Fused: polled again after it ended (after `cancel`, say) it says so again rather
            // than panic, as an unfolded stream would.
            deliveries: futures::StreamExt::boxed(futures::StreamExt::fuse(deliveries)),
            liveness,
            cancel: None,
        }
    }

    /// A subscription whose implementation can stop the broker from delivering more: after
    /// `cancel` runs, the stream yields what the broker had delivered to it (a client's
    /// prefetch buffer) and then ends.
    #[must_use]
    pub fn with_cancel(mut self, cancel: impl FnOnce() + Send + 'static) -> Self {
        self.cancel = Some(Box::new(cancel));
        self
    }

    /// Has the broker stop delivering to this subscription and returns what it had delivered
    /// that was not taken yet, for the caller to settle or drop (dropped unsettled, a delivery
    /// goes back to the broker). Used at shutdown, where a delivery the broker drops when it is
    /// returned (a RabbitMQ quorum queue's last one) must be settled instead. Nothing for a
    /// subscription that cannot be cancelled; the subscription ends either way.
    pub async fn cancel(&mut self) -> Vec<Result<Delivery, BrokerError>> {
        let Some(cancel) = self.cancel.take() else {
            return Vec::new();
        };
        cancel();
        let mut left = Vec::new();
        while let Some(item) = self.next().await {
            left.push(item);
        }
        left
    }

    /// The destination this subscription consumes.
    pub fn destination(&self) -> &str {
        &self.destination
    }

    /// Whether this subscription consumes now; clone it to watch from elsewhere.
    pub fn liveness(&self) -> &Liveness {
        &self.liveness
    }

    /// The next delivery; cancel safe (dropping the future loses no message).
    pub async fn next(&mut self) -> Option<Result<Delivery, BrokerError>> {
        futures::StreamExt::next(&mut self.deliveries).await
    }
}

impl Stream for Subscription {
    type Item = Result<Delivery, BrokerError>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.deliveries.as_mut().poll_next(cx)
    }
}

impl fmt::Debug for Subscription {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Subscription")
            .field("destination", &self.destination)
            .finish_non_exhaustive()
    }
}
