//! The broker every simulated instance shares: the in-memory broker behind the run's broker
//! faults, one view per instance incarnation (so each publication is attributed). Publishes
//! may be refused, lose their confirm after taking effect, arrive twice or late; deliveries may
//! arrive late; an instance cut off from the broker has its publishes held until the cut ends
//! (then they reach the broker, long after its publish timeout) and its deliveries held too.
//! While faults are on every publish also takes 0 to 3 ms, so publishes in flight together
//! race. Redelivery needs no injecting: a crashed instance's unsettled deliveries go back to
//! their queue, as a closed connection's do.

use std::sync::Arc;

use chatter_runtime::BrokeredMessage;
use chatter_runtime::broker::{Broker, BrokerError, InMemoryBroker, Subscription};
use futures::StreamExt;
use futures::future::BoxFuture;

use super::faults::{Cut, PublishFault, Schedule, pick_publish_fault};
use super::history::{Event, History, Who};

#[derive(Clone)]
pub struct SimBroker {
    inner: InMemoryBroker,
    publishes: Arc<Schedule>,
    deliveries: Arc<Schedule>,
    cut: Arc<Cut>,
    who: Who,
    history: Arc<History>,
}

impl SimBroker {
    pub fn new(
        inner: InMemoryBroker,
        (publishes, deliveries): (Arc<Schedule>, Arc<Schedule>),
        cut: Arc<Cut>,
        who: Who,
        history: Arc<History>,
    ) -> Self {
        Self {
            inner,
            publishes,
            deliveries,
            cut,
            who,
            history,
        }
    }

    fn record(&self, message: &BrokeredMessage, outcome: &'static str) {
        self.history.record(Event::Publish {
            who: self.who,
            message_id: message.message_id.clone(),
            destination: message.destination.clone(),
            outcome,
        });
    }
}

impl Broker for SimBroker {
    fn messaging_system(&self) -> &'static str {
        self.inner.messaging_system()
    }

    fn check(&self, message: &BrokeredMessage) -> Result<(), BrokerError> {
        self.inner.check(message)
    }

    fn publish(&self, message: BrokeredMessage) -> BoxFuture<'_, Result<(), BrokerError>> {
        let operation = format!("publish {}", message.message_id);
        let fault = self.publishes.roll(&operation, pick_publish_fault);
        let latency = self.publishes.jitter(&operation, 3);
        Box::pin(async move {
            if let Some(held) = self.cut.remaining() {
                // Cut off: the publish reaches the broker when the cut ends; the publisher
                // has long given up by then.
                self.publishes.tally.add("broker cut off (publish held)");
                self.record(&message, "held by a cut-off, published when it ended");
                tokio::time::sleep(held).await;
                return self.inner.publish(message).await;
            }
            if let Some(latency) = latency {
                tokio::time::sleep(latency).await;
            }
            let Some((kind, fault)) = fault else {
                self.record(&message, "published");
                return self.inner.publish(message).await;
            };
            self.publishes.tally.add(kind);
            match fault {
                PublishFault::Refused => {
                    self.record(&message, "refused (not published)");
                    Err(BrokerError::Rejected {
                        message_id: message.message_id,
                        destination: message.destination,
                        reason: "simulated nack".to_owned(),
                    })
                }
                PublishFault::ConfirmLost => {
                    self.record(&message, "published, confirm lost");
                    self.inner.publish(message).await?;
                    Err(BrokerError::Timeout {
                        operation: "simulated publish confirm".to_owned(),
                        after: std::time::Duration::ZERO,
                        source: None,
                    })
                }
                PublishFault::Duplicated => {
                    self.record(&message, "published (the broker carried it twice)");
                    self.inner.publish(message.clone()).await?;
                    self.inner.publish(message).await
                }
                PublishFault::Slow(wait) => {
                    self.record(&message, "published (slow)");
                    tokio::time::sleep(wait).await;
                    self.inner.publish(message).await
                }
            }
        })
    }

    fn subscribe<'a>(
        &'a self,
        destination: &'a str,
    ) -> BoxFuture<'a, Result<Subscription, BrokerError>> {
        Box::pin(async move {
            let subscription = self.inner.subscribe(destination).await?;
            let deliveries = Arc::clone(&self.deliveries);
            let cut = Arc::clone(&self.cut);
            let operation = format!("deliver {destination}");
            let late = subscription.then(move |delivery| {
                let wait = deliveries.roll(&operation, |rng| rng.millis(5, 150));
                if wait.is_some() {
                    deliveries.tally.add("broker delivery late");
                }
                let held = cut.remaining();
                async move {
                    if let Some(wait) = held.into_iter().chain(wait).max() {
                        tokio::time::sleep(wait).await;
                    }
                    delivery
                }
            });
            Ok(Subscription::new(destination, late.boxed()))
        })
    }
}
