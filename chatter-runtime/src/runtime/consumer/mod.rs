//! One consumer per registered command: broker deliveries through the pipeline, acked on
//! success; a failure that can succeed later is delivered again (counted), one that never can is
//! dead-lettered.
//!
//! - **Concurrency.** A consumer handles up to its
//!   [consumer concurrency](super::RuntimeBuilder::consumer_concurrency) deliveries at once
//!   (default [`DEFAULT_CONSUMER_CONCURRENCY`]) and subscribes asking the broker for a prefetch
//!   of as many: it takes the next delivery from the subscription only while fewer than that
//!   are held, in progress or waiting for their key.
//! - **Order per partition-key value.** Deliveries whose command bodies have the same
//!   partition-key value are handled one after another, in the order they arrived; deliveries
//!   of different values run concurrently. A body whose key does not resolve (or that is not
//!   JSON) runs on its own, ordered with nothing. A failed delivery is retried by publishing
//!   its next attempt to the back of the destination, so a failure can reorder a key's
//!   deliveries: the retry runs after those that arrived behind it.
//! - **Attempts survive restarts.** A failed delivery is not nacked: a copy carrying the next
//!   attempt number in its context (`Chatter.Delivery.Attempts`) is published to the same
//!   destination, then the original is acked. The count travels with the message, so neither a
//!   consumer restart nor a broker restart resets it. A broker that counts deliveries itself
//!   ([`Delivery::delivery_count`], NATS JetStream, whose deduplication would drop such a copy)
//!   is asked instead to deliver the original again after the redelivery delay, and its count is
//!   the attempt number.
//! - **Dead letters.** A delivery whose body is not the command's JSON or that has no message id
//!   is dead-lettered at once; one that failed `max_delivery_attempts` times is dead-lettered
//!   then. The broker's last delivery of a message it drops unless settled
//!   ([`Delivery::is_last_delivery`]: a RabbitMQ quorum queue at its delivery limit) is
//!   dead-lettered without running it, unless it had committed; if its dead letter cannot be
//!   published, a copy goes to the back of its destination instead (counted afresh there), as
//!   returning it would have the queue drop it. A dead letter keeps its id, body and context,
//!   adds `Chatter.DeadLetter.Reason` and `Chatter.Delivery.Attempts`, and goes to
//!   `<destination>.dead-letter` on the same broker, logged at Error; the original is then
//!   acked (`term`ed on JetStream).
//! - **Channel losses.** A retry copy or a dead letter is published only if its delivery's
//!   channel is still open then (after the redelivery delay), and a delivery waiting in a key
//!   lane whose channel closed is let go: a channel closed meanwhile has the broker deliver the
//!   original again. The broker's last delivery is the exception, as the queue drops it
//!   instead: it is dead-lettered (unless it committed) all the same.
//! - **Subscriptions.** A subscription the broker ends is made again with backoff, logged at
//!   Error when it ends and at Info when it is back; the consumer never ends on its own.
//! - **Bounded wait behind a key.** A delivery that has waited
//!   [`lane_wait_limit`](super::RuntimeBuilder::lane_wait_limit) (default
//!   [`DEFAULT_LANE_WAIT_LIMIT`], 25 minutes) behind its key's delivery in progress is published
//!   again as an uncounted copy at the back of its queue and acked (logged at warn; a quorum
//!   queue would count a nack; JetStream, which has no such timeout, lets it wait): held past the broker's
//!   consumer timeout (RabbitMQ's 30 minutes by default) the channel would close and every
//!   delivery on it be requeued. Its key's order is then no longer kept for it: the deliveries
//!   queued behind it may run first. A stale one is let go, and the queue's last delivery is
//!   handled at once instead (dead-lettered unless it committed), as a return would drop it.
//! - **Shutdown.** Deliveries in progress finish and are settled; deliveries waiting behind
//!   their key are returned to the broker unsettled, which delivers them again. The queue's
//!   last delivery among them is handled instead (dead-lettered unless it committed), as a
//!   return would have the queue drop it. The subscription is cancelled first, so settling
//!   them frees no prefetch the broker fills; what its client had buffered is treated the same
//!   way (a RabbitMQ quorum queue's last delivery among it handled, the rest returned).

mod lanes;
mod retry;
mod settle;

use std::sync::Arc;
use std::time::Duration;

use opentelemetry::context::FutureExt as _;
use serde_json::Value;
use tokio_util::sync::CancellationToken;

use super::health::ConsumerStatus;
use crate::backoff;
use crate::broker::{self, Broker, BrokerError, Delivery, Subscription};
use crate::error_chain::ErrorChain;
use crate::pipeline::{Outcome, Pipeline, PipelineError};
use crate::registry::RegisteredCommand;
use crate::telemetry::trace_context::{self, SharedTracer};
use lanes::Executor;
use retry::attempt_of;

