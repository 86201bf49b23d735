//! A failed attempt's way back: a retry copy carrying the next attempt number (or, on a broker
//! that counts deliveries, a delayed redelivery), a copy that waits out another attempt's
//! claim, and the dead letter once attempts run out or can never succeed.

use std::time::Duration;

use serde_json::Value;

use super::{Consumer, DEFAULT_MAX_DELIVERY_ATTEMPTS};
use crate::broker::{Delivery, dead_letter_destination};
use crate::error_chain::ErrorChain;
use crate::message::{ATTEMPTS_CONTEXT_KEY, DEAD_LETTER_REASON_CONTEXT_KEY};

impl Consumer {
    /// Publishes the next attempt, then acks this one; if that publish fails, nacks instead
    /// (the broker redelivers; the attempt is counted only where the broker counts deliveries,
    /// as a quorum queue does). A broker that counts deliveries itself (JetStream) is asked to
    /// deliver this one again after the redelivery delay.
    pub(super) async fn retry(&self, delivery: Delivery, attempt: u32) {
        if delivery.delivery_count().is_some() {
            let message_id = delivery.message.message_id.clone();
            if let Err(error) = delivery.nack_after(self.redelivery_delay).await {
                self.settlement_failed(&message_id, "delayed nack", &error);
            }
            return;
        }
        tokio::select! {
            _ = self.cancel.cancelled() => {}
            () = tokio::time::sleep(self.redelivery_delay) => {}
        }
        let Some(delivery) = self.unless_stale(delivery, "retry copy") else {
            return;
        };
        self.requeue(
            delivery,
            attempt + 1,
            "chatter consumer: could not requeue the next attempt; returning the delivery to the broker",
        )
        .await;
    }

    /// Delivers `delivery` again, its attempt not counted, after another attempt's claim of its
    /// message id was found live for at most `for_at_most`. On RabbitMQ a copy goes to the back
    /// of the queue after a tenth of that (between the redelivery delay, at least a second, and
    /// 10 s), so a claim that completes or is released soon is seen soon, and one that must run
    /// out (its attempt crashed) costs a few dozen looks, not hundreds. A broker that counts
    /// deliveries itself (JetStream) counts each look as an attempt, so it is asked once, when
    /// the claim ends unless its running handler renews it (a claim period, a second and the
    /// clock margin): a copy waiting behind a handler that runs for minutes spends an attempt
    /// each time.
    pub(super) async fn retry_after_claim(
        &self,
        delivery: Delivery,
        attempt: u32,
        for_at_most: Duration,
    ) {
        if delivery.delivery_count().is_some() {
            let message_id = delivery.message.message_id.clone();
            // A claim whose end time cannot hold (a huge delivery timeout) is asked again in an
            // hour rather than at a delay the server cannot take.
            let delay = for_at_most.min(Duration::from_secs(3600));
            if let Err(error) = delivery.nack_after(delay).await {
                self.settlement_failed(&message_id, "delayed nack", &error);
            }
            return;
        }
        let shortest = self.redelivery_delay.max(Duration::from_secs(1));
        let delay = (for_at_most / 10)
            .clamp(
                shortest.min(Duration::from_secs(10)),
                Duration::from_secs(10),
            )
            .min(for_at_most)
            .max(Duration::from_millis(100));
        tokio::select! {
            _ = self.cancel.cancelled() => {}
            () = tokio::time::sleep(delay) => {}
        }
        let Some(delivery) = self.unless_stale(delivery, "copy") else {
            return;
        };
        self.requeue(
            delivery,
            attempt,
            "chatter consumer: could not requeue a delivery that waits for another attempt; returning it to the broker",
        )
        .await;
    }

    /// Publishes a copy of `delivery` carrying `attempts` to the back of its destination, then
    /// acks it; if that publish fails, logs `failed` at Error and nacks it. If the ack is lost,
    /// the original comes back too: one extra delivery, nothing lost.
    pub(super) async fn requeue(&self, delivery: Delivery, attempts: u32, failed: &str) {
        let name = self.command.registration.command_name;
        let message_id = delivery.message.message_id.clone();
        let mut copy = delivery.message.clone();
        copy.context
            .insert(ATTEMPTS_CONTEXT_KEY.to_owned(), Value::from(attempts));
        match self.publish(copy).await {
            Ok(()) => self.ack(delivery, "ack after requeue").await,
            Err(error) => {
                tracing::error!(command = name, message_id, error = %ErrorChain(&error), "{failed}");
                self.nack(delivery).await;
            }
        }
    }

