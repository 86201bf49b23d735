//! The change-feed relay, which publishes each committed Outbox Document to the broker
//! ([`RelayOptions`]), and the standalone relay for containers chatter's commands do not write
//! ([`StandaloneRelay`], with a [`BodyResolver`] for thin triggers).
//!
#![doc = include_str!("../../docs/relay.md")]

// For maintainers: one `cosmos_change_feed` processor per change-feed source, draining each
// monitored container's pending Outbox Documents to the broker. The files of this folder:
//
// | file | concern |
// | --- | --- |
// | `identity.rs` | change-feed source identities and processor names |
// | `contract.rs` | the Monitored Container Contract, checked before any processor starts |
// | `drain.rs` | what one page does: pending gate, per-key groups in change-feed order, in-flight limit, page failure |
// | `dispatch.rs` | what publishes and stamps one Outbox Document, for the drain and for publish after commit: Outbox Document Contract (or the body resolver), publish, stamp |
// | `after_commit.rs` | publish after commit: the committing process publishes a batch's documents at once when nothing earlier of their key is pending |
// | `resolver.rs` | the standalone relay's body-resolver seam and pending filter |
// | `standalone.rs` | the standalone relay: a container chatter's commands do not write, built and validated by its builder |
// | `suspension.rs` | Drain Suspension: the per-lease gate over Confirmation Failures |
// | `delivery.rs` | what a delivered document is stamped with |
// | `options.rs` | [`RelayOptions`] |
// | `host.rs` | the relay host: verifies every container, then starts one processor per source |
// | `backlog.rs` | the per-lease backlog estimate behind the `chatter.messaging.outbox.backlog` gauge |
// | `sweep.rs` | the stranded-document sweep: pending documents a lease read past, logged, counted and put back on the change feed; each lease's oldest pending age |
// | `diagnostics.rs` | the always-on logs, counted when metrics are on, and the faults' `error.type` names |
// | `error.rs` | why the relay did not start, and why a page failed |
pub(crate) mod after_commit;
pub(crate) mod backlog;
pub(crate) mod contract;
pub(crate) mod delivery;
mod diagnostics;
mod dispatch;
pub(crate) mod drain;
pub(crate) mod error;
pub(crate) mod host;
pub(crate) mod identity;
pub(crate) mod in_flight;
mod options;
pub(crate) mod resolver;
pub(crate) mod standalone;
pub(crate) mod state;
pub(crate) mod suspension;
pub(crate) mod sweep;

pub use options::RelayOptions;
pub use resolver::{BodyResolver, DrainContext};
pub use standalone::{
    RunningRelays, StandaloneRelay, StandaloneRelayBuilder, StandaloneRelayError,
};
