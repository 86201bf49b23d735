//! The keyed executor: a consumer's permits, and one lane per partition-key value, whose
//! deliveries run one after another while other values run concurrently; a delivery that waits
//! too long behind its key goes back to the broker.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use serde_json::Value;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::Consumer;
use super::retry::attempt_of;
use crate::broker::Delivery;
use crate::partition_key;

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
pub(super) struct Executor {
    pub(super) permits: Arc<Semaphore>,
    lanes: Lanes,
    pub(super) workers: TaskTracker,
    /// The next [`Pending::id`].
    next_id: AtomicU64,
}

impl Executor {
    pub(super) fn new(concurrency: u16) -> Self {
        Self {
            permits: Arc::new(Semaphore::new(usize::from(concurrency))),
            lanes: Lanes::default(),
            workers: TaskTracker::new(),
            next_id: AtomicU64::new(0),
        }
    }
}

impl Consumer {
    /// Starts `delivery` now, or queues it behind the delivery of its partition-key value in
    /// progress.
    pub(super) fn dispatch(
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
