//! The in-process broker: the embedded default, with the same settlement semantics as RabbitMQ.

use std::collections::{HashMap, VecDeque};
use std::fmt;
use std::pin::pin;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use futures::future::{self, BoxFuture};
use futures::{FutureExt, StreamExt};
use tokio::sync::Notify;

use super::{Broker, BrokerError, Delivery, Settle, Subscription};
use crate::message::BrokeredMessage;

/// An in-process broker: one FIFO queue per destination, competing consumers, real redelivery.
///
/// - [`publish`](Broker::publish) enqueues and returns at once; a message published before anyone
///   subscribed waits for the first subscriber.
/// - Each message goes to one subscription of its destination; it stays pending until acked.
/// - [`Delivery::nack`], or dropping the delivery unsettled, puts the message back in its queue
///   where it was published, ahead of every message published after it, and its next delivery
///   has `redelivered == true`: several deliveries returned at once come back in the order they
///   were published, whatever order they were returned in (as RabbitMQ requeues).
///
/// - Its dead letters (`<destination>.dead-letter`) can be listed, replayed and discarded
///   through [`DeadLetters`](super::DeadLetters), as `chatter dead-letters` does on RabbitMQ.
///
/// Clones share the same queues. Nothing survives the process.
#[derive(Clone, Default)]
pub struct InMemoryBroker {
    shared: Arc<Shared>,
}

#[derive(Default)]
struct Shared {
    queues: Mutex<HashMap<String, Queue>>,
}

struct Queue {
    /// Messages waiting for a consumer, the next one first.
    ready: VecDeque<Queued>,
    /// Delivered and not yet settled.
    unsettled: usize,
    /// Every message ever published here.
    published: usize,
    /// Wakes a consumer waiting on an empty queue.
    signal: Arc<Notify>,
}

struct Queued {
    /// Its place in the queue: the publish count when it was published. `ready` is kept in
    /// this order, so a requeued message goes back where it was.
    sequence: usize,
    message: BrokeredMessage,
    redelivered: bool,
}

impl InMemoryBroker {
    /// A broker with no queues.
    pub fn new() -> Self {
        Self::default()
    }

    /// How many messages were ever published to `destination` (acked ones included).
    pub fn published_count(&self, destination: &str) -> usize {
        self.shared
            .lock()
            .get(destination)
            .map_or(0, |queue| queue.published)
    }

    /// How many messages of `destination` are not acked yet: waiting for a consumer, or delivered
    /// and not settled.
    pub fn pending_count(&self, destination: &str) -> usize {
        self.shared
            .lock()
            .get(destination)
            .map_or(0, |queue| queue.ready.len() + queue.unsettled)
    }
}

impl fmt::Debug for InMemoryBroker {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let queues = self.shared.lock();
        let mut map = f.debug_map();
        for (destination, queue) in queues.iter() {
            map.entry(
                destination,
                &format_args!(
                    "{{ ready: {}, unsettled: {}, published: {} }}",
                    queue.ready.len(),
                    queue.unsettled,
                    queue.published
                ),
            );
        }
        map.finish()
    }
}

impl Shared {
    /// The queues; a panic elsewhere while holding the lock leaves them consistent (every
    /// critical section is a handful of infallible steps), so poisoning is ignored.
    fn lock(&self) -> MutexGuard<'_, HashMap<String, Queue>> {
        self.queues.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn signal(&self, destination: &str) -> Arc<Notify> {
        let mut queues = self.lock();
        queue(&mut queues, destination).signal.clone()
    }

    /// Publishes `message` at the back of its queue.
    fn publish(&self, message: BrokeredMessage) {
        let mut queues = self.lock();
        let queue = queue(&mut queues, &message.destination);
        let sequence = queue.published;
        queue.published += 1;
        queue.ready.push_back(Queued {
            sequence,
            message,
            redelivered: false,
        });
        queue.signal.notify_one();
    }

    /// Returns an unsettled delivery to its place in the queue (by its publish sequence).
    fn requeue(&self, destination: &str, mut item: Queued) {
        let mut queues = self.lock();
        let queue = queue(&mut queues, destination);
        queue.unsettled = queue.unsettled.saturating_sub(1);
        item.redelivered = true;
        let at = queue
            .ready
            .partition_point(|ready| ready.sequence < item.sequence);
        queue.ready.insert(at, item);
        queue.signal.notify_one();
    }

    fn take(&self, destination: &str) -> Option<Queued> {
        let mut queues = self.lock();
        let queue = queues.get_mut(destination)?;
        let item = queue.ready.pop_front()?;
        queue.unsettled += 1;
        Some(item)
    }

    fn acked(&self, destination: &str) {
        if let Some(queue) = self.lock().get_mut(destination) {
            queue.unsettled = queue.unsettled.saturating_sub(1);
        }
    }
}

