//! Reliable messaging on Azure Cosmos DB.
//!
//! A command type derives [`DocumentReliable`](macro@DocumentReliable) and gets one `#[handler]`.
//! [`start()`] collects every registration, validates them, connects to Cosmos, verifies the
//! monitored containers, and then:
//!
//! - consumes each command's destination from the [`broker`]; each delivery runs its handler
//!   inside the document tier ([`pipeline`]): the inbox marker (op 0), the handler's staged writes
//!   and its outbox documents commit in **one** TransactionalBatch, executed once; a duplicate
//!   delivery is confirmed by point-reading the marker and acknowledged without committing again;
//! - runs the change-feed relay ([`relay`]): one change-feed processor per distinct source
//!   identity, with leases in the lease container, publishing each pending Outbox Document to the
//!   broker and only then stamping it delivered with a TTL.
//!
//! ```text
//! broker --CreateOrder--> consumer --> handler --(marker, writes, outbox)--> one batch --> Cosmos
//! Cosmos change feed --> relay --publish, confirmed--> broker, then patch status/ttl --> Cosmos
//! ```
//!
//! | module | concern |
//! | --- | --- |
//! | [`registry`] | registrations collected by `inventory`, validated at start |
//! | [`pipeline`] | the Batch-Lifecycle Behavior, the Atomic-Write Handle ([`HandlerContext`]) |
//! | [`document`] | Outbox Documents, inbox markers, ids (the wire shapes shared with .NET) |
//! | [`cosmos`] | the connection (real, emulator server, embedded), provisioning for development, store calls |
//! | [`broker`] | the broker trait, in-memory and RabbitMQ implementations |
//! | [`relay`] | the change-feed relay (on the [`cosmos_change_feed`] processor): drain, source identity, Monitored Container Contract |
//!
//! | feature | default | what |
//! | --- | --- | --- |
//! | `embedded` | yes | the SDK's in-memory Cosmos emulator when `CHATTER_COSMOS_ENDPOINT` is unset (nothing persisted) |
//! | `rabbitmq` | no | `broker::RabbitMqBroker` through `lapin` |
//!
//! Registrations are collected with `inventory`, which only sees crates linked into the binary:
//! reference a crate of commands from the binary (`use my_commands as _;`) or its registrations are
//! silently left out.
mod backoff;
pub mod broker;
pub mod cosmos;
pub mod document;
mod error_chain;
pub mod message;
mod partition_key;
pub mod pipeline;
pub mod registry;
pub mod relay;
mod runtime;

pub use chatter_macros::{DocumentReliable, handler};
pub use error_chain::ErrorChain;
pub use pipeline::HandlerContext;
pub use registry::{BoxError, DocumentReliable};
pub use runtime::{
    ATTEMPTS_CONTEXT_KEY, ConsumerHealth, ConsumerState, DEAD_LETTER_REASON_CONTEXT_KEY,
    DEFAULT_MAX_DELIVERY_ATTEMPTS, DispatchError, Health, LeaseHealth, Runtime, RuntimeBuilder,
    StartError, dead_letter_destination, start,
};

/// The README's Rust examples, compiled as doctests so its quick start cannot rot.
#[cfg(doctest)]
#[doc = include_str!("../../README.md")]
struct ReadmeDoctests;

#[doc(hidden)]
pub mod __private {
    pub use crate::partition_key::PartitionKeyPath;
    pub use crate::registry::{
        CommandRegistration, HandlerFuture, HandlerRegistration, IntoHandlerResult,
        SourceIdentityDeclaration, SourceLocation,
    };
    pub use inventory;
    pub use serde_json;
    pub use std::any::{TypeId, type_name};
}
