//! One consumer per registered command: broker deliveries through the pipeline, acked on
//! success; a failure that can succeed later is delivered again (counted), one that never can is
//! dead-lettered.
//!
//! - **Attempts survive restarts.** A failed delivery is not nacked: a copy carrying the next
//!   attempt number in its context (`Chatter.Delivery.Attempts`) is published to the same
//!   destination, then the original is acked. The count travels with the message, so neither a
//!   consumer restart nor a broker restart resets it.
//! - **Dead letters.** A delivery whose body is not the command's JSON or that has no message id
//!   is dead-lettered at once; one that failed `max_delivery_attempts` times is dead-lettered
//!   then. A dead letter keeps its id, body and context, adds `Chatter.DeadLetter.Reason` and
//!   `Chatter.Delivery.Attempts`, and goes to `<destination>.dead-letter` on the same broker,
//!   logged at Error.
//! - **Subscriptions.** A subscription the broker ends is made again with backoff, logged at
//!   Error when it ends and at Info when it is back; the consumer never ends on its own.

use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;
use tokio_util::sync::CancellationToken;

use super::health::ConsumerStatus;
use crate::backoff;
use crate::broker::{Broker, Delivery, Subscription, dead_letter_destination};
use crate::error_chain::ErrorChain;
use crate::message::BrokeredMessage;
use crate::pipeline::{Outcome, Pipeline, PipelineError};
use crate::registry::RegisteredCommand;

/// Deliveries of one message, the first included, before it is dead-lettered, for a command
/// that does not set `#[chatter(max_delivery_attempts = N)]`.
pub const DEFAULT_MAX_DELIVERY_ATTEMPTS: u32 = 5;

/// The context key counting a message's deliveries (absent on the first).
pub const ATTEMPTS_CONTEXT_KEY: &str = "Chatter.Delivery.Attempts";

/// The context key a dead letter carries its reason in.
pub const DEAD_LETTER_REASON_CONTEXT_KEY: &str = "Chatter.DeadLetter.Reason";

/// What a consumer task needs.
pub(super) struct Consumer {
    pub(super) command: RegisteredCommand,
    pub(super) broker: Arc<dyn Broker>,
    pub(super) pipeline: Pipeline,
    pub(super) cancel: CancellationToken,
    pub(super) redelivery_delay: Duration,
    pub(super) status: ConsumerStatus,
}

impl Consumer {
    pub(super) async fn run(self, mut subscription: Subscription) {
        let name = self.command.registration.command_name;
        let destination = self.command.registration.destination;
        tracing::info!(command = name, destination, "chatter consumer started");
        loop {
            self.status.subscribed(subscription.liveness().clone());
            if !self.consume(&mut subscription).await {
                break;
            }
            tracing::error!(
                command = name,
                destination,
                "chatter consumer: the broker ended the subscription; subscribing again with backoff"
            );
            self.status.reconnecting(None);
            match self.resubscribe().await {
                Some(again) => {
                    tracing::info!(
                        command = name,
                        destination,
                        "chatter consumer subscribed again"
                    );
                    subscription = again;
                }
                None => break,
            }
        }
        self.status.stopped();
        tracing::info!(command = name, "chatter consumer stopped");
    }

    /// Handles deliveries until the subscription ends (`true`) or shutdown (`false`).
    async fn consume(&self, subscription: &mut Subscription) -> bool {
        let name = self.command.registration.command_name;
        loop {
            let next = tokio::select! {
                _ = self.cancel.cancelled() => return false,
                next = subscription.next() => next,
            };
            match next {
                None => return true,
                Some(Err(error)) => {
                    tracing::error!(command = name, error = %ErrorChain(&error), "chatter consumer: the broker reported a failed delivery");
                }
                // A delivery in progress finishes even when shutdown is requested: settling it
                // is what keeps it from being lost or handled twice.
                Some(Ok(delivery)) => self.handle(delivery).await,
            }
        }
    }

    /// Subscribes again with backoff until it works (`None` on shutdown).
    async fn resubscribe(&self) -> Option<Subscription> {
        let destination = self.command.registration.destination;
        let mut backoff = backoff::reconnect();
        loop {
            match self.broker.subscribe(destination).await {
                Ok(subscription) => return Some(subscription),
                Err(error) => {
                    tracing::debug!(destination, error = %ErrorChain(&error), "chatter consumer: subscribing failed; retrying");
                    self.status
                        .reconnecting(Some(ErrorChain(&error).to_string()));
                }
            }
            tokio::select! {
                _ = self.cancel.cancelled() => return None,
                () = tokio::time::sleep(backoff.next_delay()) => {}
            }
        }
    }

