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
//!
//! | file | what |
//! | --- | --- |
//! | `connection.rs` | the shared publishing and consuming connections, their bounded reconnects, the publishing channel |
//! | `publish.rs` | declaring a queue, publishing with confirms, the server's refusals |
//! | `declaration.rs` | how a queue is declared: classic, or an existing quorum queue's type and delivery limit learned from the server |
//! | `consume.rs` | subscriptions that resume after outages, settling deliveries, dead-lettering what is no Brokered Message |
//! | `codec.rs` | a Brokered Message as AMQP properties and headers, and back |

mod codec;
mod connection;
mod consume;
mod dead_letters;
mod declaration;
mod publish;

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use futures::FutureExt;
use futures::future::BoxFuture;
use lapin::options::QueueDeleteOptions;
use lapin::types::ShortString;
use tokio::runtime::Handle;

pub use codec::{CONTEXT_HEADER, DEAD_LETTER_REASON_HEADER};

use super::{Broker, BrokerContract, BrokerError, Subscription};
use crate::message::BrokeredMessage;
use codec::{properties, queue_name};
use connection::{Inner, Role, open, redact};
use declaration::DeliveryLimit;

/// How many unacked deliveries one subscription holds by default.
const DEFAULT_PREFETCH: u16 = 1;

/// A [`Broker`] on RabbitMQ: publisher confirms, durable queues, persistent messages, manual ack.
///
/// - [`publish`](Broker::publish) declares the destination's durable queue (once per connection:
///   a classic queue when it is missing, an existing classic or quorum queue as it is),
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
///   [`Delivery::nack`](super::Delivery::nack) and dropping a delivery unsettled are `basic.nack` with `requeue`, and
///   [`Delivery::redelivered`](super::Delivery::redelivered) is the AMQP `redelivered` flag and
///   [`Delivery::previous_deliveries`](super::Delivery::previous_deliveries) a quorum queue's
///   `x-delivery-count`.
///
/// **Two connections.** Publishes go on one connection, consumers (and their acks and nacks),
/// queue declarations and dead-letter browsing on another. During a memory or disk alarm
/// RabbitMQ blocks a connection that publishes and stops reading it until the alarm clears: the
/// publishes wait (bounded by the publish timeout), while the consumers keep receiving and
/// settling what is already queued.
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
/// Clones share the two connections.
#[derive(Clone)]
pub struct RabbitMqBroker {
    inner: Arc<Inner>,
    prefetch: u16,
}

/// The default bound of one publish, reconnection included.
pub const DEFAULT_PUBLISH_TIMEOUT: Duration = Duration::from_secs(30);

/// The default bound of one connection attempt: TCP and the AMQP handshake.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

impl RabbitMqBroker {
    /// Connect to `uri`, e.g. `amqp://guest:guest@127.0.0.1:5672/%2f` (plain AMQP: this build has
    /// no TLS backend). Must be called within a Tokio runtime, which then runs the connection.
    ///
    /// The first connection must succeed (a wrong address or credentials fail here, and a
    /// server that does not answer within [`DEFAULT_CONNECT_TIMEOUT`]); later losses are
    /// recovered from.
    pub async fn connect(uri: &str) -> Result<Self, BrokerError> {
        if Handle::try_current().is_err() {
            return Err(BrokerError::transport(
                "connect",
                "RabbitMqBroker::connect must be called within a Tokio runtime",
            ));
        }
        // Publishes and consumers on connections of their own: see `connection.rs`.
        let (publishing, consuming) = futures::try_join!(
            open(uri, DEFAULT_CONNECT_TIMEOUT),
            open(uri, DEFAULT_CONNECT_TIMEOUT)
        )?;
        Ok(Self {
            inner: Arc::new(Inner::new(
                uri.to_owned(),
                publishing,
                consuming,
                DEFAULT_PUBLISH_TIMEOUT,
                DEFAULT_CONNECT_TIMEOUT,
            )),
            prefetch: DEFAULT_PREFETCH,
        })
    }

