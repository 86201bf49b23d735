//! `start()`: collect the registrations, validate them, build the pipeline, return a handle.

mod error;

pub use error::{DispatchError, StartError};

use std::sync::Arc;

use crate::pipeline::HandlerContext;
use crate::registry::{DocumentReliable, Registry};

/// Starts chatter from every registration in the binary, with settings from the environment.
///
/// Equivalent to `Runtime::builder().start()`.
pub async fn start() -> Result<Runtime, StartError> {
    Runtime::builder().start().await
}

/// Configures a [`Runtime`] before starting it.
#[derive(Debug, Default)]
#[must_use = "a builder does nothing until `.start().await`"]
pub struct Builder {
    registry: Option<Registry>,
}

impl Builder {
    /// Serves exactly this registry instead of every registration `inventory` collected.
    pub fn registry(mut self, registry: Registry) -> Self {
        self.registry = Some(registry);
        self
    }

    /// Validates the registrations and starts the runtime. Every registration problem is reported
    /// in one [`StartError::Registry`].
    pub async fn start(self) -> Result<Runtime, StartError> {
        let registry = match self.registry {
            Some(registry) => registry,
            None => Registry::from_inventory()?,
        };
        for command in registry.commands() {
            let r = command.registration;
            tracing::info!(
                command = r.command_name,
                destination = r.destination,
                database = r.database,
                container = r.container,
                lease = r.lease,
                handler = command.handler.handler_name,
                "chatter registered command"
            );
        }
        Ok(Runtime {
            inner: Arc::new(Inner { registry }),
        })
    }
}

/// A started chatter runtime: dispatch commands, then shut it down.
#[derive(Debug, Clone)]
pub struct Runtime {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    registry: Registry,
}

impl Runtime {
    /// A builder for a runtime.
    pub fn builder() -> Builder {
        Builder::default()
    }

    /// The validated registrations this runtime serves.
    pub fn registry(&self) -> &Registry {
        &self.inner.registry
    }

    /// Handles `command` in process under the caller-supplied message id.
    pub async fn dispatch<T: DocumentReliable>(
        &self,
        command: T,
        message_id: impl Into<String>,
    ) -> Result<(), DispatchError> {
        let registered = self
            .inner
            .registry
            .get::<T>()
            .ok_or(DispatchError::NotRegistered {
                command: std::any::type_name::<T>(),
            })?;
        let json = serde_json::to_value(&command).map_err(DispatchError::Encode)?;
        let mut ctx = HandlerContext::new(message_id.into(), false);
        let future = (registered.handler.invoke)(json, &mut ctx).map_err(DispatchError::Decode)?;
        future.await.map_err(|source| DispatchError::Handler {
            command: registered.registration.command_name,
            source,
        })
    }

    /// Stops the runtime.
    pub async fn shutdown(self) {}
}
