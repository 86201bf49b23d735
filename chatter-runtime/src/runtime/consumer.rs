//! One consumer per registered command: broker deliveries through the pipeline, acked on success,
//! nacked (redelivered) on failure.

use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::broker::{Delivery, Subscription};
use crate::pipeline::{Outcome, Pipeline};
use crate::registry::RegisteredCommand;

pub(super) async fn run(
    command: RegisteredCommand,
    mut subscription: Subscription,
    pipeline: Pipeline,
    cancel: CancellationToken,
    redelivery_delay: Duration,
) {
    let name = command.registration.command_name;
    tracing::info!(
        command = name,
        destination = subscription.destination(),
        "chatter consumer started"
    );
    loop {
        let next = tokio::select! {
            _ = cancel.cancelled() => break,
            next = subscription.next() => next,
        };
        match next {
            None => {
                tracing::error!(
                    command = name,
                    destination = subscription.destination(),
                    "chatter consumer: the broker ended the subscription"
                );
                break;
            }
            Some(Err(error)) => {
                tracing::error!(command = name, %error, "chatter consumer: the broker reported a failed delivery");
            }
            // A delivery in progress finishes even when shutdown is requested: settling it is what
            // keeps it from being lost or handled twice.
            Some(Ok(delivery)) => handle(&command, delivery, &pipeline, redelivery_delay).await,
        }
    }
    tracing::info!(command = name, "chatter consumer stopped");
}

async fn handle(
    command: &RegisteredCommand,
    delivery: Delivery,
    pipeline: &Pipeline,
    redelivery_delay: Duration,
) {
    let name = command.registration.command_name;
    let message_id = delivery.message.message_id.clone();
    let result = match serde_json::from_str(&delivery.message.body) {
        Ok(body) => pipeline
            .handle(command, body, &message_id, delivery.redelivered)
            .await
            .map_err(|e| e.to_string()),
        Err(e) => Err(format!(
            "the body of `{name}` message '{message_id}' is not JSON: {e}"
        )),
    };
    match result {
        Ok(outcome) => {
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
                Outcome::PassedThrough => tracing::info!(
                    command = name,
                    message_id,
                    "chatter delivery handled without a batch"
                ),
            }
            if let Err(error) = delivery.ack().await {
                tracing::error!(command = name, message_id, %error, "chatter consumer: ack failed; the broker will redeliver");
            }
        }
        Err(error) => {
            tracing::error!(command = name, message_id, %error, "chatter delivery failed; returning it to the broker");
            tokio::time::sleep(redelivery_delay).await;
            if let Err(error) = delivery.nack().await {
                tracing::error!(command = name, message_id, %error, "chatter consumer: nack failed");
            }
        }
    }
}
