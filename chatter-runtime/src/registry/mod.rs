//! The registry: every command registered by `#[derive(DocumentReliable)]` and every handler bound
//! by `#[handler]`, collected at start and validated as a whole.
//!
//! Registrations are const data submitted through `inventory`, so they exist before `main` runs.
//! `inventory` keeps an entry only if the object file that defines it is linked: a command defined in
//! a library crate that the binary never references is dropped without a trace. Reference such a crate
//! from the binary (a `use` of any item, or `extern crate my_commands;`) to keep its registrations.

mod command;
mod error;
mod handler;
mod validate;

pub use command::{
    CommandRegistration, DocumentReliable, InboxDeclaration, SourceIdentityDeclaration,
    SourceLocation,
};
pub use error::{RegistrationProblem, RegistryError};
pub use handler::{
    BoxError, HandlerFuture, HandlerRegistration, IntoHandlerResult, StateRequirement,
    handler_state,
};
pub(crate) use validate::RegisteredCommand;
pub use validate::Registry;

inventory::collect!(CommandRegistration);
inventory::collect!(HandlerRegistration);
