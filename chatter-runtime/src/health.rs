//! What [`Runtime::health`](crate::Runtime::health) reports: each consumer's state and each
//! relay lease's progress, so a fault that stops progress is visible, not only logged.
//!
#![doc = include_str!("../docs/health.md")]

pub use crate::runtime::{ConsumerHealth, ConsumerState, Health, LeaseHealth};
