//! Consuming: a durable pull consumer per destination, a subscription that resumes after every
//! outage, and how its deliveries are settled.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use async_nats::jetstream::consumer::{AckPolicy, DeliverPolicy, PullConsumer, pull};
use async_nats::jetstream::context::GetStreamByNameErrorKind;
use async_nats::jetstream::message::Acker;
use async_nats::jetstream::message::PublishMessage as Publish;
use async_nats::jetstream::{AckKind, Message};
use futures::future::BoxFuture;
use futures::{FutureExt, StreamExt};
use sha2::{Digest, Sha256};
use tokio::task::AbortHandle;

use super::Inner;
use super::codec::{DEAD_LETTER_REASON_HEADER, NATS_MSG_ID, decode, subject};
use crate::backoff;
use crate::broker::{
    BrokerError, Delivery, Liveness, Refusal, Settle, Subscription, dead_letter_destination,
};
use crate::error_chain::ErrorChain;

/// How long a delivery that could not be dead-lettered waits before it is delivered again.
const UNDELIVERABLE_REDELIVERY_DELAY: Duration = Duration::from_secs(1);

/// How long one pull request waits on the server, and the heartbeat that tells a dead
/// connection from an idle subject within it.
const PULL_EXPIRES: Duration = Duration::from_secs(30);
const PULL_HEARTBEAT: Duration = Duration::from_secs(5);

/// The durable consumer chatter binds for `destination`: `chatter-` and the destination with
/// every character a consumer name cannot hold replaced, plus a hash of the destination, so
/// `a.b` and `a_b` never share one.
pub(super) fn durable_name(destination: &str) -> String {
    let readable: String = destination
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                c
            } else {
                '_'
            }
        })
        .take(64)
        .collect();
    let hash = Sha256::digest(destination.as_bytes());
    let suffix: String = hash[..4].iter().map(|b| format!("{b:02x}")).collect();
    format!("chatter-{readable}-{suffix}")
}

impl Inner {
    /// The name of the stream storing `destination`, or the refusal that none does.
    pub(super) async fn stream_of(&self, destination: &str) -> Result<String, BrokerError> {
        match self.jetstream.stream_by_subject(destination).await {
            Ok(name) => Ok(name),
            Err(error) if matches!(error.kind(), GetStreamByNameErrorKind::NotFound) => {
                Err(BrokerError::Refused {
                    destination: destination.to_owned(),
                    refusal: Refusal::NoStream,
                    reply: format!("no JetStream stream's subjects cover `{destination}`"),
                })
            }
            Err(error) => Err(BrokerError::transport(
                format!("look up the stream of `{destination}`"),
                error,
            )),
        }
    }

    /// The durable pull consumer of `destination` (made when missing, checked when it exists), a
    /// pull stream of it, its ack wait and its ack floor (a stream sequence) as the server has them.
    /// One made here starts after `settled_up_to` (every message up to that stream sequence
    /// settled), or at the stream's first message when it is 0.
    async fn consume(
        &self,
        destination: &str,
        prefetch: u16,
        settled_up_to: u64,
    ) -> Result<(pull::Stream, Duration, u64), BrokerError> {
        let stream_name = self.stream_of(destination).await?;
        let transport = |what: &str, e: async_nats::Error| {
            BrokerError::transport(format!("{what} `{destination}`"), e)
        };
        let stream = self
            .jetstream
            .get_stream(&stream_name)
            .await
            .map_err(|e| transport("get the stream of", e.into()))?;
        let name = durable_name(destination);
        let config = pull::Config {
            durable_name: Some(name.clone()),
            filter_subject: destination.to_owned(),
            ack_policy: AckPolicy::Explicit,
            ack_wait: self.ack_wait,
            // Only taken when the consumer is made: one an operator deleted under a running
            // subscription starts after what this subscription settled, not at the stream's start.
            deliver_policy: if settled_up_to == 0 {
                DeliverPolicy::All
            } else {
                DeliverPolicy::ByStartSequence {
                    start_sequence: settled_up_to + 1,
                }
            },
            // chatter counts attempts and dead-letters; the server never drops a message itself.
            max_deliver: -1,
            max_ack_pending: if prefetch == 0 {
                -1
            } else {
                i64::from(prefetch)
            },
            ..pull::Config::default()
        };
        let consumer: PullConsumer = stream
            .get_or_create_consumer(&name, config)
            .await
            .map_err(|e| transport("bind the durable consumer of", e.into()))?;
        // One made before (by an earlier version, another setting, or by hand) is taken as the
        // server has it: refused when it would drop messages or deliver them to the wrong place.
        let info = consumer.cached_info();
        let ack_floor = info.ack_floor.stream_sequence;
        let existing = &info.config;
        check_durable(&stream_name, &name, destination, existing, ack_floor)?;
        let ack_wait = existing.ack_wait;
        let pulling = consumer
            .stream()
            .max_messages_per_batch(usize::from(prefetch.max(1)))
            .expires(PULL_EXPIRES)
            .heartbeat(PULL_HEARTBEAT)
            .messages()
            .await
            .map_err(|e| transport("pull from", e.into()))?;
        Ok((pulling, ack_wait, ack_floor))
    }

