//! The instances' Error logs, by seed: a stall must have been said at Error, and some Error
//! logs (a stranded document) are violations by themselves.
//!
//! One `tracing` layer for the whole test binary records every Error event logged on an
//! instance's thread (named `sim-<seed>-<run>-<instance>`: each instance's tasks run on its own
//! current-thread runtime), so runs side by side keep their logs apart.

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

static LOGGED: Mutex<BTreeMap<u64, Vec<Logged>>> = Mutex::new(BTreeMap::new());

/// Takes the Error logs of `seed`'s instances.
pub fn take(seed: u64) -> Vec<Logged> {
    LOGGED.lock().unwrap().remove(&seed).unwrap_or_default()
}

/// The layer that records them; install it with a `LevelFilter::ERROR` filter.
pub struct Recorder;

impl<S: Subscriber> Layer<S> for Recorder {
    fn on_event(&self, event: &Event<'_>, _: Context<'_, S>) {
        let thread = std::thread::current();
        let Some(name) = thread.name() else { return };
        let Some(seed) = name
            .strip_prefix("sim-")
            .and_then(|rest| rest.split('-').next())
            .and_then(|seed| seed.parse::<u64>().ok())
        else {
            return;
        };
        let mut text = Text::default();
        event.record(&mut text);
        LOGGED
            .lock()
            .unwrap()
            .entry(seed)
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
