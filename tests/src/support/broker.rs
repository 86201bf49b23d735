//! Broker-side helpers: counting what arrives on a destination, bounded waits for deliveries,
//! and [`Intercepted`], the in-memory broker behind a publish hook (for test doubles).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use chatter_runtime::BrokeredMessage;
use chatter_runtime::broker::{Broker, BrokerError, Delivery, InMemoryBroker, Subscription};
use futures::future::BoxFuture;
use tokio::time::timeout;

/// Every message id received, with how often it arrived. Clones share the counts.
///
/// [`Received::consume`] fills it from a subscription in the background; [`Received::record`]
/// fills it by hand.
#[derive(Clone, Debug, Default)]
pub struct Received(Arc<Mutex<BTreeMap<String, usize>>>);

impl Received {
    /// Consumes `destination` on `broker` in the background, acking every delivery; panics if
    /// the subscription cannot be made.
    pub async fn on<B: Broker + ?Sized>(broker: &B, destination: &str) -> Self {
        Self::consume(broker.subscribe(destination).await.unwrap())
    }

    /// Consumes `subscription` in a background task (call it inside a Tokio runtime): records
    /// every delivery's message id and acks it. Panics in that task on an undecodable delivery
    /// or a failed ack.
    pub fn consume(mut subscription: Subscription) -> Self {
        let received = Self::default();
        let sink = received.clone();
        tokio::spawn(async move {
            while let Some(delivery) = subscription.next().await {
                let delivery = delivery.expect("the relay publishes Brokered Messages");
                sink.record(&delivery.message.message_id);
                delivery.ack().await.unwrap();
            }
        });
        received
    }

    /// Counts one more arrival of `id`.
    pub fn record(&self, id: &str) {
        *self.0.lock().unwrap().entry(id.to_owned()).or_default() += 1;
    }

    /// Every id received at least once.
    pub fn ids(&self) -> BTreeSet<String> {
        self.0.lock().unwrap().keys().cloned().collect()
    }

    /// How many distinct ids arrived.
    pub fn distinct(&self) -> usize {
        self.0.lock().unwrap().len()
    }

    /// How often `id` arrived (0 if never).
    pub fn count(&self, id: &str) -> usize {
        self.0.lock().unwrap().get(id).copied().unwrap_or(0)
    }

    /// Every id with its count, read at one moment.
    pub fn snapshot(&self) -> BTreeMap<String, usize> {
        self.0.lock().unwrap().clone()
    }
}

/// The next delivery on `subscription`; panics if none arrives `within`, the subscription ended
/// or the delivery is not a Brokered Message.
pub async fn next_delivery(subscription: &mut Subscription, within: Duration) -> Delivery {
    timeout(within, subscription.next())
        .await
        .expect("a delivery arrives in time")
        .expect("the subscription is open")
        .expect("the delivery is a Brokered Message")
}

/// The next `count` deliveries on `subscription`, each acked, sorted by message id; panics as
/// [`next_delivery`] does.
pub async fn acked(
    subscription: &mut Subscription,
    count: usize,
    within: Duration,
) -> Vec<BrokeredMessage> {
    let mut messages = Vec::with_capacity(count);
    for _ in 0..count {
        let delivery = next_delivery(subscription, within).await;
        messages.push(delivery.message.clone());
        delivery.ack().await.expect("the delivery is acked");
    }
    messages.sort_by(|a, b| a.message_id.cmp(&b.message_id));
    messages
}

/// Panics if anything arrives on `subscription` during `watched`.
pub async fn assert_quiet_for(subscription: &mut Subscription, watched: Duration) {
    if let Ok(item) = timeout(watched, subscription.next()).await {
        panic!("expected no further delivery, got {item:?}");
    }
}

/// Publishes a command to `destination` on `broker`: `body` as its JSON, under `message_id`.
pub async fn publish_command(
    broker: &InMemoryBroker,
    destination: &str,
    message_id: &str,
    body: &serde_json::Value,
) {
    broker
        .publish(BrokeredMessage::json(
            message_id,
            destination,
            body.to_string(),
        ))
        .await
        .expect("the in-memory broker takes the command");
}

/// Waits until nothing is queued or unsettled on `destination`: every delivery was settled;
/// panics after 30 s.
pub async fn settled(broker: &InMemoryBroker, destination: &str) {
    timeout(Duration::from_secs(30), async {
        while broker.pending_count(destination) > 0 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await
    .unwrap_or_else(|_| panic!("every delivery on `{destination}` settles within 30 s"));
}

/// What an [`Intercepted`] broker's hook answers for one publish: `Some` in the broker's place,
/// `None` to publish through the in-memory broker (after the returned future completed).
pub type Interception = BoxFuture<'static, Option<Result<(), BrokerError>>>;

/// For test doubles: the in-memory broker with a hook called (synchronously) at the start of
/// every publish, which may delay the confirm or answer in the broker's place. Subscriptions are
/// the in-memory broker's.
pub struct Intercepted<F> {
    inner: InMemoryBroker,
    hook: F,
}

impl<F> Intercepted<F>
where
    F: Fn(&BrokeredMessage) -> Interception + Send + Sync + 'static,
{
    /// `inner` behind `hook`.
    pub fn new(inner: InMemoryBroker, hook: F) -> Self {
        Self { inner, hook }
    }

    /// The in-memory broker behind the hook.
    pub fn inner(&self) -> &InMemoryBroker {
        &self.inner
    }
}

impl<F> Broker for Intercepted<F>
where
    F: Fn(&BrokeredMessage) -> Interception + Send + Sync + 'static,
{
    fn publish(&self, message: BrokeredMessage) -> BoxFuture<'_, Result<(), BrokerError>> {
        let intercepting = (self.hook)(&message);
        Box::pin(async move {
            match intercepting.await {
                Some(answer) => answer,
                None => self.inner.publish(message).await,
            }
        })
    }

    fn subscribe<'a>(
        &'a self,
        destination: &'a str,
    ) -> BoxFuture<'a, Result<Subscription, BrokerError>> {
        self.inner.subscribe(destination)
    }
}
