//! Publishing: declaring the destination's queue (classic, or a quorum queue as it is), the
//! publish and its confirm, and the server's refusals.

use lapin::message::Delivery as AmqpDelivery;
use lapin::options::{BasicPublishOptions, QueueDeclareOptions};
use lapin::types::{AMQPValue, FieldTable, LongString, ShortString};
use lapin::{BasicProperties, Confirmation};

use super::codec::{
    DEAD_LETTER_REASON_HEADER, DELIVERY_COUNT_HEADER, PERSISTENT, message_id_or_none, properties,
    queue_name,
};
use super::connection::{Inner, Role};
use super::declaration::{Declaration, Inequivalent};
use crate::broker::{BrokerError, Refusal};
use crate::error_chain::ErrorChain;
use crate::message::BrokeredMessage;

impl Inner {
    /// Declares `destination`'s durable queue, once per connection, each try on a channel of
    /// its own (a refusal closes the channel it came on, not the publishing channel other
    /// messages are waiting on). An existing quorum queue's type and delivery limit are learned
    /// from the server's refusals and declared as they are (see [`Declaration`]); the
    /// declaration the server took is returned. It goes on the connection of `role`: a
    /// consumer's on the consuming one, which a resource alarm never blocks.
    pub(super) async fn declare(
        &self,
        role: Role,
        destination: &str,
        queue: ShortString,
    ) -> Result<Declaration, BrokerError> {
        if let Some(declaration) = self.declared_as(destination) {
            return Ok(declaration);
        }
        let mut declaration = self.learned(destination);
        // A refusal names one argument: the queue type, then its limit. More refusals than
        // that mean the queue is being declared otherwise meanwhile.
        for _ in 0..4 {
            let connection = self.connection(role).await?;
            let channel = connection
                .create_channel()
                .await
                .map_err(|e| BrokerError::transport("channel.open", e))?;
            let options = QueueDeclareOptions {
                durable: true,
                ..QueueDeclareOptions::default()
            };
            let declared = channel
                .queue_declare(queue.clone(), options, declaration.arguments())
                .await;
            if channel.status().connected() {
                // Best effort: a channel left open closes with its connection.
                let _ = channel.close(200, ShortString::from("OK")).await;
            }
            let error = match declared {
                Ok(_) => {
                    self.declared(destination, declaration.clone());
                    return Ok(declaration);
                }
                Err(error) => error,
            };
            let adopted = precondition_failed(&error)
                .and_then(Inequivalent::parse)
                .is_some_and(|inequivalent| declaration.adopt(&inequivalent));
            if !adopted {
                return Err(declare_error(destination, error));
            }
            // lapin logs the refusal as an Error ("Channel closed"); it is how AMQP answers.
            tracing::info!(
                queue = destination,
                arguments = %declaration,
                "RabbitMQ queue exists with other arguments chatter takes; declaring it as it is (the channel error before this is the server's answer to the first declaration)"
            );
        }
        Err(BrokerError::Refused {
            destination: destination.to_owned(),
            refusal: Refusal::ConflictingDeclaration,
            reply: "its x-queue-type or x-delivery-limit changed between declarations".to_owned(),
        })
    }

    /// Publishes `message`, retrying transport failures on a new connection until the publish
    /// timeout.
    pub(super) async fn publish(&self, message: BrokeredMessage) -> Result<(), BrokerError> {
        let queue = queue_name(&message.destination)?;
        let properties = properties(&message)?;
        let timeout = self.publish_timeout();
        let operation = format!(
            "publish `{}` to `{}`",
            message.message_id, message.destination
        );
        // A transport failure (the connection dropped before or during the publish) is retried
        // on a new connection until the bound.
        let published = crate::broker::publish_retrying(
            operation,
            timeout,
            || self.publish_once(message.clone(), queue.clone(), properties.clone()),
            |error| {
                tracing::debug!(error = %ErrorChain(error), "RabbitMQ publish failed; retrying on a new connection");
                // Its channel may be dead before the client noticed: open a new one.
                self.forget_publisher();
            },
        )
        .await;
        if let Err(error) = &published
            && self.publishing_blocked()
        {
            // The timeout alone would not say why: name the alarm.
            tracing::error!(destination = %message.destination, message_id = %message.message_id, error = %ErrorChain(error), "RabbitMQ has blocked the publishing connection (a memory or disk alarm): publishes wait until the alarm clears; consumers go on");
        }
        published
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
        let transport = |error: lapin::Error| {
            BrokerError::transport(format!("basic.publish `{message_id}`"), error)
        };
        let rejected = |reason: String| BrokerError::Rejected {
            message_id: message_id.to_owned(),
            destination: destination.to_owned(),
            reason,
        };
        // A second attempt after the message came back unroutable (the queue was deleted since
        // this broker declared it, so it is declared again), or after the server closed the
        // publishing channel with a refusal: the channel is shared, so the refusal may have been
        // of another message waiting on it. The second attempt then goes on a channel of its
        // own, where nothing else is published: a refusal there is this message's, never that of
        // another message refused meanwhile (on a fresh shared channel, a second oversized
        // message could close it again and fail this one twice). Neither was stored anywhere,
        // so publishing again cannot duplicate it.
        let mut unroutable = 0;
        let mut refused = 0;
        loop {
            self.declare(Role::Publishing, destination, queue.clone())
                .await?;
            let channel = if refused == 0 {
                self.publisher().await?
            } else {
                self.confirm_channel().await?
            };
            let publishing = async {
                channel
                    .basic_publish(
                        ShortString::default(),
                        queue.clone(),
                        options,
                        body,
                        properties.clone(),
                    )
                    .await?
                    .await
            };
            let confirmation = match publishing.await {
                Ok(confirmation) => confirmation,
                Err(error) => match refusal(destination, AmqpMethod::Publish, &error) {
                    Some(_) if refused == 0 => {
                        refused += 1;
                        self.forget_publisher();
                        continue;
                    }
                    Some(refusal) => return Err(refusal),
                    None => return Err(transport(error)),
                },
            };
            return match confirmation {
                Confirmation::Ack(None) => Ok(()),
                Confirmation::Ack(Some(returned)) => {
                    self.forget(destination);
                    unroutable += 1;
                    if unroutable < 2 {
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
    pub(super) async fn publish_raw(
        &self,
        destination: &str,
        delivery: &AmqpDelivery,
        reason: &str,
    ) -> Result<(), BrokerError> {
        let queue = queue_name(destination)?;
        let original = &delivery.properties;
        // Without the queue's count of the original: on the copy it would read as the queue's
        // own.
        let mut headers = FieldTable::from(
            original
                .headers()
                .as_ref()
                .map(|headers| headers.inner().clone())
                .unwrap_or_default()
                .into_iter()
                .filter(|(name, _)| name.as_str() != DELIVERY_COUNT_HEADER)
                .collect::<std::collections::BTreeMap<_, _>>(),
        );
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
        let message_id = message_id_or_none(original);
        let attempt =
            self.publish_bytes(&message_id, destination, queue, &delivery.data, properties);
        let operation = || format!("dead-letter to `{destination}`");
        crate::broker::bounded(operation, self.publish_timeout(), attempt).await
    }
}

/// The reply text of a `PRECONDITION_FAILED` (406) refusal.
fn precondition_failed(error: &lapin::Error) -> Option<&str> {
    match error.kind() {
        lapin::ErrorKind::ProtocolError(amqp) if amqp.kind().get_id() == 406 => {
            Some(amqp.get_message().as_str())
        }
        _ => None,
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
