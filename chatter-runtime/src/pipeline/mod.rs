//! The document tier: the Batch-Lifecycle Behavior around every handler call.

mod context;

pub use context::HandlerContext;
