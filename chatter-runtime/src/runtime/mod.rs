//! The runtime: what `start()` builds from the registrations, and the running [`Runtime`].
//!
//! | file | concern |
//! | --- | --- |
//! | `builder.rs` | [`RuntimeBuilder`]: what a runtime is given, and its settings |
//! | `start.rs` | `start()`, phase by phase: settings, the store, the commands' containers, the brokers, the relay, the consumers |
//! | `consumer/` | one command's consumer: subscribe and decode (`mod.rs`), per-key lanes (`lanes.rs`), settling (`settle.rs`), retries and dead letters (`retry.rs`) |
//! | `health.rs` | what [`Runtime::health`] reports |
//! | `idle.rs` | [`Runtime::relay_idle`] and the shutdown drain: counting what is still pending |
//! | `error.rs` | why a start or a dispatch failed |

mod builder;
mod consumer;
mod error;
mod health;
mod idle;
mod start;

pub use builder::{DEFAULT_SHUTDOWN_DRAIN, RuntimeBuilder};
pub use consumer::{
    DEFAULT_CONSUMER_CONCURRENCY, DEFAULT_DELIVERY_TIMEOUT, DEFAULT_LANE_WAIT_LIMIT,
    DEFAULT_MAX_DELIVERY_ATTEMPTS,
};
pub use error::{DispatchError, StartError};
pub use health::{ConsumerHealth, ConsumerState, Health, LeaseHealth};
pub use idle::RelayNotIdle;
pub use start::start;

use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::broker::Broker;
use crate::cosmos::charge::RequestMeter;
use crate::cosmos::{CosmosConnection, RequestCharges};
use crate::error_chain::ErrorChain;
use crate::pipeline::{Outcome, Pipeline};
use crate::registry::{CommandRegistration, DocumentReliable, Registry};
use crate::relay::host::RelayHost;

/// A started chatter runtime: consumes its commands' destinations, dispatches in process, shuts
/// down gracefully.
#[derive(Debug, Clone)]
pub struct Runtime {
    inner: Arc<Inner>,
}

struct Inner {
    registry: Registry,
    cosmos: CosmosConnection,
    broker: Arc<dyn Broker>,
    pipeline: Pipeline,
    cancel: CancellationToken,
    tracker: TaskTracker,
    relay: tokio::sync::Mutex<Option<RelayHost>>,
    consumers: Vec<health::ConsumerStatus>,
    charges: Arc<RequestMeter>,
    shutdown_drain: Duration,
    /// The containers the relay drains (what `relay_idle` counts) and its in-flight limit.
    watched: idle::Watched,
}

impl std::fmt::Debug for Inner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Runtime")
            .field("commands", &self.registry.commands().len())
            .field("cosmos", &self.cosmos)
            .finish_non_exhaustive()
    }
}

impl Runtime {
    /// A builder for a runtime.
    pub fn builder() -> RuntimeBuilder {
        RuntimeBuilder::default()
    }

    /// The commands this runtime serves, as their derives registered them.
    pub fn commands(&self) -> impl Iterator<Item = &'static CommandRegistration> + '_ {
        self.inner
            .registry
            .commands()
            .iter()
            .map(|command| command.registration)
    }

    /// The validated registrations this runtime serves (feature `test-support`).
    #[cfg(feature = "test-support")]
    pub fn registry(&self) -> &Registry {
        &self.inner.registry
    }

    /// The Cosmos connection.
    pub fn cosmos(&self) -> &CosmosConnection {
        &self.inner.cosmos
    }

    /// The broker.
    pub fn broker(&self) -> &Arc<dyn Broker> {
        &self.inner.broker
    }

    /// Handles `command` in process under the caller-supplied message id, through the same batch
    /// lifecycle as a brokered delivery. A handler that panics returns
    /// [`PipelineError::HandlerPanicked`](crate::error::PipelineError::HandlerPanicked) instead of
    /// unwinding into the caller. No delivery timeout applies: the caller awaits it.
    pub async fn dispatch<T: DocumentReliable>(
        &self,
        command: T,
        message_id: impl Into<String>,
    ) -> Result<Outcome, DispatchError> {
        let registered = self
            .inner
            .registry
            .get::<T>()
            .ok_or(DispatchError::NotRegistered {
                command: std::any::type_name::<T>(),
            })?;
        let json = serde_json::to_value(&command).map_err(DispatchError::Encode)?;
        Ok(self
            .inner
            .pipeline
            .handle(registered, json, &message_id.into(), false)
            .await?)
    }