/// Deliveries of one message, the first included, before it is dead-lettered, for a command
/// that does not set `#[chatter(max_delivery_attempts = N)]`.
pub const DEFAULT_MAX_DELIVERY_ATTEMPTS: u32 = 5;

/// Deliveries each command's consumer handles at once, and the prefetch it asks the broker
/// for, unless [`RuntimeBuilder::consumer_concurrency`](super::RuntimeBuilder::consumer_concurrency)
/// sets another.
pub const DEFAULT_CONSUMER_CONCURRENCY: usize = 16;

/// How long one delivery attempt may take unless
/// [`RuntimeBuilder::delivery_timeout`](crate::RuntimeBuilder::delivery_timeout) says
/// otherwise: 5 minutes, as long as the relay gives a page.
pub const DEFAULT_DELIVERY_TIMEOUT: Duration = Duration::from_secs(5 * 60);

/// How long a delivery may wait behind its partition-key value's delivery in progress before it
/// is returned to the broker, unless
/// [`RuntimeBuilder::lane_wait_limit`](crate::RuntimeBuilder::lane_wait_limit) says otherwise:
/// 25 minutes, below RabbitMQ's default consumer timeout of 30 minutes.
pub const DEFAULT_LANE_WAIT_LIMIT: Duration = Duration::from_secs(25 * 60);

/// What a consumer task needs.
pub(super) struct Consumer {
    pub(super) command: RegisteredCommand,
    pub(super) broker: Arc<dyn Broker>,
    pub(super) pipeline: Pipeline,
    pub(super) cancel: CancellationToken,
    pub(super) redelivery_delay: Duration,
    /// How long one attempt (decode, handler, batch, duplicate confirmation) may take.
    pub(super) delivery_timeout: Duration,
    /// How long publishing a retry copy or a dead letter may take.
    pub(super) publish_timeout: Duration,
    /// How long a delivery may wait behind its key before it is returned to the broker.
    pub(super) lane_wait_limit: Duration,
    pub(super) status: ConsumerStatus,
    /// Deliveries handled at once, and the prefetch asked of the broker (at least 1).
    pub(super) concurrency: u16,
    /// Each delivery is handled under a `process` span on it; none when tracing is off.
    pub(super) tracer: SharedTracer,
}

