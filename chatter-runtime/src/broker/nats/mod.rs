//! NATS JetStream through `async-nats` (feature `nats`).
//!
//! Mapping of a [`BrokeredMessage`] onto JetStream:
//!
//! | Brokered Message | NATS |
//! | --- | --- |
//! | `destination` | the subject, stored by whichever stream's subjects cover it (chatter never creates streams) |
//! | `message_id` | the [`MESSAGE_ID_HEADER`] header, and in `Nats-Msg-Id` as `<destination>/<message id>`, `%` and `/` in the destination escaped as `%25` and `%2F` (JetStream deduplicates per stream; a dead letter's gets a random suffix) |
//! | `content_type` | the `Content-Type` header (left out when empty) |
//! | `body` | the payload, UTF-8 |
//! | `context` | the [`CONTEXT_HEADER`] header: the context as one JSON object |
//!
//! | file | what |
//! | --- | --- |
//! | `codec.rs` | a Brokered Message as headers and payload, and back |
//! | `publish.rs` | publishing and waiting for the stream's ack, the server's refusals |
//! | `consume.rs` | durable pull consumers, settling deliveries, dead-lettering what is no Brokered Message |
//! | `contract.rs` | the start-time checks of the server and the streams |

mod codec;
mod consume;
mod contract;
mod dead_letters;
mod publish;

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use async_nats::{ConnectOptions, Event};
use futures::FutureExt;
use futures::future::BoxFuture;

pub use codec::{CONTEXT_HEADER, DEAD_LETTER_REASON_HEADER, MESSAGE_ID_HEADER};

use super::{Broker, BrokerContract, BrokerError, Subscription, redact_uri};
use crate::message::BrokeredMessage;

/// The default bound of one publish (30 s): the publish and its ack, reconnection included.
const DEFAULT_PUBLISH_TIMEOUT: Duration = Duration::from_secs(30);

/// How long one publish attempt waits for the stream's ack before it is made again (within the
/// publish timeout): a publish sent into a connection that was being lost is never answered.
const ACK_ATTEMPT_TIMEOUT: Duration = Duration::from_secs(5);

/// The default bound of the first connection (10 s).
const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// How long JetStream waits for a delivery's ack before delivering it again, by default. A
/// delivery being handled is kept from that by a progress signal every third of it, so a crashed
/// consumer's deliveries come back after at most this long.
pub const DEFAULT_ACK_WAIT: Duration = Duration::from_secs(30);

/// The longest ack wait the server takes: it counts durations in nanoseconds as an `i64`, and
/// a longer one would reach it wrapped (negative).
const MAX_ACK_WAIT: Duration = Duration::from_nanos(i64::MAX as u64);

/// The smallest `max_payload` (server) and `max_msg_size` (stream) chatter accepts: a Cosmos
/// document can be 2 MB, and the server's default is 1 MB.
pub const MIN_MAX_PAYLOAD: usize = 2 * 1024 * 1024;