    /// The relay's change-feed processor names and the lease tokens this instance drains now.
    pub async fn relay_leases(&self) -> Vec<(String, Vec<String>)> {
        self.inner
            .relay
            .lock()
            .await
            .as_ref()
            .map(RelayHost::owned_leases)
            .unwrap_or_default()
    }

    /// What every consumer and every lease this instance owns is doing now: back a liveness or
    /// readiness probe with [`Health::is_healthy`].
    pub async fn health(&self) -> Health {
        let consumers = self
            .inner
            .consumers
            .iter()
            .map(health::ConsumerStatus::health)
            .collect();
        let leases = self
            .inner
            .relay
            .lock()
            .await
            .as_ref()
            .map(RelayHost::lease_statuses)
            .unwrap_or_default()
            .into_iter()
            .map(|state| LeaseHealth {
                processor: state.processor,
                lease_token: state.status.lease_token,
                last_checkpoint_age: state.status.last_checkpoint_age,
                last_error: state.status.last_error,
                needs_operator: state.status.needs_operator,
                suspended: state.suspended,
                blocked: state.blocked,
                backlog: state.backlog,
                oldest_pending_age: state.sweep.and_then(|s| s.oldest_pending_age),
                stranded: state.sweep.map_or(0, |s| s.stranded),
            })
            .collect();
        Health { consumers, leases }
    }

    /// The Request Units this runtime's store requests were billed so far: per command (its
    /// batch) and per relayed message (the page reads that returned it and its stamp), from each
    /// response's request charge. Against an account, RU per relayed message and the 10,000
    /// RU/s of one physical partition bound what the relay can drain.
    pub fn request_charges(&self) -> RequestCharges {
        self.inner.charges.snapshot()
    }

    /// The leases this instance owns that are under a Drain Suspension now (their
    /// confirmations kept failing, so their pages are refused until a probe confirms), per
    /// processor; empty when none is.
    pub async fn relay_suspended_leases(&self) -> Vec<(String, Vec<String>)> {
        self.inner
            .relay
            .lock()
            .await
            .as_ref()
            .map(RelayHost::suspended_leases)
            .unwrap_or_default()
    }

    /// Waits until the relay has published every Outbox Document pending in the containers it
    /// drains (the commands' and the standalone relays'), as a test or an example waits for
    /// its events, at most `within`. It counts them (a query over every such container) every
    /// 100 ms, and only while this process's relay has no document in flight: one in flight is
    /// still pending, so a count then could not come back zero. `Duration::MAX` waits without
    /// a deadline (saturating at about 100 years).
    ///
    /// # Errors
    ///
    /// [`RelayNotIdle`]: the runtime does not relay, or documents were still pending at the
    /// deadline ([`health`](Self::health) says whether a lease is suspended or blocked), or
    /// they could not be counted.
    pub async fn relay_idle(&self, within: Duration) -> Result<(), RelayNotIdle> {
        if self.inner.relay.lock().await.is_none() {
            return Err(RelayNotIdle::NoRelay);
        }
        idle::wait_until_idle(&self.inner.watched, within).await
    }

    /// Stops consuming and waits for deliveries in progress to settle (each at most its
    /// [delivery timeout](RuntimeBuilder::delivery_timeout); one that runs out counts as a
    /// failed attempt and is republished), lets the relay publish what is pending (at most
    /// [`shutdown_drain`](RuntimeBuilder::shutdown_drain); what is left stays pending for
    /// another instance or the next start), then stops the relay: pages in flight finish and
    /// leases are released for other instances.
    ///
    /// Deliveries a consumer holds that have not started (waiting behind another delivery of
    /// their partition-key value) are returned to the broker unsettled, which delivers them
    /// again; a RabbitMQ quorum queue's last delivery among them, which the queue would drop,
    /// is dead-lettered instead (or acked, if it had committed).
    pub async fn shutdown(self) {
        self.inner.cancel.cancel();
        self.inner.tracker.close();
        self.inner.tracker.wait().await;
        let relays = self.inner.relay.lock().await.is_some();
        if relays && !self.inner.shutdown_drain.is_zero() {
            let drained =
                idle::wait_until_idle(&self.inner.watched, self.inner.shutdown_drain).await;
            if let Err(error) = drained {
                tracing::warn!(error = %ErrorChain(&error), "chatter runtime stops with outbox documents still pending; another instance or the next start relays them");
            }
        }
        // Taken out first: the lock is not held while the relay stops, so `health()` answers.
        let relay = self.inner.relay.lock().await.take();
        if let Some(relay) = relay {
            relay.shutdown().await;
        }
        tracing::info!("chatter runtime stopped");
    }
}
