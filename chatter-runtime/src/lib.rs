//! placeholder
pub mod broker;
pub mod cosmos;
pub mod document;
pub mod message;
pub mod pipeline;
pub mod registry;
pub mod relay;
mod runtime;

pub use chatter_macros::{DocumentReliable, handler};
pub use pipeline::HandlerContext;
pub use registry::{BoxError, DocumentReliable};
pub use runtime::{Builder, DispatchError, Runtime, StartError, start};

#[doc(hidden)]
pub mod __private {
    pub use crate::registry::{
        CommandRegistration, HandlerFuture, HandlerRegistration, IntoHandlerResult,
        SourceIdentityDeclaration, SourceLocation,
    };
    pub use inventory;
    pub use serde_json;
    pub use std::any::{TypeId, type_name};
}