/// A [`Broker`] on NATS JetStream: publish acks, `Nats-Msg-Id` deduplication, durable pull
/// consumers with explicit ack.
///
/// - [`publish`](Broker::publish) publishes to the destination's subject with `Nats-Msg-Id` set
///   to `<destination>/<message id>` (`%` and `/` in the destination escaped) and waits for the stream's ack, so a republish of a message the stream
///   already holds (within its duplicate window) is taken without storing it twice. A subject
///   no stream stores is [`BrokerError::Refused`] with
///   [`Refusal::NoStream`](super::Refusal::NoStream), a message over the server's
///   `max_payload` with [`Refusal::TooLarge`](super::Refusal::TooLarge): never permanent, an
///   operator lifts them.
/// - [`subscribe`](Broker::subscribe) binds a durable pull consumer of the stream storing the
///   destination (named `chatter-<destination>`, made on first use: explicit ack, no delivery
///   limit of its own, at most `prefetch` unacked deliveries). Competing subscriptions share it.
///   A delivery counts its deliveries ([`Delivery::delivery_count`](super::Delivery::delivery_count)),
///   so the runtime retries it with a delayed `nak` and, past the attempt limit, `term`s it
///   after publishing its dead letter. A delivery being handled sends a progress signal every
///   third of the [ack wait](Self::with_ack_wait); one never settled comes back after it.
/// - [`verify`](Broker::verify), at start: the server's `max_payload` carries a Cosmos document
///   ([`MIN_MAX_PAYLOAD`]); a stream stores each consumed destination, keeps its messages until
///   they are read (limits or work-queue retention, file storage), takes a Cosmos document
///   (`max_msg_size`), and deduplicates for longer than a running relay can take to publish a
///   message again (`duplicate_window`). A stream only the relay publishes to is checked at its
///   first publish (an Error log when its window is too short).
///
/// **Recovery.** The client reconnects by itself, without limit (logged at Error when the
/// connection is lost, at Info when it is back); a publish retries until the publish timeout,
/// and a subscription consumes again once the server answers.
///
/// Clones share one connection.
#[derive(Clone)]
pub struct NatsBroker {
    inner: Arc<Inner>,
    prefetch: u16,
}

#[derive(Clone)]
struct Inner {
    client: async_nats::Client,
    jetstream: async_nats::jetstream::Context,
    /// The server address without its password.
    url: String,
    publish_timeout: Duration,
    ack_wait: Duration,
    /// What [`Broker::verify`] was told of the relay's republish bound; each stream the relay
    /// publishes to is checked against it once (`streams_checked`).
    republish_within: Arc<std::sync::Mutex<Duration>>,
    streams_checked: Arc<std::sync::Mutex<std::collections::HashSet<String>>>,
}

impl NatsBroker {
    /// Connect to `url`, e.g. `nats://127.0.0.1:4222` (or `nats://user:password@host:4222`;
    /// plain NATS: this build has no TLS backend). Must be called within a Tokio runtime.
    ///
    /// The first connection must succeed within 10 s; later losses are
    /// recovered from.
    pub async fn connect(url: &str) -> Result<Self, BrokerError> {
        if tokio::runtime::Handle::try_current().is_err() {
            return Err(BrokerError::transport(
                "connect",
                "NatsBroker::connect must be called within a Tokio runtime",
            ));
        }
        let redacted = redact_uri(url);
        let logged = redacted.clone();
        let options = ConnectOptions::new()
            .connection_timeout(DEFAULT_CONNECT_TIMEOUT)
            .max_reconnects(None::<usize>)
            .event_callback(move |event| {
                let url = logged.clone();
                async move { log_event(&url, event) }
            });
        let operation = || format!("connect to `{redacted}`");
        let client = super::bounded(operation, DEFAULT_CONNECT_TIMEOUT, async {
            options
                .connect(url)
                .await
                .map_err(|e| BrokerError::transport(format!("connect to `{redacted}`"), e))
        })
        .await?;
        let mut jetstream = async_nats::jetstream::new(client.clone());
        jetstream.set_timeout(ACK_ATTEMPT_TIMEOUT.min(DEFAULT_PUBLISH_TIMEOUT));
        Ok(Self {
            inner: Arc::new(Inner {
                client,
                jetstream,
                url: redacted,
                publish_timeout: DEFAULT_PUBLISH_TIMEOUT,
                ack_wait: DEFAULT_ACK_WAIT,
                republish_within: Arc::default(),
                streams_checked: Arc::default(),
            }),
            prefetch: 1,
        })
    }

    /// [`connect`](Self::connect), retried with backoff while the server is unreachable, for up
    /// to `give_up_after`: for a process that may start while the server restarts. The first
    /// failure is logged at Error; the last one is returned. `Duration::MAX` keeps trying
    /// (saturating at about 100 years).
    pub async fn connect_retrying(url: &str, give_up_after: Duration) -> Result<Self, BrokerError> {
        super::connect_retrying("NATS", url, give_up_after, || Self::connect(url)).await
    }

