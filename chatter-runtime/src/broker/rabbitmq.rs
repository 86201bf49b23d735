//! RabbitMQ through `lapin` (feature `rabbitmq`).
//!
//! Mapping of a [`BrokeredMessage`] onto AMQP 0-9-1:
//!
//! | Brokered Message | AMQP |
//! | --- | --- |
//! | `destination` | a durable queue of that name, published to through the default exchange |
//! | `message_id` | the `message-id` property |
//! | `content_type` | the `content-type` property (left unset when empty) |
//! | `body` | the body, UTF-8 |
//! | `context` | the [`CONTEXT_HEADER`] header: the context as one JSON object in a long string, so that every JSON value (nested objects, `null`, big numbers) comes back exactly as it went |
//!
//! Messages are persistent (`delivery-mode` 2).

use std::collections::HashSet;
use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use futures::future::BoxFuture;
use futures::{FutureExt, StreamExt};
use lapin::message::Delivery as AmqpDelivery;
use lapin::options::{
    BasicAckOptions, BasicConsumeOptions, BasicNackOptions, BasicPublishOptions, BasicQosOptions,
    ConfirmSelectOptions, QueueDeclareOptions, QueueDeleteOptions,
};
use lapin::types::{AMQPValue, FieldTable, LongString, ShortString};
use lapin::{Acker, BasicProperties, Channel, Confirmation, Connection, ConnectionProperties};
use serde_json::{Map, Value};
use tokio::runtime::Handle;

use super::{Broker, BrokerError, Delivery, Liveness, Refusal, Settle, Subscription};
use crate::backoff;
use crate::error_chain::ErrorChain;
use crate::message::BrokeredMessage;

/// The AMQP header carrying a Brokered Message's `context`, as a JSON object string.
pub const CONTEXT_HEADER: &str = "chatter-context";

/// The AMQP header a dead-lettered delivery that is not a Brokered Message carries its reason in.
pub const DEAD_LETTER_REASON_HEADER: &str = "chatter-dead-letter-reason";

/// How long a delivery that could not be dead-lettered waits before it is returned to its queue.
const UNDELIVERABLE_REQUEUE_DELAY: Duration = Duration::from_secs(1);

/// The `delivery-mode` of a persistent message.
const PERSISTENT: u8 = 2;

/// How many unacked deliveries one subscription holds by default.
const DEFAULT_PREFETCH: u16 = 1;

/// A [`Broker`] on RabbitMQ: publisher confirms, durable queues, persistent messages, manual ack.
///
/// - [`publish`](Broker::publish) declares the destination's durable queue (once per connection),
///   publishes with `mandatory` set and waits for the publisher confirm: a nack is
///   [`BrokerError::Rejected`]; a message returned as unroutable (its queue was deleted since)
///   is published once more after declaring the queue again, then is
///   [`BrokerError::Refused`]. A server that refuses the queue or the message because of its
///   settings (403 access refused, 405 locked, 406 a queue declared with other arguments or a
///   message over the configured size) is [`BrokerError::Refused`] too: never permanent, as
///   an operator can lift it.
/// - [`subscribe`](Broker::subscribe) opens a channel of its own with a prefetch of
///   [`prefetch`](Self::with_prefetch) (1 by default; [`Broker::subscribe_with_prefetch`] sets
///   it per subscription, as the runtime's consumers do) and consumes with manual ack;
///   [`Delivery::nack`] and dropping a delivery unsettled are `basic.nack` with `requeue`, and
///   [`Delivery::redelivered`] is the AMQP `redelivered` flag.
///
/// **Recovery.** The broker reconnects by itself after a broker restart or a dropped connection,
/// with exponential backoff (logged at Error when the outage starts, at Info when it ends):
///
/// - a publish waits for the connection to come back, bounded by the
///   [publish timeout](Self::with_publish_timeout) (default 30 s), then fails with
///   [`BrokerError::Timeout`];
/// - a subscription consumes again after recovery on a new channel, without the caller
///   subscribing again; its stream never ends while the broker is open;
/// - a delivery unacked at the drop is requeued by the server and delivered again (marked
///   redelivered); settling the old one fails with [`BrokerError::SettlementLost`], so no
///   message is ever acked on a channel it was not delivered on.
///
/// (lapin's own `enable_auto_recover` was not used: it gives up after a fixed number of
/// attempts, and replaying consumers on a recovered channel would settle old delivery tags on
/// the new channel. Here each delivery settles only on the channel it came from.)
///
/// Clones share one connection.
#[derive(Clone)]
pub struct RabbitMqBroker {
    inner: Arc<Inner>,
    prefetch: u16,
}

/// The default bound of one publish, reconnection included.
pub const DEFAULT_PUBLISH_TIMEOUT: Duration = Duration::from_secs(30);