impl Consumer {
    pub(super) async fn run(self, mut subscription: Subscription) {
        let consumer = Arc::new(self);
        let name = consumer.command.registration.command_name;
        let destination = consumer.command.registration.destination;
        let executor = Executor::new(consumer.concurrency);
        tracing::info!(
            command = name,
            destination,
            concurrency = consumer.concurrency,
            "chatter consumer started"
        );
        loop {
            consumer.status.subscribed(subscription.liveness().clone());
            if !consumer.consume(&executor, &mut subscription).await {
                consumer
                    .release_prefetched(&executor, &mut subscription)
                    .await;
                break;
            }
            tracing::error!(
                command = name,
                destination,
                "chatter consumer: the broker ended the subscription; subscribing again with backoff"
            );
            consumer.status.reconnecting(None);
            match consumer.resubscribe().await {
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
        // The deliveries in progress finish (and are settled) before the consumer has stopped.
        executor.workers.close();
        executor.workers.wait().await;
        consumer.status.stopped();
        tracing::info!(command = name, "chatter consumer stopped");
    }

    /// Hands deliveries to the executor until the subscription ends (`true`) or shutdown
    /// (`false`).
    async fn consume(
        self: &Arc<Self>,
        executor: &Executor,
        subscription: &mut Subscription,
    ) -> bool {
        let name = self.command.registration.command_name;
        loop {
            // A permit first, then the delivery: at most `concurrency` deliveries are held at
            // once, in progress or waiting for their key, as many as the prefetch.
            let permit = tokio::select! {
                biased;
                _ = self.cancel.cancelled() => return false,
                permit = Arc::clone(&executor.permits).acquire_owned() => permit,
            };
            // The semaphore is never closed.
            let Ok(permit) = permit else { return false };
            let next = tokio::select! {
                biased;
                _ = self.cancel.cancelled() => return false,
                next = subscription.next() => next,
            };
            match next {
                None => return true,
                Some(Err(error)) => {
                    tracing::error!(command = name, error = %ErrorChain(&error), "chatter consumer: the broker reported a failed delivery");
                }
                Some(Ok(delivery)) => self.dispatch(executor, delivery, permit),
            }
        }
    }

    /// At shutdown, before the deliveries in progress are settled (each settlement would free a
    /// prefetch slot the broker fills): stops the broker from delivering more and treats what
    /// its client had buffered as a delivery waiting in a lane: the queue's last delivery is
    /// handled (dead-lettered unless it committed), as returned the queue would drop it; the
    /// others are returned unsettled and delivered again.
    async fn release_prefetched(
        self: &Arc<Self>,
        executor: &Executor,
        subscription: &mut Subscription,
    ) {
        let name = self.command.registration.command_name;
        let destination = self.command.registration.destination;
        let cancelling = async { Ok::<_, BrokerError>(subscription.cancel().await) };
        let operation = || format!("cancel the subscription to `{destination}`");
        let left = match broker::bounded(operation, self.publish_timeout, cancelling).await {
            Ok(left) => left,
            Err(error) => {
                tracing::error!(command = name, error = %ErrorChain(&error), "chatter consumer: the broker did not end the subscription at shutdown; deliveries its client still holds go back to the broker (a quorum queue drops its last delivery then)");
                return;
            }
        };
        for item in left {
            match item {
                Err(error) => {
                    tracing::error!(command = name, error = %ErrorChain(&error), "chatter consumer: the broker reported a failed delivery");
                }
                Ok(delivery) if delivery.is_last_delivery() => {
                    let body = serde_json::from_str::<Value>(&delivery.message.body);
                    let consumer = Arc::clone(self);
                    executor
                        .workers
                        .spawn(async move { consumer.handle(delivery, body).await });
                }
                // Dropped unsettled: returned, the broker delivers it again.
                Ok(delivery) => drop(delivery),
            }
        }
    }

    /// Subscribes again with backoff until it works (`None` on shutdown).
    async fn resubscribe(&self) -> Option<Subscription> {
        let destination = self.command.registration.destination;
        let mut backoff = backoff::reconnect();
        loop {
            let subscribing = self
                .broker
                .subscribe_with_prefetch(destination, self.concurrency);
            let operation = || format!("subscribe to `{destination}`");
            match broker::bounded(operation, self.publish_timeout, subscribing).await {
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

    /// Handles one delivery whose body parsed as `body`: runs its attempt, then acks it,
    /// retries it with its attempt count, or dead-letters it.
    async fn handle(&self, delivery: Delivery, body: Result<Value, serde_json::Error>) {
        // Prefetched before a channel loss and waiting in a key lane since: the server already
        // requeued it and delivers it again, so this copy is neither handled nor retried. The
        // queue's last delivery is the exception: that requeue passed its delivery limit and
        // the queue dropped it (RabbitMQ 3.10, seen in the tests), so this copy is all that
        // remains and is handled below.
        if delivery.is_stale() && !delivery.is_last_delivery() {
            tracing::debug!(command = self.command.registration.command_name, message_id = %delivery.message.message_id, "chatter consumer: dropped a delivery whose channel closed; the broker delivers it again");
            delivery.discard();
            return;
        }
        let attempt = attempt_of(&delivery);
        if delivery.is_last_delivery() {
            self.last_delivery(delivery, attempt).await;
            return;
        }
        let result = self.attempt(&delivery, attempt, body).await;
        self.settle(delivery, attempt, result).await;
    }

    /// Runs one attempt of `delivery` through the pipeline, under its `process` span, bounded by
    /// the delivery timeout.
    async fn attempt(
        &self,
        delivery: &Delivery,
        attempt: u32,
        body: Result<Value, serde_json::Error>,
    ) -> Result<Outcome, PipelineError> {
        let name = self.command.registration.command_name;
        let message_id = delivery.message.message_id.as_str();
        let redelivered = delivery.redelivered || attempt > 1;
        // The handler runs in the delivery's trace: `ctx.send` persists it with the outbox.
        let trace =
            trace_context::process_context(&self.tracer, &delivery.message, self.broker.as_ref());
        let result = match body {
            // Boxed: the pipeline's future (the SDK's batch call inside) is large, and this
            // future is the task spawned per delivery, which spawning copies whole.
            Ok(body) => {
                let handling = Box::pin(
                    self.pipeline
                        .handle(&self.command, body, message_id, redelivered)
                        .with_context(trace.clone()),
                );
                // A hung handler or store call fails the attempt instead of holding its key's
                // lane (and a permit) forever. A batch that committed meanwhile is confirmed a
                // duplicate on the retry.
                match tokio::time::timeout(self.delivery_timeout, handling).await {
                    Ok(result) => result,
                    Err(_) => Err(PipelineError::TimedOut {
                        command: name,
                        message_id: message_id.to_owned(),
                        after: self.delivery_timeout,
                    }),
                }
            }
            Err(source) => Err(PipelineError::NotJson {
                command: name,
                message_id: message_id.to_owned(),
                source,
            }),
        };
        if self.tracer.is_some() {
            let failure = result
                .as_ref()
                .err()
                .map(|error| (error.type_name(), ErrorChain(error).to_string()));
            trace_context::end(&trace, failure);
        }
        result
    }
}
