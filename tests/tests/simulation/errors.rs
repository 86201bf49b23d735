//! The instances' Error logs, by seed: a stall must have been said at Error, and some Error
//! logs (a stranded document) are violations by themselves.
//!
//! One `tracing` layer for the whole test binary records every Error event logged on an
//! instance's thread (named `sim-<seed>-<run>-<instance>`: each instance's tasks run on its own
//! current-thread runtime), by seed and run: runs side by side keep their logs apart, two runs
//! of one seed included (the regression seeds run twice at once; keyed by seed alone, one run
//! took the other's logs, and a relay's logged stamp failure went missing from its run).

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::Mutex;
use std::time::Instant;

use tracing::field::{Field, Visit};
use tracing::{Event, Subscriber};
use tracing_subscriber::layer::{Context, Layer};

/// One Error event of an instance.
#[derive(Debug, Clone)]
pub struct Logged {
    pub at: Instant,
    pub instance: String,
    /// The message, then every other field as `name=value`.
    pub text: String,
}

static LOGGED: Mutex<BTreeMap<(u64, u64), Vec<Logged>>> = Mutex::new(BTreeMap::new());

/// Takes the Error logs of the instances of run `run` of `seed`.
pub fn take(seed: u64, run: u64) -> Vec<Logged> {
    LOGGED
        .lock()
        .unwrap()
        .remove(&(seed, run))
        .unwrap_or_default()
}

/// The layer that records them; install it with a `LevelFilter::ERROR` filter.
pub struct Recorder;

impl<S: Subscriber> Layer<S> for Recorder {
    fn on_event(&self, event: &Event<'_>, _: Context<'_, S>) {
        let thread = std::thread::current();
        let Some(name) = thread.name() else { return };
        let mut parts = name.strip_prefix("sim-").unwrap_or_default().split('-');
        let (Some(Ok(seed)), Some(Ok(run))) = (
            parts.next().map(str::parse::<u64>),
            parts.next().map(str::parse::<u64>),
        ) else {
            return;
        };
        let mut text = Text::default();
        event.record(&mut text);
        LOGGED
            .lock()
            .unwrap()
            .entry((seed, run))
            .or_default()
            .push(Logged {
                at: Instant::now(),
                instance: name.to_owned(),
                text: format!("{}{}", text.message, text.fields),
            });
    }
}

#[derive(Default)]
struct Text {
    message: String,
    fields: String,
}

impl Visit for Text {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        if field.name() == "message" {
            let _ = write!(self.message, "{value:?}");
        } else {
            let _ = write!(self.fields, " {}={value:?}", field.name());
        }
    }
}

#[cfg(test)]
mod tests {
    use tracing_subscriber::prelude::*;

    use super::{Recorder, take};

    /// Logs one Error on a thread named as an instance of run `run` of seed 7.
    fn log_on_instance_of_run(run: u64) {
        std::thread::Builder::new()
            .name(format!("sim-7-{run}-0"))
            .spawn(move || {
                let subscriber = tracing_subscriber::registry().with(Recorder);
                tracing::subscriber::with_default(subscriber, || {
                    tracing::error!(run, "a stamp failed");
                });
            })
            .unwrap()
            .join()
            .unwrap();
    }

    #[test]
    fn two_runs_of_one_seed_keep_their_error_logs_apart() {
        log_on_instance_of_run(900_001);
        log_on_instance_of_run(900_002);
        let first = take(7, 900_001);
        assert_eq!(first.len(), 1, "{first:?}");
        assert!(first[0].text.contains("run=900001"), "{first:?}");
        let second = take(7, 900_002);
        assert_eq!(second.len(), 1, "{second:?}");
        assert!(second[0].text.contains("run=900002"), "{second:?}");
    }
}
