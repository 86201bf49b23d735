//! The broker every simulated instance shares: the in-memory broker behind the run's broker
//! faults. Publishes may be refused, lose their confirm after taking effect, arrive twice or
//! late; deliveries may arrive late. While faults are on every publish also takes 0 to 3 ms, so
//! publishes in flight together race. Redelivery needs no injecting: a crashed instance's
//! unsettled deliveries go back to their queue, as a closed connection's do.

use std::sync::Arc;

use chatter_runtime::BrokeredMessage;
use chatter_runtime::broker::{Broker, BrokerError, InMemoryBroker, Subscription};
use futures::StreamExt;
use futures::future::BoxFuture;

use super::faults::{PublishFault, Schedule, pick_publish_fault};

#[derive(Clone)]
pub struct SimBroker {
    inner: InMemoryBroker,
    publishes: Arc<Schedule>,
    deliveries: Arc<Schedule>,
}

impl SimBroker {
    pub fn new(inner: InMemoryBroker, publishes: Arc<Schedule>, deliveries: Arc<Schedule>) -> Self {
        Self {
            inner,
            publishes,
            deliveries,
        }
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
        let fault = self.publishes.roll(pick_publish_fault);
        let latency = self.publishes.jitter(3);
        Box::pin(async move {
            if let Some(latency) = latency {
                tokio::time::sleep(latency).await;
            }
            let Some((kind, fault)) = fault else {
                return self.inner.publish(message).await;
            };
            self.publishes.tally.add(kind);
            match fault {
                PublishFault::Refused => Err(BrokerError::Rejected {
                    message_id: message.message_id,
                    destination: message.destination,
                    reason: "simulated nack".to_owned(),
                }),
                PublishFault::ConfirmLost => {
                    self.inner.publish(message).await?;
                    Err(BrokerError::Timeout {
                        operation: "simulated publish confirm".to_owned(),
                        after: std::time::Duration::ZERO,
                        source: None,
                    })
                }
                PublishFault::Duplicated => {
                    self.inner.publish(message.clone()).await?;
                    self.inner.publish(message).await
                }
                PublishFault::Slow(wait) => {
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
            let late = subscription.then(move |delivery| {
                let wait = deliveries.roll(|rng| rng.millis(5, 150));
                if wait.is_some() {
                    deliveries.tally.add("broker delivery late");
                }
                async move {
                    if let Some(wait) = wait {
                        tokio::time::sleep(wait).await;
                    }
                    delivery
                }
            });
            Ok(Subscription::new(destination, late.boxed()))
        })
    }
}
