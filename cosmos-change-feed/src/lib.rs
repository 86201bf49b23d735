//! A change-feed processor for Azure Cosmos DB, on the official Rust SDK
//! ([`azure_data_cosmos`]).
//!
//! The Rust SDK reads a container's change feed but has no change-feed *processor*: nothing
//! that shares the feed between several processes, remembers how far each part of it has been
//! handled, and survives restarts and partition splits. This crate is one. It follows the
//! model of the .NET SDK's change-feed processor:
//!
//! - **Leases in a lease container.** One [`LeaseDocument`] per (processor name, feed range)
//!   in a separate lease container (partition key `/id`; several processors, and one
//!   processor on several monitored containers, may share it: see [`lease_id`]).
//!   Every lease write is guarded by the ETag read before it (`if-match`): a 412 means another
//!   instance got there first.
//! - **One lease per feed range, many instances.** Any number of instances (each with a unique
//!   instance name) run the same processor. Each renews the leases it owns every
//!   [`lease_renew_interval`](ChangeFeedProcessorOptions::lease_renew_interval); a lease not
//!   renewed for [`lease_expiry`](ChangeFeedProcessorOptions::lease_expiry) is expired (its
//!   owner presumed dead; judged by the store's clock, see [`LeaseDocument::server_timestamp`])
//!   and any instance may take it. A graceful
//!   [`shutdown`](RunningProcessor::shutdown) releases the leases (owner cleared, checkpoint
//!   kept) so others take over at their next acquire cycle instead of after the expiry.
//! - **Balancing.** Every
//!   [`lease_acquire_interval`](ChangeFeedProcessorOptions::lease_acquire_interval) an instance
//!   takes free and expired leases up to its fair share, `ceil(leases / live owners)`, and below
//!   it takes one lease from an owner holding at least two more leases than itself.
//! - **Checkpoints after the handler succeeds.** Per owned lease, one page at a time is handed
//!   to your async handler as a [`ChangeFeedBatch`], in feed order. The new continuation is
//!   written to the lease only after the handler returned `Ok` (and so after every earlier
//!   page's). While a page is handled, the previous page's checkpoint is written and, after a
//!   full page, the next one read, so a backlog waits for no store round trip between pages. At
//!   most one page is held ahead; it is dropped (read again) when the handler fails or it came
//!   back empty. A page with documents is followed by the next at once (read until caught up);
//!   only an empty read after the handler returned waits the poll interval. A page read ahead is
//!   the feed as it was during the previous page's handler: a document that handler changed
//!   comes again, in its new version, in a later page.
//! - **At-least-once delivery.** A batch can be handed over again after a handler error, a
//!   failed checkpoint, or a lease changing hands mid-batch: the handler must tolerate
//!   repeats (be idempotent).
//! - **Splits.** When a lease's feed range is no longer one of the container's feed ranges
//!   but contains several of them, its owner stops polling it, creates one lease per child
//!   range carrying the parent's checkpoint, and deletes the parent lease. Until then the
//!   lease's reads go round every child partition of its range (one page from each in turn,
//!   the lease caught up only when a whole round found nothing), so no child waits for the
//!   replacement. A range spanning several leases (a merge) keeps those leases.
//! - **Fault reports.** A processor never stops on its own. A failed read, a failed or
//!   panicking handler, a checkpoint or renewal that could not be written is a [`LeaseFault`],
//!   reported to [`ChangeFeedProcessorBuilder::on_fault`] (or logged at Error through
//!   `tracing`); the lease is retried. [`RunningProcessor::lease_statuses`] tells how each
//!   owned lease is doing.
//! - **Timeouts and backoff.** Every store call is bounded by
//!   [`store_timeout`](ChangeFeedProcessorOptions::store_timeout) and every handler call by
//!   [`handler_timeout`](ChangeFeedProcessorOptions::handler_timeout); failures back off
//!   exponentially with jitter, from the poll interval up to
//!   [`max_backoff`](ChangeFeedProcessorOptions::max_backoff), at least as long as a throttled
//!   read's `Retry-After`.
//!
//! The change feed is read in "latest version" mode: a document changed several times
//! between two reads is handed over once, in its latest state.
//!
//! [`ChangeFeedEstimator`] tells how many changed documents each lease still has to hand over
//! (those a predicate accepts), by reading the change feed after each checkpoint; it only reads.
//!
//! ```no_run
//! # async fn demo(
//! #     orders: std::sync::Arc<azure_data_cosmos::clients::ContainerClient>,
//! #     leases: std::sync::Arc<azure_data_cosmos::clients::ContainerClient>,
//! # ) -> Result<(), cosmos_change_feed::ChangeFeedError> {
//! use cosmos_change_feed::{ChangeFeedBatch, ChangeFeedProcessor};
//! use futures::FutureExt;
//!
//! // `orders` is the monitored container, `leases` the lease container (partition key `/id`).
//! let processor = ChangeFeedProcessor::builder("orders-sync", "host-1", orders, leases)
//!     .start(|batch: ChangeFeedBatch| {
//!         async move {
//!             println!("{} documents from {}", batch.documents.len(), batch.lease_token);
//!             Ok(())
//!         }
//!         .boxed()
//!     })
//!     .await?;
//! // ...
//! processor.shutdown().await;
//! # Ok(())
//! # }
//! ```
//!
//! `examples/print_batches.rs` runs a processor end to end against the SDK's in-memory
//! emulator: `cargo run -p cosmos-change-feed --example print_batches`.

