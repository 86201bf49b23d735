//! The broker every simulated instance shares: the in-memory broker behind the run's broker
//! faults, one view per instance incarnation (so each publication is attributed). Publishes
//! may be refused, lose their confirm after taking effect, arrive twice or late; deliveries may
//! arrive late; an instance cut off from the broker has its publishes held until the cut ends
//! (then they reach the broker, long after its publish timeout) and its deliveries held too.
//! While faults are on every publish also takes 0 to 3 ms, so publishes in flight together
//! race. A crashed instance's unsettled deliveries go back to their queue, as a closed
//! connection's do. Settlements meet the broker's faults: an ack or a nack lost (the message is
//! requeued; the consumer hears so, or, for an ack that was sent before the loss, nothing), and
//! a delivery taken back while held, which the broker delivers again, maybe to another
//! instance while this one's handler still runs: as RabbitMQ does when a channel closes (each
//! delivery it held turns stale, and settling it fails), or as NATS JetStream does past the
//! ack wait of a delivery whose progress signals stopped (the held copy can still ack). A run's
//! broker is one or the other ([`Redelivery`]); the counting one counts every message's
//! deliveries, which the consumer takes for its attempts, and delays a redelivery it is asked
//! to delay.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};

use chatter_runtime::BrokeredMessage;
use chatter_runtime::broker::{
    Broker, BrokerError, Delivery, InMemoryBroker, Settle, Subscription,
};
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

/// One instance's broker fault schedules: its publishes, its deliveries (late), and their
/// settlements (lost, or taken back: by a channel close, or past their ack wait); and how the
/// run's broker redelivers.
#[derive(Clone)]
pub struct Schedules {
    pub publishes: Arc<Schedule>,
    pub deliveries: Arc<Schedule>,
    pub settlements: Arc<Schedule>,
    /// On a counting broker: deliveries whose progress signals are lost.
    pub progress: Arc<Schedule>,
    pub redelivery: Redelivery,
}

#[derive(Clone)]
pub struct SimBroker {
    inner: InMemoryBroker,
    schedules: Schedules,
    cut: Arc<Cut>,
    who: Who,
    history: Arc<History>,
    fragile: Arc<Fragile>,
}

