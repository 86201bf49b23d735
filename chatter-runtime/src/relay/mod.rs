//! The relay side of chatter: reading the monitored containers' change feeds.
//!
//! | module | concern |
//! | --- | --- |
//! | [`change_feed`] | the change-feed processor: the [`cosmos_change_feed`] crate, re-exported |
//! | [`drain`] | what one page does: pending gate, Outbox Document Contract, publish, stamps |
//! | [`delivery`] | the delivered stamp's settings (catalog 3.4) |
//! | [`suspension`] | Drain Suspension: the per-lease gate over Confirmation Failures (area 6) |
//! | [`contract`] | the Monitored Container Contract, checked before any processor starts |
//! | [`identity`] | change-feed source identities and processor names |
//! | [`host`] | the relay host: one processor per source |
//! | `diagnostics` | the always-on logs (catalog 8.5) |
/// The change-feed processor the relay runs: the [`cosmos_change_feed`] crate, re-exported so
/// that [`RelayOptions::processor`](host::RelayOptions::processor) and the lease documents can be
/// named without depending on it directly.
pub use cosmos_change_feed as change_feed;
pub mod contract;
pub mod delivery;
mod diagnostics;
pub mod drain;
pub mod host;
pub mod identity;
pub mod suspension;