struct Inner {
    /// Where to reconnect to.
    uri: String,
    /// The current connection; `None` after it failed a call, replaced when it was lost.
    connection: tokio::sync::Mutex<Option<Arc<Connection>>>,
    /// The confirm-mode channel publishes go through; replaced when the server closed it.
    publisher: tokio::sync::Mutex<Option<Channel>>,
    /// Queues declared on the current connection.
    declared: Mutex<HashSet<String>>,
    /// How long one publish may take, reconnection included.
    publish_timeout: Mutex<Duration>,
    /// Set by [`RabbitMqBroker::close`]: nothing reconnects any more.
    closed: AtomicBool,
}

impl RabbitMqBroker {
    /// Connect to `uri`, e.g. `amqp://guest:guest@127.0.0.1:5672/%2f` (plain AMQP: this build has
    /// no TLS backend). Must be called within a Tokio runtime, which then runs the connection.
    ///
    /// The first connection must succeed (a wrong address or credentials fail here); later
    /// losses are recovered from.
    pub async fn connect(uri: &str) -> Result<Self, BrokerError> {
        if Handle::try_current().is_err() {
            return Err(BrokerError::transport(
                "connect",
                "RabbitMqBroker::connect must be called within a Tokio runtime",
            ));
        }
        let connection = open(uri).await?;
        Ok(Self {
            inner: Arc::new(Inner {
                uri: uri.to_owned(),
                connection: tokio::sync::Mutex::new(Some(Arc::new(connection))),
                publisher: tokio::sync::Mutex::new(None),
                declared: Mutex::new(HashSet::new()),
                publish_timeout: Mutex::new(DEFAULT_PUBLISH_TIMEOUT),
                closed: AtomicBool::new(false),
            }),
            prefetch: DEFAULT_PREFETCH,
        })
    }

    /// [`connect`](Self::connect), retried with backoff while the broker is unreachable, for up
    /// to `give_up_after`: for a process that may start while the broker restarts. The first
    /// failure is logged at Error; the last one is returned.
    pub async fn connect_retrying(uri: &str, give_up_after: Duration) -> Result<Self, BrokerError> {
        let deadline = tokio::time::Instant::now() + give_up_after;
        let mut backoff = backoff::reconnect();
        let mut attempts = 0u32;
        loop {
            match Self::connect(uri).await {
                Ok(broker) => {
                    if attempts > 0 {
                        tracing::info!(uri = %redact(uri), attempts, "RabbitMQ reachable; connected");
                    }
                    return Ok(broker);
                }
                Err(error) => {
                    let delay = backoff.next_delay();
                    if tokio::time::Instant::now() + delay > deadline {
                        return Err(error);
                    }
                    if attempts == 0 {
                        tracing::error!(uri = %redact(uri), error = %ErrorChain(&error), "RabbitMQ unreachable; retrying the connection with backoff");
                    }
                    attempts += 1;
                    tokio::time::sleep(delay).await;
                }
            }
        }
    }

    /// The same broker, whose new subscriptions hold up to `prefetch` unacked deliveries each
    /// (AMQP `basic.qos`; 0 means no limit). The default, 1, gives each message to whichever
    /// competing consumer is free.
    pub fn with_prefetch(mut self, prefetch: u16) -> Self {
        self.prefetch = prefetch;
        self
    }

    /// Bounds every publish (waiting for a lost connection, the publish and its confirm) by
    /// `timeout` (default [`DEFAULT_PUBLISH_TIMEOUT`]), for every clone of this broker.
    pub fn with_publish_timeout(self, timeout: Duration) -> Self {
        *self
            .inner
            .publish_timeout
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = timeout;
        self
    }

    /// Whether the connection is up now (`false` while it is being re-established).
    pub fn is_connected(&self) -> bool {
        self.inner
            .connection
            .try_lock()
            .is_ok_and(|connection| connection.as_ref().is_some_and(|c| c.status().connected()))
    }

    /// Close the connection (shared by all clones) gracefully; nothing reconnects afterwards and
    /// subscriptions end. Deliveries not settled by then are requeued by the server and
    /// delivered again; settling them afterwards fails with [`BrokerError::SettlementLost`] or
    /// [`BrokerError::Transport`].
    pub async fn close(&self) -> Result<(), BrokerError> {
        self.inner.closed.store(true, Ordering::SeqCst);
        let Some(connection) = self.inner.connection.lock().await.take() else {
            return Ok(());
        };
        connection
            .close(200, ShortString::from("OK"))
            .await
            .map_err(|e| BrokerError::transport("connection.close", e))
    }

    /// Delete `destination`'s queue and the messages in it; returns how many messages it held.
    pub async fn delete_queue(&self, destination: &str) -> Result<u32, BrokerError> {
        let queue = queue_name(destination)?;
        let channel = self.inner.publisher().await?;
        let count = channel
            .queue_delete(queue, QueueDeleteOptions::default())
            .await
            .map_err(|e| BrokerError::transport(format!("queue.delete `{destination}`"), e))?;
        self.inner.forget(destination);
        Ok(count)
    }
}

