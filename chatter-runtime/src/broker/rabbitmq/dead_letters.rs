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
use super::connection::Role;
use crate::broker::dead_letters::{
    DeadLetter, DeadLetterAction, DeadLetterOutcome, DeadLetters, replayed,
};
use crate::broker::{BrokerError, dead_letter_destination};
use crate::error_chain::ErrorChain;

impl RabbitMqBroker {
    /// A channel of its own on which `destination`'s dead-letter queue is browsed: everything
    /// taken from it and not acked goes back to the queue when it closes ([`close`]).
    /// Bounded by the connect timeout: a broker that stops answering (even a connection that
    /// went silent, heartbeats off) ends an operator's run with an error, never a hang.
    async fn browsing(&self) -> Result<Channel, BrokerError> {
        let opening = async {
            let connection = self.inner.connection(Role::Consuming).await?;
            connection
                .create_channel()
                .await
                .map_err(|e| BrokerError::transport("channel.open", e))
        };
        crate::broker::bounded(
            || "channel.open (dead letters)".to_owned(),
            self.inner.connect_timeout(),
            opening,
        )
        .await
    }
}

/// The next message of `queue` on `channel`, unacked; `None` when it is empty (or was never
/// declared).
/// Bounded by `bound`: a broker that stops answering fails the run.
async fn next(
    channel: &Channel,
    queue: &ShortString,
    bound: std::time::Duration,
) -> Result<Option<Delivery>, BrokerError> {
    let getting = async {
        match channel
            .basic_get(queue.clone(), BasicGetOptions { no_ack: false })
            .await
        {
            Ok(Some(message)) => Ok(Some(message.delivery)),
            Ok(None) => Ok(None),
            Err(error) if is_not_found(&error) => Ok(None),
            Err(error) => Err(BrokerError::transport(
                format!("basic.get `{queue}`"),
                error,
            )),
        }
    };
    crate::broker::bounded(|| format!("basic.get `{queue}`"), bound, getting).await
}

/// `delivery`, found at `position` of `dead_letters`, as an operator sees it.
fn described(dead_letters: &str, position: u64, delivery: &Delivery) -> DeadLetter {
    match decode(dead_letters, delivery) {
        Ok(message) => DeadLetter::of(position, &message),
        Err(_) => DeadLetter::raw(
            position,
            delivery
                .properties
                .message_id()
                .as_ref()
                .map(|id| id.as_str().to_owned()),
            reason_header(delivery),
            &delivery.data,
        ),
    }
}

/// Closes a browsing channel: its unacked messages go back to their queue (bounded: a silent
/// broker puts them back when the connection drops).
async fn close(channel: &Channel) {
    if channel.status().connected() {
        let _ = tokio::time::timeout(
            std::time::Duration::from_secs(5),
            channel.close(200, ShortString::from("OK")),
        )
        .await;
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
            let dead_letters = dead_letter_destination(destination);
            let queue = queue_name(&dead_letters)?;
            let channel = self.browsing().await?;
            let mut letters = Vec::new();
            let listed = async {
                while letters.len() < limit {
                    let Some(delivery) =
                        next(&channel, &queue, self.inner.publish_timeout()).await?
                    else {
                        break;
                    };
                    letters.push(described(&dead_letters, letters.len() as u64, &delivery));
                }
                Ok(())
            }
            .await;
            close(&channel).await;
            listed.map(|()| letters)
        }
        .boxed()
    }

    fn settle<'a>(
        &'a self,
        destination: &'a str,
        chosen: &'a [DeadLetter],
        action: DeadLetterAction,
    ) -> BoxFuture<'a, Result<DeadLetterOutcome, BrokerError>> {
        async move {
            let dead_letters = dead_letter_destination(destination);
            let queue = queue_name(&dead_letters)?;
            let channel = self.browsing().await?;
            let mut outcome = DeadLetterOutcome::default();
            let mut found = vec![false; chosen.len()];
            // Only as far as the last chosen position: what arrived since is never reached.
            let last = chosen.iter().map(|letter| letter.position).max();
            let mut position = 0;
            while last.is_some_and(|last| position <= last) {
                let delivery = match next(&channel, &queue, self.inner.publish_timeout()).await {
                    Ok(Some(delivery)) => delivery,
                    Ok(None) => break,
                    Err(error) => {
                        outcome.failed = Some(ErrorChain(&error).to_string());
                        break;
                    }
                };
                let at = chosen.iter().position(|letter| letter.position == position);
                position += 1;
                let Some(at) = at else {
                    continue;
                };
                let shown = &chosen[at];
                if described(&dead_letters, shown.position, &delivery).message_id
                    != shown.message_id
                {
                    continue;
                }
                found[at] = true;
                if let Err(error) = self
                    .settle_one(destination, &dead_letters, &delivery, action, &mut outcome)
                    .await
                {
                    outcome.failed = Some(ErrorChain(&error).to_string());
                    break;
                }
            }
            close(&channel).await;
            if outcome.failed.is_none() {
                for (letter, found) in chosen.iter().zip(found) {
                    if !found {
                        outcome.refused.push((
                            letter.message_id.clone(),
                            "it is no longer where it was listed (the queue changed): list again"
                                .to_owned(),
                        ));
                    }
                }
            }
            Ok(outcome)
        }
        .boxed()
    }
}

impl RabbitMqBroker {
    /// Replays (publish, confirm, then ack) or discards (ack) one dead letter.
    async fn settle_one(
        &self,
        destination: &str,
        dead_letters: &str,
        delivery: &Delivery,
        action: DeadLetterAction,
        outcome: &mut DeadLetterOutcome,
    ) -> Result<(), BrokerError> {
        let shown = described(dead_letters, 0, delivery);
        if action == DeadLetterAction::Replay {
            let Ok(message) = decode(dead_letters, delivery) else {
                outcome.refused.push((
                    shown.message_id,
                    "it is no Brokered Message: discard it".to_owned(),
                ));
                return Ok(());
            };
            self.inner.publish(replayed(message, destination)).await?;
        }
        crate::broker::bounded(
            || "basic.ack (dead letter)".to_owned(),
            self.inner.publish_timeout(),
            async {
                delivery
                    .acker
                    .ack(BasicAckOptions::default())
                    .await
                    .map_err(|e| BrokerError::transport("basic.ack", e))
            },
        )
        .await?;
        outcome.done.push(shown.message_id);
        Ok(())
    }
}
