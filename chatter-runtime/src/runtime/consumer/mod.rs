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

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use opentelemetry::context::FutureExt as _;
use serde_json::Value;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::health::ConsumerStatus;
use crate::backoff;
use crate::broker::{self, Broker, BrokerError, Delivery, Subscription, dead_letter_destination};
use crate::error_chain::ErrorChain;
use crate::message::BrokeredMessage;
use crate::partition_key;
use crate::pipeline::{Outcome, Pipeline, PipelineError};
use crate::registry::RegisteredCommand;
use crate::telemetry::trace_context::{self, SharedTracer};

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

use crate::message::{ATTEMPTS_CONTEXT_KEY, DEAD_LETTER_REASON_CONTEXT_KEY};

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

/// A delivery taken from the subscription, with its body parsed once, holding one of the
/// consumer's permits until it is settled or dropped.
struct Pending {
    /// Tells it apart in its lane, to return it once it waited too long.
    id: u64,
    /// Ends the lane-wait timer of this delivery once it leaves its lane (dropped with it), so
    /// no timer outlives the wait it bounds.
    _waiting: Option<tokio_util::sync::DropGuard>,
    delivery: Delivery,
    body: Result<Value, serde_json::Error>,
    permit: OwnedSemaphorePermit,
}

/// Deliveries waiting behind the one in progress, per partition-key value
/// ([`partition_key::ordering_key`]). A value is present exactly while one worker drains it.
type Lanes = Arc<Mutex<HashMap<String, VecDeque<Pending>>>>;

/// The keyed executor of one consumer: the permits, the lanes and the tasks handling them.
struct Executor {
    permits: Arc<Semaphore>,
    lanes: Lanes,
    workers: TaskTracker,
    /// The next [`Pending::id`].
    next_id: AtomicU64,
}

