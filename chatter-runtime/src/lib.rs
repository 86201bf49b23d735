//! Reliable messaging on Azure Cosmos DB: a command handler's document writes, the messages it
//! emits and an inbox marker commit together in **one** TransactionalBatch; the committing
//! process then publishes the emitted messages to a broker, and a change-feed relay publishes
//! whatever it could not (a crash, a broker outage), in commit order per key. Nothing is lost,
//! nothing a batch wrote is applied twice, and a fault that stops progress is logged at `error`
//! and shows in [`Runtime::health`].
//!
//! # Start here
//!
//! 1. Derive [`DocumentReliable`](macro@DocumentReliable) on a command struct: where its
//!    documents live (`#[cosmos(..)]`) and its partition key (`#[partition_key(..)]`). The
//!    derive's page is the attribute reference.
//! 2. Write one [`#[handler]`](macro@handler): `async fn(command, &mut HandlerContext)`. On the
//!    [`HandlerContext`] stage document writes and [`send`](HandlerContext::send) messages;
//!    nothing is written until the handler returns `Ok`.
//! 3. Call [`start()`] (or [`Runtime::builder()`] for a broker, a store or [`RelayOptions`](relay::RelayOptions) of
//!    your own). It validates every registration in the binary, checks the containers, consumes
//!    each command's destination and runs the relay. [`Runtime::shutdown`] stops it gracefully.
//!
//! ```rust,no_run,standalone_crate
//! use chatter_runtime::{BoxError, DocumentReliable, HandlerContext, Report, handler};
//! use serde::{Deserialize, Serialize};
//! use serde_json::json;
//!
//! #[derive(Serialize, Deserialize, DocumentReliable)]
//! #[cosmos(database = "shop", container = "orders", lease = "orders-leases")]
//! #[partition_key(path = "/orderId")]
//! #[serde(rename_all = "camelCase")]
//! struct CreateOrder {
//!     order_id: String,
//!     quantity: u32,
//! }
//!
//! #[handler]
//! async fn create_order(cmd: CreateOrder, ctx: &mut HandlerContext) -> Result<(), BoxError> {
//!     // Staged, then committed in one batch with the inbox marker and the outbox document.
//!     ctx.upsert(json!({ "id": cmd.order_id, "orderId": cmd.order_id, "quantity": cmd.quantity }))?;
//!     let event = json!({ "orderId": cmd.order_id });
//!     ctx.send_json(&format!("{}:OrderCreated", ctx.message_id()), "order-events", &event)?;
//!     Ok(())
//! }
//!
//! #[tokio::main]
//! async fn main() -> Result<(), Report> {
//!     // Consumes `CreateOrder`'s destination and relays what its handler sends.
//!     let runtime = chatter_runtime::start().await?;
//!     // ... until your service is asked to stop; then the work in flight finishes:
//!     runtime.shutdown().await;
//!     Ok(())
//! }
//! ```
//!
//! The README's quick start is a complete program, compiled and run with the tests; the
//! chapters of the guide are the pages of the modules below.
//!
//! # What happens to one command
//!
//! ```text
//! broker --command--> consumer --> handler stages writes and messages
//!        --> one batch [inbox marker, writes.., outbox documents..] --> Cosmos DB
//! Cosmos DB change feed --> relay --publish, confirmed--> broker --> stamp "delivered" + ttl
//! ```
//!
//! - A redelivered command conflicts on its inbox marker: nothing commits again and the
//!   delivery is acknowledged ([`Outcome::Duplicate`]).
//! - A delivery that fails is delivered again, counted; one that can never succeed, or fails
//!   too often, is dead-lettered to `<destination>.dead-letter` ([`dead_letter_destination`](broker::dead_letter_destination)).
//! - An outbox document the broker could never take is stamped `undeliverable` and logged; a
//!   lease whose delivered stamps keep failing is suspended for a while instead of republishing.
//!
//! The words these pages use are in the [glossary](#glossary) below.
//!
//! # Modules, and the guide
//!
//! Each module's page opens with its chapter of the guide (the README's map lists them); read
//! them in this order: [`registration`], [`cosmos`], [`relay`], [`broker`], then [`inbox`],
//! [`health`], [`telemetry`] and [`operator`] as you need them.
//!
//! | module | chapter | what you find there |
//! | --- | --- | --- |
//! | crate root | | what a handler and a `main` write: [`start`], [`Runtime`], [`RuntimeBuilder`], [`Report`]; [`HandlerContext`], [`BrokeredMessage`], [`Rejection`], [`Outcome`], [`State`], [`ETag`], [`Versioned`], [`Query`], [`BoxError`]; the derive and `#[handler]` |
//! | [`registration`] | commands and handlers: registering, the delivery contract, the handler's context, consumers, retries and dead letters | what the derive registers for a command ([`CommandRegistration`](registration::CommandRegistration)) |
//! | [`cosmos`] | the store: the environment, keys, Entra ID, the embedded emulator | [`CosmosConnection`](cosmos::CosmosConnection), reading back what chatter wrote, request charges |
//! | [`relay`] | the relay: publish after commit, the standalone relay, undeliverable documents, Drain Suspension, the sweep, faults and recovery | [`RelayOptions`](relay::RelayOptions), the standalone relay and its body-resolver seam |
//! | [`broker`] | brokers: RabbitMQ, NATS JetStream | the [`Broker`](broker::Broker) trait, [`InMemoryBroker`](broker::InMemoryBroker), `RabbitMqBroker` (feature `rabbitmq`), `NatsBroker` (feature `nats`), dead-letter destinations and surveys |
//! | [`inbox`] | the standalone inbox | handling by message id for side effects outside Cosmos |
//! | [`health`] | health and logs | what [`Runtime::health`] reports: consumers and relay leases |
//! | [`telemetry`] | telemetry | the OpenTelemetry metrics and spans, and how to turn them on or off |
//! | [`operator`] | the `chatter` command | what the command runs: lease and outbox surveys, requeue and give-up repairs |
//! | [`error`] | | every error type, and [`ErrorChain`](error::ErrorChain) to print one with its causes |
//! | [`constants`] | | the runtime's defaults and the context keys it writes on a message |
//! | [`provision`] | | creating databases and containers, for development and tests |
//!
//! The change-feed processor under the relay is its own crate, `cosmos-change-feed`, usable
//! without chatter.
//!
//! # Features
//!
//! | feature | default | what |
//! | --- | --- | --- |
//! | `embedded` | yes | the SDK's in-memory Cosmos DB emulator when `CHATTER_COSMOS_ENDPOINT` is unset (nothing persisted) |
//! | `tls` | yes | `https://` endpoints (a Cosmos account) through rustls; without it only plain `http://` ones (`chatter-emulator`) |
//! | `entra-id` | yes | Microsoft Entra ID instead of an account key (`CHATTER_COSMOS_CREDENTIAL`); implies `tls` |
//! | `rabbitmq` | no | `broker::RabbitMqBroker` through `lapin` |
//! | `nats` | no | `broker::NatsBroker`: NATS JetStream through `async-nats` |
//! | `test-support` | no | the `testing` module: internals for chatter's own integration tests, with no stability promise |
//!
//! Registrations are collected with `inventory`, which only sees crates linked into the binary:
//! reference a crate of commands from the binary (`use my_commands as _;`) or its registrations
//! are silently left out.
#![doc = include_str!("../docs/glossary.md")]
// The test seams `testing` re-exports are `pub` so that the `test-support` feature can reach
// them; without it they are unreachable by design. CI builds with every feature, where this lint
// holds everything else to `pub(crate)`.
#![cfg_attr(not(feature = "test-support"), allow(unreachable_pub))]
// On docs.rs: each feature-gated item says which feature it needs.
#![cfg_attr(docsrs, feature(doc_cfg))]

