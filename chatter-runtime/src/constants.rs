//! The runtime's defaults and the context keys it writes on a message.
//!
//! | constant | what | set with |
//! | --- | --- | --- |
//! | [`DEFAULT_MAX_DELIVERY_ATTEMPTS`] | deliveries of one command before it is dead-lettered | `#[chatter(max_delivery_attempts = ..)]` |
//! | [`DEFAULT_CONSUMER_CONCURRENCY`] | commands one consumer handles at a time | [`RuntimeBuilder::consumer_concurrency`](crate::RuntimeBuilder::consumer_concurrency) |
//! | [`DEFAULT_DELIVERY_TIMEOUT`] | how long one delivery may take before it is abandoned and retried | [`RuntimeBuilder::delivery_timeout`](crate::RuntimeBuilder::delivery_timeout) |
//! | [`DEFAULT_LANE_WAIT_LIMIT`] | how long a delivery waits behind earlier ones of its key | [`RuntimeBuilder::lane_wait_limit`](crate::RuntimeBuilder::lane_wait_limit) |
//! | [`DEFAULT_SHUTDOWN_DRAIN`] | how long [`Runtime::shutdown`](crate::Runtime::shutdown) lets the relay publish the Outbox Documents still pending | [`RuntimeBuilder::shutdown_drain`](crate::RuntimeBuilder::shutdown_drain) |
//! | [`ATTEMPTS_CONTEXT_KEY`] | the context key counting a message's deliveries | |
//! | [`DEAD_LETTER_REASON_CONTEXT_KEY`] | the context key a dead-lettered message carries its reason in | |

pub use crate::message::{ATTEMPTS_CONTEXT_KEY, DEAD_LETTER_REASON_CONTEXT_KEY};
pub use crate::runtime::{
    DEFAULT_CONSUMER_CONCURRENCY, DEFAULT_DELIVERY_TIMEOUT, DEFAULT_LANE_WAIT_LIMIT,
    DEFAULT_MAX_DELIVERY_ATTEMPTS, DEFAULT_SHUTDOWN_DRAIN,
};