impl Consumer {
    pub(super) async fn run(self, mut subscription: Subscription) {
        let consumer = Arc::new(self);
        let name = consumer.command.registration.command_name;
        let destination = consumer.command.registration.destination;
        let executor = Executor {
            permits: Arc::new(Semaphore::new(usize::from(consumer.concurrency))),
            lanes: Lanes::default(),
            workers: TaskTracker::new(),
            next_id: AtomicU64::new(0),
        };
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

    /// Starts `delivery` now, or queues it behind the delivery of its partition-key value in
    /// progress.
    fn dispatch(
        self: &Arc<Self>,
        executor: &Executor,
        delivery: Delivery,
        permit: OwnedSemaphorePermit,
    ) {
        let body = serde_json::from_str::<Value>(&delivery.message.body);
        let registration = self.command.registration;
        // A standalone-inbox command has no partition key: its deliveries are ordered by
        // message id (duplicates of one id one after another), all else concurrently.
        let key = if registration.standalone_inbox.is_some() {
            Some(format!("inbox:{}", delivery.message.message_id))
        } else {
            body.as_ref()
                .ok()
                .and_then(|body| registration.resolve_partition_key(body))
                .map(|values| partition_key::ordering_key(&values))
        };
        let id = executor.next_id.fetch_add(1, Ordering::Relaxed);
        let waiting = self.cancel.child_token();
        let mut pending = Pending {
            id,
            _waiting: None,
            delivery,
            body,
            permit,
        };
        let Some(key) = key else {
            // No key to order by: it runs on its own.
            let consumer = Arc::clone(self);
            executor.workers.spawn(async move {
                let Pending {
                    delivery,
                    body,
                    permit,
                    ..
                } = pending;
                consumer.handle(delivery, body).await;
                drop(permit);
            });
            return;
        };
        {
            let mut lanes = executor
                .lanes
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            if let Some(queue) = lanes.get_mut(&key) {
                pending._waiting = Some(waiting.clone().drop_guard());
                queue.push_back(pending);
                drop(lanes);
                let returning = Arc::clone(self).return_if_still_waiting(
                    Arc::clone(&executor.lanes),
                    key,
                    id,
                    waiting,
                );
                executor.workers.spawn(returning);
                return;
            }
            lanes.insert(key.clone(), VecDeque::new());
        }
        let lane = Lane {
            lanes: Arc::clone(&executor.lanes),
            key,
            drained: false,
        };
        executor
            .workers
            .spawn(Arc::clone(self).drain(lane, pending));
    }

    /// Handles `first`, then every delivery queued behind it on `lane`, one at a time, until the
    /// lane is empty or shutdown is requested.
    async fn drain(self: Arc<Self>, mut lane: Lane, first: Pending) {
        let mut next = first;
        loop {
            let Pending {
                delivery,
                body,
                permit,
                ..
            } = next;
            // A delivery in progress finishes even when shutdown is requested: settling it is
            // what keeps it from being lost or handled twice.
            self.handle(delivery, body).await;
            drop(permit);
            // Deliveries still waiting are not started once shutdown is requested: returning
            // them has the broker deliver them again, so nothing is lost and shutdown waits for
            // one delivery per key, not for a whole queue.
            if self.cancel.is_cancelled() {
                self.return_waiting(lane).await;
                return;
            }
            match lane.pop() {
                Some(pending) => next = pending,
                None => return,
            }
        }
    }

    /// Returns the deliveries still waiting on `lane` at shutdown, except the queue's last
    /// deliveries: returned, the queue would drop them, so they are handled (dead-lettered
    /// unless they committed) first.
    async fn return_waiting(&self, lane: Lane) {
        for Pending {
            delivery,
            body,
            permit,
            ..
        } in lane.take_waiting()
        {
            if delivery.is_last_delivery() {
                self.handle(delivery, body).await;
            } else {
                // Dropped unsettled: nacked, the broker delivers it again.
                drop(delivery);
            }
            drop(permit);
        }
    }

    /// Once the lane wait limit has passed, takes the delivery `id` out of `key`'s lane if it
    /// still waits there and returns it to the broker, before the broker's consumer timeout
    /// closes the channel and requeues everything on it. Ends early once the delivery left its
    /// lane (`waiting` is cancelled then) and on shutdown (which returns the waiting deliveries
    /// itself).
    async fn return_if_still_waiting(
        self: Arc<Self>,
        lanes: Lanes,
        key: String,
        id: u64,
        waiting: CancellationToken,
    ) {
        tokio::select! {
            _ = waiting.cancelled() => return,
            () = tokio::time::sleep(self.lane_wait_limit) => {}
        }
        // A broker that counts deliveries itself (JetStream) keeps a delivery in progress
        // without a timeout of this kind, and a return would cost it an attempt.
        let waited = {
            let mut lanes = lanes.lock().unwrap_or_else(PoisonError::into_inner);
            lanes.get_mut(&key).and_then(|queue| {
                let position = queue.iter().position(|pending| pending.id == id)?;
                let pending = &queue[position];
                if pending.delivery.delivery_count().is_some() {
                    return None;
                }
                // A standalone-inbox lane holds one message id: the delivery ahead is the same
                // message, so its last delivery waits for it (bounded by the delivery
                // timeout) rather than be dead-lettered while it may commit.
                if key.starts_with("inbox:") && pending.delivery.is_last_delivery() {
                    return None;
                }
                queue.remove(position)
            })
        };
        // Handled (or being handled) already.
        let Some(Pending {
            delivery,
            body,
            permit,
            ..
        }) = waited
        else {
            return;
        };
        if delivery.is_stale() || delivery.is_last_delivery() {
            // A stale one is let go (the broker has it back already); the queue's last one is
            // handled now, out of its key's order, as a return would have the queue drop it.
            self.handle(delivery, body).await;
        } else {
            let name = self.command.registration.command_name;
            tracing::warn!(command = name, message_id = %delivery.message.message_id, waited = ?self.lane_wait_limit, "chatter consumer: a delivery waited behind its partition-key value's delivery in progress for the lane wait limit; delivered again as a copy at the back of its queue, its attempt not counted (its key's order is not kept for it)");
            // A copy with the same attempt count, not a nack: a quorum queue would count a
            // nack as a delivery, and a message behind a busy key would use up its limit.
            let attempt = attempt_of(&delivery);
            self.requeue(
                delivery,
                attempt,
                "chatter consumer: could not requeue a delivery that waited behind its key; returning it to the broker",
            )
            .await;
        }
        drop(permit);
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

    /// The attempts after which a failing delivery is dead-lettered.
    fn max_attempts(&self) -> u32 {
        self.command
            .registration
            .max_delivery_attempts
            .unwrap_or(DEFAULT_MAX_DELIVERY_ATTEMPTS)
    }

    /// The broker's last delivery of a message (its queue drops it unless this one settles
    /// it): the broker delivered it again each time it was not settled (its consumer crashed or
    /// stopped during it, or returned it), so it is dead-lettered without running it again,
    /// where no crash can lose it; one that committed meanwhile (only its ack was lost) is acked
    /// as handled.
    async fn last_delivery(&self, delivery: Delivery, attempt: u32) {
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
        self.dead_letter(delivery, attempt, &reason).await;
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

    /// Settles `delivery` after its attempt number `attempt` ended with `result`.
    async fn settle(
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
                self.dead_letter(delivery, attempt, &reason).await;
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
                    self.dead_letter(delivery, attempt, &reason).await;
                } else {
                    tracing::error!(command = name, message_id, attempt, max_attempts = max, error = %ErrorChain(&error), "chatter delivery failed; it is delivered again");
                    self.retry(delivery, attempt).await;
                }
            }
        }
    }

