//! The two connections shared by every clone of a broker, and their recovery.
//!
//! Publishes go on one connection and everything else (consumers, their acks, declarations,
//! browsing) on another: during a memory or disk alarm RabbitMQ blocks a connection that
//! publishes and stops reading it, so an ack sent on it would wait for the alarm to clear and
//! the consumers would stall behind the publishers.
//!
//! Each connection and the publishing channel sit behind plain mutexes taken for a moment,
//! never across a network wait. The one lock held across one is a connection's reconnect lock:
//! one attempt is made at a time per connection, bounded by the connect timeout, so a server
//! that accepts TCP and never answers holds the callers waiting for that attempt (each bounded
//! by its own timeout) for at most that long; a caller whose awaited attempt failed backs off
//! instead of dialling again at once.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use lapin::options::ConfirmSelectOptions;
use lapin::{Channel, Connection, ConnectionProperties};

use super::declaration::Declaration;
use crate::backoff;
use crate::broker::BrokerError;
pub(super) use crate::broker::redact_uri as redact;
use crate::error_chain::ErrorChain;

/// What a connection of the broker carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Role {
    /// Publishes (and the queue deletions made on the publishing channel): the connection a
    /// resource alarm blocks.
    Publishing,
    /// Consumers and their settlements, declarations, dead-letter browsing: never publishes,
    /// so an alarm never blocks it.
    Consuming,
}

impl Role {
    fn name(self) -> &'static str {
        match self {
            Self::Publishing => "publishing",
            Self::Consuming => "consuming",
        }
    }
}

/// One of the broker's connections and the state of its recovery.
struct Link {
    role: Role,
    /// The current connection; `None` after a call on it failed or it was closed.
    connection: Mutex<Option<Arc<Connection>>>,
    /// Held by the one caller making a connection attempt now (bounded by the connect
    /// timeout); the others wait for its outcome instead of dialling too.
    reconnecting: tokio::sync::Mutex<()>,
    /// Failed connection attempts so far: a caller that waited for an attempt that failed
    /// backs off instead of dialling again at once.
    failed_attempts: AtomicU64,
    /// Set while the connection is lost (between the Error and the Info log).
    outage: AtomicBool,
}

impl Link {
    fn new(role: Role, connection: Connection) -> Self {
        Self {
            role,
            connection: Mutex::new(Some(Arc::new(connection))),
            reconnecting: tokio::sync::Mutex::new(()),
            failed_attempts: AtomicU64::new(0),
            outage: AtomicBool::new(false),
        }
    }

    /// The current connection, if it is up.
    fn current(&self) -> Option<Arc<Connection>> {
        lock(&self.connection)
            .as_ref()
            .filter(|connection| connection.status().connected())
            .cloned()
    }
}

/// The state every clone of one [`RabbitMqBroker`](super::RabbitMqBroker) shares.
pub(super) struct Inner {
    /// Where to reconnect to.
    pub(super) uri: String,
    /// The connection publishes go on.
    publishing: Link,
    /// The connection consumers, acks and declarations go on.
    consuming: Link,
    /// The confirm-mode channel publishes go through; replaced when the server closed it.
    publisher: Mutex<Option<Channel>>,
    /// Queues declared on the current connection, and how.
    declared: Mutex<HashMap<String, Declaration>>,
    /// How each queue was last declared, kept across connections: the next declaration starts
    /// from it instead of learning the queue's type and limit again.
    learned: Mutex<HashMap<String, Declaration>>,
    /// How long one publish may take, reconnection included.
    publish_timeout: Mutex<Duration>,
    /// How long one connection attempt (TCP and the AMQP handshake) may take.
    connect_timeout: Mutex<Duration>,
    /// Set by [`RabbitMqBroker::close`](super::RabbitMqBroker::close): nothing reconnects any
    /// more.
    pub(super) closed: AtomicBool,
}

/// The error of a call on a closed broker.
fn closed() -> BrokerError {
    BrokerError::transport("connect", "the broker was closed; it does not reconnect")
}

/// Takes a lock whose critical sections are a few infallible steps: a poisoned one holds
/// consistent data.
fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// One connection attempt to `uri`, bounded by `timeout`.
pub(super) async fn open(uri: &str, timeout: Duration) -> Result<Connection, BrokerError> {
    let operation = || format!("connect to `{}`", redact(uri));
    let connecting = async {
        Connection::connect(uri, ConnectionProperties::default())
            .await
            .map_err(|e| BrokerError::transport(operation(), e))
    };
    crate::broker::bounded(operation, timeout, connecting).await
}