    /// The same broker, whose new subscriptions hold up to `prefetch` unacked deliveries each
    /// (the durable consumer's `max_ack_pending` when this makes it; 0 means no limit).
    pub fn with_prefetch(mut self, prefetch: u16) -> Self {
        self.prefetch = prefetch;
        self
    }

    /// Bounds every publish (the publish, its ack, waiting for a lost connection) by `timeout`
    /// (default 30 s), for this broker and the clones made from it after. `Duration::MAX`: no
    /// bound of chatter's own (each ack attempt is still bounded by 5 s).
    pub fn with_publish_timeout(mut self, timeout: Duration) -> Self {
        let inner = Arc::make_mut(&mut self.inner);
        inner.publish_timeout = timeout;
        inner
            .jetstream
            .set_timeout(ACK_ATTEMPT_TIMEOUT.min(timeout));
        self
    }

    /// How long JetStream waits for a delivery's ack before delivering it again (default
    /// [`DEFAULT_ACK_WAIT`], at least 1 s), for the durable consumers this broker makes. A huge
    /// value (`Duration::MAX`) is capped at the longest the server can hold, about 292 years:
    /// a crashed consumer's deliveries then never come back by themselves.
    pub fn with_ack_wait(mut self, ack_wait: Duration) -> Self {
        Arc::make_mut(&mut self.inner).ack_wait =
            ack_wait.clamp(Duration::from_secs(1), MAX_ACK_WAIT);
        self
    }

    /// Whether the connection is up now.
    pub fn is_connected(&self) -> bool {
        self.inner.client.connection_state() == async_nats::connection::State::Connected
    }

    /// The JetStream context of this broker's connection (for operators' tools and tests:
    /// streams, consumers).
    pub fn jetstream(&self) -> &async_nats::jetstream::Context {
        &self.inner.jetstream
    }
}

/// The client's connection events, as chatter logs them: a lost connection at Error (publishes
/// wait and subscriptions pause until it is back), its return at Info.
fn log_event(url: &str, event: Event) {
    match event {
        Event::Disconnected => {
            tracing::error!(url, "NATS connection lost; reconnecting with backoff")
        }
        Event::Connected => tracing::info!(url, "NATS connection (re)established"),
        Event::Closed => tracing::info!(url, "NATS connection closed"),
        Event::ServerError(error) => tracing::error!(url, %error, "NATS server error"),
        Event::ClientError(error) => tracing::error!(url, %error, "NATS client error"),
        other => tracing::warn!(url, event = %other, "NATS connection event"),
    }
}

impl fmt::Debug for NatsBroker {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("NatsBroker")
            .field("url", &self.inner.url)
            .field("prefetch", &self.prefetch)
            .finish_non_exhaustive()
    }
}

impl Broker for NatsBroker {
    fn messaging_system(&self) -> &'static str {
        "nats"
    }

    fn publish(&self, message: BrokeredMessage) -> BoxFuture<'_, Result<(), BrokerError>> {
        self.inner.publish(message).boxed()
    }

    fn subscribe<'a>(
        &'a self,
        destination: &'a str,
    ) -> BoxFuture<'a, Result<Subscription, BrokerError>> {
        self.inner
            .clone()
            .subscribe(destination, self.prefetch)
            .boxed()
    }

    fn subscribe_with_prefetch<'a>(
        &'a self,
        destination: &'a str,
        prefetch: u16,
    ) -> BoxFuture<'a, Result<Subscription, BrokerError>> {
        self.inner.clone().subscribe(destination, prefetch).boxed()
    }

    fn check(&self, message: &BrokeredMessage) -> Result<(), BrokerError> {
        codec::subject(&message.destination)?;
        codec::headers(message).map(|_| ())
    }

    fn verify<'a>(
        &'a self,
        contract: &'a BrokerContract,
    ) -> BoxFuture<'a, Result<(), BrokerError>> {
        self.inner.verify(contract).boxed()
    }
}
