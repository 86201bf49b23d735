//! Publish after commit: the process that committed a command's batch publishes its Outbox
//! Documents at once and stamps each delivered, instead of waiting for the relay's next
//! change-feed read. The relay stays the safety net for every document this path does not
//! publish and stamp.
//!
//! It runs on a task of its own, beside the command: the delivery is acked and the next command
//! starts while the documents are published (a process that dies meanwhile leaves them pending,
//! for the relay).
//!
//! **Per-key order.** Before the batch's documents go out this way, nothing else of their
//! partition-key value may be pending: one single-partition query of the pending Outbox
//! Documents' ids right after the commit. If another is pending (an earlier eager publish
//! failed, another process committed before this one and has not published, the relay is
//! behind), every document of the batch is left to the relay, which publishes in change-feed
//! order. Except for this process's own documents: its batches of one key commit one at a time
//! (a per-key turn, which a consumer's key lane already gives) and are numbered in that order; a
//! document of a later batch does not hold an earlier one back, and one of an earlier batch is
//! waited for and does not hold it back once stamped (waits go to lower numbers only: no two
//! wait for each other). Both by the version the check read (its ETag): a retry of a command
//! whose first batch committed without an answer marks the same document again, and must not
//! pass for a later batch. (The simulation found that: seeds 7, 77 and 166.) So a burst of one key's commands in one process goes out in order
//! without the relay. The batch's own documents go out one
//! after another, in batch order, each stamped (conditional on the ETag the batch returned: a
//! 412 means another stamped it, which is as good) before the next.
//!
//! **The relay in the same process** waits for a document whose eager dispatch is in flight
//! ([`AfterCommitInFlight`]) and skips the version this path stamped, so one process does not
//! publish a document twice. Another process's relay can read a document before its stamp lands
//! and publish it again: a duplicate the consumer's inbox recognises by its message id.
//!
//! **Failures** never fail the command (its batch committed): the document stays pending and
//! the relay publishes it. While any lease of the container's processor is failing (failed
//! confirmations, a suspension, a refusing broker), and for [`PAUSE_AFTER_FAILURE`] after an
//! eager publish or stamp failed, every document is left to the relay, whose Drain Suspension
//! and blocked-lease state then see the failure as it meets it again.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use azure_data_cosmos::feed::FeedScope;
use futures::StreamExt;
use serde_json::Value;
use tokio::sync::watch;
use tokio_util::task::TaskTracker;

use super::dispatch::{Dispatch, Processed, Stamp};
use super::in_flight::InFlightLimit;
use super::suspension::DrainGate;
use crate::cosmos::CosmosStoreError;
use crate::cosmos::store::bounded;
use crate::document;
use crate::document::outbox::STATUS_PENDING;
use crate::partition_key;
use crate::telemetry::metrics::{AfterCommitOutcome, LeftBecause};

/// How long after an eager publish or stamp failed every document of the container is left to
/// the relay: the relay meets the same failure and handles it by its rules (one document at a
/// time, Drain Suspension, a blocked lease) instead of every command trying again.
pub(crate) const PAUSE_AFTER_FAILURE: Duration = Duration::from_secs(60);

/// How long the drain remembers a document version this path stamped, so a page read before
/// the stamp does not publish it again. Past a page's handler timeout and poll interval.
const REMEMBERED_FOR: Duration = Duration::from_secs(600);

/// One Outbox Document a batch committed: its id, its body as written, and the ETag the batch
/// returned for it.
#[derive(Debug, Clone)]
pub(crate) struct Committed {
    pub(crate) id: String,
    pub(crate) document: Value,
    pub(crate) etag: Option<String>,
}

/// The state of one document's dispatch after its commit.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Dispatched {
    /// Its batch is being executed.
    Committing,
    /// Committed as this version (ETag), and numbered (a later dispatch of its key may wait
    /// only for a lower number: no two wait for each other); being checked, published and
    /// stamped.
    InFlight(String, u64),
    /// This version was stamped by this path.
    Stamped(String),
    /// Not published by this path (left to the relay, or its batch did not commit).
    Failed,
}

impl Dispatched {
    fn settled(&self) -> bool {
        matches!(self, Self::Stamped(_) | Self::Failed)
    }
}

