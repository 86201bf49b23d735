//! What `#[handler]` registers for an async handler function.

use futures::future::BoxFuture;

use super::{CommandRegistration, SourceLocation};
use crate::atomic_write::HandlerContext;

/// The error a handler returns; any `std::error::Error + Send + Sync` converts into it with `?`.
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// The future a registered handler returns.
pub type HandlerFuture<'a> = BoxFuture<'a, Result<(), BoxError>>;

/// One handler bound to one command type by `#[handler]`.
#[derive(Debug, Clone, Copy)]
pub struct HandlerRegistration {
    /// The command the handler handles.
    pub command: fn() -> &'static CommandRegistration,
    /// The handler function's path, for logs and errors.
    pub handler_name: &'static str,
    /// Decodes the command from its JSON form and starts the handler.
    pub invoke: for<'a> fn(
        serde_json::Value,
        &'a mut HandlerContext,
    ) -> Result<HandlerFuture<'a>, serde_json::Error>,
    /// Where the handler was written.
    pub location: SourceLocation,
}

/// What a handler function may return: `()` or `Result<(), E>` with `E` convertible into [`BoxError`].
#[diagnostic::on_unimplemented(
    message = "a chatter handler must return `()` or `Result<(), E>` where `E` converts into `BoxError`, not `{Self}`",
    note = "return `Result<(), chatter_runtime::BoxError>` and use `?` on any error"
)]
pub trait IntoHandlerResult {
    /// Converts into the handler result.
    fn into_handler_result(self) -> Result<(), BoxError>;
}

impl IntoHandlerResult for () {
    fn into_handler_result(self) -> Result<(), BoxError> {
        Ok(())
    }
}

impl<E: Into<BoxError>> IntoHandlerResult for Result<(), E> {
    fn into_handler_result(self) -> Result<(), BoxError> {
        self.map_err(Into::into)
    }
}
