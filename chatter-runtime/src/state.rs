//! Application state: values the runtime is given once ([`RuntimeBuilder::state`]) and any
//! handler may take as a third parameter, [`State<T>`] (an HTTP client, settings, a pool).
//!
//! [`RuntimeBuilder::state`]: crate::RuntimeBuilder::state

use std::any::{Any, TypeId};
use std::collections::HashMap;
use std::sync::Arc;

/// A handler's third parameter: the application state of type `T` the runtime was given with
/// [`RuntimeBuilder::state`](crate::RuntimeBuilder::state), shared by every delivery (it
/// dereferences to `T`). `start()` refuses a handler whose state type the runtime was not given.
///
/// ```ignore
/// #[handler]
/// async fn reserve(cmd: ReserveSeat, ctx: &mut HandlerContext, pricing: State<Pricing>) -> Result<(), BoxError> {
///     let price = pricing.price_of(&cmd.seat);
///     // ...
/// #   Ok(())
/// }
/// ```
#[derive(Debug)]
pub struct State<T>(Arc<T>);

impl<T> Clone for State<T> {
    fn clone(&self) -> Self {
        Self(Arc::clone(&self.0))
    }
}

impl<T> std::ops::Deref for State<T> {
    type Target = T;

    fn deref(&self) -> &T {
        &self.0
    }
}

impl<T> State<T> {
    /// The shared value.
    pub fn arc(&self) -> &Arc<T> {
        &self.0
    }
}

/// Every state value the runtime was given, by type.
#[derive(Default)]
pub(crate) struct AppState {
    values: HashMap<TypeId, Arc<dyn Any + Send + Sync>>,
}

impl std::fmt::Debug for AppState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AppState")
            .field("values", &self.values.len())
            .finish()
    }
}

impl AppState {
    /// Keeps `value` as the state of type `T` (replacing an earlier one of that type).
    pub(crate) fn insert<T: Send + Sync + 'static>(&mut self, value: T) {
        self.values.insert(TypeId::of::<T>(), Arc::new(value));
    }

    /// Whether state of the type `id` was given.
    pub(crate) fn contains(&self, id: TypeId) -> bool {
        self.values.contains_key(&id)
    }

    /// The state of type `T`, if it was given.
    pub(crate) fn get<T: Send + Sync + 'static>(&self) -> Option<State<T>> {
        let value = Arc::clone(self.values.get(&TypeId::of::<T>())?);
        value.downcast::<T>().ok().map(State)
    }
}