struct Entry {
    state: watch::Receiver<Dispatched>,
    since: Instant,
}

/// The documents this process is committing and publishing after their commit, and those it
/// stamped, by identity (id and partition-key value): shared by the path and the drain of one
/// container.
#[derive(Clone, Default)]
pub(crate) struct AfterCommitInFlight(Arc<Mutex<Record>>);

#[derive(Default)]
struct Record {
    /// Every dispatch of a document, oldest first: a second copy of a command (a duplicate
    /// delivery, a retry) begins its own while the first's is still in flight or remembered,
    /// and must not hide it. (Replacing it made the relay here publish the first's document
    /// again once the copy's batch failed as a duplicate.)
    entries: HashMap<String, Vec<Entry>>,
    /// When settled entries older than [`REMEMBERED_FOR`] were last dropped: at most once per
    /// [`PURGE_EVERY`], not on every commit (a scan of every entry).
    purged_at: Option<Instant>,
}

/// How often the record drops what it no longer needs to remember.
const PURGE_EVERY: Duration = Duration::from_secs(10);

impl std::fmt::Debug for AfterCommitInFlight {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AfterCommitInFlight")
            .finish_non_exhaustive()
    }
}

/// One document's dispatch, from before its batch executes to its stamp; dropped unfinished
/// (its batch failed, the path left it to the relay, the command was cancelled), it counts as
/// not published, and the relay publishes it.
pub(crate) struct Ticket {
    state: watch::Sender<Dispatched>,
}

impl Ticket {
    fn committed(&self, etag: &str, number: u64) {
        let _ = self
            .state
            .send(Dispatched::InFlight(etag.to_owned(), number));
    }

    fn finish(self, stamped: bool) {
        self.state.send_modify(|state| {
            *state = match state {
                Dispatched::InFlight(etag, _) if stamped => {
                    Dispatched::Stamped(std::mem::take(etag))
                }
                _ => Dispatched::Failed,
            }
        });
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        self.state.send_if_modified(|state| {
            let unfinished = !state.settled();
            if unfinished {
                *state = Dispatched::Failed;
            }
            unfinished
        });
    }
}

fn identity(id: &str, key: &[Value]) -> String {
    format!("{id}\u{0}{}", partition_key::ordering_key(key))
}

impl AfterCommitInFlight {
    fn record(&self) -> std::sync::MutexGuard<'_, Record> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Marks document `id` of `key` as committing: a page that reads it waits for its outcome.
    fn begin(&self, id: &str, key: &[Value]) -> Ticket {
        let (state, receiver) = watch::channel(Dispatched::Committing);
        let now = Instant::now();
        let mut record = self.record();
        if record
            .purged_at
            .is_none_or(|at| now.duration_since(at) >= PURGE_EVERY)
        {
            record.entries.retain(|_, entries| {
                entries.retain(|entry| {
                    now.duration_since(entry.since) < REMEMBERED_FOR
                        || !entry.state.borrow().settled()
                });
                !entries.is_empty()
            });
            record.purged_at = Some(now);
        }
        record
            .entries
            .entry(identity(id, key))
            .or_default()
            .push(Entry {
                state: receiver,
                since: now,
            });
        Ticket { state }
    }

    /// Whether pending document `id` of `key`, seen at version `etag` by the check of the
    /// dispatch numbered `number`, does not hold that dispatch back: this process committed
    /// that very version later (a higher number), or earlier and this path stamped it (waited
    /// for while in flight). A batch still executing here is waited for first (it waits for
    /// nothing but the store), as only its outcome tells whether it wrote that version or is a
    /// retry of a command that committed it before. Anything else holds the dispatch back: a
    /// document of another process, another version, one this path did not publish.
    async fn not_holding_back(&self, id: &str, etag: &str, key: &[Value], number: u64) -> bool {
        for mut state in self.states_of(id, key) {
            let _ = state
                .wait_for(|state| *state != Dispatched::Committing)
                .await;
            let earlier = match &*state.borrow() {
                Dispatched::Stamped(stamped) if stamped == etag => return true,
                Dispatched::InFlight(theirs, number_of_theirs) if theirs == etag => {
                    *number_of_theirs < number
                }
                _ => continue,
            };
            return !earlier || stamped_as(state, etag).await;
        }
        false
    }