impl Inner {
    /// The state of a broker whose first connections are `publishing` and `consuming`.
    pub(super) fn new(
        uri: String,
        publishing: Connection,
        consuming: Connection,
        publish_timeout: Duration,
        connect_timeout: Duration,
    ) -> Self {
        Self {
            uri,
            publishing: Link::new(Role::Publishing, publishing),
            consuming: Link::new(Role::Consuming, consuming),
            publisher: Mutex::new(None),
            declared: Mutex::new(HashMap::new()),
            learned: Mutex::new(HashMap::new()),
            publish_timeout: Mutex::new(publish_timeout),
            connect_timeout: Mutex::new(connect_timeout),
            closed: AtomicBool::new(false),
        }
    }

    fn link(&self, role: Role) -> &Link {
        match role {
            Role::Publishing => &self.publishing,
            Role::Consuming => &self.consuming,
        }
    }

    /// Whether the publishing connection is up now (the consuming one reconnects when a
    /// subscription or declaration needs it, and is not awaited by publishes).
    pub(super) fn is_connected(&self) -> bool {
        self.publishing.current().is_some()
    }

    /// Whether the server has blocked the publishing connection (`connection.blocked`: a memory
    /// or disk alarm), so publishes wait until the alarm clears.
    pub(super) fn publishing_blocked(&self) -> bool {
        self.publishing
            .current()
            .is_some_and(|connection| connection.status().blocked())
    }

    /// Marks the broker closed and takes the connections away (to close them): nothing
    /// reconnects afterwards, and a reconnect in flight closes what it made.
    pub(super) fn close(&self) -> Vec<Arc<Connection>> {
        let mut publishing = lock(&self.publishing.connection);
        let mut consuming = lock(&self.consuming.connection);
        self.closed.store(true, Ordering::SeqCst);
        publishing
            .take()
            .into_iter()
            .chain(consuming.take())
            .collect()
    }

    /// A live connection for `role`: the current one, or a new one once the broker is
    /// reachable again. Waits (with backoff) as long as it takes; callers bound the wait, and
    /// dropping this future at any point leaves no lock held.
    pub(super) async fn connection(&self, role: Role) -> Result<Arc<Connection>, BrokerError> {
        let link = self.link(role);
        let mut backoff = backoff::reconnect();
        loop {
            if self.closed.load(Ordering::SeqCst) {
                return Err(closed());
            }
            if let Some(connection) = link.current() {
                return Ok(connection);
            }
            let seen_failures = link.failed_attempts.load(Ordering::SeqCst);
            let attempt = {
                let _reconnecting = link.reconnecting.lock().await;
                if let Some(connection) = link.current() {
                    // Another caller reconnected while this one waited.
                    return Ok(connection);
                }
                if link.failed_attempts.load(Ordering::SeqCst) == seen_failures {
                    Some(self.attempt(link).await)
                } else {
                    // The attempt this caller waited for failed: back off like its maker.
                    None
                }
            };
            match attempt {
                Some(Ok(connection)) => return Ok(connection),
                Some(Err(error)) if self.closed.load(Ordering::SeqCst) => return Err(error),
                _ => {}
            }
            // Waited without the reconnect lock: other callers may try in the meantime.
            tokio::time::sleep(backoff.next_delay()).await;
        }
    }

    /// One connection attempt for `link`, made while holding its reconnect lock.
    async fn attempt(&self, link: &Link) -> Result<Arc<Connection>, BrokerError> {
        let role = link.role.name();
        // The connection dropped (or a call on it failed): an outage, logged once when it is
        // seen. A closed broker has no outage.
        if !self.closed.load(Ordering::SeqCst) && !link.outage.swap(true, Ordering::SeqCst) {
            tracing::error!(uri = %redact(&self.uri), connection = role, "RabbitMQ connection lost; reconnecting with backoff");
        }
        let failed = link.failed_attempts.load(Ordering::SeqCst);
        let error = match open(&self.uri, self.connect_timeout()).await {
            Ok(connection) => {
                let connection = Arc::new(connection);
                {
                    let mut current = lock(&link.connection);
                    // Checked under the lock `close` takes the connection with: a connection
                    // made after the broker was closed is closed at once, never kept.
                    if !self.closed.load(Ordering::SeqCst) {
                        *current = Some(Arc::clone(&connection));
                        lock(&self.declared).clear();
                        link.outage.store(false, Ordering::SeqCst);
                        tracing::info!(uri = %redact(&self.uri), connection = role, failed_attempts = failed, "RabbitMQ connection recovered");
                        return Ok(connection);
                    }
                }
                let _ = tokio::time::timeout(
                    self.connect_timeout(),
                    connection.close(200, lapin::types::ShortString::from("OK")),
                )
                .await;
                closed()
            }
            Err(error) => error,
        };
        link.failed_attempts.fetch_add(1, Ordering::SeqCst);
        if failed == 0 {
            tracing::warn!(uri = %redact(&self.uri), connection = role, error = %ErrorChain(&error), "RabbitMQ unreachable; still reconnecting with backoff");
        } else {
            tracing::debug!(uri = %redact(&self.uri), connection = role, attempts = failed + 1, error = %ErrorChain(&error), "RabbitMQ still unreachable");
        }
        Err(error)
    }