    /// Publishes `delivery` to the dead-letter destination with `reason`, then acks it (terms
    /// it, on a broker that tells the two apart); if that publish fails, nacks it, so nothing
    /// is dropped. Logged at Error, or at Warn for a `Rejection` (`rejected`): the handler's
    /// own verdict on a command, an outcome the application chose, not a fault.
    pub(super) async fn dead_letter(
        &self,
        delivery: Delivery,
        attempt: u32,
        reason: &str,
        rejected: bool,
    ) {
        let Some(delivery) = self.unless_stale(delivery, "dead letter") else {
            return;
        };
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
        match self.publish(letter).await {
            Ok(()) => {
                if rejected {
                    tracing::warn!(
                        command = name,
                        message_id,
                        attempts = attempt,
                        dead_letters,
                        reason,
                        "chatter dead-lettered a command its handler rejected"
                    );
                } else {
                    tracing::error!(
                        command = name,
                        message_id,
                        attempts = attempt,
                        dead_letters,
                        reason,
                        "chatter dead-lettered a delivery"
                    );
                }
                let message_id = delivery.message.message_id.clone();
                if let Err(error) = delivery.term().await {
                    self.settlement_failed(&message_id, "ack after dead-lettering", &error);
                }
            }
            // Returned, the broker's last delivery would be dropped.
            Err(error) if delivery.is_last_delivery() => {
                tracing::error!(command = name, message_id, error = %ErrorChain(&error), reason, "chatter consumer: could not dead-letter the broker's last delivery of a message; publishing it to its queue again instead");
                self.requeue_last(delivery, attempt).await;
            }
            Err(error) => {
                tracing::error!(command = name, message_id, error = %ErrorChain(&error), reason, "chatter consumer: could not dead-letter the delivery; returning it to the broker");
                tokio::time::sleep(self.redelivery_delay).await;
                self.nack(delivery).await;
            }
        }
    }

    /// Publishes the broker's last delivery of a message, which could not be dead-lettered, to
    /// its destination again with its attempts, then acks it: a new copy the queue counts
    /// afresh, where returning this one would have the queue drop it. Its next failure is
    /// dead-lettered then. Nacked only when that publish fails too (the broker is unreachable,
    /// and the queue drops the message).
    async fn requeue_last(&self, delivery: Delivery, attempt: u32) {
        self.requeue(
            delivery,
            attempt,
            "chatter consumer: could not publish the broker's last delivery of a message again either; returning it, and the queue drops it",
        )
        .await;
    }

    /// The broker's last delivery of a message (its queue drops it unless this one settles
    /// it): the broker delivered it again each time it was not settled (its consumer crashed or
    /// stopped during it, or returned it), so it is dead-lettered without running it again,
    /// where no crash can lose it; one that committed meanwhile (only its ack was lost) is acked
    /// as handled.
    pub(super) async fn last_delivery(&self, delivery: Delivery, attempt: u32) {
        let name = self.command.registration.command_name;
        let message_id = delivery.message.message_id.clone();
        if self.committed(&delivery).await {
            tracing::info!(
                command = name,
                message_id,
                attempt,
                "chatter: the broker's last delivery of a message that had committed; acknowledged as handled"
            );
            self.ack(delivery, "ack").await;
            return;
        }
        let reason = format!(
            "the broker delivered it {} times without its being settled (its consumer crashed \
             or stopped during it, or returned it) and drops it unless this delivery settles it",
            delivery.previous_deliveries().saturating_add(1)
        );
        self.dead_letter(delivery, attempt, &reason, false).await;
    }

    /// The attempts after which a failing delivery is dead-lettered.
    pub(super) fn max_attempts(&self) -> u32 {
        self.command
            .registration
            .max_delivery_attempts
            .unwrap_or(DEFAULT_MAX_DELIVERY_ATTEMPTS)
    }
}

/// This delivery's attempt number: 1 for a first delivery. The count its context carries (a
/// retry copy's), plus the broker's own count of this copy's earlier deliveries where the
/// broker keeps one (JetStream redelivers instead of taking copies; a RabbitMQ quorum queue
/// counts the deliveries its consumers never settled).
pub(super) fn attempt_of(delivery: &Delivery) -> u32 {
    let carried = delivery
        .message
        .context
        .get(ATTEMPTS_CONTEXT_KEY)
        .and_then(Value::as_u64)
        .and_then(|n| u32::try_from(n).ok())
        .filter(|n| *n >= 1)
        .unwrap_or(1);
    carried.saturating_add(delivery.previous_deliveries())
}