    /// Whether this process stamped `doc` (this version of it, by its `_etag`) after its
    /// commit: waits while that document's commit or dispatch is in flight here. `false` for a
    /// document this path never took, one it did not publish, or one written again since.
    pub(crate) async fn stamped_here(&self, doc: &Value, id: &str, key: &[Value]) -> bool {
        let Some(etag) = doc.get("_etag").and_then(Value::as_str) else {
            return false;
        };
        for state in self.states_of(id, key) {
            if stamped_as(state, etag).await {
                return true;
            }
        }
        false
    }

    /// The states of document `id` of `key`'s dispatches here, oldest first (none if this path
    /// never took it).
    fn states_of(&self, id: &str, key: &[Value]) -> Vec<watch::Receiver<Dispatched>> {
        self.record()
            .entries
            .get(&identity(id, key))
            .map(|entries| entries.iter().map(|entry| entry.state.clone()).collect())
            .unwrap_or_default()
    }
}

/// Waits until a dispatch settled; whether it stamped version `etag`. A dropped ticket settles
/// its state first, so the last state is always readable.
async fn stamped_as(mut state: watch::Receiver<Dispatched>, etag: &str) -> bool {
    let _ = state.wait_for(Dispatched::settled).await;
    matches!(&*state.borrow(), Dispatched::Stamped(stamped) if stamped == etag)
}

/// Publish after commit for the Outbox Documents of one monitored container: the drain's
/// [`Dispatch`], gate and in-flight limit, shared with the relay of that container in this
/// process.
#[derive(Clone)]
pub(crate) struct AfterCommit {
    pub(super) dispatch: Dispatch,
    pub(super) gate: Arc<DrainGate>,
    pub(super) in_flight: AfterCommitInFlight,
    pub(super) limit: InFlightLimit,
    /// Until when every document is left to the relay, after a failure of this path (on the
    /// gate's clock).
    pub(super) paused_until: Arc<Mutex<Option<Duration>>>,
    /// The dispatches running beside the commands that committed them.
    pub(super) tasks: TaskTracker,
    /// One commit at a time per partition-key value (by ordering key).
    pub(super) turns: Turns,
}

pub(super) type Turns = Arc<Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>>;

/// This process's turn to commit a batch of one partition-key value; the key's lock is
/// forgotten once nobody holds or waits for it.
pub(crate) struct KeyTurn {
    guard: Option<tokio::sync::OwnedMutexGuard<()>>,
    turns: Turns,
    name: String,
}

impl Drop for KeyTurn {
    fn drop(&mut self) {
        drop(self.guard.take());
        let mut turns = self.turns.lock().unwrap_or_else(PoisonError::into_inner);
        if turns
            .get(&self.name)
            .is_some_and(|lock| Arc::strong_count(lock) == 1)
        {
            turns.remove(&self.name);
        }
    }
}

impl std::fmt::Debug for AfterCommit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AfterCommit")
            .field("source_identity", &self.dispatch.source_identity)
            .finish_non_exhaustive()
    }
}

impl AfterCommit {
    /// Marks the Outbox Documents `ids` of partition key `key` as committing, before their batch
    /// executes: the relay here waits for what this path does with them.
    pub(crate) fn begin(&self, key: &[Value], ids: &[String]) -> Vec<Ticket> {
        ids.iter().map(|id| self.in_flight.begin(id, key)).collect()
    }

    /// [`publish`](Self::publish) on a task of its own: the command that committed the batch
    /// goes on (its delivery is acked, the next command starts) while its documents are
    /// published. A process that dies meanwhile leaves them pending, for the relay.
    pub(crate) fn spawn_publish(
        &self,
        key: Vec<Value>,
        committed: Vec<Committed>,
        tickets: Vec<Ticket>,
        number: u64,
        committed_at: Instant,
    ) {
        let this = self.clone();
        self.tasks.spawn(async move {
            this.publish(&key, committed, tickets, number, committed_at)
                .await;
        });
    }

