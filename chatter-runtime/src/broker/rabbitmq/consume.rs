//! Consuming: a subscription that resumes after every outage, and how its deliveries are
//! settled.

/// How long a delivery that could not be dead-lettered waits before it is returned to its queue.
const UNDELIVERABLE_REQUEUE_DELAY: Duration = Duration::from_secs(1);

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use futures::future::BoxFuture;
use futures::{FutureExt, StreamExt};
use lapin::message::Delivery as AmqpDelivery;
use lapin::options::{
    BasicAckOptions, BasicCancelOptions, BasicConsumeOptions, BasicNackOptions, BasicQosOptions,
};
use lapin::types::{FieldTable, ShortString};
use lapin::{Acker, Channel};
use tokio::runtime::Handle;
use tokio_util::sync::CancellationToken;

use super::codec::{DELIVERY_COUNT_HEADER, decode, message_id_or_none, queue_name};
use super::connection::{Inner, Role};
use super::declaration::{Declaration, DeliveryLimit, integer};
use crate::backoff;
use crate::broker::{
    BrokerError, Delivery, Liveness, Settle, Subscription, dead_letter_destination,
};
use crate::error_chain::ErrorChain;

impl Inner {
    /// A consumer on `destination` on a new channel of a live connection. Opening it is bounded
    /// by the connect timeout, so a connection that looks up but does not answer fails the
    /// attempt (the subscription tries again with backoff) instead of hanging it; the shared
    /// connection is dropped only once the client sees it closed.
    async fn consume(&self, destination: &str, prefetch: u16) -> Result<Consumer, BrokerError> {
        let queue = queue_name(destination)?;
        let connection = self.connection(Role::Consuming).await?;
        let timeout = self.connect_timeout();
        let opening = self.consume_on(&connection, destination, queue, prefetch);
        let operation = || format!("consume `{destination}`");
        let opened = crate::broker::bounded(operation, timeout, opening).await;
        if opened.is_err() && !connection.status().connected() {
            self.invalidate(&connection);
        }
        opened
    }

    async fn consume_on(
        &self,
        connection: &lapin::Connection,
        destination: &str,
        queue: ShortString,
        prefetch: u16,
    ) -> Result<Consumer, BrokerError> {
        // Declared on every (re)subscription: the queue may have been deleted by another client
        // since, and consuming a missing queue fails with 404 forever.
        self.forget(destination);
        let declaration = self
            .declare(Role::Consuming, destination, queue.clone())
            .await?;
        let channel = connection
            .create_channel()
            .await
            .map_err(|e| BrokerError::transport("channel.open", e))?;
        channel
            .basic_qos(prefetch, BasicQosOptions::default())
            .await
            .map_err(|e| BrokerError::transport("basic.qos", e))?;
        let consumer = channel
            .basic_consume(
                queue,
                ShortString::default(),
                BasicConsumeOptions::default(),
                FieldTable::default(),
            )
            .await
            .map_err(|e| BrokerError::transport(format!("basic.consume `{destination}`"), e))?;
        Ok(Consumer {
            channel,
            consumer,
            declaration,
        })
    }

    /// Consumes `destination` for as long as the broker is open: after the connection or the
    /// channel is lost, consumes again on a new channel once the broker is reachable.
    pub(super) async fn subscribe(
        self: Arc<Self>,
        destination: &str,
        prefetch: u16,
    ) -> Result<Subscription, BrokerError> {
        queue_name(destination)?;
        // The first consumer is made now, so a broker that refuses it fails the subscribe.
        let first = self.consume(destination, prefetch).await?;
        let liveness = Liveness::default();
        let cancelled = CancellationToken::new();
        let state = Consuming {
            inner: self,
            destination: destination.to_owned(),
            prefetch,
            current: Some(first),
            handle: Handle::try_current().ok(),
            liveness: liveness.clone(),
            cancelled: cancelled.clone(),
            cancel_sent: false,
        };
        let deliveries = futures::stream::unfold(state, |mut state| async move {
            let item = state.next().await?;
            Some((item, state))
        });
        Ok(
            Subscription::with_liveness(destination, deliveries.boxed(), liveness)
                .with_cancel(move || cancelled.cancel()),
        )
    }
}

/// One consumer of a queue: its channel, and the queue's declaration when it was made.
struct Consumer {
    channel: Channel,
    consumer: lapin::Consumer,
    declaration: Declaration,
}