impl fmt::Debug for RabbitMqBroker {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RabbitMqBroker")
            .field("uri", &redact(&self.inner.uri))
            .field("prefetch", &self.prefetch)
            .finish_non_exhaustive()
    }
}

/// One connection attempt.
async fn open(uri: &str) -> Result<Connection, BrokerError> {
    Connection::connect(uri, ConnectionProperties::default())
        .await
        .map_err(|e| BrokerError::transport(format!("connect to `{}`", redact(uri)), e))
}

impl Inner {
    /// A live connection: the current one, or a new one once the broker is reachable again.
    /// Waits (with backoff) as long as it takes; callers bound the wait.
    async fn connection(&self) -> Result<Arc<Connection>, BrokerError> {
        let mut current = self.connection.lock().await;
        if let Some(connection) = current.as_ref()
            && connection.status().connected()
        {
            return Ok(Arc::clone(connection));
        }
        // The connection dropped (or a call on it failed): an outage, logged when it is seen,
        // whether the first attempt to reconnect works or not. A closed broker has no outage.
        if !self.closed.load(Ordering::SeqCst) {
            tracing::error!(uri = %redact(&self.uri), "RabbitMQ connection lost; reconnecting with backoff");
        }
        let mut backoff = backoff::reconnect();
        let mut attempts = 0u32;
        loop {
            if self.closed.load(Ordering::SeqCst) {
                return Err(BrokerError::transport(
                    "connect",
                    "the broker was closed; it does not reconnect",
                ));
            }
            match open(&self.uri).await {
                Ok(connection) => {
                    tracing::info!(uri = %redact(&self.uri), failed_attempts = attempts, "RabbitMQ connection recovered");
                    let connection = Arc::new(connection);
                    *current = Some(Arc::clone(&connection));
                    self.declared
                        .lock()
                        .unwrap_or_else(PoisonError::into_inner)
                        .clear();
                    return Ok(connection);
                }
                Err(error) => {
                    if attempts == 0 {
                        tracing::warn!(uri = %redact(&self.uri), error = %ErrorChain(&error), "RabbitMQ unreachable; still reconnecting with backoff");
                    } else {
                        tracing::debug!(uri = %redact(&self.uri), attempts, error = %ErrorChain(&error), "RabbitMQ still unreachable");
                    }
                    attempts += 1;
                    tokio::time::sleep(backoff.next_delay()).await;
                }
            }
        }
    }

    /// Forgets `connection` after a call on it failed, so the next call reconnects (the
    /// client may not have noticed the drop yet).
    ///
    /// The two locks are never held together here: `publisher()` holds the publisher lock while
    /// it waits for the connection lock.
    async fn invalidate(&self, connection: &Arc<Connection>) {
        {
            let mut current = self.connection.lock().await;
            if current.as_ref().is_some_and(|c| Arc::ptr_eq(c, connection)) {
                *current = None;
            }
        }
        *self.publisher.lock().await = None;
    }

    /// The confirm-mode publishing channel, opened again if it or its connection closed (a
    /// failed declaration closes the channel it ran on).
    async fn publisher(&self) -> Result<Channel, BrokerError> {
        let mut publisher = self.publisher.lock().await;
        if let Some(channel) = publisher.as_ref()
            && channel.status().connected()
        {
            return Ok(channel.clone());
        }
        let connection = self.connection().await?;
        let opened = async {
            let channel = connection
                .create_channel()
                .await
                .map_err(|e| BrokerError::transport("channel.open", e))?;
            channel
                .confirm_select(ConfirmSelectOptions::default())
                .await
                .map_err(|e| BrokerError::transport("confirm.select", e))?;
            Ok::<_, BrokerError>(channel)
        }
        .await;
        match opened {
            Ok(channel) => {
                *publisher = Some(channel.clone());
                Ok(channel)
            }
            Err(error) => {
                drop(publisher);
                self.invalidate(&connection).await;
                Err(error)
            }
        }
    }

    async fn declare(
        &self,
        channel: &Channel,
        destination: &str,
        queue: ShortString,
    ) -> Result<(), BrokerError> {
        if self.is_declared(destination) {
            return Ok(());
        }
        let options = QueueDeclareOptions {
            durable: true,
            ..QueueDeclareOptions::default()
        };
        channel
            .queue_declare(queue, options, FieldTable::default())
            .await
            .map_err(|e| declare_error(destination, e))?;
        self.declared
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(destination.to_owned());
        Ok(())
    }

    fn is_declared(&self, destination: &str) -> bool {
        self.declared
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .contains(destination)
    }

    fn forget(&self, destination: &str) {
        self.declared
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(destination);
    }

