//! [`RequestError`]: a Cosmos DB request that failed, with its HTTP status kept.

use std::time::Duration;

use azure_data_cosmos::CosmosError;

/// A Cosmos DB request that failed: answered with a non-success status, or not answered at all.
///
/// The HTTP status code (and Cosmos sub-status) is kept, so a caller can tell a missing document
/// (404) from a precondition failure (412), a conflict (409) or throttling (429).
///
/// Displayed as `Cosmos DB {operation} failed: ` and the SDK error's own one-line header, which
/// carries the status (`503/20010 (ServiceUnavailable): connection refused`); its
/// [`source`](std::error::Error::source) is the SDK error's source, so an
/// [`ErrorChain`](crate::ErrorChain) shows the status once.
#[derive(Debug)]
#[non_exhaustive]
pub struct RequestError {
    /// What was attempted, e.g. `read_item`, `query_change_feed`, `replace_lease`.
    pub operation: &'static str,
    /// The HTTP status code. For failures raised by the SDK itself (transport errors,
    /// timeouts) this is the SDK's synthetic status (see `from_wire`).
    pub status: u16,
    /// The Cosmos sub-status code, when there is one.
    pub sub_status: Option<u16>,
    /// Whether the status was answered by the service (`false`: raised client-side).
    pub from_wire: bool,
    /// The SDK error (its text is part of this error's; its source is this error's source).
    pub source: CosmosError,
}

impl std::fmt::Display for RequestError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Cosmos DB {} failed: {}", self.operation, self.source)
    }
}

impl std::error::Error for RequestError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        std::error::Error::source(&self.source)
    }
}

impl RequestError {
    /// Wraps an SDK error of `operation`, keeping its status code.
    pub fn new(operation: &'static str, source: CosmosError) -> Self {
        let status = source.status();
        Self {
            operation,
            status: u16::from(status.status_code()),
            sub_status: status.sub_status().map(u16::from),
            from_wire: source.is_from_wire(),
            source,
        }
    }

    /// How long the service asked the caller to wait before retrying (`x-ms-retry-after-ms`,
    /// sent with 429 Too Many Requests), if it did.
    pub fn retry_after(&self) -> Option<Duration> {
        self.source
            .response()?
            .headers()
            .retry_after_ms
            .map(Duration::from_millis)
    }

    /// Whether the service itself answered with `status`.
    pub fn is_status(&self, status: u16) -> bool {
        self.from_wire && self.status == status
    }
}