/// An error variant's `error.type` attribute: its public path under [`error`], which the `use`
/// checks exists (a renamed or moved variant fails to compile instead of naming a dead path).
macro_rules! error_type {
    ($type:ident :: $variant:ident) => {{
        #[allow(unused_imports)]
        use crate::error::$type::$variant as _;
        concat!(
            "chatter_runtime::error::",
            stringify!($type),
            "::",
            stringify!($variant)
        )
    }};
}

mod backoff;
pub mod broker;
mod clock;
pub mod constants;
pub mod cosmos;
mod deadline;
mod document;
pub mod error;
mod error_chain;
mod error_report;
mod handler_context;
pub mod health;
pub mod inbox;
mod message;
pub mod operator;
mod partition_key;
mod pipeline;
pub mod provision;
mod registry;
pub mod relay;
mod runtime;
mod state;
pub mod telemetry;
#[cfg(feature = "test-support")]
pub mod testing;

pub use chatter_macros::{DocumentReliable, handler};
pub use error_report::Report;
pub use handler_context::{ETag, HandlerContext, Query, Versioned};
pub use message::BrokeredMessage;
pub use pipeline::{Outcome, Rejection};
pub use registry::{BoxError, DocumentReliable};
pub use runtime::{Runtime, RuntimeBuilder, start};
pub use state::State;

/// What `#[derive(DocumentReliable)]` registers for a command, as
/// [`DocumentReliable::registration`] and [`Runtime::commands`] return it, and the return
/// types `#[handler]` accepts ([`IntoHandlerResult`](registration::IntoHandlerResult)).
///
#[doc = include_str!("../docs/handlers.md")]
pub mod registration {
    pub use crate::partition_key::PartitionKeyPath;
    pub use crate::registry::{
        CommandRegistration, InboxDeclaration, IntoHandlerResult, SourceIdentityDeclaration,
        SourceLocation,
    };
}

/// The README's Rust examples, compiled as doctests so its quick start cannot rot.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;

#[doc(hidden)]
pub mod __private {
    pub use crate::partition_key::PartitionKeyPath;
    pub use crate::registry::{
        CommandRegistration, HandlerFuture, HandlerRegistration, InboxDeclaration,
        IntoHandlerResult, SourceIdentityDeclaration, SourceLocation, StateRequirement,
        handler_state,
    };
    pub use inventory;
    pub use serde_json;
    pub use std::any::{TypeId, type_name};
}