    /// Consumes `destination` for as long as the broker lives: after the connection or the
    /// pull is lost, consumes again once the server answers.
    pub(super) async fn subscribe(
        self: Arc<Self>,
        destination: &str,
        prefetch: u16,
    ) -> Result<Subscription, BrokerError> {
        subject(destination)?;
        // The first pull is made now, so a missing stream fails the subscribe.
        let (first, ack_wait, ack_floor) = self.consume(destination, prefetch, 0).await?;
        let liveness = Liveness::default();
        let settled = Arc::new(Mutex::new(Settled::default()));
        settled
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .bound(ack_floor);
        let state = Consuming {
            inner: self,
            destination: destination.to_owned(),
            prefetch,
            current: Some(first),
            ack_wait,
            liveness: liveness.clone(),
            settled,
        };
        let deliveries = futures::stream::unfold(state, |mut state| async move {
            let next = state.next().await;
            Some((next, state))
        });
        Ok(Subscription::with_liveness(
            destination,
            deliveries.boxed(),
            liveness,
        ))
    }
}

struct Consuming {
    inner: Arc<Inner>,
    destination: String,
    prefetch: u16,
    current: Option<pull::Stream>,
    /// The durable consumer's ack wait on the server, which the progress signals keep ahead of.
    ack_wait: Duration,
    liveness: Liveness,
    /// What this subscription settled, for making the durable consumer again after it.
    settled: Arc<Mutex<Settled>>,
}

/// The stream sequences a subscription was delivered and has not acked or termed yet, and the
/// highest it was delivered: every message up to [`Settled::floor`] is settled, so a durable
/// consumer an operator deleted is made again after it instead of delivering the stream's
/// whole history again. Only this subscription's own deliveries are known; another process
/// consuming the same durable consumer settles its own, so the floor can pass a message it
/// still holds (it has been handled or is being handled there; only its retry would be lost).
#[derive(Debug, Default)]
struct Settled {
    /// The server's ack floor when the durable consumer was last bound.
    bound_floor: u64,
    highest_delivered: u64,
    unsettled: BTreeSet<u64>,
}

impl Settled {
    fn bound(&mut self, ack_floor: u64) {
        self.bound_floor = self.bound_floor.max(ack_floor);
    }

    fn delivered(&mut self, sequence: u64) {
        self.highest_delivered = self.highest_delivered.max(sequence);
        self.unsettled.insert(sequence);
    }

    /// Acked or termed, confirmed by the server: never delivered again. A nak leaves it
    /// unsettled, as it comes back.
    fn settled(&mut self, sequence: u64) {
        self.unsettled.remove(&sequence);
    }

    /// The highest stream sequence up to which every message is settled.
    fn floor(&self) -> u64 {
        match self.unsettled.first() {
            Some(first) => first.saturating_sub(1),
            None => self.highest_delivered.max(self.bound_floor),
        }
    }
}