    /// Waits for this process's turn to commit a batch of partition key `key`: one at a time
    /// per key, so that the numbers [`committed`](Self::committed) gives follow the key's
    /// commit order. A consumer's key lane already runs one command of a key at a time; only
    /// concurrent `Runtime::dispatch` calls of one key wait here.
    pub(crate) async fn turn(&self, key: &[Value]) -> KeyTurn {
        let name = partition_key::ordering_key(key);
        let lock = Arc::clone(
            self.turns
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .entry(name.clone())
                .or_default(),
        );
        KeyTurn {
            guard: Some(lock.lock_owned().await),
            turns: Arc::clone(&self.turns),
            name,
        }
    }

    /// Numbers a batch that committed (during its [`turn`](Self::turn)) and marks its
    /// documents in flight as the versions it wrote: later dispatches of the key in this
    /// process wait for them, earlier ones do not.
    pub(crate) fn committed(&self, tickets: &[Ticket], committed: &[Committed]) -> u64 {
        static NUMBERS: AtomicU64 = AtomicU64::new(0);
        let number = NUMBERS.fetch_add(1, Ordering::Relaxed);
        for (ticket, doc) in tickets.iter().zip(committed) {
            if let Some(etag) = &doc.etag {
                ticket.committed(etag, number);
            }
        }
        number
    }

    /// Waits for the dispatches in flight (each bounded by the relay's publish and store
    /// timeouts), before the relay stops.
    pub(crate) async fn finish(&self) {
        self.tasks.close();
        self.tasks.wait().await;
    }

    /// Publishes and stamps the Outbox Documents one batch of partition key `key` committed
    /// `committed_at` (with the `tickets` [`begin`](Self::begin) gave them), in batch order, or
    /// leaves them to the relay; one outcome per document.
    pub(crate) async fn publish(
        &self,
        key: &[Value],
        committed: Vec<Committed>,
        tickets: Vec<Ticket>,
        number: u64,
        committed_at: Instant,
    ) -> Vec<AfterCommitOutcome> {
        if committed.is_empty() {
            return Vec::new();
        }
        let outcomes = self
            .publish_each(key, &committed, tickets, number, committed_at)
            .await;
        if let Some(metrics) = &self.dispatch.metrics {
            for outcome in &outcomes {
                metrics.after_commit(*outcome);
            }
        }
        outcomes
    }

    async fn publish_each(
        &self,
        key: &[Value],
        committed: &[Committed],
        tickets: Vec<Ticket>,
        number: u64,
        committed_at: Instant,
    ) -> Vec<AfterCommitOutcome> {
        let left = |because| vec![AfterCommitOutcome::Left(because); committed.len()];
        if self.paused() || self.gate.any_failing() {
            return left(LeftBecause::RelayFailing);
        }
        let mut tickets: Vec<Option<Ticket>> = tickets
            .into_iter()
            .zip(committed)
            .map(|(ticket, doc)| doc.etag.as_ref().map(|_| ticket))
            .collect();
        let ours: Vec<&str> = committed.iter().map(|doc| doc.id.as_str()).collect();
        let others = match self.others_pending(key, &ours).await {
            Ok(others) => others,
            Err(error) => {
                tracing::debug!(source_identity = %self.dispatch.source_identity, error = %crate::error_chain::ErrorChain(&error), "publish after commit: the pending check failed; the relay publishes");
                return left(LeftBecause::CheckFailed);
            }
        };
        // Another pending document of the key holds these back, unless this process is
        // publishing it after its own commit and it gets stamped: a burst of one key's commands
        // in this process goes out in order without the relay.
        for (other, etag) in &others {
            if !self
                .in_flight
                .not_holding_back(other, etag, key, number)
                .await
            {
                return left(LeftBecause::EarlierPending);
            }
        }
        let mut outcomes = Vec::with_capacity(committed.len());
        for (doc, ticket) in committed.iter().zip(tickets.iter_mut()) {
            let Some(ticket) = ticket.take() else {
                // No ETag to stamp against: the relay publishes it, and so every later one.
                break;
            };
            let outcome = self.publish_one(key, doc, committed_at).await;
            ticket.finish(matches!(
                outcome,
                AfterCommitOutcome::Published | AfterCommitOutcome::Undeliverable
            ));
            outcomes.push(outcome);
            if let AfterCommitOutcome::Left(_) = outcome {
                self.pause();
                break;
            }
        }
        // What was not tried waits for the relay, in order behind the one that failed.
        outcomes.resize(
            committed.len(),
            AfterCommitOutcome::Left(LeftBecause::PublishFailed),
        );
        outcomes
    }