    fn publish_timeout(&self) -> Duration {
        *self
            .publish_timeout
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    async fn publish(&self, message: BrokeredMessage) -> Result<(), BrokerError> {
        let queue = queue_name(&message.destination)?;
        let properties = properties(&message)?;
        let timeout = self.publish_timeout();
        let operation = format!(
            "publish `{}` to `{}`",
            message.message_id, message.destination
        );
        let mut last_error = None;
        let attempts = async {
            // A transport failure (the connection dropped before or during the publish) is
            // retried on a new connection until the bound: the broker never confirmed, so at
            // worst the message is stored twice, which consumers deduplicate.
            let mut backoff = backoff::reconnect();
            loop {
                match self
                    .publish_once(message.clone(), queue.clone(), properties.clone())
                    .await
                {
                    Err(error @ BrokerError::Transport { .. }) => {
                        tracing::debug!(error = %ErrorChain(&error), "RabbitMQ publish failed; retrying on a new connection");
                        last_error = Some(Box::new(error));
                        // Its channel may be dead before the client noticed: open a new one.
                        *self.publisher.lock().await = None;
                        tokio::time::sleep(backoff.next_delay()).await;
                    }
                    done => return done,
                }
            }
        };
        match tokio::time::timeout(timeout, attempts).await {
            Ok(done) => done,
            Err(_) => Err(BrokerError::Timeout {
                operation,
                after: timeout,
                source: last_error,
            }),
        }
    }

    async fn publish_once(
        &self,
        message: BrokeredMessage,
        queue: ShortString,
        properties: BasicProperties,
    ) -> Result<(), BrokerError> {
        self.publish_bytes(
            &message.message_id,
            &message.destination,
            queue,
            message.body.as_bytes(),
            properties,
        )
        .await
    }

    /// Publishes `body` with `properties` to the queue of `destination` and waits for the
    /// publisher confirm.
    async fn publish_bytes(
        &self,
        message_id: &str,
        destination: &str,
        queue: ShortString,
        body: &[u8],
        properties: BasicProperties,
    ) -> Result<(), BrokerError> {
        let options = BasicPublishOptions {
            mandatory: true,
            immediate: false,
        };
        let publish_error = |error: lapin::Error| {
            refusal(destination, AmqpMethod::Publish, &error).unwrap_or_else(|| {
                BrokerError::transport(format!("basic.publish `{message_id}`"), error)
            })
        };
        let rejected = |reason: String| BrokerError::Rejected {
            message_id: message_id.to_owned(),
            destination: destination.to_owned(),
            reason,
        };
        // A second attempt only after the message came back unroutable: the queue was deleted
        // since this broker declared it, so it is declared again. A returned message was not
        // stored anywhere, so publishing it again cannot duplicate it.
        let mut attempt = 0;
        loop {
            attempt += 1;
            let channel = self.publisher().await?;
            self.declare(&channel, destination, queue.clone()).await?;
            let confirmation = channel
                .basic_publish(
                    ShortString::default(),
                    queue.clone(),
                    options,
                    body,
                    properties.clone(),
                )
                .await
                .map_err(&publish_error)?
                .await
                .map_err(&publish_error)?;
            return match confirmation {
                Confirmation::Ack(None) => Ok(()),
                Confirmation::Ack(Some(returned)) => {
                    self.forget(destination);
                    if attempt < 2 {
                        continue;
                    }
                    Err(BrokerError::Refused {
                        destination: destination.to_owned(),
                        refusal: Refusal::Unroutable,
                        reply: format!("{} {}", returned.reply_code, returned.reply_text),
                    })
                }
                Confirmation::Nack(_) => Err(rejected("the publisher confirm was a nack".into())),
                Confirmation::NotRequested => Err(rejected(
                    "the channel is not in confirm mode, so the broker never confirmed".into(),
                )),
            };
        }
    }

    /// Publishes `delivery`'s body and properties verbatim to `destination` (with the reason in
    /// a header) and waits for the confirm, bounded by the publish timeout.
    async fn publish_raw(
        &self,
        destination: &str,
        delivery: &AmqpDelivery,
        reason: &str,
    ) -> Result<(), BrokerError> {
        let queue = queue_name(destination)?;
        let original = &delivery.properties;
        let mut headers = original.headers().clone().unwrap_or_default();
        headers.insert(
            ShortString::from(DEAD_LETTER_REASON_HEADER),
            AMQPValue::LongString(LongString::from(reason.to_owned())),
        );
        // The copy is kept like every dead letter: persistent, and without the original's
        // per-message expiration, so it neither vanishes on a broker restart nor expires.
        let mut properties = BasicProperties::default()
            .with_delivery_mode(PERSISTENT)
            .with_headers(headers);
        if let Some(id) = original.message_id() {
            properties = properties.with_message_id(id.clone());
        }
        if let Some(content_type) = original.content_type() {
            properties = properties.with_content_type(content_type.clone());
        }
        if let Some(encoding) = original.content_encoding() {
            properties = properties.with_content_encoding(encoding.clone());
        }
        if let Some(correlation) = original.correlation_id() {
            properties = properties.with_correlation_id(correlation.clone());
        }
        if let Some(kind) = original.kind() {
            properties = properties.with_type(kind.clone());
        }
        let message_id = original
            .message_id()
            .as_ref()
            .map_or("<none>", |id| id.as_str())
            .to_owned();
        let attempt =
            self.publish_bytes(&message_id, destination, queue, &delivery.data, properties);
        let timeout = self.publish_timeout();
        tokio::time::timeout(timeout, attempt)
            .await
            .unwrap_or_else(|_| {
                Err(BrokerError::Timeout {
                    operation: format!("dead-letter to `{destination}`"),
                    after: timeout,
                    source: None,
                })
            })
    }

    /// A consumer on `destination` on a new channel of a live connection.
    async fn consume(
        &self,
        destination: &str,
        prefetch: u16,
    ) -> Result<(Channel, lapin::Consumer), BrokerError> {
        let queue = queue_name(destination)?;
        let connection = self.connection().await?;
        let channel = match connection.create_channel().await {
            Ok(channel) => channel,
            Err(e) => {
                self.invalidate(&connection).await;
                return Err(BrokerError::transport("channel.open", e));
            }
        };
        channel
            .basic_qos(prefetch, BasicQosOptions::default())
            .await
            .map_err(|e| BrokerError::transport("basic.qos", e))?;
        // Declared on every (re)subscription: the queue may have been deleted by another client
        // since, and consuming a missing queue fails with 404 forever.
        self.forget(destination);
        self.declare(&channel, destination, queue.clone()).await?;
        let consumer = channel
            .basic_consume(
                queue,
                ShortString::default(),
                BasicConsumeOptions::default(),
                FieldTable::default(),
            )
            .await
            .map_err(|e| BrokerError::transport(format!("basic.consume `{destination}`"), e))?;
        Ok((channel, consumer))
    }

    /// Consumes `destination` for as long as the broker is open: after the connection or the
    /// channel is lost, consumes again on a new channel once the broker is reachable.
    async fn subscribe(
        self: Arc<Self>,
        destination: &str,
        prefetch: u16,
    ) -> Result<Subscription, BrokerError> {
        queue_name(destination)?;
        // The first consumer is made now, so a broker that refuses it fails the subscribe.
        let first = self.consume(destination, prefetch).await?;
        let liveness = Liveness::default();
        let state = Consuming {
            inner: self,
            destination: destination.to_owned(),
            prefetch,
            current: Some(first),
            handle: Handle::try_current().ok(),
            liveness: liveness.clone(),
        };
        let deliveries = futures::stream::unfold(state, |mut state| async move {
            let item = state.next().await?;
            Some((item, state))
        });
        Ok(Subscription::with_liveness(
            destination,
            deliveries.boxed(),
            liveness,
        ))
    }
}

/// The state of one subscription's stream.
struct Consuming {
    inner: Arc<Inner>,
    destination: String,
    prefetch: u16,
    current: Option<(Channel, lapin::Consumer)>,
    handle: Option<Handle>,
    liveness: Liveness,
}

impl Consuming {
    /// The next delivery (or undecodable item); `None` only once the broker was closed.
    async fn next(&mut self) -> Option<Result<Delivery, BrokerError>> {
        let mut backoff = backoff::reconnect();
        let mut lost = false;
        loop {
            if self.inner.closed.load(Ordering::SeqCst) {
                return None;
            }
            let Some((channel, consumer)) = self.current.as_mut() else {
                match self.inner.consume(&self.destination, self.prefetch).await {
                    Ok(consuming) => {
                        tracing::info!(destination = %self.destination, "RabbitMQ subscription resumed");
                        self.liveness.set_live(true);
                        self.current = Some(consuming);
                        backoff.reset();
                    }
                    Err(error) => {
                        tracing::debug!(destination = %self.destination, error = %ErrorChain(&error), "RabbitMQ subscription not resumed yet");
                        tokio::time::sleep(backoff.next_delay()).await;
                    }
                }
                continue;
            };
            match consumer.next().await {
                Some(Ok(delivery)) => {
                    let channel = channel.clone();
                    return Some(self.deliver(channel, delivery).await);
                }
                ended => {
                    if self.inner.closed.load(Ordering::SeqCst) {
                        return None;
                    }
                    if !lost {
                        let error = match ended {
                            Some(Err(e)) => ErrorChain(&e).to_string(),
                            _ => "the server ended the consumer".to_owned(),
                        };
                        tracing::error!(destination = %self.destination, %error, "RabbitMQ subscription lost; it resumes once the broker is reachable");
                        lost = true;
                    }
                    self.liveness.set_live(false);
                    self.current = None;
                }
            }
        }
    }