    /// [`connect`](Self::connect), retried with backoff while the broker is unreachable, for up
    /// to `give_up_after`: for a process that may start while the broker restarts. The first
    /// failure is logged at Error; the last one is returned. `Duration::MAX` keeps trying
    /// (saturating at about 100 years).
    pub async fn connect_retrying(uri: &str, give_up_after: Duration) -> Result<Self, BrokerError> {
        super::connect_retrying("RabbitMQ", uri, give_up_after, || Self::connect(uri)).await
    }

    /// The same broker, whose new subscriptions hold up to `prefetch` unacked deliveries each
    /// (AMQP `basic.qos`; 0 means no limit). The default, 1, gives each message to whichever
    /// competing consumer is free.
    pub fn with_prefetch(mut self, prefetch: u16) -> Self {
        self.prefetch = prefetch;
        self
    }

    /// Bounds every publish (waiting for a lost connection, the publish and its confirm) by
    /// `timeout` (default [`DEFAULT_PUBLISH_TIMEOUT`]), for every clone of this broker. Closing
    /// and deleting a queue are bounded by it too. `Duration::MAX`: no bound of chatter's own.
    pub fn with_publish_timeout(self, timeout: Duration) -> Self {
        self.inner.set_publish_timeout(timeout);
        self
    }

    /// Bounds every connection attempt (TCP and the AMQP handshake) of a reconnect by `timeout`
    /// (default [`DEFAULT_CONNECT_TIMEOUT`]), for every clone of this broker: a server that
    /// accepts the connection and never answers is dialled again after it. `Duration::MAX`: no
    /// bound of chatter's own (such a server then holds the reconnect).
    pub fn with_connect_timeout(self, timeout: Duration) -> Self {
        self.inner.set_connect_timeout(timeout);
        self
    }

    /// Whether the publishing connection is up now (`false` while it is being re-established).
    /// The consuming connection reconnects when a subscription needs it; whether a
    /// subscription consumes is its own [`Subscription::liveness`].
    pub fn is_connected(&self) -> bool {
        self.inner.is_connected()
    }

    /// Close the connections (shared by all clones) gracefully; nothing reconnects afterwards and
    /// subscriptions end. Deliveries not settled by then are requeued by the server and
    /// delivered again; settling them afterwards fails with [`BrokerError::SettlementLost`] or
    /// [`BrokerError::Transport`].
    pub async fn close(&self) -> Result<(), BrokerError> {
        let connections = self.inner.close();
        let closing = async {
            // Both are closed even when the first fails; the first error is returned.
            let closed = futures::future::join_all(
                connections
                    .iter()
                    .map(|connection| connection.close(200, ShortString::from("OK"))),
            )
            .await;
            closed
                .into_iter()
                .collect::<Result<Vec<()>, _>>()
                .map(drop)
                .map_err(|e| BrokerError::transport("connection.close", e))
        };
        self.bounded("connection.close", closing).await
    }

    /// Delete `destination`'s queue and the messages in it; returns how many messages it held.
    pub async fn delete_queue(&self, destination: &str) -> Result<u32, BrokerError> {
        let queue = queue_name(destination)?;
        let operation = format!("queue.delete `{destination}`");
        let count = self
            .bounded(&operation, async {
                let channel = self.inner.publisher().await?;
                channel
                    .queue_delete(queue, QueueDeleteOptions::default())
                    .await
                    .map_err(|e| BrokerError::transport(operation.clone(), e))
            })
            .await?;
        self.inner.forget(destination);
        Ok(count)
    }

    /// `call`, bounded by the publish timeout.
    async fn bounded<T>(
        &self,
        operation: &str,
        call: impl Future<Output = Result<T, BrokerError>>,
    ) -> Result<T, BrokerError> {
        super::bounded(|| operation.to_owned(), self.inner.publish_timeout(), call).await
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

    /// Declares every destination of `contract` (each command's queue and its dead-letter
    /// queue) as chatter declares it, so a queue another service declared otherwise refuses the
    /// start instead of a poison message's dead letter, later. A quorum queue is taken as it is,
    /// as long as its delivery limit (`x-delivery-limit`, or RabbitMQ 4's default of 20 without
    /// one) is above the attempts of the command consuming it, or the start is refused with
    /// [`BrokerError::Misconfigured`] naming both numbers.
    fn verify<'a>(
        &'a self,
        contract: &'a BrokerContract,
    ) -> BoxFuture<'a, Result<(), BrokerError>> {
        async move {
            for destination in &contract.destinations {
                let declaration = self
                    .inner
                    .declare(Role::Consuming, destination, queue_name(destination)?)
                    .await?;
                check_delivery_limit(
                    destination,
                    declaration.delivery_limit(),
                    contract.max_delivery_attempts.get(destination).copied(),
                )?;
            }
            Ok(())
        }
        .boxed()
    }
}