impl SimBroker {
    pub fn new(
        inner: InMemoryBroker,
        schedules: Schedules,
        cut: Arc<Cut>,
        who: Who,
        (history, fragile): (Arc<History>, Arc<Fragile>),
    ) -> Self {
        Self {
            inner,
            schedules,
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
        // A dead letter is a stream message of its own: its replay (which keeps its context) is
        // counted apart from any copy of the original still around.
        let message = if message.destination.ends_with(".dead-letter") {
            published_anew(&message)
        } else {
            message
        };
        let operation = format!("publish {}", message.message_id);
        let publishes = &self.schedules.publishes;
        let fault = publishes.roll(&operation, pick_publish_fault);
        let latency = publishes.jitter(&operation, 3);
        Box::pin(async move {
            if let Some(refusal) = self.refuse_notice(&message) {
                return Err(refusal);
            }
            if let Some(held) = self.cut.remaining() {
                // Cut off: the publish reaches the broker when the cut ends, on a task of its
                // own, as bytes already on their way do: the publisher, whose publish timeout
                // drops this future, has often given up by then.
                publishes.tally.add("broker cut off (publish held)");
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
            publishes.tally.add(kind);
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
            let deliveries = Arc::clone(&self.schedules.deliveries);
            let channel = Channel::new(
                destination,
                [
                    Arc::clone(&self.schedules.settlements),
                    Arc::clone(&self.schedules.progress),
                ],
                self.who,
                Arc::clone(&self.history),
                self.schedules.redelivery.clone(),
            );
            let cut = Arc::clone(&self.cut);
            let operation = format!("deliver {destination}");
            let late = subscription.then(move |delivery| {
                let wait = deliveries.roll(&operation, |rng| rng.millis(5, 150));
                if wait.is_some() {
                    deliveries.tally.add("broker delivery late");
                }
                let held = cut.remaining();
                let channel = Arc::clone(&channel);
                async move {
                    if let Some(wait) = held.into_iter().chain(wait).max() {
                        tokio::time::sleep(wait).await;
                    }
                    delivery.map(|delivery| channel.hold(delivery))
                }
            });
            Ok(Subscription::new(destination, late.boxed()))
        })
    }
}

/// How the broker counts and takes back deliveries, drawn per run.
#[derive(Clone)]
pub enum Redelivery {
    /// As RabbitMQ: a channel that closes takes back every delivery it holds (the broker
    /// requeues them at their place and delivers them again), and they turn stale: settling
    /// one after fails.
    Channels,
    /// As NATS JetStream: the broker counts each message's deliveries (the consumer's attempts
    /// are that count), delivers one again after a delay when asked (`nack_after`), and
    /// delivers one again past its ack wait when its progress signals stop coming (a network
    /// hiccup), **while its handler still runs**: the held copy can still be acked, which
    /// settles the message.
    Counting(Arc<Counts>),
}

/// The context key that tells one publish of a message from another (the harness publishes a
/// command's copies under one message id): a JetStream stream message, counted on its own.
const PUBLISH: &str = "sim.publish";

/// `message` as a publish of its own: a counting broker counts its deliveries apart from those
/// of every other publish of the same message id.
pub fn published_anew(
    message: &chatter_runtime::BrokeredMessage,
) -> chatter_runtime::BrokeredMessage {
    static PUBLISHES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let mut message = message.clone();
    message.context.insert(
        PUBLISH.to_owned(),
        PUBLISHES.fetch_add(1, Ordering::SeqCst).into(),
    );
    message
}

/// JetStream's delivery counts, one per publish ([`published_anew`]), shared by every instance;
/// reset once the message is acked or termed (a replayed dead letter is counted afresh, as its
/// new stream sequence is).
#[derive(Debug, Default)]
pub struct Counts(Mutex<std::collections::HashMap<String, u32>>);

impl Counts {
    fn next(&self, key: &str) -> u32 {
        let mut counts = self.0.lock().unwrap();
        let count = counts.entry(key.to_owned()).or_default();
        *count += 1;
        *count
    }

    fn reset(&self, key: &str) {
        self.0.lock().unwrap().remove(key);
    }
}

/// One subscription's deliveries until they are settled, and the faults that take them back.
/// On [`Redelivery::Channels`], a channel close is due on a delivery now and then: a moment
/// later (so deliveries in progress, not only the new one, are taken back) every delivery the
/// channel holds is taken back, and the channel is open again at once (the client
/// reconnects). On [`Redelivery::Counting`], a delivery's progress signals are lost now and
/// then: past its ack wait it is delivered again.
struct Channel {
    destination: String,
    faults: Arc<Schedule>,
    progress: Arc<Schedule>,
    who: Who,
    history: Arc<History>,
    redelivery: Redelivery,
    held: Mutex<Vec<Weak<Held>>>,
}

/// One delivery on a [`Channel`]: its settlement, until it is settled or taken back.
struct Held {
    message_id: String,
    /// Its count's key ([`Channel::key`]).
    key: String,
    /// Its count, on [`Redelivery::Counting`].
    count: Option<u32>,
    settle: Mutex<Option<Box<dyn Settle>>>,
    /// Taken back by a channel close: settling it fails.
    stale: AtomicBool,
    /// Delivered again past its ack wait: settling it still works (an ack settles the message).
    redelivered: AtomicBool,
}

impl Channel {
    fn new(
        destination: &str,
        [faults, progress]: [Arc<Schedule>; 2],
        who: Who,
        history: Arc<History>,
        redelivery: Redelivery,
    ) -> Arc<Self> {
        Arc::new(Self {
            destination: destination.to_owned(),
            faults,
            progress,
            who,
            history,
            redelivery,
            held: Mutex::default(),
        })
    }

    fn counts(&self) -> Option<&Arc<Counts>> {
        match &self.redelivery {
            Redelivery::Counting(counts) => Some(counts),
            Redelivery::Channels => None,
        }
    }

    /// The key a message's count is kept under: its destination, id and publish.
    fn key(&self, message: &chatter_runtime::BrokeredMessage) -> String {
        let publish = message.context.get(PUBLISH).cloned().unwrap_or_default();
        format!("{}\n{}\n{publish}", self.destination, message.message_id)
    }

    /// `delivery`, held by this channel; a channel close, or a redelivery past its ack wait, may
    /// be due on it.
    fn hold(self: &Arc<Self>, delivery: Delivery) -> Delivery {
        let message_id = delivery.message.message_id.clone();
        let key = self.key(&delivery.message);
        let count = self.counts().map(|counts| counts.next(&key));
        let operation = format!("channel {}", self.destination);
        let taken_back_after = match count {
            // The ack wait, short (as the harness's timings are): most deliveries held that
            // long wait for their key, or for a slow handler.
            Some(_) => self.progress.roll(&operation, |rng| rng.millis(10, 300)),
            None => self.faults.roll(&operation, |rng| rng.millis(0, 1_500)),
        };
        let mut held = None;
        let delivery = delivery.map_settle(|settle| {
            let entry = Arc::new(Held {
                message_id,
                key,
                count,
                settle: Mutex::new(Some(settle)),
                stale: AtomicBool::new(false),
                redelivered: AtomicBool::new(false),
            });
            held = Some(Arc::clone(&entry));
            Box::new(SimSettle {
                held: entry,
                channel: Arc::clone(self),
            })
        });
        let Some(entry) = held else {
            return delivery;
        };
        {
            let mut list = self.held.lock().unwrap();
            list.retain(|weak| weak.strong_count() > 0);
            list.push(Arc::downgrade(&entry));
        }
        if let Some(after) = taken_back_after {
            let channel = Arc::clone(self);
            if count.is_some() {
                self.faults
                    .tally
                    .add("broker progress lost (redelivered past its ack wait)");
                let entry = Arc::downgrade(&entry);
                tokio::spawn(async move {
                    tokio::time::sleep(after).await;
                    if let Some(entry) = entry.upgrade() {
                        channel.redeliver(&entry);
                    }
                });
            } else {
                self.faults
                    .tally
                    .add("broker channel closed (deliveries taken back)");
                tokio::spawn(async move {
                    tokio::time::sleep(after).await;
                    channel.close();
                });
            }
        }
        delivery
    }

    /// The channel closes: every delivery it holds goes back to the broker, stale here.
    fn close(&self) {
        let held: Vec<Arc<Held>> = std::mem::take(&mut *self.held.lock().unwrap())
            .iter()
            .filter_map(Weak::upgrade)
            .collect();
        for entry in held {
            self.take_back(
                &entry,
                &entry.stale,
                "taken back by a channel close (redelivered)",
            );
        }
    }

    /// Past its ack wait without progress: the broker delivers `entry`'s message again, and
    /// the held copy can still settle it.
    fn redeliver(&self, entry: &Held) {
        self.take_back(
            entry,
            &entry.redelivered,
            "taken back past its ack wait (redelivered while held)",
        );
    }

    /// Returns `entry` to the broker, unless it was settled or taken back already, marking it
    /// as `how` (stale or redelivered) says.
    fn take_back(&self, entry: &Held, how: &AtomicBool, what: &'static str) {
        if let Some(settle) = entry.take() {
            how.store(true, Ordering::SeqCst);
            self.record(&entry.message_id, what);
            settle.abandon();
        }
    }

    fn record(&self, message_id: &str, what: &'static str) {
        self.history.record(Event::Settle {
            who: self.who,
            message_id: message_id.to_owned(),
            what,
        });
    }
}

impl Held {
    fn take(&self) -> Option<Box<dyn Settle>> {
        self.settle.lock().unwrap().take()
    }
}

/// A delivery's settlement through its [`Channel`]: lost with the channel now and then.
struct SimSettle {
    held: Arc<Held>,
    channel: Arc<Channel>,
}

/// How a settlement meets its channel's close.
#[derive(Clone, Copy)]
enum Lost {
    /// The channel closed before the settlement left: the client hears so.
    Heard,
    /// The ack left, the channel closed before the broker read it: the client hears nothing
    /// (an ack has no answer), and the broker delivers the message again.
    Unheard,
}

/// A settlement the broker never got returns its delivery when dropped (its instance crashed
/// while it waited to be sent): the broker delivers the message again.
struct Returning(Option<Box<dyn Settle>>);

impl Drop for Returning {
    fn drop(&mut self) {
        if let Some(settle) = self.0.take() {
            settle.abandon();
        }
    }
}

impl SimSettle {
    /// Whether a fault takes this settlement (`settlement`) away with its channel.
    fn lost(&self, settlement: &'static str) -> Option<Lost> {
        let operation = format!("{settlement} {}", self.held.message_id);
        let lost = self.channel.faults.roll(&operation, |rng| {
            if settlement == "ack" && rng.chance(500) {
                Lost::Unheard
            } else {
                Lost::Heard
            }
        })?;
        let what = match lost {
            Lost::Heard => "settlement lost with its channel (the consumer heard; redelivered)",
            Lost::Unheard => "ack lost with its channel, unheard (redelivered)",
        };
        self.channel.faults.tally.add(match lost {
            Lost::Heard => "broker settlement lost",
            Lost::Unheard => "broker ack lost unheard",
        });
        self.channel.record(&self.held.message_id, what);
        Some(lost)
    }

    /// Settles through `settle`, unless the settlement is lost: then the broker takes the
    /// delivery back and the consumer hears so, or nothing. An ack (`settles`) resets the
    /// message's count. A delivery taken back by a channel close cannot be settled; one
    /// delivered again past its ack wait still can: its ack settles the message (the copy
    /// delivered again is a duplicate then), and a nack changes nothing.
    fn settle(
        &self,
        settlement: &'static str,
        settles: bool,
        settle: impl FnOnce(Box<dyn Settle>) -> BoxFuture<'static, Result<(), BrokerError>>,
    ) -> BoxFuture<'static, Result<(), BrokerError>> {
        let Some(inner) = self.held.take() else {
            if self.held.redelivered.load(Ordering::SeqCst) {
                if settles {
                    self.reset();
                }
                return Box::pin(async { Ok(()) });
            }
            let error = BrokerError::SettlementLost {
                message_id: self.held.message_id.clone(),
                settlement,
            };
            return Box::pin(async move { Err(error) });
        };
        match self.lost(settlement) {
            None => {
                if settles {
                    self.reset();
                }
                settle(inner)
            }
            Some(lost) => {
                inner.abandon();
                let error = BrokerError::SettlementLost {
                    message_id: self.held.message_id.clone(),
                    settlement,
                };
                Box::pin(async move {
                    match lost {
                        Lost::Heard => Err(error),
                        Lost::Unheard => Ok(()),
                    }
                })
            }
        }
    }

    fn reset(&self) {
        if let Some(counts) = self.channel.counts() {
            counts.reset(&self.held.key);
        }
    }
}

impl Settle for SimSettle {
    fn ack(self: Box<Self>) -> BoxFuture<'static, Result<(), BrokerError>> {
        self.settle("ack", true, |inner| inner.ack())
    }