    async fn deliver(
        &self,
        channel: Channel,
        delivery: AmqpDelivery,
    ) -> Result<Delivery, BrokerError> {
        match decode(&self.destination, &delivery) {
            Ok(message) => {
                let settle = AmqpSettle {
                    message_id: message.message_id.clone(),
                    acker: delivery.acker,
                    handle: self.handle.clone(),
                    channel,
                    _inner: Arc::clone(&self.inner),
                };
                Ok(Delivery::new(
                    message,
                    delivery.redelivered,
                    Box::new(settle),
                ))
            }
            Err(reason) => {
                Err(
                    dead_letter_undecodable(&self.inner, &self.destination, &delivery, reason)
                        .await,
                )
            }
        }
    }
}

impl Broker for RabbitMqBroker {
    fn messaging_system(&self) -> &'static str {
        "rabbitmq"
    }

    fn publish(&self, message: BrokeredMessage) -> BoxFuture<'_, Result<(), BrokerError>> {
        self.inner.publish(message).boxed()
    }

    fn subscribe<'a>(
        &'a self,
        destination: &'a str,
    ) -> BoxFuture<'a, Result<Subscription, BrokerError>> {
        self.inner
            .clone()
            .subscribe(destination, self.prefetch)
            .boxed()
    }

    /// Overrides [`with_prefetch`](Self::with_prefetch) for this subscription: its channel's
    /// `basic.qos` is `prefetch` (0 means no limit), kept across recoveries.
    fn subscribe_with_prefetch<'a>(
        &'a self,
        destination: &'a str,
        prefetch: u16,
    ) -> BoxFuture<'a, Result<Subscription, BrokerError>> {
        self.inner.clone().subscribe(destination, prefetch).boxed()
    }

    fn check(&self, message: &BrokeredMessage) -> Result<(), BrokerError> {
        queue_name(&message.destination)?;
        properties(message).map(|_| ())
    }
}

