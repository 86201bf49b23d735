//! The connection shared by every clone of a broker, and its recovery.
//!
//! No lock is held across a network wait: the current connection and the publishing channel
//! sit behind plain mutexes taken for a moment; one reconnect at a time is made (the others
//! wait for its outcome, each bounded by its own caller), and every connection attempt is
//! bounded by the connect timeout, so a server that accepts TCP and never answers holds nothing
//! up for longer than that.

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use lapin::options::ConfirmSelectOptions;
use lapin::{Channel, Connection, ConnectionProperties};

use crate::backoff;
use crate::broker::BrokerError;
use crate::error_chain::ErrorChain;

/// The state every clone of one [`RabbitMqBroker`](super::RabbitMqBroker) shares.
pub(super) struct Inner {
    /// Where to reconnect to.
    pub(super) uri: String,
    /// The current connection; `None` after a call on it failed or it was closed.
    connection: Mutex<Option<Arc<Connection>>>,
    /// Held by the one caller reconnecting now; the others wait for its outcome instead of
    /// dialling too.
    reconnecting: tokio::sync::Mutex<()>,
    /// Set while the connection is lost (between the Error and the Info log).
    outage: AtomicBool,
    /// The confirm-mode channel publishes go through; replaced when the server closed it.
    publisher: Mutex<Option<Channel>>,
    /// Queues declared on the current connection.
    declared: Mutex<HashSet<String>>,
    /// How long one publish may take, reconnection included.
    publish_timeout: Mutex<Duration>,
    /// How long one connection attempt (TCP and the AMQP handshake) may take.
    connect_timeout: Mutex<Duration>,
    /// Set by [`RabbitMqBroker::close`](super::RabbitMqBroker::close): nothing reconnects any
    /// more.
    pub(super) closed: AtomicBool,
}

/// Takes a lock whose critical sections are a few infallible steps: a poisoned one holds
/// consistent data.
fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// One connection attempt to `uri`, bounded by `timeout`.
pub(super) async fn open(uri: &str, timeout: Duration) -> Result<Connection, BrokerError> {
    let operation = || format!("connect to `{}`", redact(uri));
    match tokio::time::timeout(
        timeout,
        Connection::connect(uri, ConnectionProperties::default()),
    )
    .await
    {
        Ok(connected) => connected.map_err(|e| BrokerError::transport(operation(), e)),
        Err(_) => Err(BrokerError::Timeout {
            operation: operation(),
            after: timeout,
            source: None,
        }),
    }
}

impl Inner {
    /// The state of a broker whose first connection is `connection`.
    pub(super) fn new(
        uri: String,
        connection: Connection,
        publish_timeout: Duration,
        connect_timeout: Duration,
    ) -> Self {
        Self {
            uri,
            connection: Mutex::new(Some(Arc::new(connection))),
            reconnecting: tokio::sync::Mutex::new(()),
            outage: AtomicBool::new(false),
            publisher: Mutex::new(None),
            declared: Mutex::new(HashSet::new()),
            publish_timeout: Mutex::new(publish_timeout),
            connect_timeout: Mutex::new(connect_timeout),
            closed: AtomicBool::new(false),
        }
    }

    /// The current connection, if it is up.
    pub(super) fn current(&self) -> Option<Arc<Connection>> {
        lock(&self.connection)
            .as_ref()
            .filter(|connection| connection.status().connected())
            .cloned()
    }

    /// Takes the connection away (to close it); nothing reconnects once `closed` is set.
    pub(super) fn take(&self) -> Option<Arc<Connection>> {
        lock(&self.connection).take()
    }

