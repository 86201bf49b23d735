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
//! waited for and does not hold it back once published (waits go to lower numbers only: no two
//! wait for each other). Both by the version the check read (its ETag): a retry of a command
//! whose first batch committed without an answer marks the same document again, and must not
//! pass for a later batch. (The simulation found that: seeds 7, 77 and 166.) So a burst of one
//! key's commands in one process goes out in order without the relay.
//!
//! **A check that proves it is fresh.** The query also returns the batch's own documents, as
//! witnesses: a replica that shows them had applied the batch, and so every earlier write of
//! the partition. One that misses them (a lagging region, an account below Session) is read
//! again, then the batch is left to the relay: order holds at every consistency level with one
//! write region. (The simulation found the stale check at Eventual: seeds 5013, 5016, 5039.)
//!
//! The batch's own documents go out one after another, in batch order, each stamped before the
//! next, conditional on the ETag the batch returned (a 412 is decided by
//! [`Dispatch::settle`]: no stamp overwrites another writer's verdict).
//!
//! **The relay in the same process** waits for a document whose eager dispatch is in flight
//! ([`AfterCommitInFlight`]), skips the version this path stamped, and only stamps a version
//! this path published whose stamp did not land (`Published`), so one process does not publish
//! a document twice. (The simulation found it did: seed 214.) The same record keeps the newer
//! versions of a message the relay here published that its stamp met and tried to write over
//! (a rewrite of the same message, found stamped or stamped by it), which a page read ahead
//! may hold still pending (seed 9079873). A version written and overwritten by another writer
//! between two reads of the stamp is never seen, and not kept. Another
//! process's relay can read a document before its stamp lands and publish it again: a
//! duplicate the consumer's inbox recognises by its message id.
//!
//! **Failures** never fail the command (its batch committed): the document stays pending and
//! the relay publishes it. While any lease of the container's processor is failing (failed
//! confirmations, a suspension, a refusing broker), and for [`PAUSE_AFTER_FAILURE`] after an
//! eager publish or stamp failed, every document is left to the relay, whose Drain Suspension
//! and blocked-lease state then see the failure as it meets it again.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use std::num::NonZeroU32;

use azure_data_cosmos::Query;
use azure_data_cosmos::feed::FeedScope;
use azure_data_cosmos::options::{MaxItemCountHint, QueryOptions};
use futures::StreamExt;
use serde_json::Value;
use tokio::sync::watch;
use tokio_util::task::TaskTracker;

use super::dispatch::{Dispatch, Processed, Stamp, Target};
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

/// How many times the pending check is read before it is left to the relay, when its reads do
/// not show the batch's own documents (a replica behind the commit: another region, or an
/// account below Session consistency); the pause between reads doubles from 20 ms.
const CHECK_READS: u32 = 4;

/// The pending check's page: one page holds every pending document of a key the check can
/// judge (past it, the key is left to the relay).
const CHECK_PAGE: u32 = 1000;

/// How many dispatch tasks per permit of the relay's in-flight limit may run beside the
/// commands before batches are left to the relay (128 with the default limit of 32).
const TASKS_PER_PERMIT: usize = 4;

/// How long publish after commit waits, before each new read of the pending check, for an
/// earlier document of the key another process is publishing (its stamp usually lands within
/// milliseconds) before leaving the batch to the relay: 75 ms in all.
const HOT_KEY_WAITS: [Duration; 4] = [
    Duration::from_millis(5),
    Duration::from_millis(10),
    Duration::from_millis(20),
    Duration::from_millis(40),
];

/// What the pending check read.
enum Check {
    /// The pending Outbox Documents of the key other than the batch's (ids and versions), by a
    /// read that showed the batch's own.
    Pending(Vec<(String, String)>),
    /// The read did not show all of the batch's own documents: it may be stale.
    Unwitnessed,
    /// A document of the batch was stamped already (another process's relay was first).
    SettledElsewhere,
    /// More pending documents than one page.
    ManyPending,
}

