//! The faults a run injects, drawn from its seed: at the store (through `chatter-emulator`'s
//! injector, in front of the SDK's in-memory emulator) and at the broker ([`super::broker`]).
//! Both are off until the run turns them on, and off again when it heals.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use chatter_emulator::{Injection, Injector};

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

/// A schedule of faults: on or off, a rate, and its own generator.
#[derive(Debug)]
pub struct Schedule {
    on: AtomicBool,
    per_mille: u32,
    rng: Mutex<Rng>,
    pub tally: Tally,
}

impl Schedule {
    pub fn new(rng: Rng, per_mille: u32) -> Arc<Self> {
        Arc::new(Self {
            on: AtomicBool::new(false),
            per_mille,
            rng: Mutex::new(rng),
            tally: Tally::default(),
        })
    }

    pub fn set(&self, on: bool) {
        self.on.store(on, Ordering::SeqCst);
    }

    /// While faults are on, a wait of up to `max_ms` drawn for every call (the latency every
    /// network call has, so concurrent calls race); none while off.
    pub fn jitter(&self, max_ms: u64) -> Option<Duration> {
        if !self.on.load(Ordering::SeqCst) {
            return None;
        }
        Some(self.rng.lock().unwrap().millis(0, max_ms))
    }

    /// When a fault is due now, the generator to pick it with (held briefly).
    pub fn roll<T>(&self, pick: impl FnOnce(&mut Rng) -> T) -> Option<T> {
        if !self.on.load(Ordering::SeqCst) {
            return None;
        }
        let mut rng = self.rng.lock().unwrap();
        if !rng.chance(self.per_mille) {
            return None;
        }
        Some(pick(&mut rng))
    }
}

/// The store's faults as an emulator injector. Only document traffic is faulted (reads, writes,
/// batches, queries, the change feed: paths with `/docs`); the account and container metadata
/// a client reads once is left alone, as a fault there only delays a start.
pub fn store_injector(schedule: Arc<Schedule>) -> Injector {
    Arc::new(move |method: &str, path: &str| {
        if !path.contains("/docs") {
            return None;
        }
        let write = method != "GET";
        let (kind, injection) = schedule.roll(|rng| pick_store_fault(rng, write))?;
        schedule.tally.add(kind);
        Some(injection)
    })
}

fn refuse(status: u16, sub_status: Option<u32>) -> Injection {
    Injection::Refuse {
        status,
        sub_status,
        retry_after: None,
    }
}

fn pick_store_fault(rng: &mut Rng, write: bool) -> (&'static str, Injection) {
    match rng.below(if write { 10 } else { 8 }) {
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
        // Writes only: it took effect, and the client hears a timeout or an outage.
        8 => (
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
