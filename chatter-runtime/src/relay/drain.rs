//! The drain: what the relay does with each change-feed page of a monitored container.
//!
//! Per page (catalog 6.3's order): the [Drain Suspension](super::suspension) gate is consulted
//! once, above every document; a suspended lease's page is refused whole and not checkpointed.
//! Then per document:
//!
//! 1. Only genuine pending Outbox Documents pass the pending gate; everything else (the handler's
//!    own documents, inbox markers, delivered documents, the relay's own stamps coming back) is
//!    skipped, and so is a version this process already published and stamped (after its
//!    commit, or met by an earlier page's stamp as a rewrite of its message, this page having
//!    read it before). One that looks pending under an id that is not the outbox id of its
//!    `MessageId` (another writer's mistake) is skipped too, but logged at Warn and counted
//!    ([`diagnostics::IdMismatches`]). A standalone relay's pending filter then narrows what
//!    passes; a filter that panics fails the page before anything of it is published, so the
//!    page is read again and never checkpointed past.
//! 2. Its drain lag is recorded (admitted), then the
//!    [Outbox Document Contract](crate::document::outbox_contract) verifies it. A document whose
//!    own fields prove it can never be published, or break a protocol limit no broker setting
//!    lifts ([`BrokerError::is_permanent`], e.g. an AMQP queue name over 255 bytes), is stamped
//!    `undeliverable` (one op, no ttl), then logged at Error, and the page goes on past it.
//! 3. Otherwise it is published, and only after the broker confirmed stamped delivered with a TTL
//!    in one patch. A failed publish stamps nothing and fails the page, so the change-feed
//!    processor does not checkpoint past it: at-least-once, never lost. A broker that refuses
//!    the document because of a setting ([`BrokerError::Refused`]: a permission, a queue
//!    declared with other arguments, a size limit, no route) fails the page the same way and
//!    blocks the lease (logged at Error once, shown in health) until a page drains again: the
//!    document is never given up for a setting an operator can fix. A failed stamp after a
//!    publish is a Confirmation Failure, counted by the gate, and so is a page cancelled by the
//!    processor's handler timeout after it published.
//!
//! **Order and concurrency.** The page's pending documents are grouped by partition-key value
//! (a logical partition). Within a group they are published one after another, in change-feed
//! order, which is the only order Cosmos DB gives (per logical partition): the next document
//! once the broker confirmed the previous one, while the confirmed ones are stamped
//! concurrently. Groups run concurrently. Every document in flight (publishing or being stamped) holds one permit of an
//! [`InFlightLimit`] shared by every lease of the relay, so the broker and the RU budget see a
//! bounded load however many leases a process owns. When a document fails, its group stops and
//! the others start no new document; the page returns only after every document in flight has
//! finished, and fails as a whole: it is not checkpointed and is read again, where the pending
//! gate skips what was already stamped. So two events of one logical partition are first
//! published in the order they were written; events of different partitions may interleave. A
//! document whose stamp failed (or had not landed when the process died) is published again
//! when its page is read again, possibly after later events of its key whose stamps landed: a
//! repeat, which the consumer's inbox recognises by its message id.
//!
//! While a lease is failing (it has failed confirmations, the page is its suspension's probe,
//! or the broker refuses one of its documents) its pages are drained one document at a time
//! instead (the next starts once the previous one was stamped), stopping at the first failure,
//! so a failing page publishes one document, not one per group or per confirm: the
//! suspension's bound holds however wide the page.
//!
//! Every stamp that lands mints a [`ConfirmationReceipt`]; the page's receipts are presented to
//! the gate once, after the whole page, and a failed page counts as one Confirmation Failure when
//! any of its groups failed to confirm.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use futures::stream::{FuturesUnordered, StreamExt};
use serde_json::Value;
use tokio::sync::SemaphorePermit;

use super::after_commit::{AfterCommit, AfterCommitInFlight, Here};
use super::delivery::DeliverySettings;
use super::diagnostics;
use super::dispatch::{Dispatch, Processed, Stamp, Target};
use super::error::DrainError;
use super::in_flight::InFlightLimit;
use super::options::DEFAULT_DRAIN_TIMEOUT;
use super::resolver::{PendingFilter, ResolverFactory};
use super::suspension::{Admission, ConfirmationReceipt, DrainGate};
use crate::broker::Broker;
use crate::cosmos::ContainerClient;
use crate::cosmos::charge::RequestMeter;
use crate::document::{self, outbox};
use crate::partition_key::{self, PartitionKeyPath};
use crate::telemetry::Telemetry;
use crate::telemetry::metrics::{DrainOutcome, SourceMetrics};

