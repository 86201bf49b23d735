//! [`ChangeFeedError`]: why a change-feed processor could not start.

use crate::cosmos::CosmosStoreError;

/// Why a [`ChangeFeedProcessor`](super::ChangeFeedProcessor) could not start.
///
/// Once started, a processor never stops on its own: store failures while polling, renewing
/// or balancing are logged (`tracing`) and retried.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ChangeFeedError {
    /// The processor or instance name is empty.
    #[error("the change-feed processor's {what} must not be empty")]
    EmptyName {
        /// `processor name` or `instance name`.
        what: &'static str,
    },

    /// The options do not make sense together.
    #[error("invalid change-feed processor options: {0}")]
    InvalidOptions(String),

    /// The monitored or lease container could not be read or written while starting.
    #[error("change-feed processor '{processor}' could not {action}: {source}")]
    Store {
        /// The processor name.
        processor: String,
        /// What was attempted, e.g. `read the feed ranges of the monitored container`.
        action: &'static str,
        /// The store error.
        #[source]
        source: Box<CosmosStoreError>,
    },
}