/// At most this many settled versions are remembered per container: past it the oldest are
/// forgotten first, sooner than their span (about 33 MB: 327 bytes a version, measured with a
/// counting allocator; with the default span it binds above about 166 documents a second per
/// container). A page republishes a version forgotten early only if it read that version
/// before its stamp landed and reaches it more than this many settlements later. A version
/// published whose stamp did not land stays pending, and is forgotten the same way: a relay here
/// that reaches it only after that (its lease far behind, or backing off that long) publishes it
/// again, a duplicate the consumer's inbox recognises.
const MAX_REMEMBERED: usize = 100_000;

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
    /// This version was published, and its stamp did not land: the relay here stamps it and
    /// does not publish it again.
    Published(Published),
    /// Stamped delivered over these versions, or found stamped: the batch's (publish after
    /// commit's own), and the newer versions of the same message the stamp met and tried to
    /// write over (a rewrite: the sweep's, an operator's requeue). The relay here records only
    /// the latter ([`AfterCommitInFlight::stamped_by_relay`]).
    Stamped(Vec<String>),
    /// Not published by this path (left to the relay, or its batch did not commit).
    Failed,
}

/// A version of a document this process published whose stamp did not land.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Published {
    pub(crate) version: String,
    pub(crate) message_id: String,
    pub(crate) destination: String,
}

impl Dispatched {
    fn settled(&self) -> bool {
        matches!(self, Self::Published(_) | Self::Stamped(_) | Self::Failed)
    }

    /// Whether version `etag` of the document was published by this process (stamped or not).
    fn published_as(&self, etag: &str) -> bool {
        match self {
            Self::Stamped(versions) => versions.iter().any(|version| version == etag),
            Self::Published(published) => published.version == etag,
            _ => false,
        }
    }
}

/// What this process did with the version of a document a change-feed page holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Here {
    /// Published and stamped it: nothing is left to do.
    Stamped,
    /// Published it; its stamp did not land: the relay stamps it, and publishes nothing.
    Published(Published),
    /// Nothing: the relay publishes it.
    Nothing,
}

/// A dispatch not settled yet.
struct Entry {
    /// Tells this dispatch apart from the other dispatches of the same document.
    serial: u64,
    state: watch::Receiver<Dispatched>,
}

/// The documents this process is committing and publishing after their commit, and the
/// versions it stamped or published, by identity (id and partition-key value): shared by the
/// path and the drain of one container. The drain adds the newer versions its stamps met
/// ([`stamped_by_relay`](Self::stamped_by_relay)).
///
/// Bounded by what is in flight and by settlement: a dispatch that published nothing is
/// forgotten as it settles; a version it published is remembered (as a plain value, its
/// channel gone) for a span from its settlement, long enough for every page of this process
/// that read the document before its stamp, and at most [`MAX_REMEMBERED`] of them, forgotten
/// oldest first.
#[derive(Clone)]
pub(crate) struct AfterCommitInFlight(Arc<Mutex<Record>>);

impl Default for AfterCommitInFlight {
    fn default() -> Self {
        Self::new(super::RelayOptions::default().after_commit_remembered_for())
    }
}

struct Record {
    /// Every dispatch of a document in flight, oldest first: a second copy of a command (a
    /// duplicate delivery, a retry) begins its own while the first's is still in flight or
    /// remembered, and must not hide it. (Replacing it made the relay here publish the first's
    /// document again once the copy's batch failed as a duplicate.)
    live: HashMap<String, Vec<Entry>>,
    /// The settled dispatches that published, by identity: each its serial and last state
    /// ([`Dispatched::Stamped`] or [`Dispatched::Published`]).
    published: HashMap<Arc<str>, Vec<(u64, Dispatched)>>,
    /// The same, in settlement order: when to forget each (never, past the clock's range), its
    /// identity and serial. Forgetting pops from the front, never scans the record.
    settled: VecDeque<(Option<Instant>, Arc<str>, u64)>,
    /// The next dispatch's serial.
    next: u64,
    /// How long a settled dispatch that published is remembered.
    remembered_for: Duration,
    /// At most how many settled dispatches are remembered.
    limit: usize,
}

