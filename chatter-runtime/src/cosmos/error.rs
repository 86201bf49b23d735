//! The error type of the Cosmos access layer.

use azure_data_cosmos::CosmosError;

/// Environment variable naming the Cosmos account endpoint chatter connects to.
pub const ENDPOINT_ENV: &str = "CHATTER_COSMOS_ENDPOINT";
/// Environment variable holding the account key (optional for loopback emulator endpoints).
pub const KEY_ENV: &str = "CHATTER_COSMOS_KEY";

/// An error talking to Cosmos DB, or preparing a request for it.
///
/// Errors answered by the service keep their HTTP status code (and Cosmos sub-status), so
/// callers can tell a missing document (404) from a precondition failure (412) or a conflict
/// (409): see [`CosmosStoreError::status`].
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CosmosStoreError {
    /// A Cosmos request failed (answered with a non-success status, or not answered at all).
    #[error("Cosmos {operation} failed with HTTP status {status}{}: {source}", sub_status_text(*.sub_status))]
    Request {
        /// What was attempted, e.g. `read_item`, `execute_batch`, `create_container`.
        operation: &'static str,
        /// The HTTP status code. For failures raised by the SDK itself (transport errors,
        /// timeouts) this is the SDK's synthetic status (see `from_wire`).
        status: u16,
        /// The Cosmos sub-status code, when there is one.
        sub_status: Option<u16>,
        /// Whether the status was answered by the service (`false`: raised client-side).
        from_wire: bool,
        /// The SDK error.
        #[source]
        source: CosmosError,
    },

    /// A partition-key value is not a JSON string, number, boolean or null.
    #[error(
        "partition key value {index} is a JSON {kind}; a partition key value must be a string, number, boolean or null"
    )]
    InvalidPartitionKeyValue {
        /// Zero-based position of the value (the hierarchical level).
        index: usize,
        /// The JSON kind found (`array` or `object`).
        kind: &'static str,
    },

    /// A partition key has no value, or more than the three levels Cosmos allows.
    #[error("a partition key needs 1 to 3 values (one per partition-key path), got {count}")]
    PartitionKeyArity {
        /// How many values were given.
        count: usize,
    },

    /// A partition-key number is NaN or infinite.
    #[error("partition key value {index} is not a finite number")]
    NonFinitePartitionKeyNumber {
        /// Zero-based position of the value.
        index: usize,
    },

    /// A document to write has no string `id` field.
    #[error("a Cosmos document needs a string `id` field; {operation} got a document without one")]
    MissingDocumentId {
        /// What was attempted.
        operation: &'static str,
    },

    /// The SDK could not encode a request or decode a response body.
    #[error("Cosmos {operation}: {message}")]
    Codec {
        /// What was attempted.
        operation: &'static str,
        /// What went wrong.
        message: String,
    },

    /// A store call did not finish within its timeout; it was cancelled and may be retried.
    #[error("Cosmos {operation} timed out after {after:?}")]
    Timeout {
        /// What was attempted.
        operation: &'static str,
        /// The bound that elapsed.
        after: std::time::Duration,
    },

    /// The connection settings are missing or unusable.
    #[error("{0}")]
    Configuration(String),

    /// A container that provisioning found already exists with other partition-key paths.
    #[error(
        "container '{database}/{container}' already exists with partition-key paths {existing:?}, not the requested {requested:?}"
    )]
    PartitionKeyPathsMismatch {
        /// Database name.
        database: String,
        /// Container name.
        container: String,
        /// The paths the existing container has.
        existing: Vec<String>,
        /// The paths that were asked for.
        requested: Vec<String>,
    },
}

fn sub_status_text(sub_status: Option<u16>) -> String {
    match sub_status {
        Some(code) if code != 0 => format!(" (sub-status {code})"),
        _ => String::new(),
    }
}

impl CosmosStoreError {
    /// Wraps an SDK error, keeping its status code.
    pub(crate) fn request(operation: &'static str, source: CosmosError) -> Self {
        let status = source.status();
        Self::Request {
            operation,
            status: u16::from(status.status_code()),
            sub_status: status.sub_status().map(u16::from),
            from_wire: source.is_from_wire(),
            source,
        }
    }

    /// Wraps an SDK error raised while encoding or decoding a body.
    pub(crate) fn codec(operation: &'static str, source: impl std::fmt::Display) -> Self {
        Self::Codec {
            operation,
            message: source.to_string(),
        }
    }

    /// A [`CosmosStoreError::Timeout`] of `operation` after `after`.
    pub(crate) fn timeout(operation: &'static str, after: std::time::Duration) -> Self {
        Self::Timeout { operation, after }
    }

    /// The HTTP status code of a failed request, if this error is one.
    pub fn status(&self) -> Option<u16> {
        match self {
            Self::Request { status, .. } => Some(*status),
            _ => None,
        }
    }

    /// The Cosmos sub-status code of a failed request, if there is one.
    pub fn sub_status(&self) -> Option<u16> {
        match self {
            Self::Request { sub_status, .. } => *sub_status,
            _ => None,
        }
    }

    /// How long the service asked the caller to wait before retrying (`x-ms-retry-after-ms`,
    /// sent with 429 Too Many Requests), if it did.
    pub fn retry_after(&self) -> Option<std::time::Duration> {
        match self {
            Self::Request { source, .. } => source
                .response()?
                .headers()
                .retry_after_ms
                .map(std::time::Duration::from_millis),
            _ => None,
        }
    }

    /// Whether this is a request the service answered with `status`.
    pub fn is_status(&self, status: u16) -> bool {
        matches!(self, Self::Request { status: s, from_wire: true, .. } if *s == status)
    }
}