/// A failed `queue.declare`: a refusal when the server refused the queue because of how it is
/// set up (see [`refusal`]); anything else is a transport error.
fn declare_error(destination: &str, error: lapin::Error) -> BrokerError {
    refusal(destination, AmqpMethod::Declare, &error)
        .unwrap_or_else(|| BrokerError::transport(format!("queue.declare `{destination}`"), error))
}

/// The AMQP method a server refusal answered.
#[derive(Debug, Clone, Copy)]
enum AmqpMethod {
    Declare,
    Publish,
}

/// The server's refusal in `error`, when it closed the channel with a reply that a broker
/// setting decides: 403 access refused, 405 an exclusive queue of another connection, 406 a
/// queue declared with other arguments (on `queue.declare`) or a message over the configured
/// size (on `basic.publish`). These are never permanent: an operator lifts them.
fn refusal(destination: &str, method: AmqpMethod, error: &lapin::Error) -> Option<BrokerError> {
    let lapin::ErrorKind::ProtocolError(amqp) = error.kind() else {
        return None;
    };
    let refusal = match (amqp.kind().get_id(), method) {
        (403, _) => Refusal::AccessRefused,
        (405, _) => Refusal::Locked,
        (406, AmqpMethod::Declare) => Refusal::ConflictingDeclaration,
        (406, AmqpMethod::Publish) => Refusal::TooLarge,
        _ => return None,
    };
    Some(BrokerError::Refused {
        destination: destination.to_owned(),
        refusal,
        reply: amqp.to_string(),
    })
}

/// `destination` as an AMQP queue name: non-blank, at most 255 bytes (a short string), and not
/// in the `amq.` namespace the server reserves (declaring one is refused with 403).
fn queue_name(destination: &str) -> Result<ShortString, BrokerError> {
    let invalid = |reason: String| BrokerError::InvalidDestination {
        destination: destination.to_owned(),
        reason,
    };
    if destination.trim().is_empty() {
        return Err(invalid("a destination must not be empty or blank".into()));
    }
    if destination.starts_with("amq.") {
        return Err(invalid(
            "queue names starting with `amq.` are reserved by RabbitMQ".into(),
        ));
    }
    ShortString::try_new(destination).map_err(|e| invalid(format!("not an AMQP queue name: {e}")))
}

/// The AMQP properties of `message`, or why AMQP cannot carry them (a field that is no short
/// string, a context that cannot be rendered).
fn properties(message: &BrokeredMessage) -> Result<BasicProperties, BrokerError> {
    let invalid = |reason: String| BrokerError::InvalidMessage {
        message_id: message.message_id.clone(),
        destination: message.destination.clone(),
        reason,
    };
    let message_id = ShortString::try_new(message.message_id.as_str())
        .map_err(|e| invalid(format!("the message id is not an AMQP short string: {e}")))?;
    let context = serde_json::to_string(&message.context)
        .map_err(|e| invalid(format!("the context cannot be rendered as JSON: {e}")))?;
    let mut headers = FieldTable::default();
    headers.insert(
        ShortString::from(CONTEXT_HEADER),
        AMQPValue::LongString(LongString::from(context)),
    );
    let mut properties = BasicProperties::default()
        .with_message_id(message_id)
        .with_delivery_mode(PERSISTENT)
        .with_headers(headers);
    if !message.content_type.is_empty() {
        let content_type = ShortString::try_new(message.content_type.as_str())
            .map_err(|e| invalid(format!("the content type is not an AMQP short string: {e}")))?;
        properties = properties.with_content_type(content_type);
    }
    Ok(properties)
}