/// The state of one subscription's stream.
struct Consuming {
    inner: Arc<Inner>,
    destination: String,
    prefetch: u16,
    current: Option<Consumer>,
    handle: Option<Handle>,
    liveness: Liveness,
    /// [`Subscription::cancel`] was called: `basic.cancel` the consumer, yield what the client
    /// had buffered, then end.
    cancelled: CancellationToken,
    /// The `basic.cancel` went out (or there was no consumer to send it for).
    cancel_sent: bool,
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
            if self.cancelled.is_cancelled() && self.current.is_none() {
                return None;
            }
            let Some(Consumer {
                channel,
                consumer,
                declaration,
            }) = self.current.as_mut()
            else {
                match self.inner.consume(&self.destination, self.prefetch).await {
                    Ok(consuming) => {
                        tracing::info!(destination = %self.destination, "RabbitMQ subscription resumed");
                        self.liveness.set_live(true);
                        self.current = Some(consuming);
                        backoff.reset();
                    }
                    Err(error) => {
                        tracing::debug!(destination = %self.destination, error = %ErrorChain(&error), "RabbitMQ subscription not resumed yet");
                        tokio::select! {
                            () = self.cancelled.cancelled() => {}
                            () = tokio::time::sleep(backoff.next_delay()) => {}
                        }
                    }
                }
                continue;
            };
            let next = tokio::select! {
                biased;
                () = self.cancelled.cancelled(), if !self.cancel_sent => None,
                next = consumer.next() => Some(next),
            };
            let Some(next) = next else {
                // The server delivers nothing more after `basic.cancel`; what it delivered
                // before is still in the client's buffer and comes next, then the end.
                self.cancel_sent = true;
                let cancelling = async {
                    channel
                        .basic_cancel(consumer.tag(), BasicCancelOptions::default())
                        .await
                        .map_err(|e| BrokerError::transport("basic.cancel", e))
                };
                let operation = || format!("cancel the consumer of `{}`", self.destination);
                let timeout = self.inner.connect_timeout();
                if let Err(error) = crate::broker::bounded(operation, timeout, cancelling).await {
                    // Its channel is gone (the server returned its deliveries then) or does not
                    // answer: nothing more is taken from it.
                    tracing::warn!(destination = %self.destination, error = %ErrorChain(&error), "could not cancel the RabbitMQ consumer; the deliveries it did not take go back to the queue when its channel closes");
                    self.current = None;
                }
                continue;
            };
            match next {
                Some(Ok(delivery)) => {
                    let channel = channel.clone();
                    let counted = Counted::of(&delivery, declaration);
                    return Some(self.deliver(channel, counted, delivery).await);
                }
                ended => {
                    if self.inner.closed.load(Ordering::SeqCst) || self.cancelled.is_cancelled() {
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

    /// `delivery`, counted as its queue counts it, to be settled on `channel`.
    async fn deliver(
        &self,
        channel: Channel,
        counted: Counted,
        delivery: AmqpDelivery,
    ) -> Result<Delivery, BrokerError> {
        match decode(&self.destination, &delivery) {
            Ok(message) => {
                let settle = AmqpSettle {
                    counted,
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
                let undecodable = Undecodable {
                    inner: Arc::clone(&self.inner),
                    destination: self.destination.clone(),
                    message_id: message_id_or_none(&delivery.properties),
                    delivery,
                    last: counted.last,
                };
                let error = BrokerError::Undecodable {
                    destination: self.destination.clone(),
                    message_id: undecodable.message_id.clone(),
                    reason: reason.clone(),
                };
                // On a task of its own: a delay before returning it does not hold up the
                // deliveries behind it, and a subscription dropped meanwhile (at a shutdown)
                // does not cut its settlement off half-way.
                match &self.handle {
                    Some(handle) => drop(handle.spawn(undecodable.dead_letter(reason))),
                    None => undecodable.dead_letter(reason).await,
                }
                Err(error)
            }
        }
    }
}

/// How a quorum queue counted a delivery.
#[derive(Debug, Clone, Copy)]
struct Counted {
    /// Its earlier unsettled deliveries (`x-delivery-count`).
    previous: u32,
    /// The count reached the queue's delivery limit: it drops the message unless this
    /// delivery settles it.
    last: bool,
}

impl Counted {
    /// `delivery`'s count, read only from a quorum queue that delivers it again: only then did
    /// the queue set the header (a publisher's own, or one a message kept from another queue,
    /// arrives untouched on a first delivery).
    fn of(delivery: &AmqpDelivery, queue: &Declaration) -> Self {
        if !queue.is_quorum() || !delivery.redelivered {
            return Self {
                previous: 0,
                last: false,
            };
        }
        let previous = previous_deliveries(delivery);
        let last = match queue.delivery_limit() {
            DeliveryLimit::Limited { limit, .. } => i64::from(previous) >= limit,
            DeliveryLimit::Unlimited => false,
        };
        Self { previous, last }
    }
}

/// A delivery that is not a Brokered Message.
struct Undecodable {
    inner: Arc<Inner>,
    destination: String,
    message_id: String,
    delivery: AmqpDelivery,
    /// Its queue drops it unless this delivery settles it.
    last: bool,
}

impl Undecodable {
    /// Moves the delivery to `<destination>.dead-letter` as it is (body and properties
    /// verbatim, plus a `chatter-dead-letter-reason` header), then acks it; requeueing would
    /// hand it back forever. If the dead letter cannot be published it is returned to the queue
    /// instead, so nothing is dropped; on a quorum queue's last delivery, which it would drop,
    /// a copy goes to the back of the queue instead.
    async fn dead_letter(self, reason: String) {
        let (destination, message_id) = (&self.destination, &self.message_id);
        let dead_letters = dead_letter_destination(destination);
        let inner = &self.inner;
        match inner
            .publish_raw(&dead_letters, &self.delivery, &reason)
            .await
        {
            Ok(()) => {
                tracing::error!(%destination, %message_id, %reason, %dead_letters, "dead-lettered a delivery that is not a Brokered Message");
                self.ack("the dead-lettered delivery").await;
            }
            Err(error) if self.last => {
                tracing::error!(%destination, %message_id, %reason, error = %ErrorChain(&error), "could not dead-letter the queue's last delivery of a message that is not a Brokered Message; publishing it to the queue again");
                match inner
                    .publish_raw(destination, &self.delivery, &reason)
                    .await
                {
                    Ok(()) => self.ack("the delivery published again").await,
                    Err(error) => {
                        tracing::error!(%destination, %message_id, error = %ErrorChain(&error), "could not publish it again either; returning it, and the queue drops it");
                        self.nack().await;
                    }
                }
            }
            Err(error) => {
                tracing::error!(%destination, %message_id, %reason, error = %ErrorChain(&error), "could not dead-letter a delivery that is not a Brokered Message; returning it to the queue");
                // Not at once: it comes straight back, and a dead-letter path that is down for a
                // while must not turn into a hot loop.
                tokio::time::sleep(UNDELIVERABLE_REQUEUE_DELAY).await;
                self.nack().await;
            }
        }
    }

    async fn ack(&self, what: &str) {
        if let Err(e) = self.delivery.acker.ack(BasicAckOptions::default()).await {
            // The channel is gone: the server requeues it, and it is handled again.
            tracing::warn!(destination = %self.destination, message_id = %self.message_id, error = %ErrorChain(&e), "could not ack {what}");
        }
    }

    async fn nack(&self) {
        let options = BasicNackOptions {
            multiple: false,
            requeue: true,
        };
        if let Err(e) = self.delivery.acker.nack(options).await {
            tracing::warn!(destination = %self.destination, message_id = %self.message_id, error = %ErrorChain(&e), "could not return the delivery");
        }
    }
}

/// The `x-delivery-count` header a quorum queue sets on a message it delivers again (classic
/// queues do not count: 0).
fn previous_deliveries(delivery: &AmqpDelivery) -> u32 {
    let count = delivery
        .properties
        .headers()
        .as_ref()
        .and_then(|headers| headers.inner().get(DELIVERY_COUNT_HEADER))
        .and_then(integer)
        .and_then(|n| u32::try_from(n).ok());
    count.unwrap_or(0)
}

/// Settles one RabbitMQ delivery; keeps its channel (and connection) open until then.
struct AmqpSettle {
    message_id: String,
    /// How its quorum queue counted it.
    counted: Counted,
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

    fn previous_deliveries(&self) -> u32 {
        self.counted.previous
    }

    fn is_last_delivery(&self) -> bool {
        self.counted.last
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
