//! placeholder
pub mod broker;
pub mod cosmos;
pub mod document;
pub mod message;
pub mod pipeline;
pub mod registry;