/// The delivery as a Brokered Message of `destination`, or why it is not one.
fn decode(destination: &str, delivery: &AmqpDelivery) -> Result<BrokeredMessage, String> {
    let properties = &delivery.properties;
    let message_id = properties
        .message_id()
        .as_ref()
        .map(|id| id.as_str().to_owned())
        .ok_or("it has no message-id property")?;
    let body = String::from_utf8(delivery.data.clone())
        .map_err(|e| format!("its body is not UTF-8: {e}"))?;
    let content_type = properties
        .content_type()
        .as_ref()
        .map(|ct| ct.as_str().to_owned())
        .unwrap_or_default();
    let context = match properties
        .headers()
        .as_ref()
        .and_then(|headers| headers.inner().get(CONTEXT_HEADER))
    {
        None => Map::new(),
        Some(AMQPValue::LongString(json)) => parse_context(json.as_bytes())?,
        Some(AMQPValue::ShortString(json)) => parse_context(json.as_str().as_bytes())?,
        Some(other) => {
            return Err(format!(
                "its `{CONTEXT_HEADER}` header is not a string but {other:?}"
            ));
        }
    };
    Ok(BrokeredMessage {
        message_id,
        destination: destination.to_owned(),
        body,
        content_type,
        context,
    })
}

fn parse_context(json: &[u8]) -> Result<Map<String, Value>, String> {
    match serde_json::from_slice(json) {
        Ok(Value::Object(context)) => Ok(context),
        Ok(other) => Err(format!(
            "its `{CONTEXT_HEADER}` header is JSON but not an object: {other}"
        )),
        Err(e) => Err(format!("its `{CONTEXT_HEADER}` header is not JSON: {e}")),
    }
}

/// Moves a delivery that is not a Brokered Message to `<destination>.dead-letter` as it is
/// (body and properties verbatim, plus a `chatter-dead-letter-reason` header), then acks it;
/// requeueing would hand it back forever. If the dead letter cannot be published it is returned
/// to the queue instead, so nothing is dropped.
async fn dead_letter_undecodable(
    inner: &Inner,
    destination: &str,
    delivery: &AmqpDelivery,
    reason: String,
) -> BrokerError {
    let message_id = delivery
        .properties
        .message_id()
        .as_ref()
        .map_or_else(|| "<none>".to_owned(), |id| id.as_str().to_owned());
    let dead_letters = super::dead_letter_destination(destination);
    match inner.publish_raw(&dead_letters, delivery, &reason).await {
        Ok(()) => {
            tracing::error!(%destination, %message_id, %reason, %dead_letters, "dead-lettered a delivery that is not a Brokered Message");
            if let Err(e) = delivery.acker.ack(BasicAckOptions::default()).await {
                // The channel is gone: the server requeues it, and it is dead-lettered again.
                tracing::warn!(%destination, %message_id, error = %ErrorChain(&e), "could not ack the dead-lettered delivery");
            }
        }
        Err(error) => {
            tracing::error!(%destination, %message_id, %reason, error = %ErrorChain(&error), "could not dead-letter a delivery that is not a Brokered Message; returning it to the queue");
            // Not at once: it comes straight back, and a dead-letter path that is down for a
            // while must not turn into a hot loop.
            tokio::time::sleep(UNDELIVERABLE_REQUEUE_DELAY).await;
            let options = BasicNackOptions {
                multiple: false,
                requeue: true,
            };
            if let Err(e) = delivery.acker.nack(options).await {
                tracing::warn!(%destination, %message_id, error = %ErrorChain(&e), "could not return the delivery");
            }
        }
    }
    BrokerError::Undecodable {
        destination: destination.to_owned(),
        message_id,
        reason,
    }
}

/// Settles one RabbitMQ delivery; keeps its channel (and connection) open until then.
struct AmqpSettle {
    message_id: String,
    acker: Acker,
    /// Where `abandon` sends its `basic.nack` from.
    handle: Option<Handle>,
    /// The channel it came on; a delivery whose channel closed was requeued by the server.
    channel: Channel,
    _inner: Arc<Inner>,
}

impl AmqpSettle {
    async fn nack(self) -> Result<(), BrokerError> {
        let options = BasicNackOptions {
            multiple: false,
            requeue: true,
        };
        let sent =
            self.acker.nack(options).await.map_err(|e| {
                BrokerError::transport(format!("basic.nack `{}`", self.message_id), e)
            })?;
        if !sent {
            return Err(BrokerError::SettlementLost {
                message_id: self.message_id,
                settlement: "nack",
            });
        }
        Ok(())
    }
}

