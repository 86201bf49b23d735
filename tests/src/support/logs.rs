//! Capturing what chatter logs through `tracing`, to assert the always-on logs.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::{Arc, Mutex};

use tracing::field::{Field, Visit};
use tracing::subscriber::DefaultGuard;
use tracing::{Event, Level, Subscriber};
use tracing_subscriber::layer::{Context, Layer, SubscriberExt};

/// One captured event.
#[derive(Debug, Clone)]
pub struct LogEntry {
    /// Its level.
    pub level: Level,
    /// The formatted message.
    pub message: String,
    /// The other fields, rendered (`error` holds an error's `Display`).
    pub fields: BTreeMap<String, String>,
}

impl LogEntry {
    /// The field `name`, if the event carried it.
    pub fn field(&self, name: &str) -> Option<&str> {
        self.fields.get(name).map(String::as_str)
    }
}

/// Every event logged on this thread while the guard of [`capture`] lives. Clones share them.
#[derive(Debug, Clone, Default)]
pub struct Captured(Arc<Mutex<Vec<LogEntry>>>);

impl Captured {
    /// Every entry so far.
    pub fn entries(&self) -> Vec<LogEntry> {
        self.0.lock().unwrap().clone()
    }

    /// The entries at `level` whose message contains `text`.
    pub fn matching(&self, level: Level, text: &str) -> Vec<LogEntry> {
        self.entries()
            .into_iter()
            .filter(|e| e.level == level && e.message.contains(text))
            .collect()
    }

    /// The entries at `level`.
    pub fn at(&self, level: Level) -> Vec<LogEntry> {
        self.matching(level, "")
    }
}

/// Captures every event of this thread (a `#[tokio::test]` runs its tasks on it) until the
/// guard drops.
pub fn capture() -> (Captured, DefaultGuard) {
    let captured = Captured::default();
    let subscriber = tracing_subscriber::registry().with(Capture(captured.clone()));
    (captured, tracing::subscriber::set_default(subscriber))
}

/// Every event logged on any thread of this process that has no [`capture`] of its own, from
/// the first call on: a process-wide subscriber, for events whose thread a test cannot pin down
/// (its assertions then select the entries of its own run by a field). Clones share them.
pub fn capture_process() -> Captured {
    static PROCESS: std::sync::OnceLock<Captured> = std::sync::OnceLock::new();
    PROCESS
        .get_or_init(|| {
            let captured = Captured::default();
            let subscriber = tracing_subscriber::registry().with(Capture(captured.clone()));
            // Another global subscriber of the test binary keeps its own: nothing is captured
            // here then, and the assertions say so.
            let _ = tracing::subscriber::set_global_default(subscriber);
            captured
        })
        .clone()
}

struct Capture(Captured);

impl<S: Subscriber> Layer<S> for Capture {
    fn on_event(&self, event: &Event<'_>, _ctx: Context<'_, S>) {
        let mut visitor = Fields::default();
        event.record(&mut visitor);
        let message = visitor.fields.remove("message").unwrap_or_default();
        self.0.0.lock().unwrap().push(LogEntry {
            level: *event.metadata().level(),
            message,
            fields: visitor.fields,
        });
    }
}

#[derive(Default)]
struct Fields {
    fields: BTreeMap<String, String>,
}

impl Visit for Fields {
    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        self.fields
            .insert(field.name().to_owned(), format!("{value:?}"));
    }

    fn record_str(&mut self, field: &Field, value: &str) {
        self.fields
            .insert(field.name().to_owned(), value.to_owned());
    }

    fn record_error(&mut self, field: &Field, value: &(dyn std::error::Error + 'static)) {
        // As a subscriber shows it: the error and its causes.
        self.fields.insert(
            field.name().to_owned(),
            chatter_runtime::error::ErrorChain(value).to_string(),
        );
    }
}