    /// Forgets `connection` after a call on it failed, so the next call reconnects (the client
    /// may not have noticed the drop yet).
    pub(super) fn invalidate(&self, connection: &Arc<Connection>) {
        for link in [&self.publishing, &self.consuming] {
            let mut current = lock(&link.connection);
            if current.as_ref().is_some_and(|c| Arc::ptr_eq(c, connection)) {
                *current = None;
            }
        }
        self.forget_publisher();
    }

    /// Drops the publishing channel, so the next publish opens a new one (its channel may be
    /// dead before the client noticed).
    pub(super) fn forget_publisher(&self) {
        *lock(&self.publisher) = None;
    }

    /// The confirm-mode publishing channel on the publishing connection, opened again if it or
    /// its connection closed (a refused publish closes the channel it ran on).
    pub(super) async fn publisher(&self) -> Result<Channel, BrokerError> {
        if let Some(channel) = lock(&self.publisher)
            .as_ref()
            .filter(|channel| channel.status().connected())
        {
            return Ok(channel.clone());
        }
        let channel = self.confirm_channel().await?;
        // Two publishes may both have opened one; the later is kept, the other serves its own
        // publish and closes when dropped.
        *lock(&self.publisher) = Some(channel.clone());
        Ok(channel)
    }

    /// A new confirm-mode channel on the publishing connection, shared with nothing: it closes
    /// when its last clone is dropped.
    pub(super) async fn confirm_channel(&self) -> Result<Channel, BrokerError> {
        let connection = self.connection(Role::Publishing).await?;
        let opened = async {
            let channel = connection
                .create_channel()
                .await
                .map_err(|e| BrokerError::transport("channel.open", e))?;
            channel
                .confirm_select(ConfirmSelectOptions::default())
                .await
                .map_err(|e| BrokerError::transport("confirm.select", e))?;
            Ok::<_, BrokerError>(channel)
        }
        .await;
        if opened.is_err() {
            self.invalidate(&connection);
        }
        opened
    }

    /// How `destination`'s queue was declared on the current connection, if it was.
    pub(super) fn declared_as(&self, destination: &str) -> Option<Declaration> {
        lock(&self.declared).get(destination).cloned()
    }

    /// How to declare `destination`'s queue first: as it was last taken, else as chatter makes
    /// a queue.
    pub(super) fn learned(&self, destination: &str) -> Declaration {
        lock(&self.learned)
            .get(destination)
            .cloned()
            .unwrap_or_default()
    }

    /// Records that `destination`'s queue was declared as `declaration` on the current
    /// connection.
    pub(super) fn declared(&self, destination: &str, declaration: Declaration) {
        lock(&self.learned).insert(destination.to_owned(), declaration.clone());
        lock(&self.declared).insert(destination.to_owned(), declaration);
    }

    /// Forgets that `destination`'s queue was declared (it was deleted, or may have been).
    pub(super) fn forget(&self, destination: &str) {
        lock(&self.declared).remove(destination);
    }

    pub(super) fn publish_timeout(&self) -> Duration {
        *lock(&self.publish_timeout)
    }

    pub(super) fn set_publish_timeout(&self, timeout: Duration) {
        *lock(&self.publish_timeout) = timeout;
    }

    pub(super) fn connect_timeout(&self) -> Duration {
        *lock(&self.connect_timeout)
    }

    pub(super) fn set_connect_timeout(&self, timeout: Duration) {
        *lock(&self.connect_timeout) = timeout;
    }
}
