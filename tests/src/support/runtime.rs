//! Runtimes for tests. Building one here registers nothing: `start` validates the commands and
//! handlers of the binary that calls it.

use chatter_runtime::broker::Broker;
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

/// The registry of `T` alone (with its handler from this binary), consuming `destination`
/// instead of the one its derive names: a queue name unique to one test run on a broker other
/// runs share. The registration is leaked, as the derive's are `'static`.
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
    let seeder = Runtime::builder()
        .cosmos(cosmos.clone())
        .consume(false)
        .without_relay()
        .start()
        .await?;
    for (command, message_id) in commands {
        seeder.dispatch(command, message_id).await?;
    }
    seeder.shutdown().await;
    Ok(())
}