/// Marks `sequence` settled in `settled`.
fn mark_settled(settled: &Mutex<Settled>, sequence: Option<u64>) {
    if let Some(sequence) = sequence {
        settled
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .settled(sequence);
    }
}

impl Consuming {
    async fn next(&mut self) -> Result<Delivery, BrokerError> {
        // Grows until a message arrives: a pull that fails as soon as it is made (a consumer
        // the server refuses to pull from) is retried ever more slowly, not every 100 ms.
        let mut backoff = backoff::reconnect();
        let mut complaints = Complaints::default();
        loop {
            let Some(pulling) = self.current.as_mut() else {
                let settled_up_to = self
                    .settled
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .floor();
                match self
                    .inner
                    .consume(&self.destination, self.prefetch, settled_up_to)
                    .await
                {
                    Ok((pulling, ack_wait, ack_floor)) => {
                        tracing::info!(destination = %self.destination, settled_up_to, "NATS subscription resumed");
                        self.liveness.set_live(true);
                        self.current = Some(pulling);
                        self.ack_wait = ack_wait;
                        self.settled
                            .lock()
                            .unwrap_or_else(PoisonError::into_inner)
                            .bound(ack_floor);
                    }
                    Err(error) => {
                        if complaints.due() {
                            tracing::error!(destination = %self.destination, error = %ErrorChain(&error), "NATS subscription not resumed yet; retrying with backoff");
                        }
                        tokio::time::sleep(backoff.next_delay()).await;
                    }
                }
                continue;
            };
            match pulling.next().await {
                Some(Ok(message)) => {
                    self.liveness.set_live(true);
                    match self.deliver(message).await {
                        Some(delivery) => return delivery,
                        None => continue,
                    }
                }
                ended => {
                    if complaints.due() {
                        let error = match ended {
                            Some(Err(e)) => ErrorChain(&e).to_string(),
                            _ => "the server ended the pull".to_owned(),
                        };
                        tracing::error!(destination = %self.destination, %error, "NATS subscription lost; it resumes once the server answers");
                    }
                    self.liveness.set_live(false);
                    self.current = None;
                    tokio::time::sleep(backoff.next_delay()).await;
                }
            }
        }
    }

    /// `message` as a delivery; `None` for a message that is not a Brokered Message, after
    /// dead-lettering it (`Some(Err)` reports it, as RabbitMQ's subscription does).
    async fn deliver(&self, message: Message) -> Option<Result<Delivery, BrokerError>> {
        let info = message.info().ok();
        let delivered = info
            .as_ref()
            .map(|info| u32::try_from(info.delivered).unwrap_or(u32::MAX))
            .unwrap_or(1)
            .max(1);
        let sequence = info.map(|info| info.stream_sequence);
        if let Some(sequence) = sequence {
            self.settled
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .delivered(sequence);
        }
        let (message, acker) = message.split();
        let acker = Arc::new(acker);
        match decode(
            &self.destination,
            message.headers.as_ref(),
            &message.payload,
        ) {
            Ok(brokered) => {
                let settle = JetStreamSettle {
                    message_id: brokered.message_id.clone(),
                    delivered,
                    sequence,
                    settled: Arc::clone(&self.settled),
                    progress: keep_in_progress(Arc::clone(&acker), self.ack_wait),
                    acker,
                };
                Some(Ok(Delivery::new(brokered, delivered > 1, Box::new(settle))))
            }
            Err(reason) => Some(Err(self
                .dead_letter_undecodable(&message, &acker, reason, sequence)
                .await)),
        }
    }