/// Refuses a quorum queue whose delivery limit would cut a message's attempts short: the
/// queue delivers a message that its consumers never settle (each crashed during it) until its
/// count reaches the limit, and the runtime dead-letters that last delivery without running it.
/// The limit must be above the `max_delivery_attempts` of the command consuming `destination`:
/// RabbitMQ 3 delivers such a message limit + 1 times, and the one to spare covers versions
/// that count otherwise. A queue nobody consumes (a dead-letter queue, `None`) is only warned
/// about: browsing it counts as a delivery.
fn check_delivery_limit(
    destination: &str,
    limit: DeliveryLimit,
    max_delivery_attempts: Option<u32>,
) -> Result<(), BrokerError> {
    let DeliveryLimit::Limited { limit, declared } = limit else {
        return Ok(());
    };
    let Some(attempts) = max_delivery_attempts else {
        tracing::warn!(
            queue = destination,
            delivery_limit = limit,
            "RabbitMQ quorum queue with a delivery limit: each `chatter dead-letters list` counts as a delivery of every dead letter it shows, and the queue drops a dead letter shown more often than the limit; declare dead-letter queues classic"
        );
        return Ok(());
    };
    if limit > i64::from(attempts) {
        return Ok(());
    }
    let problem = if declared {
        format!(
            "is {limit}, not above the {attempts} delivery attempts of the command consuming \
             it: a message that crashes its consumer would be dead-lettered before it had its \
             attempts"
        )
    } else {
        format!(
            "is not set, and RabbitMQ 4 then applies {limit}, not above the {attempts} delivery \
             attempts of the command consuming it: a message that crashes its consumer would be \
             dead-lettered before it had its attempts"
        )
    };
    Err(BrokerError::Misconfigured {
        setting: format!("`x-delivery-limit` of the quorum queue `{destination}`"),
        problem,
        fix: format!(
            "re-create the queue with `x-delivery-limit` above {attempts} (or -1 on RabbitMQ 4 \
             for none; a queue's arguments cannot change: move its messages off, delete it and \
             declare it again), or lower the command's `max_delivery_attempts` below {limit}"
        ),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_delivery_limit_above_the_attempts_or_none_is_taken() {
        let limited = |limit| DeliveryLimit::Limited {
            limit,
            declared: true,
        };
        assert!(check_delivery_limit("q", limited(6), Some(5)).is_ok());
        assert!(check_delivery_limit("q", DeliveryLimit::Unlimited, Some(500)).is_ok());
        assert!(
            check_delivery_limit("q", limited(1), None).is_ok(),
            "a queue nobody consumes is only warned about"
        );
        let refused = check_delivery_limit("q", limited(5), Some(5)).unwrap_err();
        assert!(
            refused
                .to_string()
                .contains("is 5, not above the 5 delivery attempts"),
            "{refused}"
        );
    }

    #[test]
    fn a_quorum_queue_without_limit_is_refused_for_attempts_reaching_rabbitmq_4s_default() {
        let default = DeliveryLimit::Limited {
            limit: declaration::DEFAULT_QUORUM_DELIVERY_LIMIT,
            declared: false,
        };
        assert!(check_delivery_limit("q", default, Some(19)).is_ok());
        let refused = check_delivery_limit("q", default, Some(20)).unwrap_err();
        let text = refused.to_string();
        assert!(
            text.contains("is not set, and RabbitMQ 4 then applies 20, not above the 20")
                && text.contains("above 20 (or -1 on RabbitMQ 4 for none;"),
            "{text}"
        );
    }
}