    async fn handle(&self, delivery: Delivery) {
        let name = self.command.registration.command_name;
        let message_id = delivery.message.message_id.clone();
        let attempt = attempt_of(&delivery.message);
        let redelivered = delivery.redelivered || attempt > 1;
        let result = match serde_json::from_str(&delivery.message.body) {
            Ok(body) => {
                self.pipeline
                    .handle(&self.command, body, &message_id, redelivered)
                    .await
            }
            Err(source) => Err(PipelineError::NotJson {
                command: name,
                message_id: message_id.clone(),
                source,
            }),
        };
        match result {
            Ok(outcome) => {
                log_outcome(name, &message_id, outcome);
                if let Err(error) = delivery.ack().await {
                    tracing::error!(command = name, message_id, error = %ErrorChain(&error), "chatter consumer: ack failed; the broker will redeliver");
                }
            }
            Err(error) if error.is_permanent() => {
                let reason = ErrorChain(&error).to_string();
                self.dead_letter(delivery, attempt, &reason).await;
            }
            Err(error) => {
                let max = self
                    .command
                    .registration
                    .max_delivery_attempts
                    .unwrap_or(DEFAULT_MAX_DELIVERY_ATTEMPTS);
                if attempt >= max {
                    let reason = format!(
                        "it failed on each of its {attempt} delivery attempts; the last: {}",
                        ErrorChain(&error)
                    );
                    self.dead_letter(delivery, attempt, &reason).await;
                } else {
                    tracing::error!(command = name, message_id, attempt, max_attempts = max, error = %ErrorChain(&error), "chatter delivery failed; it is delivered again");
                    self.retry(delivery, attempt).await;
                }
            }
        }
    }

    /// Publishes the next attempt, then acks this one; if that publish fails, nacks instead
    /// (the broker redelivers; the attempt is not counted).
    async fn retry(&self, delivery: Delivery, attempt: u32) {
        let name = self.command.registration.command_name;
        tokio::select! {
            _ = self.cancel.cancelled() => {}
            () = tokio::time::sleep(self.redelivery_delay) => {}
        }
        let message_id = delivery.message.message_id.clone();
        let mut next = delivery.message.clone();
        next.context
            .insert(ATTEMPTS_CONTEXT_KEY.to_owned(), Value::from(attempt + 1));
        match self.broker.publish(next).await {
            Ok(()) => {
                if let Err(error) = delivery.ack().await {
                    // The original comes back too: one extra delivery, nothing lost.
                    tracing::error!(command = name, message_id, error = %ErrorChain(&error), "chatter consumer: ack after requeue failed");
                }
            }
            Err(error) => {
                tracing::error!(command = name, message_id, error = %ErrorChain(&error), "chatter consumer: could not requeue the next attempt; returning the delivery to the broker");
                if let Err(error) = delivery.nack().await {
                    tracing::error!(command = name, message_id, error = %ErrorChain(&error), "chatter consumer: nack failed");
                }
            }
        }
    }

    /// Publishes `delivery` to the dead-letter destination with `reason`, then acks it; if that
    /// publish fails, nacks it, so nothing is dropped.
    async fn dead_letter(&self, delivery: Delivery, attempt: u32, reason: &str) {
        let name = self.command.registration.command_name;
        let source = self.command.registration.destination;
        let mut letter = delivery.message.clone();
        letter.destination = dead_letter_destination(source);
        letter.context.insert(
            DEAD_LETTER_REASON_CONTEXT_KEY.to_owned(),
            Value::from(reason),
        );
        letter
            .context
            .insert(ATTEMPTS_CONTEXT_KEY.to_owned(), Value::from(attempt));
        let message_id = delivery.message.message_id.clone();
        let dead_letters = letter.destination.clone();
        match self.broker.publish(letter).await {
            Ok(()) => {
                tracing::error!(
                    command = name,
                    message_id,
                    attempts = attempt,
                    dead_letters,
                    reason,
                    "chatter dead-lettered a delivery"
                );
                if let Err(error) = delivery.ack().await {
                    tracing::error!(command = name, message_id, error = %ErrorChain(&error), "chatter consumer: ack after dead-lettering failed");
                }
            }
            Err(error) => {
                tracing::error!(command = name, message_id, error = %ErrorChain(&error), reason, "chatter consumer: could not dead-letter the delivery; returning it to the broker");
                tokio::time::sleep(self.redelivery_delay).await;
                if let Err(error) = delivery.nack().await {
                    tracing::error!(command = name, message_id, error = %ErrorChain(&error), "chatter consumer: nack failed");
                }
            }
        }
    }
}

/// This delivery's attempt number: 1 for a first delivery.
fn attempt_of(message: &BrokeredMessage) -> u32 {
    message
        .context
        .get(ATTEMPTS_CONTEXT_KEY)
        .and_then(Value::as_u64)
        .and_then(|n| u32::try_from(n).ok())
        .filter(|n| *n >= 1)
        .unwrap_or(1)
}

fn log_outcome(name: &str, message_id: &str, outcome: Outcome) {
    match outcome {
        Outcome::Committed { operations } => {
            tracing::info!(
                command = name,
                message_id,
                operations,
                "chatter delivery committed"
            )
        }
        Outcome::Duplicate => tracing::info!(
            command = name,
            message_id,
            "chatter duplicate delivery acknowledged"
        ),
        Outcome::HandledAtLeastOnce => tracing::info!(
            command = name,
            message_id,
            "chatter delivery handled without a batch (at least once: its partition key did not resolve)"
        ),
    }
}
