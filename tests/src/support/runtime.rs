//! Runtimes for tests. Building one here registers nothing: `start` validates the commands and
//! handlers of the binary that calls it.

use chatter_runtime::Runtime;
use chatter_runtime::broker::Broker;
use chatter_runtime::cosmos::CosmosConnection;

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
