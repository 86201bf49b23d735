//! The faults a run injects, drawn from its seed: at the store (each instance's own port of
//! `chatter-emulator`, whose injector asks [`store_injector`]) and at the broker
//! ([`super::broker`]). Both are off until the run turns them on, and off again when it heals;
//! a cut-off ([`Cut`]) holds one instance's requests whatever the schedule says.
//!
//! **Deterministic decisions:** whether a request meets a fault, and which, is a function of
//! (seed, instance, operation, how many times that instance did that operation before): not of
//! a stream shared by threads in arrival order. A replay makes the same decisions for the same
//! requests, however the instances' threads interleave.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use chatter_emulator::{Injection, Injector, Observer};

use super::history::History;
use super::rng::Rng;

/// Faults counted by kind, for the run's report.
#[derive(Debug, Default)]
pub struct Tally(Mutex<BTreeMap<&'static str, u64>>);

impl Tally {
    pub fn add(&self, kind: &'static str) {
        *self.0.lock().unwrap().entry(kind).or_default() += 1;
    }

    pub fn snapshot(&self) -> BTreeMap<&'static str, u64> {
        self.0.lock().unwrap().clone()
    }
}

/// A schedule of faults for one concern of one instance (its store requests, its publishes,
/// its deliveries): on or off, a rate, and a decision per (operation, count).
#[derive(Debug)]
pub struct Schedule {
    on: AtomicBool,
    per_mille: u32,
    /// The seed, the instance and the concern, mixed: the base of every decision.
    base: u64,
    /// How many times each operation was decided on so far.
    counts: Mutex<BTreeMap<String, u64>>,
    pub tally: Arc<Tally>,
}

impl Schedule {
    pub fn new(base: u64, per_mille: u32, tally: Arc<Tally>) -> Arc<Self> {
        Arc::new(Self {
            on: AtomicBool::new(false),
            per_mille,
            base,
            counts: Mutex::default(),
            tally,
        })
    }

    pub fn set(&self, on: bool) {
        self.on.store(on, Ordering::SeqCst);
    }

    pub fn is_on(&self) -> bool {
        self.on.load(Ordering::SeqCst)
    }

    /// The generator for the next decision on `operation`: the same for the same
    /// (base, operation, count), whatever else ran meanwhile.
    fn next(&self, operation: &str) -> Rng {
        let mut counts = self.counts.lock().unwrap();
        let count = counts.entry(operation.to_owned()).or_default();
        let n = *count;
        *count += 1;
        Rng::new(self.base ^ fnv(operation) ^ n.wrapping_mul(0x9E37_79B9_7F4A_7C15))
    }

    /// While faults are on, a wait of up to `max_ms` for `operation` (the latency every
    /// network call has, so concurrent calls race); none while off.
    pub fn jitter(&self, operation: &str, max_ms: u64) -> Option<Duration> {
        if !self.is_on() {
            return None;
        }
        Some(self.next(&format!("jitter {operation}")).millis(0, max_ms))
    }

    /// When a fault is due for `operation` now, the generator to pick it with.
    pub fn roll<T>(&self, operation: &str, pick: impl FnOnce(&mut Rng) -> T) -> Option<T> {
        if !self.is_on() {
            return None;
        }
        let mut rng = self.next(operation);
        if !rng.chance(self.per_mille) {
            return None;
        }
        Some(pick(&mut rng))
    }
}

/// FNV-1a: an operation's name as a number, the same on every machine.
pub fn fnv(text: &str) -> u64 {
    text.bytes().fold(0xCBF2_9CE4_8422_2325, |hash, byte| {
        (hash ^ u64::from(byte)).wrapping_mul(0x0100_0000_01B3)
    })
}

/// One instance cut off from the store or the broker until a moment: its requests are held
/// (a store request is applied once the cut ends, long after its client gave up; a publish
/// reaches the broker then), as a network partition holds them.
#[derive(Debug, Default)]
pub struct Cut(Mutex<Option<Instant>>);

impl Cut {
    pub fn until(&self, at: Instant) {
        *self.0.lock().unwrap() = Some(at);
    }

    /// When the last cut ends (or ended), if there was one.
    pub fn ends(&self) -> Option<Instant> {
        *self.0.lock().unwrap()
    }

    /// How long the cut still lasts, if it does.
    pub fn remaining(&self) -> Option<Duration> {
        let until = (*self.0.lock().unwrap())?;
        until.checked_duration_since(Instant::now())
    }
}

