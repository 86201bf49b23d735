//! A command's dead-letter queue for an operator: browsed with `basic.get` on a channel of its
//! own; what is not settled goes back to the queue when that channel closes (in its place, marked
//! redelivered).

use futures::FutureExt;
use futures::future::BoxFuture;
use lapin::Channel;
use lapin::message::Delivery;
use lapin::options::{BasicAckOptions, BasicGetOptions};
use lapin::types::{AMQPValue, ShortString};

use super::RabbitMqBroker;
use super::codec::{DEAD_LETTER_REASON_HEADER, decode, queue_name};
use crate::broker::dead_letters::{
    DeadLetter, DeadLetterAction, DeadLetterOutcome, DeadLetterSelection, DeadLetters, replayed,
};
use crate::broker::{BrokerError, dead_letter_destination};

impl RabbitMqBroker {
    /// Takes up to `limit` messages of `destination`'s dead-letter queue (unacked) on a channel
    /// of its own; whatever the caller leaves unacked goes back to the queue when it closes the
    /// channel ([`close`]).
    async fn take(
        &self,
        destination: &str,
        limit: usize,
    ) -> Result<(Channel, Vec<(DeadLetter, Delivery)>), BrokerError> {
        let dead_letters = dead_letter_destination(destination);
        let queue = queue_name(&dead_letters)?;
        let connection = self.inner.connection().await?;
        let channel = connection
            .create_channel()
            .await
            .map_err(|e| BrokerError::transport("channel.open", e))?;
        let mut taken = Vec::new();
        while taken.len() < limit {
            let got = channel
                .basic_get(queue.clone(), BasicGetOptions { no_ack: false })
                .await;
            let message = match got {
                Ok(Some(message)) => message,
                Ok(None) => break,
                // The queue was never declared: no dead letters.
                Err(error) if is_not_found(&error) => break,
                Err(error) => {
                    close(&channel).await;
                    return Err(BrokerError::transport(
                        format!("basic.get `{dead_letters}`"),
                        error,
                    ));
                }
            };
            let delivery = message.delivery;
            let letter = match decode(&dead_letters, &delivery) {
                Ok(message) => DeadLetter::of(&message),
                Err(_) => DeadLetter::raw(
                    delivery
                        .properties
                        .message_id()
                        .as_ref()
                        .map(|id| id.as_str().to_owned()),
                    reason_header(&delivery),
                    &delivery.data,
                ),
            };
            taken.push((letter, delivery));
        }
        Ok((channel, taken))
    }
}

/// Closes a browsing channel: its unacked messages go back to their queue.
async fn close(channel: &Channel) {
    if channel.status().connected() {
        let _ = channel.close(200, ShortString::from("OK")).await;
    }
}

fn is_not_found(error: &lapin::Error) -> bool {
    matches!(error.kind(), lapin::ErrorKind::ProtocolError(amqp) if amqp.kind().get_id() == 404)
}

fn reason_header(delivery: &lapin::message::Delivery) -> Option<String> {
    match delivery
        .properties
        .headers()
        .as_ref()?
        .inner()
        .get(DEAD_LETTER_REASON_HEADER)?
    {
        AMQPValue::LongString(text) => Some(String::from_utf8_lossy(text.as_bytes()).into_owned()),
        AMQPValue::ShortString(text) => Some(text.as_str().to_owned()),
        _ => None,
    }
}

impl DeadLetters for RabbitMqBroker {
    fn list<'a>(
        &'a self,
        destination: &'a str,
        limit: usize,
    ) -> BoxFuture<'a, Result<Vec<DeadLetter>, BrokerError>> {
        async move {
            let (channel, taken) = self.take(destination, limit).await?;
            close(&channel).await;
            Ok(taken.into_iter().map(|(letter, _)| letter).collect())
        }
        .boxed()
    }

    fn settle<'a>(
        &'a self,
        destination: &'a str,
        selection: &'a DeadLetterSelection,
        action: DeadLetterAction,
    ) -> BoxFuture<'a, Result<DeadLetterOutcome, BrokerError>> {
        async move {
            let (channel, taken) = self.take(destination, usize::MAX).await?;
            let settled = self
                .settle_taken(destination, taken, selection, action)
                .await;
            close(&channel).await;
            settled
        }
        .boxed()
    }
}

impl RabbitMqBroker {
    async fn settle_taken(
        &self,
        destination: &str,
        taken: Vec<(DeadLetter, Delivery)>,
        selection: &DeadLetterSelection,
        action: DeadLetterAction,
    ) -> Result<DeadLetterOutcome, BrokerError> {
        let dead_letters = dead_letter_destination(destination);
        let mut outcome = DeadLetterOutcome::default();
        for (letter, delivery) in taken {
            if !selection.takes(&letter.message_id) {
                continue;
            }
            if action == DeadLetterAction::Replay {
                let Ok(message) = decode(&dead_letters, &delivery) else {
                    outcome.refused.push((
                        letter.message_id,
                        "it is no Brokered Message: discard it".to_owned(),
                    ));
                    continue;
                };
                self.inner.publish(replayed(message, destination)).await?;
            }
            delivery
                .acker
                .ack(BasicAckOptions::default())
                .await
                .map_err(|e| BrokerError::transport("basic.ack", e))?;
            outcome.done.push(letter.message_id);
        }
        Ok(outcome)
    }
}