/// What one page did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DrainReport {
    /// Published and stamped delivered.
    pub published: usize,
    /// Not pending Outbox Documents: left untouched.
    pub skipped: usize,
    /// Pending but never publishable: stamped `undeliverable`, not published.
    pub undeliverable: usize,
    /// Pending, but the body resolver of a standalone relay built no message for it: stamped
    /// delivered, nothing published.
    pub dropped: usize,
}

impl std::ops::AddAssign for DrainReport {
    fn add_assign(&mut self, other: Self) {
        self.published += other.published;
        self.skipped += other.skipped;
        self.undeliverable += other.undeliverable;
        self.dropped += other.dropped;
    }
}

/// A genuine pending Outbox Document of a page, its `id` (the pending gate admits only
/// documents whose `id` is a string) and the partition key read back from it, which groups it
/// and keys its stamp.
struct Pending<'a> {
    doc: &'a Value,
    id: &'a str,
    key: Vec<Value>,
}

/// The pending filter panicked on document `id`: the page fails
/// ([`DrainError::PendingFilterPanicked`]).
struct FilterPanicked {
    id: String,
    panic: String,
}

impl From<FilterPanicked> for DrainError {
    fn from(FilterPanicked { id, panic }: FilterPanicked) -> Self {
        Self::PendingFilterPanicked { id, panic }
    }
}

/// What one partition-key group of a page did.
#[derive(Default)]
struct GroupOutcome {
    report: DrainReport,
    receipt: Option<ConfirmationReceipt>,
    /// The group's failures, first first: a publish and the stamps of earlier documents still
    /// in flight may each fail.
    errors: Vec<DrainError>,
    /// A stamp of the group found the document decided since the page read it (by another
    /// process publishing the key's documents after their commit, say; or by this relay's own
    /// earlier write whose answer was lost): each later document of the group is read again
    /// before it is published, and one provably decided since is not.
    met_another: bool,
}

impl GroupOutcome {
    /// Records one document's settled stamp; a failure stops the page. Only a stamp that landed
    /// is a receipt: another writer's verdict that stood says nothing of the status write path.
    fn record(&mut self, settled: Result<Processed, DrainError>, page: &PageInFlight<'_>) {
        let minted = match settled {
            Ok(Processed::Published {
                receipt, version, ..
            }) => {
                self.report.published += 1;
                self.met_another |= version.is_none();
                receipt
            }
            Ok(Processed::Dropped(receipt)) => {
                self.report.dropped += 1;
                receipt
            }
            Ok(Processed::Undeliverable(receipt)) => {
                self.report.undeliverable += 1;
                Some(receipt)
            }
            Ok(Processed::Superseded) => {
                self.report.skipped += 1;
                self.met_another = true;
                None
            }
            Err(error) => {
                page.stop.store(true, Ordering::Release);
                self.errors.push(error);
                return;
            }
        };
        if let Some(minted) = minted {
            page.minted.store(true, Ordering::Release);
            self.receipt = Some(minted);
        }
    }
}

/// Awaits `work` while the group's stamps in flight go on (each recorded as it settles).
async fn settling<T, S>(
    work: impl Future<Output = T>,
    stamping: &mut FuturesUnordered<S>,
    outcome: &mut GroupOutcome,
    page: &PageInFlight<'_>,
) -> T
where
    S: Future<Output = Result<Processed, DrainError>>,
{
    let mut work = std::pin::pin!(work);
    loop {
        tokio::select! {
            biased;
            done = &mut work => return done,
            Some(settled) = stamping.next(), if !stamping.is_empty() => {
                outcome.record(settled, page);
            }
        }
    }
}

