//! A command's dead letters for an operator: the messages of `<destination>.dead-letter` in the
//! stream that stores it, read by sequence, removed by sequence.

use async_nats::jetstream::message::{PublishMessage, StreamMessage};
use async_nats::jetstream::stream::{LastRawMessageErrorKind, Stream};
use bytes::Bytes;
use futures::FutureExt;
use futures::future::BoxFuture;

use super::NatsBroker;
use super::codec::{DEAD_LETTER_REASON_HEADER, NATS_MSG_ID, decode, headers, qualified_id};
use crate::broker::dead_letters::{
    DeadLetter, DeadLetterAction, DeadLetterOutcome, DeadLetters, replayed,
};
use crate::broker::{BrokerError, Refusal, dead_letter_destination};
use crate::error_chain::ErrorChain;
use crate::message::BrokeredMessage;

impl NatsBroker {
    /// The stream storing `destination`'s dead letters; `None` when no stream does (so there
    /// are none).
    async fn dead_letter_stream(&self, destination: &str) -> Result<Option<Stream>, BrokerError> {
        let subject = dead_letter_destination(destination);
        let name = match self.inner.stream_of(&subject).await {
            Ok(name) => name,
            Err(error) if error.refusal() == Some(Refusal::NoStream) => return Ok(None),
            Err(error) => return Err(error),
        };
        self.inner
            .jetstream
            .get_stream(&name)
            .await
            .map(Some)
            .map_err(|e| BrokerError::transport(format!("get stream `{name}`"), e))
    }

    /// Up to `limit` stored messages of `destination`'s dead-letter subject, oldest first.
    async fn stored(
        &self,
        stream: &Stream,
        destination: &str,
        limit: usize,
    ) -> Result<Vec<StreamMessage>, BrokerError> {
        let subject = dead_letter_destination(destination);
        let mut found = Vec::new();
        let mut sequence = 1;
        while found.len() < limit {
            let next = stream
                .raw_message_builder()
                .sequence(sequence)
                .next_by_subject(subject.clone())
                .send()
                .await;
            match next {
                Ok(message) => {
                    sequence = message.sequence + 1;
                    found.push(message);
                }
                Err(error) if error.kind() == LastRawMessageErrorKind::NoMessageFound => break,
                Err(error) => {
                    return Err(BrokerError::transport(format!("read `{subject}`"), error));
                }
            }
        }
        Ok(found)
    }
}

/// The stored dead letter as the Brokered Message it carries; `None` for a foreign message's
/// (it carries a `Chatter-Dead-Letter-Reason` header), even one whose `Nats-Msg-Id`, which
/// chatter gave it when it dead-lettered it, would decode as a message id.
fn brokered(subject: &str, message: &StreamMessage) -> Option<BrokeredMessage> {
    if message.headers.get(DEAD_LETTER_REASON_HEADER).is_some() {
        return None;
    }
    decode(subject, Some(&message.headers), &message.payload).ok()
}

fn letter(destination: &str, message: &StreamMessage) -> DeadLetter {
    match brokered(destination, message) {
        Some(decoded) => DeadLetter::of(message.sequence, &decoded),
        None => DeadLetter::raw(
            message.sequence,
            message
                .headers
                .get(NATS_MSG_ID)
                .map(|v| foreign_message_id(v.as_str()))
                .filter(|id| id != "<none>"),
            message
                .headers
                .get(DEAD_LETTER_REASON_HEADER)
                .map(|v| v.as_str().to_owned()),
            &message.payload,
        ),
    }
}

/// A foreign message's id as it came, without the `:dead-letter:<uuid>` suffix its dead
/// letter's `Nats-Msg-Id` got.
fn foreign_message_id(nats_msg_id: &str) -> String {
    nats_msg_id
        .rsplit_once(":dead-letter:")
        .map_or(nats_msg_id, |(id, _)| id)
        .to_owned()
}

impl DeadLetters for NatsBroker {
    fn list<'a>(
        &'a self,
        destination: &'a str,
        limit: usize,
    ) -> BoxFuture<'a, Result<Vec<DeadLetter>, BrokerError>> {
        async move {
            let Some(stream) = self.dead_letter_stream(destination).await? else {
                return Ok(Vec::new());
            };
            let stored = self.stored(&stream, destination, limit).await?;
            Ok(stored.iter().map(|m| letter(destination, m)).collect())
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
            let mut outcome = DeadLetterOutcome::default();
            let Some(stream) = self.dead_letter_stream(destination).await? else {
                return Ok(outcome);
            };
            for shown in chosen {
                match self.settle_one(&stream, destination, shown, action).await {
                    Ok(Settled::Done) => outcome.done.push(shown.message_id.clone()),
                    Ok(Settled::Refused(why)) => {
                        outcome
                            .refused
                            .push((shown.message_id.clone(), why.to_owned()));
                    }
                    Err(error) => {
                        outcome.failed = Some(ErrorChain(&error).to_string());
                        break;
                    }
                }
            }
            Ok(outcome)
        }
        .boxed()
    }
}

enum Settled {
    Done,
    Refused(&'static str),
}

impl NatsBroker {
    /// Replays or discards the dead letter stored at `shown.position`, if it is still the one
    /// shown.
    async fn settle_one(
        &self,
        stream: &Stream,
        destination: &str,
        shown: &DeadLetter,
        action: DeadLetterAction,
    ) -> Result<Settled, BrokerError> {
        let subject = dead_letter_destination(destination);
        let stored = match stream.get_raw_message(shown.position).await {
            Ok(stored) => stored,
            Err(error) if error.kind() == LastRawMessageErrorKind::NoMessageFound => {
                return Ok(Settled::Refused("it is no longer there: list again"));
            }
            Err(error) => {
                return Err(BrokerError::transport(format!("read `{subject}`"), error));
            }
        };
        if stored.subject.as_str() != subject
            || letter(destination, &stored).message_id != shown.message_id
        {
            return Ok(Settled::Refused("it is no longer there: list again"));
        }
        if action == DeadLetterAction::Replay {
            let Some(message) = brokered(&subject, &stored) else {
                return Ok(Settled::Refused("it is no Brokered Message: discard it"));
            };
            let message = replayed(message, destination);
            let mut replay_headers = headers(&message)?;
            // Not the original's id, which the stream may still hold within its duplicate
            // window, but one per stored dead letter (its sequence and when it was stored, so a
            // recreated stream's reused sequence is another one): a replay repeated after a
            // crash before the removal below is taken for the duplicate it is, and the dead
            // letter it already replayed is removed.
            replay_headers.insert(
                NATS_MSG_ID,
                format!(
                    "{}:replay:{}:{}",
                    qualified_id(destination, &message.message_id),
                    stored.sequence,
                    stored.time.unix_timestamp_nanos()
                )
                .as_str(),
            );
            let publish = PublishMessage::build()
                .headers(replay_headers)
                .payload(Bytes::from(message.body.clone().into_bytes()));
            self.inner
                .publish_to(&message.message_id, destination, publish)
                .await?;
        }
        stream.delete_message(stored.sequence).await.map_err(|e| {
            BrokerError::transport(format!("remove a dead letter of `{subject}`"), e)
        })?;
        Ok(Settled::Done)
    }
}