impl Record {
    /// Dispatch `serial` of `identity` settled at `now` as `last`: it leaves the dispatches in
    /// flight, and is remembered if it published (the relay publishes a document no dispatch
    /// published as if this path had never taken it). Then forgets the remembered dispatches
    /// whose span ended by `now`, and the oldest past the limit.
    fn settle(&mut self, identity: &str, serial: u64, last: Dispatched, now: Instant) {
        if let Some(entries) = self.live.get_mut(identity) {
            entries.retain(|entry| entry.serial != serial);
            if entries.is_empty() {
                self.live.remove(identity);
            }
        }
        if matches!(last, Dispatched::Stamped(_) | Dispatched::Published(_)) {
            let identity: Arc<str> = Arc::from(identity);
            // Nearly always the one dispatch of its document: no room for more.
            self.published
                .entry(Arc::clone(&identity))
                .or_insert_with(|| Vec::with_capacity(1))
                .push((serial, last));
            let until = now.checked_add(self.remembered_for);
            self.settled.push_back((until, identity, serial));
        }
        while let Some((until, _, _)) = self.settled.front() {
            if until.is_none_or(|until| until > now) && self.settled.len() <= self.limit {
                break;
            }
            let Some((_, identity, serial)) = self.settled.pop_front() else {
                break;
            };
            if let Some(versions) = self.published.get_mut(&identity) {
                versions.retain(|(theirs, _)| *theirs != serial);
                if versions.is_empty() {
                    self.published.remove(&identity);
                }
            }
        }
    }
}

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
    /// Where its dispatch is remembered, as which document and which dispatch of it.
    record: AfterCommitInFlight,
    identity: String,
    serial: u64,
}

impl Ticket {
    fn committed(&self, etag: &str, number: u64) {
        let _ = self
            .state
            .send(Dispatched::InFlight(etag.to_owned(), number));
    }

    /// Settles the dispatch as `outcome` says: stamped (over the batch's version, and over a
    /// newer one of the same message the stamp met), published without its stamp landing, or
    /// neither.
    fn finish(self, outcome: Finished) {
        self.state.send_modify(|state| {
            *state = match (std::mem::replace(state, Dispatched::Failed), outcome) {
                (Dispatched::InFlight(etag, _), Finished::Stamped(newer)) => {
                    Dispatched::Stamped(std::iter::once(etag).chain(newer).collect())
                }
                (
                    Dispatched::InFlight(etag, _),
                    Finished::Published {
                        message_id,
                        destination,
                    },
                ) => Dispatched::Published(Published {
                    version: etag,
                    message_id,
                    destination,
                }),
                _ => Dispatched::Failed,
            }
        });
    }
}

/// How a dispatch ended, for its [`Ticket`].
enum Finished {
    /// Stamped; with the newer versions of the same message the stamp met and tried to write
    /// over.
    Stamped(Vec<String>),
    /// Published; the stamp did not land.
    Published {
        message_id: String,
        destination: String,
    },
    /// Not published.
    Failed,
}

impl Drop for Ticket {
    /// Settles the dispatch ([`Dispatched::Failed`] if unfinished) and tells the record.
    fn drop(&mut self) {
        self.state.send_if_modified(|state| {
            let unfinished = !state.settled();
            if unfinished {
                *state = Dispatched::Failed;
            }
            unfinished
        });
        let last = self.state.borrow().clone();
        self.record
            .record()
            .settle(&self.identity, self.serial, last, Instant::now());
    }
}

fn identity(id: &str, key: &[Value]) -> String {
    format!("{id}\u{0}{}", partition_key::ordering_key(key))
}

impl AfterCommitInFlight {
    fn record(&self) -> std::sync::MutexGuard<'_, Record> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A record that remembers each settled dispatch that published for `remembered_for`
    /// from its settlement.
    pub(crate) fn new(remembered_for: Duration) -> Self {
        Self(Arc::new(Mutex::new(Record {
            live: HashMap::new(),
            published: HashMap::new(),
            settled: VecDeque::new(),
            next: 0,
            remembered_for,
            limit: MAX_REMEMBERED,
        })))
    }

    /// Marks document `id` of `key` as committing: a page that reads it waits for its outcome.
    fn begin(&self, id: &str, key: &[Value]) -> Ticket {
        let (state, receiver) = watch::channel(Dispatched::Committing);
        let identity = identity(id, key);
        let serial = {
            let mut record = self.record();
            let serial = record.next;
            record.next += 1;
            record
                .live
                .entry(identity.clone())
                .or_insert_with(|| Vec::with_capacity(1))
                .push(Entry {
                    serial,
                    state: receiver,
                });
            serial
        };
        Ticket {
            state,
            record: self.clone(),
            identity,
            serial,
        }
    }