/// One page being drained: what its groups share, and the guard that counts the page as a
/// Confirmation Failure when it is dropped unfinished (cancelled by the processor's handler
/// timeout) after publishing messages whose stamps had not landed (each may be published again,
/// as after a refused stamp) and without any stamp of the page landing (one that landed shows
/// the store takes stamps: the page was slow, not refused, and counts nothing).
struct PageInFlight<'a> {
    gate: &'a DrainGate,
    lease_token: &'a str,
    /// Set by the first failing group: the others start no new document.
    stop: AtomicBool,
    /// Whether the lease still counts as this instance's, asked before each document starts:
    /// a process paused past its lease's give-up point resumes mid-page, and the lease's new
    /// owner may have drained these documents meanwhile.
    owned: &'a (dyn Fn() -> bool + Sync),
    /// Set when `owned` said no.
    lost: AtomicBool,
    /// Documents the broker confirmed whose stamp has not landed (yet).
    unconfirmed: AtomicUsize,
    /// Set when a stamp of the page landed (a receipt was minted).
    minted: AtomicBool,
    finished: bool,
}

impl PageInFlight<'_> {
    /// Whether the next document may start: no group failed and the lease is still held (a
    /// lost lease stops the page).
    fn goes_on(&self) -> bool {
        if self.stop.load(Ordering::Acquire) {
            return false;
        }
        if !(self.owned)() {
            self.lost.store(true, Ordering::Release);
            self.stop.store(true, Ordering::Release);
            return false;
        }
        true
    }

    /// The page ran to its end; what it did is recorded by the drain itself.
    fn finish(mut self) {
        self.finished = true;
    }
}

impl Drop for PageInFlight<'_> {
    fn drop(&mut self) {
        let unconfirmed = self.unconfirmed.load(Ordering::Acquire);
        if self.finished || unconfirmed == 0 || self.minted.load(Ordering::Acquire) {
            return;
        }
        let cancelled = DrainError::Cancelled {
            lease_token: self.lease_token.to_owned(),
            unconfirmed,
        };
        self.gate
            .record_confirmation_failure(self.lease_token, &cancelled);
    }
}

/// Drains the pages of one monitored container, for one change-feed processor.
#[derive(Clone)]
pub struct Drain {
    /// What publishes and stamps each document (publish after commit uses the same).
    dispatch: Dispatch,
    gate: Arc<DrainGate>,
    in_flight: InFlightLimit,
    /// The standalone relay's additional pending filter (narrowing only).
    pending_filter: Option<PendingFilter>,
    /// Documents that look pending under an id that is not their outbox id: warned about
    /// (rate-limited) and counted.
    id_mismatches: Arc<diagnostics::IdMismatches>,
    /// The documents this process is publishing after their commit, which the drain waits for.
    after_commit: AfterCommitInFlight,
}

impl std::fmt::Debug for Drain {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Drain")
            .field("partition_key_paths", &self.dispatch.partition_key_paths)
            .field("settings", &self.dispatch.settings)
            .field("gate", &self.gate)
            .finish_non_exhaustive()
    }
}

impl Drain {
    /// A drain for the processor `source_identity`, publishing on `broker` and stamping in
    /// `container`, whose partition-key path(s) are `partition_key_paths`; its Drain Suspension
    /// gate runs on the system clock.
    pub fn new(
        source_identity: impl Into<String>,
        broker: Arc<dyn Broker>,
        container: Arc<ContainerClient>,
        partition_key_paths: &'static [PartitionKeyPath],
        settings: DeliverySettings,
    ) -> Self {
        let gate = Arc::new(DrainGate::new(source_identity));
        Self {
            dispatch: Dispatch {
                source_identity: Arc::from(gate.source_identity()),
                broker,
                container,
                partition_key_paths,
                settings,
                publish_timeout: DEFAULT_DRAIN_TIMEOUT,
                store_timeout: DEFAULT_DRAIN_TIMEOUT,
                charges: Arc::default(),
                metrics: None,
                tracer: None,
                resolver: None,
            },
            gate,
            in_flight: InFlightLimit::default(),
            pending_filter: None,
            id_mismatches: Arc::default(),
            after_commit: AfterCommitInFlight::default(),
        }
    }

    /// Builds each admitted document's message with a resolver from `factory` instead of
    /// reading it from the document (the standalone relay's resolver path).
    pub(crate) fn with_resolver(mut self, factory: Option<Arc<dyn ResolverFactory>>) -> Self {
        self.dispatch.resolver = factory;
        self
    }

