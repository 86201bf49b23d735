//! What `#[handler]` registers for an async handler function.

use futures::future::BoxFuture;

use super::{CommandRegistration, SourceLocation};
use crate::handler_context::HandlerContext;

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
    /// The application state the handler takes as its third parameter (`State<T>`), if any.
    pub state: Option<StateRequirement>,
}

/// The type of the application state a handler takes (`State<T>`): `start()` refuses the
/// handler unless the runtime was given a `T`.
#[derive(Debug, Clone, Copy)]
pub struct StateRequirement {
    /// `TypeId::of::<T>`.
    pub type_id: fn() -> std::any::TypeId,
    /// `type_name::<T>`, for the error.
    pub type_name: fn() -> &'static str,
}

/// The state of type `T` of the delivery's runtime, for a handler's third parameter (called by
/// `#[handler]`'s expansion).
pub fn handler_state<T: Send + Sync + 'static>(
    ctx: &HandlerContext,
) -> Result<crate::state::State<T>, BoxError> {
    ctx.state::<T>().ok_or_else(|| {
        format!(
            "no application state of type `{}` was given to the runtime (RuntimeBuilder::state)",
            std::any::type_name::<T>()
        )
        .into()
    })
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