mod backoff;
mod balance;
mod batch;
mod coordinator;
mod error;
mod estimator;
mod fault;
mod lease;
mod options;
mod page;
mod ranges;
mod request;
mod store;
#[cfg(feature = "test-support")]
pub mod testing;
mod worker;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use azure_data_cosmos::clients::ContainerClient;
pub use azure_data_cosmos::feed::FeedRange;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

pub use backoff::Backoff;
pub use batch::{BatchFuture, BoxError, ChangeFeedBatch, DocumentError, LeaseLost};
pub use error::{ChangeFeedError, ErrorChain, InvalidOptions, ProcessorOption};
pub use estimator::{ChangeFeedEstimator, LeaseBacklog};
pub use fault::{HandlerPanicked, HandlerTimedOut, LeaseFault, LeaseFaultStage};
pub use lease::{LeaseDocument, LeaseFeedRange, lease_id, lease_scope, read_leases, reset_leases};
pub use options::{ChangeFeedProcessorOptions, StartFrom};
pub use request::RequestError;
pub use store::StoreError;

use coordinator::{Coordinator, create_missing_leases, read_ranges};
use lease::LeaseStore;
use worker::WorkerContext;

/// The README's example, compiled as a doctest.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;

/// The change-feed processor. Start one with [`ChangeFeedProcessor::builder`].
#[derive(Debug)]
#[non_exhaustive]
pub struct ChangeFeedProcessor;

impl ChangeFeedProcessor {
    /// Prepares a processor named `processor_name` (shared by every instance that splits the
    /// work; the lease ids derive from it) running as `instance_name` (unique per live
    /// instance), reading `monitored`'s change feed and keeping its leases in `leases`
    /// (a container with partition key `/id`; the processor creates the lease documents).
    pub fn builder(
        processor_name: impl Into<String>,
        instance_name: impl Into<String>,
        monitored: Arc<ContainerClient>,
        leases: Arc<ContainerClient>,
    ) -> ChangeFeedProcessorBuilder {
        ChangeFeedProcessorBuilder {
            processor_name: processor_name.into(),
            instance_name: instance_name.into(),
            monitored,
            leases,
            options: ChangeFeedProcessorOptions::default(),
            faults: None,
            empty_reads: None,
            acquired: None,
            released: None,
        }
    }
}

/// Configures and starts a [`ChangeFeedProcessor`].
pub struct ChangeFeedProcessorBuilder {
    processor_name: String,
    instance_name: String,
    monitored: Arc<ContainerClient>,
    leases: Arc<ContainerClient>,
    options: ChangeFeedProcessorOptions,
    faults: Option<fault::FaultHandler>,
    empty_reads: Option<worker::EmptyReadHandler>,
    acquired: Option<worker::LeaseHandler>,
    released: Option<worker::LeaseHandler>,
}

impl std::fmt::Debug for ChangeFeedProcessorBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChangeFeedProcessorBuilder")
            .field("processor_name", &self.processor_name)
            .field("instance_name", &self.instance_name)
            .field("options", &self.options)
            .finish_non_exhaustive()
    }
}

impl ChangeFeedProcessorBuilder {
    /// Replaces the options (defaults: [`ChangeFeedProcessorOptions::default`]).
    pub fn options(mut self, options: ChangeFeedProcessorOptions) -> Self {
        self.options = options;
        self
    }