/// One instance's port's faults as an emulator injector. Only document traffic is faulted
/// (reads, writes, batches, queries, the change feed: paths with `/docs`); the account and
/// container metadata a client reads once is left alone, as a fault there only delays a start.
/// A cut-off holds every request. Each fault is written to `history` under the instance's
/// current incarnation.
pub fn store_injector(
    slot: usize,
    schedule: Arc<Schedule>,
    cut: Arc<Cut>,
    incarnation: Arc<AtomicU64>,
    history: Arc<History>,
) -> Injector {
    Arc::new(move |method: &str, path: &str| {
        let write = method != "GET";
        let incarnation = incarnation.load(Ordering::SeqCst);
        if let Some(remaining) = cut.remaining() {
            schedule.tally.add("store cut off (held, applied later)");
            history.store_fault(slot, incarnation, method, path, "cut off");
            return Some(Injection::Delay(remaining + Duration::from_millis(20)));
        }
        if !path.contains("/docs") {
            return None;
        }
        let (kind, injection) = schedule.roll(&format!("{method} {path}"), |rng| {
            pick_store_fault(rng, write)
        })?;
        schedule.tally.add(kind);
        history.store_fault(slot, incarnation, method, path, kind);
        Some(injection)
    })
}

/// The longest a store answer is held past its client's timeout.
pub const LONGEST_HELD_ANSWER: Duration = Duration::from_millis(6_000);

/// Writes to `history` what each stamp (a patch of an Outbox Document) by instance `slot` came
/// to: the status its client got, injected or the store's own (a 410/1007 during a split).
pub fn store_observer(slot: usize, incarnation: Arc<AtomicU64>, history: Arc<History>) -> Observer {
    Arc::new(
        move |method: &str, path: &str, status: u16, sub_status: Option<u32>| {
            if method != "PATCH" {
                return;
            }
            if let Some(message_id) = super::history::outbox_message_id(path) {
                history.record(super::history::Event::Stamp {
                    who: (slot, incarnation.load(Ordering::SeqCst)),
                    message_id,
                    status,
                    sub_status,
                });
            }
        },
    )
}

fn refuse(status: u16, sub_status: Option<u32>) -> Injection {
    Injection::Refuse {
        status,
        sub_status,
        retry_after: None,
    }
}

fn pick_store_fault(rng: &mut Rng, write: bool) -> (&'static str, Injection) {
    match rng.below(if write { 11 } else { 9 }) {
        0 => ("store 408", refuse(408, None)),
        1 => ("store 410/1002", refuse(410, Some(1002))),
        2 => ("store 410/1007", refuse(410, Some(1007))),
        3 => (
            "store 429",
            Injection::Refuse {
                status: 429,
                sub_status: None,
                retry_after: Some(rng.millis(1, 30)),
            },
        ),
        4 => ("store 449", refuse(449, None)),
        5 => ("store 503", refuse(503, None)),
        6 | 7 => ("store delay", Injection::Delay(rng.millis(5, 120))),
        // Handled at once, answered past the store timeout (5 s): the client gave up, the
        // request took effect.
        8 => (
            "store answer held past the timeout",
            Injection::AnswerLate(rng.millis(5_200, LONGEST_HELD_ANSWER.as_millis() as u64)),
        ),
        // Writes only: it took effect, and the client hears a timeout or an outage.
        9 => (
            "store write applied, answer lost (408)",
            Injection::LoseAnswer { status: 408 },
        ),
        _ => (
            "store write applied, answer lost (503)",
            Injection::LoseAnswer { status: 503 },
        ),
    }
}

/// What the broker does to one publish.
#[derive(Debug, Clone, Copy)]
pub enum PublishFault {
    /// Nacked: not published.
    Refused,
    /// Published, and the confirm never came (the publisher hears a timeout).
    ConfirmLost,
    /// Published twice (a retry inside the client, or a redelivery after a lost ack).
    Duplicated,
    /// Published after a wait.
    Slow(Duration),
}

pub fn pick_publish_fault(rng: &mut Rng) -> (&'static str, PublishFault) {
    match rng.below(4) {
        0 => ("broker publish refused", PublishFault::Refused),
        1 => ("broker confirm lost", PublishFault::ConfirmLost),
        2 => ("broker message duplicated", PublishFault::Duplicated),
        _ => (
            "broker publish slow",
            PublishFault::Slow(rng.millis(5, 150)),
        ),
    }
}
