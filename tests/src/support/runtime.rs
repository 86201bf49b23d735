//! Runtimes for tests. Building one here registers nothing: `start` validates the commands and
//! handlers of the binary that calls it.

use std::sync::Mutex;
use std::time::Duration;

use chatter_runtime::RuntimeBuilder;
use chatter_runtime::broker::{Broker, InMemoryBroker};
use chatter_runtime::cosmos::CosmosConnection;
use chatter_runtime::testing::Registry;
use chatter_runtime::{BoxError, DocumentReliable, Runtime};

/// A runtime on `cosmos` and `broker` that only dispatches: it neither consumes nor relays, so
/// outbox documents it writes stay pending until some other runtime's relay drains them.
pub async fn writer(cosmos: &CosmosConnection, broker: impl Broker) -> Runtime {
    Runtime::builder()
        .cosmos(cosmos.clone())
        .broker(broker)
        .consume(false)
        .without_relay()
        .start()
        .await
        .unwrap()
}

/// A runtime on `cosmos` that consumes every command of the binary from a new in-memory broker
/// (returned beside it), without the relay, retrying failed deliveries after 10 ms; `configure`
/// adjusts the builder before it starts.
pub async fn consuming(
    cosmos: &CosmosConnection,
    configure: impl FnOnce(RuntimeBuilder) -> RuntimeBuilder,
) -> (Runtime, InMemoryBroker) {
    let broker = InMemoryBroker::new();
    let builder = Runtime::builder()
        .cosmos(cosmos.clone())
        .without_relay()
        .broker(broker.clone())
        .redelivery_delay(Duration::from_millis(10));
    let runtime = configure(builder).start().await.unwrap();
    (runtime, broker)
}

/// The registry of `T` alone (with its handler from this binary), consuming `destination`
/// instead of the one its derive names: a queue name unique to one test run on a broker other
/// runs share. The registration is leaked, as the derive's are `'static`.
/// The registry of this test binary holding only the command named `command` and its handler.
pub fn registry_named(command: &str) -> Registry {
    use chatter_runtime::__private::{CommandRegistration, HandlerRegistration, inventory};
    Registry::build(
        inventory::iter::<CommandRegistration>
            .into_iter()
            .filter(|c| c.command_name == command),
        inventory::iter::<HandlerRegistration>
            .into_iter()
            .filter(|h| (h.command)().command_name == command),
    )
    .expect("the command and its handler make a valid registry")
}

pub fn registry_at<T: DocumentReliable>(destination: &str) -> Registry {
    use chatter_runtime::__private::{HandlerRegistration, inventory};
    let mut registration = *T::registration();
    registration.destination = Box::leak(destination.to_owned().into_boxed_str());
    let registration: &'static _ = Box::leak(Box::new(registration));
    let type_id = (registration.type_id)();
    Registry::build(
        [registration],
        inventory::iter::<HandlerRegistration>
            .into_iter()
            .filter(|handler| ((handler.command)().type_id)() == type_id),
    )
    .expect("the command and its handler make a valid registry")
}

/// Dispatches every `(command, message id)` of `commands` through a runtime on `cosmos` that
/// neither consumes nor relays, then shuts it down: the commands' Outbox Documents stay pending
/// for a relay started later.
pub async fn seed<T: DocumentReliable>(
    cosmos: &CosmosConnection,
    commands: impl IntoIterator<Item = (T, String)>,
) -> Result<(), BoxError> {
    let seeder = writer(cosmos, InMemoryBroker::new()).await;
    for (command, message_id) in commands {
        seeder.dispatch(command, message_id).await?;
    }
    seeder.shutdown().await;
    Ok(())
}

/// The attempts a handler saw, by message id: a `static` its handler records into and the test
/// reads back.
#[derive(Debug, Default)]
pub struct Attempts(Mutex<Vec<String>>);

impl Attempts {
    /// No attempts yet (for a `static`).
    pub const fn new() -> Self {
        Self(Mutex::new(Vec::new()))
    }

    /// Records one attempt of `message_id`; returns which one it is (1 for the first).
    pub fn record(&self, message_id: &str) -> usize {
        let mut attempts = self.0.lock().unwrap();
        attempts.push(message_id.to_owned());
        attempts.iter().filter(|id| *id == message_id).count()
    }

    /// How many attempts of `message_id` were recorded.
    pub fn of(&self, message_id: &str) -> usize {
        let attempts = self.0.lock().unwrap();
        attempts.iter().filter(|id| *id == message_id).count()
    }
}