    /// Reports every lease fault (a failed read, a failed or panicking handler, a checkpoint or
    /// renewal that could not be written) to `handler` instead of logging it at Error. The
    /// lease is retried after the poll interval either way; a panic in `handler` is contained.
    pub fn on_fault(mut self, handler: impl Fn(&LeaseFault<'_>) + Send + Sync + 'static) -> Self {
        self.faults = Some(Arc::new(handler));
        self
    }

    /// Tells `handler` the lease token of every read that found nothing new (the lease is
    /// caught up; for a lease over several physical partitions, once a read of each found
    /// nothing), before the poll interval is waited. Such reads hand no batch to the batch
    /// handler; this is how to count them, e.g. to tell an idle lease from a stalled one. A
    /// panic in `handler` is contained.
    pub fn on_empty_read(mut self, handler: impl Fn(&str) + Send + Sync + 'static) -> Self {
        self.empty_reads = Some(Arc::new(handler));
        self
    }

    /// Tells `handler` the lease token of every lease this instance takes (free, expired, or
    /// stolen from an over-loaded instance), once its acquire was written and before its first
    /// read. A panic in `handler` is contained.
    pub fn on_lease_acquired(mut self, handler: impl Fn(&str) + Send + Sync + 'static) -> Self {
        self.acquired = Some(Arc::new(handler));
        self
    }

    /// Tells `handler` the lease token of every lease this instance stops polling: lost to
    /// another instance, given up after renewals failed for almost the expiry, split into its
    /// children, or released at shutdown. Called after its last page has finished, so per-lease
    /// state kept beside the processor can be dropped (a lease that comes back starts afresh);
    /// not called when this instance already serves the lease again by then. A panic in
    /// `handler` is contained.
    pub fn on_lease_released(mut self, handler: impl Fn(&str) + Send + Sync + 'static) -> Self {
        self.released = Some(Arc::new(handler));
        self
    }

    /// Starts the processor: checks the names and options, reads the monitored container's
    /// feed ranges, creates the missing leases, then runs in the background (the current
    /// tokio runtime) until [`RunningProcessor::shutdown`].
    ///
    /// `handler` receives every non-empty page; `Ok` checkpoints it, `Err` has the same
    /// documents handed over again after the poll interval.
    pub async fn start<H>(self, handler: H) -> Result<RunningProcessor, ChangeFeedError>
    where
        H: Fn(ChangeFeedBatch) -> BatchFuture + Send + Sync + 'static,
    {
        let processor = self.processor_name.trim().to_owned();
        let instance = self.instance_name.trim().to_owned();
        if processor.is_empty() {
            return Err(ChangeFeedError::EmptyProcessorName);
        }
        if instance.is_empty() {
            return Err(ChangeFeedError::EmptyInstanceName);
        }
        self.options.validate()?;
        let store_error = |action| {
            let processor = processor.clone();
            move |source| ChangeFeedError::Store {
                processor,
                action,
                source: Box::new(source),
            }
        };

        let scope = store::bounded(
            "read_container",
            self.options.store_timeout,
            lease_scope(&self.monitored),
        )
        .await
        .map_err(store_error("read the monitored container's resource id"))?;
        let store = LeaseStore {
            container: self.leases,
            processor: processor.clone(),
            scope: Some(scope),
            timeout: self.options.store_timeout,
        };
        store.migrate_unscoped().await.map_err(store_error(
            "move its unscoped leases to the monitored container's scope",
        ))?;
        let ranges = read_ranges(&self.monitored, false, self.options.store_timeout)
            .await
            .map_err(store_error(
                "read the feed ranges of the monitored container",
            ))?;
        let existing = store
            .list()
            .await
            .map_err(store_error("list its leases in the lease container"))?;
        create_missing_leases(&store, &existing, &ranges)
            .await
            .map_err(store_error("create its leases in the lease container"))?;

        let owned = Arc::new(Mutex::new(BTreeMap::new()));
        let ctx = WorkerContext {
            monitored: self.monitored,
            store,
            instance: instance.clone(),
            options: self.options,
            handler: Arc::new(handler),
            owned: Arc::clone(&owned),
            wake: Arc::new(tokio::sync::Notify::new()),
            faults: self
                .faults
                .unwrap_or_else(|| fault::log_fault(processor.clone())),
            empty_reads: self.empty_reads,
            acquired: self.acquired,
            released: self.released,
        };
        let shutdown = CancellationToken::new();
        let tracker = TaskTracker::new();
        tracker.spawn(Coordinator::new(ctx, shutdown.clone(), tracker.clone()).run());
        tracing::info!(
            processor = %processor,
            instance = %instance,
            feed_ranges = ranges.len(),
            "change-feed processor started"
        );
        Ok(RunningProcessor {
            processor,
            instance,
            shutdown,
            tracker,
            owned,
        })
    }
}

/// A started change-feed processor instance. Dropping it stops the processor without
/// waiting; prefer [`shutdown`](Self::shutdown).
#[derive(Debug)]
#[must_use = "dropping a RunningProcessor stops it; keep it and call `shutdown`"]
pub struct RunningProcessor {
    processor: String,
    instance: String,
    shutdown: CancellationToken,
    tracker: TaskTracker,
    owned: Arc<Mutex<BTreeMap<String, worker::LeaseProgress>>>,
}

/// What one lease this instance owns has done lately ([`RunningProcessor::lease_statuses`]).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct LeaseStatus {
    /// The lease token.
    pub lease_token: String,
    /// How long ago the lease last confirmed its position (a page handled and checkpointed, or
    /// a read that found nothing new); `None` before its first.
    pub last_checkpoint_age: Option<std::time::Duration>,
    /// The fault since then, if the lease is failing now.
    pub last_error: Option<String>,
    /// Whether that fault does not clear by itself: the service refuses the lease's reads as
    /// malformed (a continuation it does not accept), for credentials or permissions, or
    /// because the container is gone. Such a read is tried again only every `max_backoff`,
    /// reported as a fault each time, until someone acts.
    pub needs_operator: bool,
}