    /// Remembers each version publish after commit published for `span` after it settled
    /// ([`RelayOptions::after_commit_remembered_for`](super::RelayOptions)).
    pub(crate) fn with_after_commit_remembered_for(mut self, span: Duration) -> Self {
        self.after_commit = AfterCommitInFlight::new(span);
        self
    }

    /// Admits only the pending documents `filter` also accepts (evaluated once per document).
    pub(crate) fn with_pending_filter(mut self, filter: Option<PendingFilter>) -> Self {
        self.pending_filter = filter;
        self
    }

    /// Whether a pending document passes the additional filter: evaluated exactly once. A
    /// filter that panics fails the page (as a throwing filter fails the batch in .NET), so the
    /// document is read again rather than checkpointed past.
    fn passes_filter(&self, doc: &Value, id: &str) -> Result<bool, FilterPanicked> {
        let Some(filter) = &self.pending_filter else {
            return Ok(true);
        };
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| filter(doc))).map_err(|panic| {
            FilterPanicked {
                id: id.to_owned(),
                panic: crate::error_chain::panic_message(panic.as_ref()),
            }
        })
    }

    /// Records the drain's metrics and publishes under `send` spans with `telemetry` (default:
    /// neither).
    pub(crate) fn with_telemetry(mut self, telemetry: &Telemetry) -> Self {
        self.dispatch.metrics = telemetry.metrics.as_ref().map(|instruments| {
            Arc::new(SourceMetrics::new(
                Arc::clone(instruments),
                self.gate.source_identity(),
            ))
        });
        if let Some(metrics) = &self.dispatch.metrics {
            self.gate.record_on(Arc::clone(metrics));
        }
        self.dispatch.tracer.clone_from(&telemetry.tracer);
        self
    }

    /// The metrics of this drain's source, when metrics are on.
    pub(crate) fn metrics(&self) -> Option<&Arc<SourceMetrics>> {
        self.dispatch.metrics.as_ref()
    }

    /// Sums what the stamps are billed, and the documents stamped, in `charges` (the
    /// runtime's), instead of a meter of its own.
    pub(crate) fn with_request_meter(mut self, charges: Arc<RequestMeter>) -> Self {
        self.dispatch.charges = charges;
        self
    }

    /// Takes a permit of `limit` for every document in flight, instead of a limit of its own
    /// (32 by default): the relay gives every drain of a process the same limit.
    pub fn with_in_flight_limit(mut self, limit: InFlightLimit) -> Self {
        self.in_flight = limit;
        self
    }

    /// Bounds each publish (broker confirm included) by `publish` and each stamp by `store`
    /// (defaults `DEFAULT_DRAIN_TIMEOUT`). A publish past its bound fails the page like any
    /// failed publish; a stamp past its bound is a failed stamp.
    pub fn with_timeouts(mut self, publish: Duration, store: Duration) -> Self {
        self.dispatch.publish_timeout = publish;
        self.dispatch.store_timeout = store;
        self
    }

    #[cfg(feature = "test-support")]
    /// The same drain with its gate on `clock` (and no suspension state).
    pub fn with_clock(mut self, clock: Arc<dyn super::suspension::MonotonicClock>) -> Self {
        self.gate = Arc::new(DrainGate::with_clock(
            self.gate.source_identity().to_owned(),
            clock,
        ));
        if let Some(metrics) = &self.dispatch.metrics {
            self.gate.record_on(Arc::clone(metrics));
        }
        self
    }

    /// The Drain Suspension gate of this drain's processor.
    pub fn gate(&self) -> &Arc<DrainGate> {
        &self.gate
    }

    /// Drains one page of `lease_token`: its partition-key groups concurrently, each in order
    /// (one document at a time while the lease is failing: see the module docs); fails when any
    /// group failed, after every document in flight has finished, so nothing of a failed page
    /// is checkpointed.
    #[cfg(feature = "test-support")]
    pub async fn drain(
        &self,
        lease_token: &str,
        documents: &[Value],
    ) -> Result<DrainReport, DrainError> {
        self.drain_while_owned(lease_token, documents, std::future::pending())
            .await
    }

    /// [`drain`](Self::drain), stopped when `lost` completes (the lease went to another
    /// instance): no document is started after that, the documents in flight finish (a
    /// publish and its stamp), and the page fails with [`DrainError::LeaseLost`] so nothing
    /// of it counts as drained; the new owner reads it again. A page that drained completely
    /// before the loss was noticed succeeds. The loss is noticed whenever the page waits (for
    /// a broker's confirm, a stamp or an in-flight permit); a processor's page also asks its
    /// lease before each document.
    #[cfg(feature = "test-support")]
    pub async fn drain_while_owned(
        &self,
        lease_token: &str,
        documents: &[Value],
        lost: impl Future<Output = ()>,
    ) -> Result<DrainReport, DrainError> {
        self.drain_page(lease_token, documents, lost, &|| true)
            .await
    }

    /// `drain_while_owned` for a change-feed processor's page, stopped when its lease is lost:
    /// the lease is also asked before each document starts (a lease that went unwritten past its
    /// give-up point counts as lost at once, though no timer has fired since).
    pub(crate) async fn drain_leased(
        &self,
        lease_token: &str,
        documents: &[Value],
        lease: &cosmos_change_feed::LeaseLost,
    ) -> Result<DrainReport, DrainError> {
        self.drain_page(lease_token, documents, lease.lost(), &|| !lease.is_lost())
            .await
    }

    async fn drain_page(
        &self,
        lease_token: &str,
        documents: &[Value],
        lost: impl Future<Output = ()>,
        owned: &(dyn Fn() -> bool + Sync),
    ) -> Result<DrainReport, DrainError> {
        // Recorded before the gate: a suspended lease's refused page was still handed over.
        if let Some(metrics) = &self.dispatch.metrics {
            metrics.batch(lease_token, documents.len());
        }
        let admission = self.gate.admit(lease_token);
        if admission == Admission::Refused {
            return Err(DrainError::Suspended {
                lease_token: lease_token.to_owned(),
            });
        }
        let (groups, skipped) = self.groups(documents)?;
        // Counts a page cancelled (by the processor's handler timeout) after it published.
        let page = PageInFlight {
            gate: &self.gate,
            lease_token,
            stop: AtomicBool::new(false),
            owned,
            lost: AtomicBool::new(false),
            unconfirmed: AtomicUsize::new(0),
            minted: AtomicBool::new(false),
            finished: false,
        };
        let (outcomes, lease_lost) = self.drain_groups(&page, &groups, admission, lost).await;
        page.finish();
        self.settle_page(lease_token, outcomes, skipped, lease_lost)
    }

    /// Drains the page's groups (one at a time for a lease on probation, else all at once)
    /// until they finish or `lost` completes: then nothing new starts, and what is in flight
    /// finishes, so no stamp is cut off. Whether the lease was lost.
    async fn drain_groups(
        &self,
        page: &PageInFlight<'_>,
        groups: &[Vec<Pending<'_>>],
        admission: Admission,
        lost: impl Future<Output = ()>,
    ) -> (Vec<GroupOutcome>, bool) {
        let work = async {
            match admission {
                Admission::OneAtATime => {
                    let mut outcomes = Vec::with_capacity(groups.len());
                    for group in groups {
                        outcomes.push(self.drain_group(page, group, false).await);
                        if page.stop.load(Ordering::Acquire) {
                            break;
                        }
                    }
                    outcomes
                }
                _ => {
                    futures::future::join_all(
                        groups
                            .iter()
                            .map(|group| self.drain_group(page, group, true)),
                    )
                    .await
                }
            }
        };
        tokio::pin!(work);
        tokio::select! {
            // The loss first: once it is known, no further document starts.
            biased;
            () = lost => {
                page.stop.store(true, Ordering::Release);
                (work.await, true)
            }
            outcomes = &mut work => {
                let lost = page.lost.load(Ordering::Acquire);
                (outcomes, lost)
            }
        }
    }

    /// The page's report from its groups' outcomes, or its first failure (a lost lease first):
    /// confirmation failures and refusals recorded with the gate once per page, the other
    /// failures logged.
    // The same error `drain_while_owned` returns as it is (a sync phase of an async function,
    // which the lint does not look at).
    #[allow(clippy::result_large_err)]
    fn settle_page(
        &self,
        lease_token: &str,
        outcomes: Vec<GroupOutcome>,
        skipped: usize,
        lease_lost: bool,
    ) -> Result<DrainReport, DrainError> {
        let mut report = DrainReport {
            skipped,
            ..DrainReport::default()
        };
        let mut receipt = None;
        let mut failures = Vec::new();
        for outcome in outcomes {
            report += outcome.report;
            receipt = receipt.or(outcome.receipt);
            failures.extend(outcome.errors);
        }
        // Stamps that landed count whether or not the page failed: they are done either way.
        self.dispatch.charges.relayed(
            u64::try_from(report.published + report.undeliverable + report.dropped)
                .unwrap_or(u64::MAX),
        );
        if lease_lost {
            // The page's own failures (if any) are the new owner's to meet again.
            failures.insert(
                0,
                DrainError::LeaseLost {
                    lease_token: lease_token.to_owned(),
                },
            );
        }
        let mut failures = failures.into_iter();
        let Some(first) = failures.next() else {
            self.gate.record_confirmation_success(lease_token, receipt);
            return Ok(report);
        };
        let rest: Vec<DrainError> = failures.collect();
        let all = || std::iter::once(&first).chain(&rest);
        // One Confirmation Failure per failed page, however many of its groups failed to confirm.
        if let Some(source) = all().find_map(|error| match error {
            DrainError::Confirmation { source, .. } => Some(source),
            _ => None,
        }) {
            self.gate.record_confirmation_failure(lease_token, source);
        }
        if let Some(refused) = all().find(|error| {
            matches!(
                error,
                DrainError::Refused { .. } | DrainError::ResolvedMessageRefused { .. }
            )
        }) {
            self.gate.record_refusal(lease_token, refused);
        }
        // The first failure fails the page (and is logged with it); the others are logged here.
        for other in &rest {
            diagnostics::page_failure_also(self.gate.source_identity(), lease_token, other);
        }
        Err(first)
    }

    /// The page's pending Outbox Documents grouped by partition-key value, in change-feed order
    /// (groups by their first document), and how many documents were skipped: the pending gate,
    /// applied once per document here. Fails when the pending filter panicked on a document.
    fn groups<'a>(
        &self,
        documents: &'a [Value],
    ) -> Result<(Vec<Vec<Pending<'a>>>, usize), FilterPanicked> {
        let mut groups: Vec<Vec<Pending<'a>>> = Vec::new();
        let mut index: HashMap<String, usize> = HashMap::new();
        let mut skipped = 0;
        for doc in documents {
            let id = doc.get(outbox::ID_FIELD).and_then(Value::as_str);
            let pending = document::is_pending_outbox(doc);
            if !pending && let Some(mismatch) = outbox::id_mismatch(doc) {
                self.id_mismatches.found(
                    self.dispatch.metrics.as_deref(),
                    self.gate.source_identity(),
                    &mismatch,
                );
            }
            let admitted = pending && self.passes_filter(doc, id.unwrap_or_default())?;
            let (true, Some(id)) = (admitted, id) else {
                skipped += 1;
                if let Some(metrics) = &self.dispatch.metrics {
                    metrics.document(DrainOutcome::Skipped);
                }
                continue;
            };
            let key = partition_key::read_back_or_null(doc, self.dispatch.partition_key_paths);
            let next = groups.len();
            let at = *index
                .entry(partition_key::ordering_key(&key))
                .or_insert(next);
            if at == next {
                groups.push(Vec::new());
            }
            groups[at].push(Pending { doc, id, key });
        }
        Ok((groups, skipped))
    }

    /// Drains one group's documents in change-feed order, each holding an in-flight permit
    /// from its publish until its stamp landed. `pipelined`: the next document is published as
    /// soon as the broker confirmed the previous one, while the stamps of the confirmed ones
    /// run concurrently (the broker sees the group's order, and a crash republishes what was not
    /// stamped yet); otherwise (a failing lease) a document starts only once the previous one
    /// was stamped. Stops at its first failure, or before its next document once another
    /// group's failure stopped the page; the stamps in flight always finish.
    async fn drain_group(
        &self,
        page: &PageInFlight<'_>,
        group: &[Pending<'_>],
        pipelined: bool,
    ) -> GroupOutcome {
        let mut outcome = GroupOutcome::default();
        let mut stamping = FuturesUnordered::new();
        for pending in group {
            if !page.goes_on() {
                break;
            }
            // Published after its commit by this process (waited for while in flight): this
            // version is stamped, or its stamp did not land and it is only to be stamped (a
            // document the relay itself published and failed to stamp is published again, as
            // the catalog's Drain Suspension rows count). Or a newer version an earlier page's
            // stamp met (a rewrite of the message it published), read by this page before that
            // stamp: stamped.
            let here = self
                .after_commit
                .here(pending.doc, pending.id, &pending.key);
            let here = settling(here, &mut stamping, &mut outcome, page).await;
            if here == Here::Stamped {
                outcome.report.skipped += 1;
                continue;
            }
            // Another writer decides this key's documents too: one provably decided since the
            // page read it is not published again (a duplicate spared, one point read each).
            if outcome.met_another && here == Here::Nothing {
                let decided = self
                    .dispatch
                    .decided_since(pending.doc, pending.id, &pending.key);
                if settling(decided, &mut stamping, &mut outcome, page).await {
                    outcome.report.skipped += 1;
                    continue;
                }
            }
            // The semaphore is never closed; without a permit the document would still be
            // drained, so an `Err` cannot lose anything.
            let acquiring = self.in_flight.permits.acquire();
            let permit = settling(acquiring, &mut stamping, &mut outcome, page)
                .await
                .ok();
            if !page.goes_on() {
                break;
            }
            let publishing = async {
                match here {
                    Here::Published(published) => Ok(Stamp::Delivered {
                        message_id: published.message_id,
                        destination: published.destination,
                    }),
                    _ => {
                        self.dispatch
                            .publish(pending.doc, pending.id, &pending.key)
                            .await
                    }
                }
            };
            match settling(publishing, &mut stamping, &mut outcome, page).await {
                Ok(stamp) => {
                    if matches!(stamp, Stamp::Delivered { .. }) {
                        page.unconfirmed.fetch_add(1, Ordering::AcqRel);
                    }
                    // Stamped even when the page stopped meanwhile: it was published, and
                    // every stamp that lands is one republish fewer.
                    let settle = self.settle(page, pending, stamp, permit);
                    if pipelined {
                        stamping.push(settle);
                    } else {
                        outcome.record(settle.await, page);
                    }
                }
                Err(error) => {
                    page.stop.store(true, Ordering::Release);
                    outcome.errors.push(error);
                    break;
                }
            }
        }
        while let Some(settled) = stamping.next().await {
            outcome.record(settled, page);
        }
        outcome
    }

    /// Writes the stamp a document's publish step called for, holding its in-flight permit
    /// until the stamp landed or failed.
    async fn settle(
        &self,
        page: &PageInFlight<'_>,
        pending: &Pending<'_>,
        stamp: Stamp,
        permit: Option<SemaphorePermit<'_>>,
    ) -> Result<Processed, DrainError> {
        let _permit = permit;
        let target = Target {
            id: pending.id,
            key: &pending.key,
            version: pending.doc.get("_etag").and_then(Value::as_str),
            doc: pending.doc,
        };
        let settled = self.dispatch.settle(page.lease_token, target, stamp).await;
        if let Ok(Processed::Published { rewrites, .. }) = &settled {
            page.unconfirmed.fetch_sub(1, Ordering::AcqRel);
            // The stamp met newer versions of the message: a later page may hold them still
            // pending (read before the stamp), and must skip them.
            if !rewrites.is_empty() {
                self.after_commit
                    .stamped_by_relay(pending.id, &pending.key, rewrites.clone());
            }
        }
        settled
    }

    /// Publish after commit for this drain's container: its dispatch, gate and in-flight limit,
    /// and the record of what it has in flight, which this drain waits for.
    pub(crate) fn after_commit(&self) -> AfterCommit {
        AfterCommit {
            dispatch: self.dispatch.clone(),
            gate: Arc::clone(&self.gate),
            in_flight: self.after_commit.clone(),
            limit: self.in_flight.clone(),
            paused_until: Arc::default(),
            tasks: tokio_util::task::TaskTracker::new(),
            turns: Arc::default(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_in_flight_limit_past_what_a_semaphore_counts_is_no_panic() {
        assert_eq!(
            InFlightLimit::new(usize::MAX).available(),
            tokio::sync::Semaphore::MAX_PERMITS
        );
        assert_eq!(InFlightLimit::new(0).available(), 1);
    }
}
