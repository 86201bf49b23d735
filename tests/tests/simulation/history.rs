//! What happened in a run, by instance and incarnation: the faults each met, what each
//! published, the crashes, pauses, cut-offs and restarts. The invariants read it (one
//! incarnation's second publication of a document must have a reason in it), and a failing
//! run writes it out, so a violation comes with its story.

use std::fmt::Write as _;
use std::sync::Mutex;
use std::time::Instant;

/// One incarnation of one instance: `(slot, incarnation)`.
pub type Who = (usize, u64);

#[derive(Debug, Clone)]
pub enum Event {
    /// A request to the store for `path` met `fault`.
    StoreFault {
        who: Who,
        method: String,
        path: String,
        fault: &'static str,
    },
    /// A publish (chatter's call to the broker) and what came of it.
    Publish {
        who: Who,
        message_id: String,
        destination: String,
        outcome: &'static str,
    },
    /// A stamp (a patch of an Outbox Document) and the status its client got.
    Stamp {
        who: Who,
        message_id: String,
        status: u16,
        sub_status: Option<u32>,
    },
    /// A delivery's settlement met a fault, or a channel close took the delivery back.
    Settle {
        who: Who,
        message_id: String,
        what: &'static str,
    },
    /// What the harness did to an instance (started, crashed, paused, cut off, stopped), or to
    /// the run (`slot` `usize::MAX`: the broker fixed, the operator's requeue).
    Harness { slot: usize, what: String },
}

impl Event {
    fn who(&self) -> Option<Who> {
        match self {
            Self::StoreFault { who, .. }
            | Self::Publish { who, .. }
            | Self::Stamp { who, .. }
            | Self::Settle { who, .. } => Some(*who),
            Self::Harness { .. } => None,
        }
    }
}

#[derive(Debug)]
pub struct History {
    began: Instant,
    events: Mutex<Vec<(Instant, Event)>>,
    /// (instance, when its pause ends) of every pause.
    pauses_end: Mutex<Vec<(usize, Instant)>>,
}

impl Default for History {
    fn default() -> Self {
        Self {
            began: Instant::now(),
            events: Mutex::default(),
            pauses_end: Mutex::default(),
        }
    }
}

impl History {
    pub fn record(&self, event: Event) {
        self.events.lock().unwrap().push((Instant::now(), event));
    }

    pub fn store_fault(
        &self,
        slot: usize,
        incarnation: u64,
        method: &str,
        path: &str,
        fault: &'static str,
    ) {
        self.record(Event::StoreFault {
            who: (slot, incarnation),
            method: method.to_owned(),
            path: decode(path),
            fault,
        });
    }

    pub fn harness(&self, slot: usize, what: impl Into<String>) {
        self.record(Event::Harness {
            slot,
            what: what.into(),
        });
    }

    /// [`harness`](Self::harness), at `at` (kept in time order): an operator's writes are
    /// recorded when they were sent, as each may land the moment it is sent, not once every
    /// write of its plan has been answered (seed 9000456: a requeue recorded after the plan's
    /// last answer came after the publish it had asked for).
    pub fn harness_at(&self, at: Instant, slot: usize, what: impl Into<String>) {
        let mut events = self.events.lock().unwrap();
        let after = events.partition_point(|(when, _)| *when <= at);
        events.insert(
            after,
            (
                at,
                Event::Harness {
                    slot,
                    what: what.into(),
                },
            ),
        );
    }

    /// Records a pause of instance `slot` for `period`, and when it ends: a pause ordered while
    /// another of the same instance lasts starts when that one ends (its thread takes the order
    /// then; seed 7001070's second pause ended 200 ms after the harness thought, and the zombie
    /// it released published inside the quiet second).
    pub fn paused(&self, slot: usize, period: std::time::Duration, what: String) {
        let mut ends = self.pauses_end.lock().unwrap();
        let start = ends
            .iter()
            .filter(|(paused, _)| *paused == slot)
            .map(|(_, end)| *end)
            .chain([Instant::now()])
            .max()
            .unwrap_or_else(Instant::now);
        ends.push((slot, start + period));
        drop(ends);
        self.harness(slot, what);
    }

