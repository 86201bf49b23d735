//! [`ChangeFeedError`]: why a change-feed processor could not start, and [`InvalidOptions`]:
//! which option breaks which rule.

use std::time::Duration;

use crate::store::StoreError;

/// Why a [`ChangeFeedProcessor`](crate::ChangeFeedProcessor) could not start.
///
/// Once started, a processor never stops on its own: store failures while polling, renewing
/// or balancing are reported (see [`LeaseFault`](crate::LeaseFault)) or logged, and retried.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ChangeFeedError {
    /// The processor name is empty (or only whitespace).
    #[error("the change-feed processor name must not be empty")]
    EmptyProcessorName,

    /// The instance name is empty (or only whitespace).
    #[error("the change-feed processor's instance name must not be empty")]
    EmptyInstanceName,

    /// The options break a rule (the source says which).
    #[error("invalid change-feed processor options")]
    InvalidOptions(#[from] InvalidOptions),

    /// The monitored or lease container could not be read or written while starting.
    #[error("change-feed processor '{processor}' could not {action}")]
    Store {
        /// The processor name.
        processor: String,
        /// What was attempted, e.g. `read the feed ranges of the monitored container`.
        action: &'static str,
        /// The store error.
        #[source]
        source: Box<StoreError>,
    },
}

/// An option of [`ChangeFeedProcessorOptions`](crate::ChangeFeedProcessorOptions), as named in
/// an [`InvalidOptions`] error.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum ProcessorOption {
    /// [`poll_interval`](crate::ChangeFeedProcessorOptions::poll_interval).
    PollInterval,
    /// [`max_items_per_page`](crate::ChangeFeedProcessorOptions::max_items_per_page).
    MaxItemsPerPage,
    /// [`lease_renew_interval`](crate::ChangeFeedProcessorOptions::lease_renew_interval).
    LeaseRenewInterval,
    /// [`lease_expiry`](crate::ChangeFeedProcessorOptions::lease_expiry).
    LeaseExpiry,
    /// [`lease_acquire_interval`](crate::ChangeFeedProcessorOptions::lease_acquire_interval).
    LeaseAcquireInterval,
    /// [`store_timeout`](crate::ChangeFeedProcessorOptions::store_timeout).
    StoreTimeout,
    /// [`handler_timeout`](crate::ChangeFeedProcessorOptions::handler_timeout).
    HandlerTimeout,
    /// [`max_backoff`](crate::ChangeFeedProcessorOptions::max_backoff).
    MaxBackoff,
}

impl ProcessorOption {
    /// The option's field name, e.g. `poll_interval`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::PollInterval => "poll_interval",
            Self::MaxItemsPerPage => "max_items_per_page",
            Self::LeaseRenewInterval => "lease_renew_interval",
            Self::LeaseExpiry => "lease_expiry",
            Self::LeaseAcquireInterval => "lease_acquire_interval",
            Self::StoreTimeout => "store_timeout",
            Self::HandlerTimeout => "handler_timeout",
            Self::MaxBackoff => "max_backoff",
        }
    }
}

impl std::fmt::Display for ProcessorOption {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Which option of [`ChangeFeedProcessorOptions`](crate::ChangeFeedProcessorOptions) breaks
/// which rule ([`validate`](crate::ChangeFeedProcessorOptions::validate)).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum InvalidOptions {
    /// An interval, timeout or page size is zero.
    #[error("`{option}` must be greater than zero")]
    Zero {
        /// The option that is zero.
        option: ProcessorOption,
    },

    /// The renew interval is more than half the expiry: a renewal that fails would leave no
    /// room for another before the owner gives its lease up, so live owners would lose their
    /// leases.
    #[error(
        "`lease_renew_interval` ({renew_interval:?}) must be at most half of `lease_expiry` \
         ({lease_expiry:?}), or live owners would lose their leases whenever a renewal is slow"
    )]
    RenewIntervalTooLong {
        /// The renew interval given.
        renew_interval: Duration,
        /// The expiry given.
        lease_expiry: Duration,
    },
}

/// Displays an error followed by each of its [`source`](std::error::Error::source)s, joined by
/// `": "`: `could not read the leases: Cosmos DB read_item failed: 503/20010
/// (ServiceUnavailable): connection refused`.
///
/// This crate's errors say what failed in `Display` and why in `source()` (the Rust API
/// guidelines), so printing only `Display` drops the cause. Print an error with `ErrorChain`
/// where a person reads it, as the processor's own logs do. A cause whose text its wrapper's
/// equals, or ends with after a `": "`, is printed once.
///
/// ```
/// use cosmos_change_feed::ErrorChain;
///
/// let error = std::io::Error::other("permission denied");
/// assert_eq!(ErrorChain(&error).to_string(), "permission denied");
/// ```
#[derive(Clone, Copy)]
pub struct ErrorChain<'a>(pub &'a (dyn std::error::Error + 'static));

impl std::fmt::Display for ErrorChain<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut previous = self.0.to_string();
        f.write_str(&previous)?;
        let mut cause = self.0.source();
        while let Some(error) = cause {
            // Some clients wrap an error in one that says the same, or that ends with what its
            // source says (`status: message` over `message`); say it once.
            let text = error.to_string();
            if previous != text && !previous.ends_with(&format!(": {text}")) {
                write!(f, ": {text}")?;
            }
            previous = text;
            cause = error.source();
        }
        Ok(())
    }
}

impl std::fmt::Debug for ErrorChain<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Display::fmt(self, f)
    }
}

#[cfg(test)]
mod chain_tests {
    use super::*;

    #[test]
    fn a_store_error_shows_its_cause() {
        let error = ChangeFeedError::InvalidOptions(InvalidOptions::Zero {
            option: ProcessorOption::PollInterval,
        });
        let text = ErrorChain(&error).to_string();
        assert!(text.starts_with(&error.to_string()), "{text}");
        assert!(text.ends_with("must be greater than zero"), "{text}");
    }

    #[derive(Debug, thiserror::Error)]
    #[error("outer")]
    struct Outer(#[source] Middle);

    #[derive(Debug, thiserror::Error)]
    #[error("middle")]
    struct Middle(#[source] std::io::Error);

    #[test]
    fn every_cause_is_printed_once_in_order() {
        let error = Outer(Middle(std::io::Error::other("inner")));
        assert_eq!(ErrorChain(&error).to_string(), "outer: middle: inner");
    }

    #[derive(Debug, thiserror::Error)]
    #[error("same")]
    struct Same(#[source] std::io::Error);

    #[test]
    fn a_cause_repeating_its_wrapper_is_printed_once() {
        let error = Same(std::io::Error::other("same"));
        assert_eq!(ErrorChain(&error).to_string(), "same");
    }

    #[test]
    fn an_error_without_a_source_prints_alone() {
        let error = std::io::Error::other("alone");
        assert_eq!(ErrorChain(&error).to_string(), "alone");
    }

    #[derive(Debug, thiserror::Error)]
    #[error("503/20010 (ServiceUnavailable): connection refused")]
    struct Header(#[source] std::io::Error);

    #[test]
    fn a_cause_its_wrapper_already_ends_with_is_printed_once() {
        let error = Header(std::io::Error::other("connection refused"));
        assert_eq!(
            ErrorChain(&error).to_string(),
            "503/20010 (ServiceUnavailable): connection refused"
        );
        // Only a whole cause after `": "`: a fragment is a cause of its own.
        let error = Header(std::io::Error::other("refused"));
        assert_eq!(
            ErrorChain(&error).to_string(),
            "503/20010 (ServiceUnavailable): connection refused: refused"
        );
    }
}
