//! Integration tests for chatter live under `tests/`; this library is their shared support code.
//!
//! Every test binary in `tests/*.rs` (and `src/bin/relay_worker.rs`) links it, so it holds only
//! plain helpers: never a `#[derive(DocumentReliable)]` command or a `#[handler]`. Those are
//! collected per binary by `inventory`, and one here would be registered in every binary that
//! links this crate and break their start-time validation. Commands and handlers stay in the
//! test files ([`event_command!`] declares the common one there, in one line).
//!
//! | module | what |
//! | --- | --- |
//! | [`wait`] | [`wait::eventually`]: bounded polling until a condition holds |
//! | [`store`] | embedded store, `chatter-emulator` server on port 0, provisioning, point reads |
//! | [`broker`] | [`broker::Received`] (message ids consumed from a destination), bounded `next`, [`broker::publish_command`] and [`broker::settled`] on the in-memory broker |
//! | [`commands`] | [`event_command!`]: a command with one key field and its handler (one document written, one event sent), expanded in the test binary |
//! | [`change_feed`] | [`change_feed::feed_range_tokens`]: a container's current feed ranges, splits seen (the processor's own tests live in `cosmos-change-feed`) |
//! | [`relay`] | [`relay::fast_relay`]: relay options with short timings |
//! | [`runtime`] | [`runtime::writer`]: a runtime that only dispatches (no consumers, no relay); [`runtime::consuming`]: one that consumes from an in-memory broker, without the relay; [`runtime::Attempts`]: a handler's attempts by message id; [`runtime::seed`]: commands dispatched through one, then shut down; [`runtime::registry_at`]: one command on a destination of the test's own |
//! | [`process`] | [`process::ChildProcess`]: a spawned process read line by line, killed on drop |
//! | [`proxy`] | [`proxy::TcpProxy`]: a TCP proxy that cuts the network to a real server (RabbitMQ) |
//! | [`logs`] | [`logs::capture`]: what chatter logs through `tracing`, for asserting the always-on logs |
//! | [`callgrind`] | [`callgrind::profile`]: a benchmark binary run under valgrind's callgrind, its instruction total; [`callgrind::invocation`] / [`callgrind::profile_modes`]: the driver and its measuring children |
//! | [`telemetry`] | OpenTelemetry SDK providers over in-memory exporters: [`telemetry::Metrics`], [`telemetry::Spans`] |
//! | `rabbitmq` (feature `rabbitmq`) | the RabbitMQ URI, bounded connect / subscribe / delete |
//! | `nats` (feature `nats`) | the shared NATS server, streams of a test's own, `nats-server` processes of a test's own |

mod support {
    pub mod broker;
    pub mod callgrind;
    pub mod change_feed;
    pub mod commands;
    pub mod logs;
    #[cfg(feature = "nats")]
    pub mod nats;
    pub mod process;
    pub mod proxy;
    #[cfg(feature = "rabbitmq")]
    pub mod rabbitmq;
    pub mod relay;
    pub mod runtime;
    pub mod store;
    pub mod telemetry;
    pub mod wait;
}

#[cfg(feature = "nats")]
pub use support::nats;
#[cfg(feature = "rabbitmq")]
pub use support::rabbitmq;
pub use support::{
    broker, callgrind, change_feed, commands, logs, process, proxy, relay, runtime, store,
    telemetry, wait,
};