    /// Whether pending document `id` of `key`, seen at version `etag` by the check of the
    /// dispatch numbered `number`, does not hold that dispatch back: this process committed
    /// that very version later (a higher number), or earlier and this path published it
    /// (waited for while in flight), or its relay published it (a rewrite its stamp met: the
    /// relay's publish came first, then its stamp and the record). A batch still executing
    /// here is waited for first (it waits for nothing but the store), as only its outcome tells
    /// whether it wrote that version or is a retry of a command that committed it before.
    /// Anything else holds the dispatch back: a document of another process, another version,
    /// one this process did not publish.
    async fn not_holding_back(&self, id: &str, etag: &str, key: &[Value], number: u64) -> bool {
        let (live, settled) = self.seen(id, key);
        if settled.iter().any(|state| state.published_as(etag)) {
            return true;
        }
        for mut state in live {
            let _ = state
                .wait_for(|state| *state != Dispatched::Committing)
                .await;
            let earlier = match &*state.borrow() {
                settled if settled.published_as(etag) => return true,
                Dispatched::InFlight(theirs, number_of_theirs) if theirs == etag => {
                    *number_of_theirs < number
                }
                _ => continue,
            };
            return !earlier || published_as(state, etag).await;
        }
        false
    }

    /// What this process did with version `doc` (by its `_etag`) of document `id`: waits while
    /// that document's commit or dispatch is in flight here. [`Here::Nothing`] for a document
    /// this process never published, or one written again since.
    pub(crate) async fn here(&self, doc: &Value, id: &str, key: &[Value]) -> Here {
        let Some(etag) = doc.get("_etag").and_then(Value::as_str) else {
            return Here::Nothing;
        };
        let (live, mut states) = self.seen(id, key);
        let stamped = |state: &Dispatched| match state {
            Dispatched::Stamped(versions) => versions.iter().any(|v| v == etag),
            _ => false,
        };
        // Stamped wins whatever a dispatch in flight does: nothing to wait for.
        if states.iter().any(stamped) {
            return Here::Stamped;
        }
        for mut state in live {
            let _ = state.wait_for(Dispatched::settled).await;
            states.push(state.borrow().clone());
        }
        if states.iter().any(stamped) {
            return Here::Stamped;
        }
        states
            .into_iter()
            .find_map(|state| match state {
                Dispatched::Published(published) if published.version == etag => {
                    Some(Here::Published(published))
                }
                _ => None,
            })
            .unwrap_or(Here::Nothing)
    }

    /// The relay here published document `id` of `key`, and its delivered stamp met `versions`,
    /// newer than its page's, each pending and the same message (a rewrite: the stranded
    /// sweep's, an operator's requeue), and tried to write over each in turn: remembered as
    /// this path's stamps are, so a later page of this process that read one of them before
    /// the stamp (a page read ahead) does not publish the message again. (The simulation found
    /// one that did: seed 9079873.)
    pub(crate) fn stamped_by_relay(&self, id: &str, key: &[Value], versions: Vec<String>) {
        let mut record = self.record();
        let serial = record.next;
        record.next += 1;
        record.settle(
            &identity(id, key),
            serial,
            Dispatched::Stamped(versions),
            Instant::now(),
        );
    }

    /// Document `id` of `key`'s dispatches here: those in flight (their states, oldest first)
    /// and those remembered as published (their last states). Both empty if this path never
    /// took it, or forgot it.
    fn seen(&self, id: &str, key: &[Value]) -> (Vec<watch::Receiver<Dispatched>>, Vec<Dispatched>) {
        let identity = identity(id, key);
        let record = self.record();
        let live = record
            .live
            .get(&identity)
            .map(|entries| entries.iter().map(|entry| entry.state.clone()).collect())
            .unwrap_or_default();
        let settled = record
            .published
            .get(identity.as_str())
            .map(|versions| versions.iter().map(|(_, state)| state.clone()).collect())
            .unwrap_or_default();
        (live, settled)
    }
}