    /// Publishes a delivery that is not a Brokered Message to `<destination>.dead-letter` as it
    /// is (payload and headers, plus a `Chatter-Dead-Letter-Reason` header), then `term`s it;
    /// if that publish fails it is delivered again after a pause, so nothing is dropped.
    async fn dead_letter_undecodable(
        &self,
        message: &async_nats::Message,
        acker: &Acker,
        reason: String,
        sequence: Option<u64>,
    ) -> BrokerError {
        let message_id = message
            .headers
            .as_ref()
            .and_then(|h| h.get(NATS_MSG_ID))
            .map_or_else(|| "<none>".to_owned(), |id| id.as_str().to_owned());
        let destination = &self.destination;
        let dead_letters = dead_letter_destination(destination);
        let mut headers = message.headers.clone().unwrap_or_default();
        headers.insert(
            DEAD_LETTER_REASON_HEADER,
            reason.replace(['\r', '\n'], " ").as_str(),
        );
        headers.insert(
            NATS_MSG_ID,
            format!("{message_id}:dead-letter:{}", uuid::Uuid::new_v4()).as_str(),
        );
        let publish = Publish::build()
            .headers(headers)
            .payload(message.payload.clone());
        let publishing = self.inner.publish_to(&message_id, &dead_letters, publish);
        let operation = || format!("dead-letter to `{dead_letters}`");
        match crate::broker::bounded(operation, self.inner.publish_timeout, publishing).await {
            Ok(()) => {
                tracing::error!(%destination, %message_id, %reason, %dead_letters, "dead-lettered a delivery that is not a Brokered Message");
                match acker.double_ack_with(AckKind::Term).await {
                    Ok(()) => mark_settled(&self.settled, sequence),
                    Err(e) => {
                        tracing::warn!(%destination, %message_id, error = %ErrorChain(&*e), "could not term the dead-lettered delivery; it comes back and is dead-lettered again");
                    }
                }
            }
            Err(error) => {
                tracing::error!(%destination, %message_id, %reason, error = %ErrorChain(&error), "could not dead-letter a delivery that is not a Brokered Message; it is delivered again");
                let later = AckKind::Nak(Some(UNDELIVERABLE_REDELIVERY_DELAY));
                if let Err(e) = acker.ack_with(later).await {
                    tracing::warn!(%destination, %message_id, error = %ErrorChain(&*e), "could not nak the delivery; it comes back after the ack wait");
                }
            }
        }
        BrokerError::Undecodable {
            destination: destination.to_owned(),
            message_id,
            reason,
        }
    }
}

/// When a failing subscription logs at Error again: once when it starts failing, then at most
/// every minute while it keeps failing.
#[derive(Default)]
struct Complaints(Option<tokio::time::Instant>);

impl Complaints {
    const EVERY: Duration = Duration::from_secs(60);

    fn due(&mut self) -> bool {
        let now = tokio::time::Instant::now();
        let due = self
            .0
            .is_none_or(|at| now.duration_since(at) >= Self::EVERY);
        if due {
            self.0 = Some(now);
        }
        due
    }
}

/// Refuses a durable consumer chatter would lose or misroute messages through: acks that are
/// not explicit, a delivery limit of its own (the server would stop delivering a message chatter
/// has not dead-lettered), another subject. The fix names how to make it again from the first
/// message not yet acked (after `ack_floor`, a stream sequence): made by chatter with no
/// subscription running to remember that, it would deliver the stream's whole history again.
fn check_durable(
    stream: &str,
    name: &str,
    destination: &str,
    config: &async_nats::jetstream::consumer::Config,
    ack_floor: u64,
) -> Result<(), BrokerError> {
    let problem = if config.ack_policy != AckPolicy::Explicit {
        Some(format!("acks by {:?}, not explicitly", config.ack_policy))
    } else if config.max_deliver > 0 {
        Some(format!(
            "stops delivering a message after {} deliveries, before chatter dead-letters it",
            config.max_deliver
        ))
    } else if config.filter_subject != destination {
        Some(format!(
            "reads `{}`, not `{destination}`",
            config.filter_subject
        ))
    } else {
        None
    };
    match problem {
        None => Ok(()),
        Some(problem) => Err(BrokerError::Misconfigured {
            setting: format!("durable consumer `{name}` of stream `{stream}`"),
            problem,
            fix: format!(
                "delete it and make it again from its first message not yet acked: `nats consumer rm {stream} {name}`, then `nats consumer add {stream} {name} --pull --filter {destination} --ack explicit --max-deliver=-1 --deliver {} --defaults` (left to chatter, it is made from the stream's first message, which delivers every message stored again)",
                ack_floor + 1
            ),
        }),
    }
}

