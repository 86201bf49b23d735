//! Settling a delivery once its attempt ended: acked when it committed (or was a duplicate),
//! retried or dead-lettered when it failed, and every failed settlement logged.

use serde_json::Value;

use super::Consumer;
use crate::broker::{self, BrokerError, Delivery};
use crate::error_chain::ErrorChain;
use crate::message::BrokeredMessage;
use crate::pipeline::{Outcome, PipelineError};

impl Consumer {
    /// Settles `delivery` after its attempt number `attempt` ended with `result`.
    pub(super) async fn settle(
        &self,
        delivery: Delivery,
        attempt: u32,
        result: Result<Outcome, PipelineError>,
    ) {
        let name = self.command.registration.command_name;
        let message_id = delivery.message.message_id.clone();
        match result {
            Ok(outcome) => {
                log_outcome(name, &message_id, outcome);
                self.ack(delivery, "ack").await;
            }
            // Its channel closed during the attempt: the server delivers the original again, so
            // a retry copy or a dead letter would handle it twice.
            Err(error) if delivery.is_stale() => {
                tracing::warn!(command = name, message_id, error = %ErrorChain(&error), "chatter delivery failed and its channel closed meanwhile; the broker delivers it again");
                delivery.discard();
            }
            // Another attempt's handler may be running now: not run, not counted, not settled
            // as handled; delivered again once that claim may have ended.
            Err(error) if error.claim_held().is_some() => {
                let for_at_most = error.claim_held().unwrap_or_default();
                tracing::info!(command = name, message_id, attempt, error = %ErrorChain(&error), "chatter delivery waits for another attempt of the same message id; it is delivered again later (uncounted on RabbitMQ; on JetStream the wait is one delivery)");
                self.retry_after_claim(delivery, attempt, for_at_most).await;
            }
            Err(error) if error.is_permanent() => {
                let reason = ErrorChain(&error).to_string();
                let rejected = error.rejection().is_some();
                self.dead_letter(delivery, attempt, &reason, rejected).await;
            }
            Err(error) => {
                let max = self.max_attempts();
                if attempt >= max && error.may_have_committed() && self.committed(&delivery).await {
                    // The last attempt committed but did not hear so in time: it was handled.
                    tracing::info!(command = name, message_id, attempt, error = %ErrorChain(&error), "chatter delivery committed although its attempt failed; acknowledged as handled");
                    self.ack(delivery, "ack").await;
                } else if attempt >= max {
                    let reason = format!(
                        "it failed on each of its {attempt} delivery attempts; the last: {}",
                        ErrorChain(&error)
                    );
                    self.dead_letter(delivery, attempt, &reason, false).await;
                } else {
                    tracing::error!(command = name, message_id, attempt, max_attempts = max, error = %ErrorChain(&error), "chatter delivery failed; it is delivered again");
                    self.retry(delivery, attempt).await;
                }
            }
        }
    }

    /// Whether an attempt of `delivery` committed (its inbox marker exists); `false` when that
    /// cannot be told.
    pub(super) async fn committed(&self, delivery: &Delivery) -> bool {
        let Ok(body) = serde_json::from_str::<Value>(&delivery.message.body) else {
            return false;
        };
        let message_id = &delivery.message.message_id;
        self.pipeline
            .committed(&self.command, &body, message_id, self.delivery_timeout)
            .await
            == Some(true)
    }

    /// `delivery`, unless its channel closed since it arrived and the broker delivers the original
    /// again: then publishing a `what` of it too would handle it twice, so it is let go
    /// unsettled. The queue's last delivery is kept all the same: the queue drops it instead of
    /// delivering it again, so the copy or dead letter is all that remains of it.
    pub(super) fn unless_stale(&self, delivery: Delivery, what: &str) -> Option<Delivery> {
        if !delivery.is_stale() || delivery.is_last_delivery() {
            return Some(delivery);
        }
        let name = self.command.registration.command_name;
        tracing::warn!(command = name, message_id = %delivery.message.message_id, "chatter consumer: the delivery's channel closed before its {what} was published; the broker delivers the original again instead");
        delivery.discard();
        None
    }

    /// Publishes a retry copy or a dead letter, bounded by the publish timeout whatever the
    /// [`Broker`] implementation does, so a broker that never answers cannot hold the
    /// delivery's lane and permit.
    pub(super) async fn publish(&self, message: BrokeredMessage) -> Result<(), BrokerError> {
        let operation = format!(
            "publish `{}` to `{}`",
            message.message_id, message.destination
        );
        let publishing = self.broker.publish(message);
        broker::bounded(|| operation, self.publish_timeout, publishing).await
    }

    /// Acks `delivery`; a failed ack is logged (`what` names the step): the broker delivers it
    /// again, and the inbox marker makes that a duplicate.
    pub(super) async fn ack(&self, delivery: Delivery, what: &str) {
        let message_id = delivery.message.message_id.clone();
        if let Err(error) = delivery.ack().await {
            self.settlement_failed(&message_id, what, &error);
        }
    }

    /// Nacks `delivery`; a failed nack is logged: the broker delivers it again all the same once
    /// its channel is gone.
    pub(super) async fn nack(&self, delivery: Delivery) {
        let message_id = delivery.message.message_id.clone();
        if let Err(error) = delivery.nack().await {
            self.settlement_failed(&message_id, "nack", &error);
        }
    }

    pub(super) fn settlement_failed(&self, message_id: &str, what: &str, error: &BrokerError) {
        let name = self.command.registration.command_name;
        tracing::error!(command = name, message_id, error = %ErrorChain(error), "chatter consumer: {what} failed; the broker will deliver the message again");
    }
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
        Outcome::InboxCompleted { taken_over } => tracing::info!(
            command = name,
            message_id,
            taken_over,
            "chatter delivery handled through the standalone inbox"
        ),
        Outcome::HandledAtLeastOnce => tracing::info!(
            command = name,
            message_id,
            "chatter delivery handled without a batch (at least once: its partition key did not resolve)"
        ),
    }
}