    /// When the last pause ends (or ended), if there was one.
    pub fn pauses_end(&self) -> Option<Instant> {
        self.pauses_end
            .lock()
            .unwrap()
            .iter()
            .map(|(_, end)| *end)
            .max()
    }

    pub fn events(&self) -> Vec<(Instant, Event)> {
        self.events.lock().unwrap().clone()
    }

    /// The whole story, one event per line, times from the run's start.
    pub fn text(&self) -> String {
        let mut text = String::new();
        for (at, event) in self.events() {
            let _ = write!(
                text,
                "{:>8.3}s ",
                at.duration_since(self.began).as_secs_f64()
            );
            let _ = match (&event, event.who()) {
                (Event::Harness { slot, what }, _) if *slot == usize::MAX => {
                    writeln!(text, "run: {what}")
                }
                (Event::Harness { slot, what }, _) => writeln!(text, "instance {slot}: {what}"),
                (
                    Event::StoreFault {
                        method,
                        path,
                        fault,
                        ..
                    },
                    Some((slot, inc)),
                ) => writeln!(text, "instance {slot}#{inc} store {method} {path}: {fault}"),
                (
                    Event::Publish {
                        message_id,
                        destination,
                        outcome,
                        ..
                    },
                    Some((slot, inc)),
                ) => writeln!(
                    text,
                    "instance {slot}#{inc} publish {message_id} to {destination}: {outcome}"
                ),
                (
                    Event::Stamp {
                        message_id,
                        status,
                        sub_status,
                        ..
                    },
                    Some((slot, inc)),
                ) => match sub_status {
                    Some(sub) => writeln!(
                        text,
                        "instance {slot}#{inc} stamp {message_id}: {status}/{sub}"
                    ),
                    None => writeln!(text, "instance {slot}#{inc} stamp {message_id}: {status}"),
                },
                (
                    Event::Settle {
                        message_id, what, ..
                    },
                    Some((slot, inc)),
                ) => {
                    writeln!(text, "instance {slot}#{inc} delivery {message_id}: {what}")
                }
                _ => Ok(()),
            };
        }
        text
    }
}

/// The message id of the Outbox Document a request path names (`…/docs/outbox:<unpadded
/// base64url of the message id>`, as `chatter_runtime::cosmos::outbox_id` writes it), if it
/// names one.
pub fn outbox_message_id(path: &str) -> Option<String> {
    use base64::Engine as _;
    let encoded = decode(path)
        .rsplit('/')
        .next()?
        .strip_prefix("outbox:")?
        .to_owned();
    let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(encoded)
        .ok()?;
    String::from_utf8(bytes).ok()
}

/// A request path with its percent-escapes of `:` (document ids are `outbox:…`) undone.
fn decode(path: &str) -> String {
    path.replace("%3A", ":").replace("%3a", ":")
}

#[cfg(test)]
mod tests {
    use super::outbox_message_id;

    #[test]
    fn a_stamp_path_names_the_message_id_its_document_id_encodes() {
        let id = chatter_runtime::cosmos::outbox_id("s7-place-3:placed:1").unwrap();
        let escaped = id.replace(':', "%3A");
        for path in [
            format!("/dbs/sim/colls/orders/docs/{id}"),
            format!("/dbs/sim/colls/orders/docs/{escaped}"),
        ] {
            assert_eq!(
                outbox_message_id(&path).as_deref(),
                Some("s7-place-3:placed:1")
            );
        }
        assert_eq!(outbox_message_id("/dbs/sim/colls/orders/docs"), None);
        assert_eq!(outbox_message_id("/dbs/sim/colls/orders/docs/ledger"), None);
    }
}
