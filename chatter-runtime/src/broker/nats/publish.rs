//! Publishing: the publish, the stream's ack, and the server's refusals.

use async_nats::jetstream::context::{PublishError, PublishErrorKind};
use async_nats::jetstream::message::PublishMessage as Publish;
use bytes::Bytes;

use super::Inner;
use super::codec::{headers, subject};
use crate::broker::{BrokerError, Refusal};
use crate::error_chain::ErrorChain;
use crate::message::BrokeredMessage;

impl Inner {
    /// Publishes `message` and waits for the stream's ack, retrying a lost connection or a
    /// missing ack until the publish timeout: the `Nats-Msg-Id` makes a second copy of one that
    /// was stored after all a duplicate the stream drops.
    pub(super) async fn publish(&self, message: BrokeredMessage) -> Result<(), BrokerError> {
        subject(&message.destination)?;
        let headers = headers(&message)?;
        let payload = Bytes::from(message.body.clone().into_bytes());
        let operation = format!(
            "publish `{}` to `{}`",
            message.message_id, message.destination
        );
        let attempt = || async {
            let publish = Publish::build()
                .headers(headers.clone())
                .payload(payload.clone());
            self.publish_to(&message.message_id, &message.destination, publish)
                .await
        };
        crate::broker::publish_retrying(operation, self.publish_timeout, attempt, |error| {
            tracing::debug!(error = %ErrorChain(error), "NATS publish failed; retrying");
        })
        .await
    }

    /// One publish of `publish` to `destination`, and its ack.
    pub(super) async fn publish_to(
        &self,
        message_id: &str,
        destination: &str,
        publish: Publish,
    ) -> Result<(), BrokerError> {
        let acked = async {
            self.jetstream
                .send_publish(destination.to_owned(), publish)
                .await?
                .await
        };
        match acked.await {
            // A duplicate is a message the stream already holds: published, as the relay needs.
            Ok(ack) => {
                self.check_window_once(&ack.stream);
                Ok(())
            }
            Err(error) if error.kind() == PublishErrorKind::StreamNotFound => {
                Err(self.no_responders(message_id, destination, error).await)
            }
            Err(error) => Err(publish_error(message_id, destination, error)),
        }
    }

    /// A publish nothing answered ("no responders", which the client reports as no stream):
    /// a missing stream only when JetStream says no stream stores `destination`. While
    /// JetStream recovers after a restart (or elects a stream's leader) nothing answers either:
    /// that is a transport failure, retried, not a refusal an operator would look for a stream
    /// for.
    async fn no_responders(
        &self,
        message_id: &str,
        destination: &str,
        error: PublishError,
    ) -> BrokerError {
        match self.stream_of(destination).await {
            Err(missing) if missing.refusal() == Some(Refusal::NoStream) => {
                publish_error(message_id, destination, error)
            }
            Ok(stream) => BrokerError::transport(
                format!("publish `{message_id}`"),
                format!(
                    "stream `{stream}` stores `{destination}` but did not answer (JetStream \
                     recovering after a restart, or electing the stream's leader)"
                ),
            ),
            Err(lookup) => BrokerError::transport(
                format!("publish `{message_id}`"),
                format!(
                    "JetStream did not answer (not enabled, or recovering after a restart); \
                     looking up the stream of `{destination}`: {}",
                    ErrorChain(&lookup)
                ),
            ),
        }
    }
}

/// What a failed JetStream publish means for chatter: a refusal an operator lifts (no stream
/// stores the subject, the message is over `max_payload`), a rejection by the stream, or a
/// transport failure to retry.
fn publish_error(message_id: &str, destination: &str, error: PublishError) -> BrokerError {
    let refused = |refusal: Refusal, error: &PublishError| BrokerError::Refused {
        destination: destination.to_owned(),
        refusal,
        reply: ErrorChain(error).to_string(),
    };
    match error.kind() {
        PublishErrorKind::StreamNotFound => refused(Refusal::NoStream, &error),
        PublishErrorKind::MaxPayloadExceeded => refused(Refusal::TooLarge, &error),
        PublishErrorKind::Other if over_max_msg_size(&error) => refused(Refusal::TooLarge, &error),
        PublishErrorKind::TimedOut | PublishErrorKind::BrokenPipe => {
            BrokerError::transport(format!("publish `{message_id}`"), error)
        }
        // The stream answered with an error (e.g. it is full and discards new messages, or it
        // refused the message's size): not taken, may be published again.
        _ => BrokerError::Rejected {
            message_id: message_id.to_owned(),
            destination: destination.to_owned(),
            reason: ErrorChain(&error).to_string(),
        },
    }
}

/// Whether the stream refused the message as larger than its `max_msg_size`.
fn over_max_msg_size(error: &PublishError) -> bool {
    std::error::Error::source(error)
        .and_then(|source| source.downcast_ref::<async_nats::jetstream::Error>())
        .is_some_and(|error| {
            error.error_code() == async_nats::jetstream::ErrorCode::STREAM_MESSAGE_EXCEEDS_MAXIMUM
        })
}