    async fn publish_one(
        &self,
        key: &[Value],
        doc: &Committed,
        committed_at: Instant,
    ) -> AfterCommitOutcome {
        // One permit of the relay's in-flight limit, as every document the relay drains holds.
        let _permit = self.limit.permits.acquire().await.ok();
        if let Some(metrics) = &self.dispatch.metrics {
            metrics.lag_since_commit(committed_at.elapsed());
        }
        let stamp = match self.dispatch.publish(&doc.document, &doc.id, key).await {
            Ok(stamp) => stamp,
            Err(error) => {
                tracing::warn!(source_identity = %self.dispatch.source_identity, id = doc.id, error = %crate::error_chain::ErrorChain(&error), "publish after commit failed; the relay publishes the document, and every document of this container for a minute");
                return AfterCommitOutcome::Left(LeftBecause::PublishFailed);
            }
        };
        let published = matches!(stamp, Stamp::Delivered { .. });
        if published && let Some(metrics) = &self.dispatch.metrics {
            metrics.commit_to_publish(committed_at.elapsed());
        }
        match self
            .dispatch
            .settle("after-commit", &doc.id, key, stamp, doc.etag.as_deref())
            .await
        {
            Ok(Processed::Published(_) | Processed::Dropped(_)) => {
                self.dispatch.charges.relayed(1);
                AfterCommitOutcome::Published
            }
            Ok(Processed::Undeliverable(_)) => {
                self.dispatch.charges.relayed(1);
                AfterCommitOutcome::Undeliverable
            }
            Err(error) => {
                tracing::warn!(source_identity = %self.dispatch.source_identity, id = doc.id, error = %crate::error_chain::ErrorChain(&error), "publish after commit: the stamp did not land; the relay publishes the document again");
                AfterCommitOutcome::Left(LeftBecause::StampFailed)
            }
        }
    }

    /// The ids and versions (ETags) of the pending Outbox Documents of partition key `key`
    /// other than `ours`.
    async fn others_pending(
        &self,
        key: &[Value],
        ours: &[&str],
    ) -> Result<Vec<(String, String)>, CosmosStoreError> {
        const OPERATION: &str = "query_items";
        // Ids and versions only: the batch's own documents are pending too, and need not be
        // sent back whole.
        let query = crate::cosmos::outbox_query::outbox_query("c.id, c._etag", STATUS_PENDING)?;
        let sdk_key = partition_key::sdk_key(key)?;
        let read = async {
            let mut others = Vec::new();
            let mut pages = self
                .dispatch
                .container
                .query_items::<Value>(query, FeedScope::partition(sdk_key), None)
                .await
                .map_err(|e| CosmosStoreError::request(OPERATION, e))?
                .into_pages();
            while let Some(page) = pages.next().await {
                let page = page.map_err(|e| CosmosStoreError::request(OPERATION, e))?;
                self.dispatch
                    .charges
                    .command_extra(page.headers().request_charge().map_or(0.0, |c| c.value()));
                // Conservative: anything that looks pending under another id holds the key
                // back (one without an id too), as the relay publishes in change-feed order
                // whatever it is.
                for doc in page.into_items() {
                    let id = doc
                        .get(document::outbox::ID_FIELD)
                        .and_then(Value::as_str)
                        .unwrap_or_default();
                    if !ours.contains(&id) {
                        let etag = doc.get("_etag").and_then(Value::as_str).unwrap_or_default();
                        others.push((id.to_owned(), etag.to_owned()));
                    }
                }
            }
            Ok(others)
        };
        bounded(OPERATION, self.dispatch.store_timeout, read).await
    }

    fn paused(&self) -> bool {
        let mut until = self
            .paused_until
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        match *until {
            Some(at) if self.gate.now() < at => true,
            Some(_) => {
                *until = None;
                false
            }
            None => false,
        }
    }

    fn pause(&self) {
        *self
            .paused_until
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = Some(self.gate.now() + PAUSE_AFTER_FAILURE);
    }
}