fn queue<'q>(queues: &'q mut HashMap<String, Queue>, destination: &str) -> &'q mut Queue {
    queues
        .entry(destination.to_owned())
        .or_insert_with(|| Queue {
            ready: VecDeque::new(),
            unsettled: 0,
            published: 0,
            signal: Arc::new(Notify::new()),
        })
}

/// The in-memory broker's one limit: a queue needs a name with something in it.
fn check_destination(destination: &str) -> Result<(), BrokerError> {
    if destination.trim().is_empty() {
        return Err(BrokerError::InvalidDestination {
            destination: destination.to_owned(),
            reason: "a destination must not be empty or blank".to_owned(),
        });
    }
    Ok(())
}

impl Broker for InMemoryBroker {
    fn messaging_system(&self) -> &'static str {
        "in_memory"
    }

    fn publish(&self, message: BrokeredMessage) -> BoxFuture<'_, Result<(), BrokerError>> {
        let result = check_destination(&message.destination).map(|()| {
            self.shared.publish(message);
        });
        future::ready(result).boxed()
    }

    fn subscribe<'a>(
        &'a self,
        destination: &'a str,
    ) -> BoxFuture<'a, Result<Subscription, BrokerError>> {
        let result = check_destination(destination).map(|()| {
            let state = (
                self.shared.clone(),
                destination.to_owned(),
                self.shared.signal(destination),
            );
            let deliveries = futures::stream::unfold(state, |(shared, destination, signal)| {
                async move {
                    let item = loop {
                        // Registered before looking at the queue, so an enqueue in between
                        // still wakes us.
                        let mut notified = pin!(signal.notified());
                        notified.as_mut().enable();
                        if let Some(item) = shared.take(&destination) {
                            break item;
                        }
                        notified.await;
                    };
                    let settle = InMemorySettle {
                        shared: shared.clone(),
                        destination: destination.clone(),
                        sequence: item.sequence,
                        message: item.message.clone(),
                    };
                    let delivery = Delivery::new(item.message, item.redelivered, Box::new(settle));
                    Some((Ok(delivery), (shared, destination, signal)))
                }
            });
            Subscription::new(destination, deliveries.boxed())
        });
        future::ready(result).boxed()
    }

    fn check(&self, message: &BrokeredMessage) -> Result<(), BrokerError> {
        check_destination(&message.destination)
    }
}

struct InMemorySettle {
    shared: Arc<Shared>,
    destination: String,
    sequence: usize,
    message: BrokeredMessage,
}

impl InMemorySettle {
    fn requeue(self) {
        let item = Queued {
            sequence: self.sequence,
            message: self.message,
            redelivered: true,
        };
        self.shared.requeue(&self.destination, item);
    }
}

impl Settle for InMemorySettle {
    fn ack(self: Box<Self>) -> BoxFuture<'static, Result<(), BrokerError>> {
        self.shared.acked(&self.destination);
        future::ready(Ok(())).boxed()
    }

    fn nack(self: Box<Self>) -> BoxFuture<'static, Result<(), BrokerError>> {
        self.requeue();
        future::ready(Ok(())).boxed()
    }

    fn abandon(self: Box<Self>) {
        self.requeue();
    }
}