    /// A live connection: the current one, or a new one once the broker is reachable again.
    /// Waits (with backoff) as long as it takes; callers bound the wait, and dropping this
    /// future at any point leaves no lock held.
    pub(super) async fn connection(&self) -> Result<Arc<Connection>, BrokerError> {
        let mut backoff = backoff::reconnect();
        let mut attempts = 0u32;
        loop {
            if self.closed.load(Ordering::SeqCst) {
                return Err(BrokerError::transport(
                    "connect",
                    "the broker was closed; it does not reconnect",
                ));
            }
            if let Some(connection) = self.current() {
                return Ok(connection);
            }
            {
                let _reconnecting = self.reconnecting.lock().await;
                // Another caller may have reconnected while this one waited.
                if let Some(connection) = self.current() {
                    return Ok(connection);
                }
                // The connection dropped (or a call on it failed): an outage, logged once when
                // it is seen. A closed broker has no outage.
                if !self.closed.load(Ordering::SeqCst) && !self.outage.swap(true, Ordering::SeqCst)
                {
                    tracing::error!(uri = %redact(&self.uri), "RabbitMQ connection lost; reconnecting with backoff");
                }
                match open(&self.uri, self.connect_timeout()).await {
                    Ok(connection) => {
                        tracing::info!(uri = %redact(&self.uri), failed_attempts = attempts, "RabbitMQ connection recovered");
                        let connection = Arc::new(connection);
                        *lock(&self.connection) = Some(Arc::clone(&connection));
                        lock(&self.declared).clear();
                        self.outage.store(false, Ordering::SeqCst);
                        return Ok(connection);
                    }
                    Err(error) => {
                        if attempts == 0 {
                            tracing::warn!(uri = %redact(&self.uri), error = %ErrorChain(&error), "RabbitMQ unreachable; still reconnecting with backoff");
                        } else {
                            tracing::debug!(uri = %redact(&self.uri), attempts, error = %ErrorChain(&error), "RabbitMQ still unreachable");
                        }
                        attempts += 1;
                    }
                }
            }
            // Waited without the reconnect lock: other callers may try in the meantime.
            tokio::time::sleep(backoff.next_delay()).await;
        }
    }

    /// Forgets `connection` after a call on it failed, so the next call reconnects (the client
    /// may not have noticed the drop yet).
    pub(super) fn invalidate(&self, connection: &Arc<Connection>) {
        {
            let mut current = lock(&self.connection);
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

    /// The confirm-mode publishing channel, opened again if it or its connection closed (a
    /// failed declaration closes the channel it ran on).
    pub(super) async fn publisher(&self) -> Result<Channel, BrokerError> {
        if let Some(channel) = lock(&self.publisher)
            .as_ref()
            .filter(|channel| channel.status().connected())
        {
            return Ok(channel.clone());
        }
        let connection = self.connection().await?;
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
        match opened {
            Ok(channel) => {
                // Two publishes may both have opened one; the later is kept, the other serves
                // its own publish and closes when dropped.
                *lock(&self.publisher) = Some(channel.clone());
                Ok(channel)
            }
            Err(error) => {
                self.invalidate(&connection);
                Err(error)
            }
        }
    }

    /// Whether `destination`'s queue was declared on the current connection.
    pub(super) fn is_declared(&self, destination: &str) -> bool {
        lock(&self.declared).contains(destination)
    }

    /// Records that `destination`'s queue was declared on the current connection.
    pub(super) fn declared(&self, destination: &str) {
        lock(&self.declared).insert(destination.to_owned());
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

/// `uri` without its password, for logs and error messages.
pub(super) fn redact(uri: &str) -> String {
    match (uri.find("://"), uri.rfind('@')) {
        (Some(scheme), Some(at)) if at > scheme => {
            let userinfo = &uri[scheme + 3..at];
            let user = userinfo.split(':').next().unwrap_or_default();
            format!("{}{user}:***{}", &uri[..scheme + 3], &uri[at..])
        }
        _ => uri.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn redact_hides_the_password_only() {
        assert_eq!(
            redact("amqp://guest:secret@host:5672/%2f"),
            "amqp://guest:***@host:5672/%2f"
        );
        assert_eq!(redact("amqp://host:5672"), "amqp://host:5672");
        assert_eq!(redact("not a uri @ all"), "not a uri @ all");
    }
}