impl Settle for AmqpSettle {
    fn ack(self: Box<Self>) -> BoxFuture<'static, Result<(), BrokerError>> {
        async move {
            let sent = self
                .acker
                .ack(BasicAckOptions::default())
                .await
                .map_err(|e| {
                    BrokerError::transport(format!("basic.ack `{}`", self.message_id), e)
                })?;
            if !sent {
                return Err(BrokerError::SettlementLost {
                    message_id: self.message_id,
                    settlement: "ack",
                });
            }
            Ok(())
        }
        .boxed()
    }

    fn nack(self: Box<Self>) -> BoxFuture<'static, Result<(), BrokerError>> {
        (*self).nack().boxed()
    }

    fn is_stale(&self) -> bool {
        !self.channel.status().connected()
    }

    fn abandon(self: Box<Self>) {
        // Without a runtime to send the nack from, dropping the channel (with `self`) still has
        // the server requeue the message once the channel closes.
        if let Some(handle) = self.handle.clone() {
            handle.spawn(async move {
                let message_id = self.message_id.clone();
                if let Err(e) = (*self).nack().await {
                    tracing::warn!(%message_id, error = %ErrorChain(&e), "nack of an abandoned delivery failed; the server requeues it when the channel closes");
                }
            });
        }
    }
}

/// `uri` without its password, for error messages.
fn redact(uri: &str) -> String {
    match (uri.find("://"), uri.rfind('@')) {
        (Some(scheme), Some(at)) if at > scheme => {
            let userinfo = &uri[scheme + 3..at];
            let user = userinfo.split(':').next().unwrap_or_default();
            format!("{}{user}:***{}", &uri[..scheme + 3], &uri[at..])
        }
        _ => uri.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn amqp(body: &[u8], properties: BasicProperties) -> AmqpDelivery {
        let mut delivery = AmqpDelivery::mock(
            1,
            ShortString::default(),
            ShortString::from("orders"),
            false,
            body.to_vec(),
        );
        delivery.properties = properties;
        delivery
    }

    fn context_header(value: AMQPValue) -> FieldTable {
        let mut headers = FieldTable::default();
        headers.insert(ShortString::from(CONTEXT_HEADER), value);
        headers
    }

    #[test]
    fn decode_reads_properties_body_and_the_json_context_header() {
        let properties = BasicProperties::default()
            .with_message_id(ShortString::from("m-1"))
            .with_content_type(ShortString::from("application/json"))
            .with_headers(context_header(AMQPValue::LongString(LongString::from(
                r#"{"a":{"b":[1,null]}}"#,
            ))));
        let message = decode("orders", &amqp(b"{}", properties)).unwrap();
        assert_eq!(message.message_id, "m-1");
        assert_eq!(message.destination, "orders");
        assert_eq!(message.body, "{}");
        assert_eq!(message.content_type, "application/json");
        assert_eq!(message.context["a"], serde_json::json!({ "b": [1, null] }));
    }

    #[test]
    fn decode_reports_what_a_foreign_message_lacks() {
        let with_id = || BasicProperties::default().with_message_id(ShortString::from("m-1"));
        let no_id = decode("orders", &amqp(b"{}", BasicProperties::default())).unwrap_err();
        assert!(no_id.contains("message-id"), "{no_id}");
        let binary = decode("orders", &amqp(&[0xff, 0xfe], with_id())).unwrap_err();
        assert!(binary.contains("UTF-8"), "{binary}");
        let not_json =
            with_id().with_headers(context_header(AMQPValue::LongString(LongString::from("{"))));
        let error = decode("orders", &amqp(b"{}", not_json)).unwrap_err();
        assert!(error.contains("not JSON"), "{error}");
        let not_object = with_id().with_headers(context_header(AMQPValue::LongString(
            LongString::from("[1]"),
        )));
        let error = decode("orders", &amqp(b"{}", not_object)).unwrap_err();
        assert!(error.contains("not an object"), "{error}");
        let not_string = with_id().with_headers(context_header(AMQPValue::Boolean(true)));
        let error = decode("orders", &amqp(b"{}", not_string)).unwrap_err();
        assert!(error.contains("not a string"), "{error}");
    }

    #[test]
    fn decode_without_context_header_or_content_type_gives_empty_ones() {
        let properties = BasicProperties::default().with_message_id(ShortString::from("m-1"));
        let message = decode("orders", &amqp(b"x", properties)).unwrap();
        assert!(message.context.is_empty());
        assert_eq!(message.content_type, "");
    }

    #[test]
    fn redact_hides_the_password_only() {
        assert_eq!(
            redact("amqp://guest:secret@host:5672/%2f"),
            "amqp://guest:***@host:5672/%2f"
        );
        assert_eq!(redact("amqp://host:5672"), "amqp://host:5672");
        assert_eq!(redact("not a uri @ all"), "not a uri @ all");
    }
}