/// An operator's view of the dead letters: those waiting in `<destination>.dead-letter` (not
/// those a consumer of it holds), oldest first, each at its publish sequence in that queue.
impl super::DeadLetters for InMemoryBroker {
    fn list<'a>(
        &'a self,
        destination: &'a str,
        limit: usize,
    ) -> BoxFuture<'a, Result<Vec<super::DeadLetter>, BrokerError>> {
        let dead_letters = super::dead_letter_destination(destination);
        let queues = self.shared.lock();
        let letters = queues
            .get(&dead_letters)
            .map(|queue| {
                queue
                    .ready
                    .iter()
                    .take(limit)
                    .map(|item| super::DeadLetter::of(item.sequence as u64, &item.message))
                    .collect()
            })
            .unwrap_or_default();
        future::ready(Ok(letters)).boxed()
    }

    fn settle<'a>(
        &'a self,
        destination: &'a str,
        chosen: &'a [super::DeadLetter],
        action: super::DeadLetterAction,
    ) -> BoxFuture<'a, Result<super::DeadLetterOutcome, BrokerError>> {
        let dead_letters = super::dead_letter_destination(destination);
        let mut outcome = super::DeadLetterOutcome::default();
        let mut taken = Vec::new();
        {
            let mut queues = self.shared.lock();
            let queue = queue(&mut queues, &dead_letters);
            for letter in chosen {
                let at = queue.ready.iter().position(|item| {
                    item.sequence as u64 == letter.position
                        && item.message.message_id == letter.message_id
                });
                match at.and_then(|at| queue.ready.remove(at)) {
                    Some(item) => {
                        outcome.done.push(letter.message_id.clone());
                        taken.push(item.message);
                    }
                    None => outcome.refused.push((
                        letter.message_id.clone(),
                        "it is no longer where it was listed (a consumer took it, or it was \
                         settled): list again"
                            .to_owned(),
                    )),
                }
            }
        }
        // In process, taking a letter out and publishing its replay cannot fail in between, so
        // the order the trait asks of a broker (publish first, then remove) changes nothing.
        if action == super::DeadLetterAction::Replay {
            for letter in taken {
                self.shared
                    .publish(super::dead_letters::replayed(letter, destination));
            }
        }
        future::ready(Ok(outcome)).boxed()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::broker::{DeadLetterAction, DeadLetters, dead_letter_destination};

    fn message(id: &str, destination: &str) -> BrokeredMessage {
        BrokeredMessage::json(id, destination, "{}")
    }

    #[tokio::test]
    async fn a_replayed_dead_letter_is_published_to_its_destination_without_its_reason_and_leaves_the_dead_letters()
     {
        let broker = InMemoryBroker::new();
        let dead = dead_letter_destination("orders");
        let mut first = message("m-1", &dead);
        first.context.insert(
            crate::message::DEAD_LETTER_REASON_CONTEXT_KEY.to_owned(),
            "it failed".into(),
        );
        first
            .context
            .insert(crate::message::ATTEMPTS_CONTEXT_KEY.to_owned(), 5.into());
        broker.publish(first).await.unwrap();
        broker.publish(message("m-2", &dead)).await.unwrap();

        let listed = broker.list("orders", 10).await.unwrap();
        assert_eq!(
            listed
                .iter()
                .map(|l| l.message_id.as_str())
                .collect::<Vec<_>>(),
            ["m-1", "m-2"]
        );
        assert_eq!(listed[0].reason.as_deref(), Some("it failed"));
        assert_eq!(listed[0].attempts, Some(5));

        let outcome = broker
            .settle("orders", &listed[..1], DeadLetterAction::Replay)
            .await
            .unwrap();
        assert_eq!(outcome.done, ["m-1"]);
        assert_eq!(broker.pending_count(&dead), 1);
        assert_eq!(broker.published_count("orders"), 1);
        let mut subscription = broker.subscribe("orders").await.unwrap();
        let replayed = futures::StreamExt::next(&mut subscription)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(replayed.message.message_id, "m-1");
        assert!(replayed.message.context.is_empty());
    }

    /// A settlement that counts the acks it passes on, for a decorating broker.
    struct Counting(Box<dyn Settle>, Arc<std::sync::atomic::AtomicUsize>);

    impl Settle for Counting {
        fn ack(self: Box<Self>) -> BoxFuture<'static, Result<(), BrokerError>> {
            self.1.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            self.0.ack()
        }
        fn nack(self: Box<Self>) -> BoxFuture<'static, Result<(), BrokerError>> {
            self.0.nack()
        }
        fn abandon(self: Box<Self>) {
            self.0.abandon();
        }
    }

    #[tokio::test]
    async fn a_decorating_broker_sees_the_settlement_of_a_delivery_it_wrapped() {
        let broker = InMemoryBroker::new();
        broker.publish(message("m-1", "orders")).await.unwrap();
        let mut subscription = broker.subscribe("orders").await.unwrap();
        let delivery = futures::StreamExt::next(&mut subscription)
            .await
            .unwrap()
            .unwrap();
        let acks = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let counted = Arc::clone(&acks);
        let delivery = delivery.map_settle(|settle| Box::new(Counting(settle, counted)));
        delivery.ack().await.unwrap();
        assert_eq!(acks.load(std::sync::atomic::Ordering::SeqCst), 1);
        assert_eq!(broker.pending_count("orders"), 0);
    }

    #[tokio::test]
    async fn a_dead_letter_no_longer_where_it_was_listed_is_refused_not_taken() {
        let broker = InMemoryBroker::new();
        let dead = dead_letter_destination("orders");
        broker.publish(message("m-1", &dead)).await.unwrap();
        let listed = broker.list("orders", 10).await.unwrap();
        // Discarded meanwhile (another operator).
        broker
            .settle("orders", &listed, DeadLetterAction::Discard)
            .await
            .unwrap();
        let again = broker
            .settle("orders", &listed, DeadLetterAction::Replay)
            .await
            .unwrap();
        assert!(again.done.is_empty());
        assert_eq!(again.refused.len(), 1);
        assert_eq!(broker.published_count("orders"), 0);
    }
}