/// Waits until a dispatch settled; whether it published version `etag`. A dropped ticket
/// settles its state first, so the last state is always readable.
async fn published_as(mut state: watch::Receiver<Dispatched>, etag: &str) -> bool {
    let _ = state.wait_for(Dispatched::settled).await;
    state.borrow().published_as(etag)
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
    /// published. A process that dies meanwhile leaves them pending, for the relay. Past
    /// [`TASKS_PER_PERMIT`] tasks per permit of the in-flight limit (a slow broker, a burst),
    /// the batch is left to the relay instead (reason `busy`): tasks waiting for a permit
    /// would only pile up, and a page of the relay here waits for each one whose document
    /// it reads.
    pub(crate) fn spawn_publish(
        &self,
        key: Vec<Value>,
        committed: Vec<Committed>,
        tickets: Vec<Ticket>,
        number: u64,
        committed_at: Instant,
    ) {
        if self.tasks.len() >= self.limit.size().saturating_mul(TASKS_PER_PERMIT) {
            // Dropped unfinished, the tickets tell the relay here to publish them.
            drop(tickets);
            if let Some(metrics) = &self.dispatch.metrics {
                for _ in &committed {
                    metrics.after_commit(AfterCommitOutcome::Left(LeftBecause::Busy));
                }
            }
            return;
        }
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
        // Another pending document of the key holds these back, unless this process is
        // publishing it after its own commit and it gets published: a burst of one key's
        // commands in this process goes out in order without the relay. One of another
        // process (a key busy across processes) is usually stamped within milliseconds: the
        // check is read again a few times before the batch is left to the relay.
        let mut waits = HOT_KEY_WAITS.iter();
        loop {
            let others = match self.check(key, &ours).await {
                Ok(Check::Pending(others)) => others,
                Ok(Check::ManyPending) => return left(LeftBecause::EarlierPending),
                Ok(Check::SettledElsewhere) => return left(LeftBecause::SettledElsewhere),
                Ok(Check::Unwitnessed) => {
                    tracing::debug!(source_identity = %self.dispatch.source_identity, "publish after commit: the pending check's reads did not show the batch's own documents (a replica behind the commit); the relay publishes");
                    return left(LeftBecause::StaleRead);
                }
                Err(error) => {
                    tracing::warn!(source_identity = %self.dispatch.source_identity, error = %crate::error_chain::ErrorChain(&error), "publish after commit: the pending check failed; the relay publishes the batch's documents, and every document of this container for a minute");
                    self.pause();
                    return left(LeftBecause::CheckFailed);
                }
            };
            let mut held = false;
            for (other, etag) in &others {
                if !self
                    .in_flight
                    .not_holding_back(other, etag, key, number)
                    .await
                {
                    held = true;
                    break;
                }
            }
            if !held {
                break;
            }
            match waits.next() {
                Some(wait) => tokio::time::sleep(*wait).await,
                None => return left(LeftBecause::EarlierPending),
            }
        }
        let mut outcomes = Vec::with_capacity(committed.len());
        for (doc, ticket) in committed.iter().zip(tickets.iter_mut()) {
            let Some(ticket) = ticket.take() else {
                // No ETag to stamp against: the relay publishes it, and so every later one.
                break;
            };
            let (outcome, finished) = self.publish_one(key, doc, committed_at).await;
            ticket.finish(finished);
            outcomes.push(outcome);
            match outcome {
                AfterCommitOutcome::Left(_) => {
                    self.pause();
                    break;
                }
                // A newer version of it may still be pending: the rest of the batch must not
                // overtake it.
                AfterCommitOutcome::Superseded => break,
                AfterCommitOutcome::Published | AfterCommitOutcome::Undeliverable => {}
            }
        }
        // What was not tried waits for the relay, in order behind the one that stopped it.
        let behind = match outcomes.last() {
            Some(AfterCommitOutcome::Superseded) => LeftBecause::EarlierPending,
            _ => LeftBecause::PublishFailed,
        };
        outcomes.resize(committed.len(), AfterCommitOutcome::Left(behind));
        outcomes
    }

    /// Publishes and stamps one committed document: what it did, and how its dispatch ends.
    async fn publish_one(
        &self,
        key: &[Value],
        doc: &Committed,
        committed_at: Instant,
    ) -> (AfterCommitOutcome, Finished) {
        // One permit of the relay's in-flight limit, as every document the relay drains holds.
        let _permit = self.limit.permits.acquire().await.ok();
        if let Some(metrics) = &self.dispatch.metrics {
            metrics.lag_since_commit(committed_at.elapsed());
        }
        let stamp = match self.dispatch.publish(&doc.document, &doc.id, key).await {
            Ok(stamp) => stamp,
            Err(error) => {
                tracing::warn!(source_identity = %self.dispatch.source_identity, id = doc.id, error = %crate::error_chain::ErrorChain(&error), "publish after commit failed; the relay publishes the document, and every document of this container for a minute");
                return (
                    AfterCommitOutcome::Left(LeftBecause::PublishFailed),
                    Finished::Failed,
                );
            }
        };
        let published = match &stamp {
            Stamp::Delivered {
                message_id,
                destination,
            } => {
                if let Some(metrics) = &self.dispatch.metrics {
                    metrics.commit_to_publish(committed_at.elapsed());
                }
                Some(Finished::Published {
                    message_id: message_id.clone(),
                    destination: destination.clone(),
                })
            }
            Stamp::Undeliverable(_) | Stamp::Dropped => None,
        };
        let target = Target {
            id: &doc.id,
            key,
            version: doc.etag.as_deref(),
            doc: &doc.document,
        };
        match self.dispatch.settle("after-commit", target, stamp).await {
            Ok(Processed::Published { rewrites, .. }) => {
                self.dispatch.charges.relayed(1);
                // The newer versions of the message the stamp met and tried to write over.
                (AfterCommitOutcome::Published, Finished::Stamped(rewrites))
            }
            Ok(Processed::Dropped(_)) => {
                self.dispatch.charges.relayed(1);
                (AfterCommitOutcome::Published, Finished::Stamped(Vec::new()))
            }
            Ok(Processed::Undeliverable(_)) => {
                self.dispatch.charges.relayed(1);
                (
                    AfterCommitOutcome::Undeliverable,
                    Finished::Stamped(Vec::new()),
                )
            }
            // Another writer decided a newer version: nothing of it is this path's.
            Ok(Processed::Superseded) => (AfterCommitOutcome::Superseded, Finished::Failed),
            Err(error) => {
                tracing::warn!(source_identity = %self.dispatch.source_identity, id = doc.id, error = %crate::error_chain::ErrorChain(&error), "publish after commit: the stamp did not land; the relay here stamps the document it published");
                (
                    AfterCommitOutcome::Left(LeftBecause::StampFailed),
                    published.unwrap_or(Finished::Failed),
                )
            }
        }
    }

    /// The pending check, read until it shows the batch's own documents (or
    /// [`CHECK_READS`] times): the ids and versions of the pending Outbox Documents of `key`
    /// other than `ours`, or why the check cannot tell.
    /// All of it within the store timeout, as the one read it was.
    async fn check(&self, key: &[Value], ours: &[&str]) -> Result<Check, CosmosStoreError> {
        let reading = async {
            let mut read = 0;
            loop {
                let check = self.others_pending(key, ours).await?;
                read += 1;
                if !matches!(check, Check::Unwitnessed) || read == CHECK_READS {
                    return Ok(check);
                }
                tokio::time::sleep(Duration::from_millis(10 << read)).await;
            }
        };
        bounded("query_items", self.dispatch.store_timeout, reading).await
    }

    /// One read of the pending check: the pending Outbox Documents of partition key `key`,
    /// and the batch's own documents (`ours`) whatever their status, as witnesses. A read that
    /// shows all of `ours` was served by a replica that had applied the batch, so every write
    /// of the partition committed before it (a replica applies a partition's writes in commit
    /// order): whatever the account's consistency level or the region read, the check then
    /// sees every document of the key committed earlier. One that misses any of them may be
    /// stale, and tells nothing.
    async fn others_pending(
        &self,
        key: &[Value],
        ours: &[&str],
    ) -> Result<Check, CosmosStoreError> {
        const OPERATION: &str = "query_items";
        // Ids, versions and status only: the batch's own documents need not be sent back whole.
        // What the relay's pending gate reads, and the version.
        let query = Query::from(format!(
            "SELECT {GATE}, c._etag FROM c WHERE c.{KIND} = @kind AND \
             (c.{STATUS} = @pending OR ARRAY_CONTAINS(@ours, c.{ID}))",
            GATE = crate::cosmos::outbox_query::gate_fields(),
            ID = document::outbox::ID_FIELD,
            STATUS = document::outbox::STATUS_FIELD,
            KIND = document::outbox::DISCRIMINATOR_FIELD,
        ))
        .with_parameter("@kind", document::id::OUTBOX_KIND)
        .and_then(|q| q.with_parameter("@pending", STATUS_PENDING))
        .and_then(|q| q.with_parameter("@ours", ours))
        .map_err(|e| CosmosStoreError::codec(OPERATION, e))?;
        let sdk_key = partition_key::sdk_key(key)?;
        // One page: a replica serves each page, and only the page that holds the witnesses is
        // known to be fresh.
        let options = QueryOptions::default().with_max_item_count(MaxItemCountHint::Limit(
            NonZeroU32::new(CHECK_PAGE).unwrap_or(NonZeroU32::MIN),
        ));
        let read = async {
            let mut others = Vec::new();
            let mut witnessed = 0;
            let mut pages = self
                .dispatch
                .container
                .query_items::<Value>(query, FeedScope::partition(sdk_key), Some(options))
                .await
                .map_err(|e| CosmosStoreError::request(OPERATION, e))?
                .into_pages();
            let mut read = 0;
            while let Some(page) = pages.next().await {
                let page = page.map_err(|e| CosmosStoreError::request(OPERATION, e))?;
                self.dispatch
                    .charges
                    .command_extra(page.headers().request_charge().map_or(0.0, |c| c.value()));
                read += 1;
                for doc in page.into_items() {
                    let text = |field: &str| doc.get(field).and_then(Value::as_str);
                    let id = text(document::outbox::ID_FIELD).unwrap_or_default();
                    let pending = text(document::outbox::STATUS_FIELD) == Some(STATUS_PENDING);
                    if ours.contains(&id) {
                        if !pending {
                            // Stamped already: another process's relay read it first.
                            return Ok(Check::SettledElsewhere);
                        }
                        witnessed += 1;
                    } else if document::is_pending_outbox(&doc) {
                        // Exactly what the relay publishes holds the key back: a document its
                        // pending gate turns away (an id that is not the one Chatter mints for
                        // its MessageId) would hold it back for ever.
                        others.push((id.to_owned(), text("_etag").unwrap_or_default().to_owned()));
                    }
                }
            }
            Ok(if read > 1 {
                // More than one page, each perhaps from another replica: only the one holding
                // the witnesses is known to be fresh (and past a page of pending documents, the
                // relay is far behind on this key anyway).
                Check::ManyPending
            } else if witnessed < ours.len() {
                Check::Unwitnessed
            } else {
                Check::Pending(others)
            })
        };
        // Within the store timeout with the check's every read: [`check`](Self::check) bounds them.
        read.await
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

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn key() -> Vec<Value> {
        vec![json!("order-1")]
    }

    /// A dispatch of document `id` that committed as `etag` and settled as `outcome`.
    fn settled(record: &AfterCommitInFlight, id: &str, etag: &str, outcome: Finished) {
        let ticket = record.begin(id, &key());
        ticket.committed(etag, 0);
        ticket.finish(outcome);
    }

    fn stamped() -> Finished {
        Finished::Stamped(Vec::new())
    }

    /// What the record says of version `etag` of document `id`.
    async fn here(record: &AfterCommitInFlight, id: &str, etag: &str) -> Here {
        record.here(&json!({ "_etag": etag }), id, &key()).await
    }

    /// Makes the record forget what is due at `at` (as a settlement then would).
    fn tick(record: &AfterCommitInFlight, at: Instant) {
        record
            .record()
            .settle("-", u64::MAX, Dispatched::Failed, at);
    }

    /// How many dispatches the record holds, in flight or remembered.
    fn remembered(record: &AfterCommitInFlight) -> usize {
        let record = record.record();
        record.live.values().map(Vec::len).sum::<usize>()
            + record.published.values().map(Vec::len).sum::<usize>()
    }

    #[tokio::test]
    async fn a_dispatch_that_published_nothing_is_forgotten_as_it_settles() {
        let record = AfterCommitInFlight::new(Duration::from_secs(600));
        for n in 0..1000 {
            // A batch that failed (a duplicate), and one the path left to the relay.
            drop(record.begin(&format!("failed-{n}"), &key()));
            settled(&record, &format!("left-{n}"), "v1", Finished::Failed);
        }
        assert_eq!(remembered(&record), 0);
        assert!(record.record().settled.is_empty());
    }

    #[tokio::test]
    async fn a_version_this_path_published_is_remembered_for_its_span_after_settling() {
        let span = Duration::from_secs(10);
        let record = AfterCommitInFlight::new(span);
        // Begun well before it settles: the span counts from the settlement.
        let begun = Instant::now();
        let ticket = record.begin("late", &key());
        ticket.committed("v1", 0);
        std::thread::sleep(Duration::from_millis(50));
        ticket.finish(stamped());
        tick(&record, begun + span + Duration::from_millis(10));
        assert_eq!(here(&record, "late", "v1").await, Here::Stamped);
        let before = Instant::now();
        settled(&record, "a", "v1", stamped());
        settled(
            &record,
            "b",
            "v1",
            Finished::Published {
                message_id: "m-b".into(),
                destination: "events".into(),
            },
        );
        let after = Instant::now();
        tick(&record, before + span - Duration::from_millis(1));
        assert_eq!(here(&record, "a", "v1").await, Here::Stamped);
        assert!(matches!(here(&record, "b", "v1").await, Here::Published(_)));
        // Another version of it is not this path's.
        assert_eq!(here(&record, "a", "v2").await, Here::Nothing);
        tick(&record, after + span);
        assert_eq!(here(&record, "a", "v1").await, Here::Nothing);
        assert_eq!(here(&record, "b", "v1").await, Here::Nothing);
        assert_eq!(remembered(&record), 0);
    }

    #[tokio::test]
    async fn past_the_limit_the_oldest_settled_versions_are_forgotten_first() {
        let record = AfterCommitInFlight::new(Duration::from_secs(600));
        record.record().limit = 3;
        for n in 0..5 {
            settled(&record, &format!("doc-{n}"), "v1", stamped());
        }
        assert_eq!(remembered(&record), 3);
        for n in 0..2 {
            assert_eq!(
                here(&record, &format!("doc-{n}"), "v1").await,
                Here::Nothing
            );
        }
        for n in 2..5 {
            assert_eq!(
                here(&record, &format!("doc-{n}"), "v1").await,
                Here::Stamped
            );
        }
    }

    #[tokio::test]
    async fn a_dispatch_in_flight_is_never_forgotten() {
        let record = AfterCommitInFlight::new(Duration::ZERO);
        record.record().limit = 0;
        let ticket = record.begin("a", &key());
        ticket.committed("v1", 0);
        for n in 0..10 {
            settled(&record, &format!("doc-{n}"), "v1", stamped());
        }
        tick(&record, Instant::now() + Duration::from_secs(3600));
        assert_eq!(remembered(&record), 1);
        ticket.finish(stamped());
        // Settled with a span of zero: forgotten as it settles.
        assert_eq!(remembered(&record), 0);
    }

    #[test]
    fn the_span_covers_a_page_read_ahead_behind_one_that_runs_its_whole_handler_timeout() {
        let options = crate::relay::RelayOptions::default()
            .handler_timeout(Duration::from_secs(1200))
            .poll_interval(Duration::from_secs(2));
        assert_eq!(
            options.after_commit_remembered_for(),
            Duration::from_secs(2402)
        );
        let never = crate::relay::RelayOptions::default().handler_timeout(Duration::MAX);
        assert_eq!(never.after_commit_remembered_for(), Duration::MAX);
        // A span past the clock's range: kept until the limit forgets it.
        let record = AfterCommitInFlight::new(Duration::MAX);
        settled(&record, "a", "v1", stamped());
        tick(&record, Instant::now() + Duration::from_secs(3600));
        assert_eq!(remembered(&record), 1);
    }
}