/// Tells the server every third of `ack_wait` that the delivery is still being handled, until
/// aborted (when it is settled or dropped).
fn keep_in_progress(acker: Arc<Acker>, ack_wait: Duration) -> Option<AbortHandle> {
    let handle = tokio::runtime::Handle::try_current().ok()?;
    let every = ack_wait / 3;
    let task = handle.spawn(async move {
        let mut warned = false;
        loop {
            tokio::time::sleep(every).await;
            // A signal lost to a dropped connection is sent again next time; if none reaches the
            // server within the ack wait it delivers the message again (handled twice at worst,
            // which the inbox dedups).
            if let Err(error) = acker.ack_with(AckKind::Progress).await
                && !warned
            {
                tracing::warn!(error = %ErrorChain(&*error), "NATS progress signal failed; the delivery may be delivered again");
                warned = true;
            }
        }
    });
    Some(task.abort_handle())
}

/// Settles one JetStream delivery.
struct JetStreamSettle {
    message_id: String,
    delivered: u32,
    /// Its stream sequence, marked settled in `settled` once an ack or term is confirmed.
    sequence: Option<u64>,
    settled: Arc<Mutex<Settled>>,
    acker: Arc<Acker>,
    progress: Option<AbortHandle>,
}

impl JetStreamSettle {
    /// Sends `kind`; `confirmed` waits for the server to confirm it (acks and terms, whose loss
    /// would deliver the message again).
    fn send(
        self: Box<Self>,
        kind: AckKind,
        what: &'static str,
        confirmed: bool,
    ) -> BoxFuture<'static, Result<(), BrokerError>> {
        if let Some(progress) = &self.progress {
            progress.abort();
        }
        async move {
            let sent = if confirmed {
                let sent = self.acker.double_ack_with(kind).await;
                if sent.is_ok() {
                    mark_settled(&self.settled, self.sequence);
                }
                sent
            } else {
                self.acker.ack_with(kind).await
            };
            sent.map_err(|e| BrokerError::transport(format!("{what} `{}`", self.message_id), e))
        }
        .boxed()
    }
}

impl Drop for JetStreamSettle {
    fn drop(&mut self) {
        if let Some(progress) = &self.progress {
            progress.abort();
        }
    }
}

impl Settle for JetStreamSettle {
    fn ack(self: Box<Self>) -> BoxFuture<'static, Result<(), BrokerError>> {
        self.send(AckKind::Ack, "ack", true)
    }

    fn nack(self: Box<Self>) -> BoxFuture<'static, Result<(), BrokerError>> {
        self.send(AckKind::Nak(None), "nak", false)
    }

    fn nack_after(self: Box<Self>, delay: Duration) -> BoxFuture<'static, Result<(), BrokerError>> {
        self.send(AckKind::Nak(Some(delay)), "nak", false)
    }

    fn term(self: Box<Self>) -> BoxFuture<'static, Result<(), BrokerError>> {
        self.send(AckKind::Term, "term", true)
    }

    fn delivery_count(&self) -> Option<u32> {
        Some(self.delivered)
    }

    fn abandon(self: Box<Self>) {
        // Without a runtime to send the nak from, the server delivers it again after the ack
        // wait, as the progress signals stop with `self`.
        if let Ok(handle) = tokio::runtime::Handle::try_current() {
            handle.spawn(async move {
                let message_id = self.message_id.clone();
                if let Err(e) = self.nack().await {
                    tracing::warn!(%message_id, error = %ErrorChain(&e), "nak of an abandoned delivery failed; the server delivers it again after the ack wait");
                }
            });
        }
    }
}
