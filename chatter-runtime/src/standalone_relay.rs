//! The standalone outbox relay: relays pending Outbox Documents from any container, including
//! one chatter's commands do not write, with a [`BodyResolver`] for documents that carry only a
//! pointer to their message. Build one with [`StandaloneRelay::builder`]; its errors are in
//! [`error`](crate::error) ([`StandaloneRelayError`](crate::error::StandaloneRelayError)).

pub use crate::relay::{
    BodyResolver, DrainContext, RunningRelays, StandaloneRelay, StandaloneRelayBuilder,
};
