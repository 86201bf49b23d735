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

use super::commands::NOTICES;
use super::faults::{Cut, PublishFault, Schedule, pick_publish_fault};
use super::history::{Event, History, Who};
use super::instance::PUBLISH_TIMEOUT;

/// The broker's refusal of [`NOTICES`], for good, until the run fixes it; a refusal may pause
/// its publisher's thread right there (a GC pause at the worst moment: between a publish and
/// the stamp it calls for), past the fix, so its stamp lands after others acted.
#[derive(Debug, Default)]
pub struct Fragile {
    /// Whether the broker refuses notices now.
    pub refusing: std::sync::atomic::AtomicBool,
    /// How long a refusal pauses its publisher, if it does (drawn per run).
    pub pause_on_refusal: std::sync::Mutex<Option<std::time::Duration>>,
}

#[derive(Clone)]
pub struct SimBroker {
    inner: InMemoryBroker,
    publishes: Arc<Schedule>,
    deliveries: Arc<Schedule>,
    cut: Arc<Cut>,
    who: Who,
    history: Arc<History>,
    fragile: Arc<Fragile>,
}

impl SimBroker {
    pub fn new(
        inner: InMemoryBroker,
        (publishes, deliveries): (Arc<Schedule>, Arc<Schedule>),
        cut: Arc<Cut>,
        who: Who,
        (history, fragile): (Arc<History>, Arc<Fragile>),
    ) -> Self {
        Self {
            inner,
            publishes,
            deliveries,
            cut,
            who,
            history,
            fragile,
        }
    }

    /// The refusal of a notice while the broker refuses them, after the pause it may cause.
    fn refuse_notice(&self, message: &BrokeredMessage) -> Option<BrokerError> {
        use std::sync::atomic::Ordering;
        if message.destination != NOTICES || !self.fragile.refusing.load(Ordering::SeqCst) {
            return None;
        }
        self.record(message, "refused for good (too large)");
        // Taken: one pause per run, on the first refusal (the lock released before it).
        let pause = self.fragile.pause_on_refusal.lock().unwrap().take();
        if let Some(pause) = pause {
            self.history.paused(
                self.who.0,
                pause,
                format!("paused for {pause:?} inside a refused publish, before its stamp"),
            );
            // Blocks the instance's thread: nothing of it runs meanwhile.
            std::thread::sleep(pause);
        }
        Some(BrokerError::InvalidMessage {
            message_id: message.message_id.clone(),
            destination: message.destination.clone(),
            reason: "simulated: larger than the broker's message size limit".to_owned(),
        })
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
            if let Some(refusal) = self.refuse_notice(&message) {
                return Err(refusal);
            }
            if let Some(held) = self.cut.remaining() {
                // Cut off: the publish reaches the broker when the cut ends, on a task of its
                // own, as bytes already on their way do: the publisher, whose publish timeout
                // drops this future, has often given up by then.
                self.publishes.tally.add("broker cut off (publish held)");
                self.record(
                    &message,
                    if held > PUBLISH_TIMEOUT {
                        "held by a cut-off past the publish timeout, published when it ended"
                    } else {
                        "held by a cut-off, published when it ended"
                    },
                );
                let inner = self.inner.clone();
                let reaching = message.clone();
                let arrival = tokio::spawn(async move {
                    tokio::time::sleep(held).await;
                    inner.publish(reaching).await
                });
                // Confirmed once it reached the broker (not when the cut ends: the publisher's
                // next message would overtake this one).
                return arrival.await.unwrap_or(Ok(()));
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