impl RunningProcessor {
    /// The processor name.
    pub fn processor_name(&self) -> &str {
        &self.processor
    }

    /// This instance's name (the `owner` of its leases).
    pub fn instance_name(&self) -> &str {
        &self.instance
    }

    /// The lease tokens (feed ranges, `{min}-{max}`) this instance is polling now.
    pub fn owned_leases(&self) -> Vec<String> {
        self.owned
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .keys()
            .cloned()
            .collect()
    }

    /// What each lease this instance polls has done lately, in lease-token order.
    pub fn lease_statuses(&self) -> Vec<LeaseStatus> {
        self.owned
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .map(|(lease_token, progress)| LeaseStatus {
                lease_token: lease_token.clone(),
                last_checkpoint_age: progress.last_progress.map(|at| at.elapsed()),
                last_error: progress.last_error.clone(),
                needs_operator: progress.needs_operator,
            })
            .collect()
    }

    /// Stops acquiring and polling, lets in-flight batches finish (and checkpoint), releases
    /// every owned lease (owner cleared, checkpoint kept), and returns when all of that is
    /// done: at most a handler timeout plus a few store timeouts later. See
    /// [`shutdown_within`](Self::shutdown_within) to bound it.
    pub async fn shutdown(self) {
        self.shutdown.cancel();
        self.tracker.close();
        self.tracker.wait().await;
        tracing::info!(
            processor = %self.processor,
            instance = %self.instance,
            "change-feed processor stopped"
        );
    }

    /// [`shutdown`](Self::shutdown), waiting at most `deadline` (e.g. what a container
    /// orchestrator allows between its stop signal and a kill).
    ///
    /// # Errors
    ///
    /// The deadline passed first: the leases still being served are named (in-flight handlers
    /// keep running in the background and release their leases when done, unless the process
    /// exits first; then the leases expire and other instances take them after
    /// [`lease_expiry`](ChangeFeedProcessorOptions::lease_expiry), from their last checkpoint).
    pub async fn shutdown_within(
        self,
        deadline: std::time::Duration,
    ) -> Result<(), ShutdownTimedOut> {
        self.shutdown.cancel();
        self.tracker.close();
        if tokio::time::timeout(deadline, self.tracker.wait())
            .await
            .is_ok()
        {
            tracing::info!(processor = %self.processor, instance = %self.instance, "change-feed processor stopped");
            return Ok(());
        }
        let error = ShutdownTimedOut {
            processor: self.processor.clone(),
            after: deadline,
            unreleased: self.owned_leases(),
        };
        tracing::warn!(processor = %self.processor, instance = %self.instance, error = %error, "change-feed processor shutdown passed its deadline");
        Err(error)
    }
}

/// A [`RunningProcessor::shutdown_within`] whose deadline passed before every lease was
/// released.
#[derive(Debug, Clone, thiserror::Error)]
#[error(
    "change-feed processor '{processor}' did not stop within {after:?}; leases still being served: {unreleased:?}"
)]
#[non_exhaustive]
pub struct ShutdownTimedOut {
    /// The processor name.
    pub processor: String,
    /// The deadline.
    pub after: std::time::Duration,
    /// The lease tokens whose page had not finished (they are released when it does, or
    /// expire).
    pub unreleased: Vec<String>,
}

impl Drop for RunningProcessor {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}