    fn nack(self: Box<Self>) -> BoxFuture<'static, Result<(), BrokerError>> {
        self.settle("nack", false, |inner| inner.nack())
    }

    /// JetStream's delayed redelivery: returned to the broker once `delay` has passed (or at
    /// once, should its instance crash meanwhile). The in-memory broker has none of its own.
    fn nack_after(
        self: Box<Self>,
        delay: std::time::Duration,
    ) -> BoxFuture<'static, Result<(), BrokerError>> {
        self.settle("nack", false, move |inner| {
            let returning = Returning(Some(inner));
            tokio::spawn(async move {
                tokio::time::sleep(delay).await;
                drop(returning);
            });
            Box::pin(async { Ok(()) })
        })
    }

    fn term(self: Box<Self>) -> BoxFuture<'static, Result<(), BrokerError>> {
        self.settle("ack", true, |inner| inner.term())
    }

    fn abandon(self: Box<Self>) {
        if let Some(inner) = self.held.take() {
            inner.abandon();
        }
    }

    fn is_stale(&self) -> bool {
        self.held.stale.load(Ordering::SeqCst)
    }

    fn delivery_count(&self) -> Option<u32> {
        self.held.count
    }

    fn is_last_delivery(&self) -> bool {
        let settle = self.held.settle.lock().unwrap();
        settle
            .as_ref()
            .is_some_and(|inner| inner.is_last_delivery())
    }
}