    /// Whether an attempt of `delivery` committed (its inbox marker exists); `false` when that
    /// cannot be told.
    async fn committed(&self, delivery: &Delivery) -> bool {
        let Ok(body) = serde_json::from_str::<Value>(&delivery.message.body) else {
            return false;
        };
        let message_id = &delivery.message.message_id;
        self.pipeline
            .committed(&self.command, &body, message_id, self.delivery_timeout)
            .await
            == Some(true)
    }

    /// Publishes the next attempt, then acks this one; if that publish fails, nacks instead
    /// (the broker redelivers; the attempt is counted only where the broker counts deliveries,
    /// as a quorum queue does). A broker that counts deliveries itself (JetStream) is asked to
    /// deliver this one again after the redelivery delay.
    async fn retry(&self, delivery: Delivery, attempt: u32) {
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
    async fn retry_after_claim(&self, delivery: Delivery, attempt: u32, for_at_most: Duration) {
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
    async fn requeue(&self, delivery: Delivery, attempts: u32, failed: &str) {
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
    /// is dropped.
    async fn dead_letter(&self, delivery: Delivery, attempt: u32, reason: &str) {
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
                tracing::error!(
                    command = name,
                    message_id,
                    attempts = attempt,
                    dead_letters,
                    reason,
                    "chatter dead-lettered a delivery"
                );
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

    /// `delivery`, unless its channel closed since it arrived and the broker delivers the original
    /// again: then publishing a `what` of it too would handle it twice, so it is let go
    /// unsettled. The queue's last delivery is kept all the same: the queue drops it instead of
    /// delivering it again, so the copy or dead letter is all that remains of it.
    fn unless_stale(&self, delivery: Delivery, what: &str) -> Option<Delivery> {
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
    async fn publish(&self, message: BrokeredMessage) -> Result<(), BrokerError> {
        let operation = format!(
            "publish `{}` to `{}`",
            message.message_id, message.destination
        );
        let publishing = self.broker.publish(message);
        broker::bounded(|| operation, self.publish_timeout, publishing).await
    }

    /// Acks `delivery`; a failed ack is logged (`what` names the step): the broker delivers it
    /// again, and the inbox marker makes that a duplicate.
    async fn ack(&self, delivery: Delivery, what: &str) {
        let message_id = delivery.message.message_id.clone();
        if let Err(error) = delivery.ack().await {
            self.settlement_failed(&message_id, what, &error);
        }
    }

    /// Nacks `delivery`; a failed nack is logged: the broker delivers it again all the same once
    /// its channel is gone.
    async fn nack(&self, delivery: Delivery) {
        let message_id = delivery.message.message_id.clone();
        if let Err(error) = delivery.nack().await {
            self.settlement_failed(&message_id, "nack", &error);
        }
    }

    fn settlement_failed(&self, message_id: &str, what: &str, error: &BrokerError) {
        let name = self.command.registration.command_name;
        tracing::error!(command = name, message_id, error = %ErrorChain(error), "chatter consumer: {what} failed; the broker will deliver the message again");
    }
}

/// One partition-key value's queue, drained by one worker; dropped unsettled (and its lane
/// removed) if the worker ends before the queue is empty: on shutdown, or if the worker itself
/// panicked (a handler's panic is caught as a failed attempt and does not end it).
struct Lane {
    lanes: Lanes,
    key: String,
    /// Set once the worker found the queue empty and removed it itself.
    drained: bool,
}

impl Lane {
    /// The next waiting delivery; when there is none, removes the lane in the same step, so a
    /// delivery of this key that arrives next starts a new worker.
    fn pop(&mut self) -> Option<Pending> {
        let mut lanes = self.lanes.lock().unwrap_or_else(PoisonError::into_inner);
        let next = lanes.get_mut(&self.key).and_then(VecDeque::pop_front);
        if next.is_none() {
            lanes.remove(&self.key);
            self.drained = true;
        }
        next
    }
}

impl Lane {
    /// Takes every delivery still waiting and removes the lane.
    fn take_waiting(mut self) -> VecDeque<Pending> {
        let waiting = self
            .lanes
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(&self.key);
        self.drained = true;
        waiting.unwrap_or_default()
    }
}

impl Drop for Lane {
    fn drop(&mut self) {
        if self.drained {
            return;
        }
        let waiting = self
            .lanes
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(&self.key);
        // Dropped outside the lock: each unsettled delivery goes back to its broker.
        drop(waiting);
    }
}

/// This delivery's attempt number: 1 for a first delivery. The count its context carries (a
/// retry copy's), plus the broker's own count of this copy's earlier deliveries where the
/// broker keeps one (JetStream redelivers instead of taking copies; a RabbitMQ quorum queue
/// counts the deliveries its consumers never settled).
fn attempt_of(delivery: &Delivery) -> u32 {
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
