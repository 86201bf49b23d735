//! The error type of the Cosmos access layer.

use azure_data_cosmos::CosmosError;
use cosmos_change_feed::RequestError;

use crate::partition_key::PartitionKeyError;

/// Environment variable naming the Cosmos account endpoint chatter connects to.
pub const ENDPOINT_ENV: &str = "CHATTER_COSMOS_ENDPOINT";
/// Environment variable holding the account key (optional for loopback emulator endpoints).
pub const KEY_ENV: &str = "CHATTER_COSMOS_KEY";
/// Environment variable choosing the Microsoft Entra ID credential used when no account key is
/// set for a remote endpoint (feature `entra-id`): `managed-identity` (the default; a
/// user-assigned one by its client id in `AZURE_CLIENT_ID`) or `developer-tools` (the Azure
/// CLI's or the Azure Developer CLI's login).
pub const CREDENTIAL_ENV: &str = "CHATTER_COSMOS_CREDENTIAL";

/// An error talking to Cosmos DB, or preparing a request for it.
///
/// Errors answered by the service keep their HTTP status code (and Cosmos sub-status), so
/// callers can tell a missing document (404) from a precondition failure (412) or a conflict
/// (409): see [`CosmosStoreError::status`].
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CosmosStoreError {
    /// A Cosmos request failed (answered with a non-success status, or not answered at all).
    #[error(transparent)]
    Request(RequestError),

    /// A partition key the SDK cannot take (no value, more than three, an array or object).
    #[error(transparent)]
    PartitionKey(#[from] PartitionKeyError),

    /// A document to write has no string `id` field.
    #[error("a Cosmos document needs a string `id` field; {operation} got a document without one")]
    MissingDocumentId {
        /// What was attempted.
        operation: &'static str,
    },

    /// A request or response body could not be encoded or decoded.
    #[error("Cosmos {operation} could not encode or decode a body")]
    Codec {
        /// What was attempted.
        operation: &'static str,
        /// What went wrong.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },

    /// A store call did not finish within its timeout; it was cancelled and may be retried.
    #[error("Cosmos {operation} timed out after {after:?}")]
    Timeout {
        /// What was attempted.
        operation: &'static str,
        /// The bound that elapsed.
        after: std::time::Duration,
    },

    /// The account endpoint did not answer: down, unreachable, or not a Cosmos DB endpoint.
    #[error("cannot reach Cosmos DB at {endpoint}")]
    Unreachable {
        /// The endpoint that was dialled.
        endpoint: String,
        /// The SDK's error (its diagnostics are logged at debug level).
        #[source]
        source: CosmosError,
    },

    /// The account endpoint is not a URL the SDK accepts.
    #[error("`{endpoint}` is not a valid Cosmos DB endpoint")]
    InvalidEndpoint {
        /// The endpoint as given.
        endpoint: String,
        /// Why the SDK refused it.
        #[source]
        source: CosmosError,
    },

    /// A non-loopback endpoint was given without an account key (and, without the `entra-id`
    /// feature, no Entra ID credential can stand in for it).
    #[error(
        "no account key given for Cosmos DB endpoint {endpoint} (set {KEY_ENV}, or enable \
         chatter-runtime's `entra-id` feature to use Microsoft Entra ID); only loopback emulator \
         endpoints default to the emulator's well-known key"
    )]
    MissingKey {
        /// The endpoint.
        endpoint: String,
    },

    /// The Microsoft Entra ID credential handed out no token (e.g. no managed identity on this
    /// machine, or no `az login`): nothing reached the account.
    #[error(
        "no Microsoft Entra ID token for Cosmos DB endpoint {endpoint}: the credential could not \
         get one (set {KEY_ENV} to use an account key, or {CREDENTIAL_ENV} to choose another \
         credential)"
    )]
    NoToken {
        /// The endpoint.
        endpoint: String,
        /// The SDK's error, with the credential's own.
        #[source]
        source: CosmosError,
    },

    /// [`CREDENTIAL_ENV`] names no credential chatter knows.
    #[error(
        "{CREDENTIAL_ENV}=`{value}` names no credential: use `managed-identity` or \
         `developer-tools` (or set {KEY_ENV} to use an account key)"
    )]
    UnknownCredential {
        /// The variable's value.
        value: String,
    },

    /// The Microsoft Entra ID credential could not be created.
    #[error("the {kind} credential for Cosmos DB could not be created")]
    Credential {
        /// `managed-identity` or `developer-tools`.
        kind: &'static str,
        /// Why.
        #[source]
        source: azure_core::Error,
    },

    /// An `https://` endpoint, with chatter-runtime built without its `tls` feature.
    #[error(
        "Cosmos DB endpoint {endpoint} needs TLS, and chatter-runtime was built without its `tls` \
         feature (a default feature): enable it"
    )]
    TlsNotCompiledIn {
        /// The endpoint.
        endpoint: String,
    },

    /// No account is configured and the `embedded` store is not compiled in.
    #[error(
        "no Cosmos DB account configured: set {ENDPOINT_ENV} (and {KEY_ENV} unless it is a \
         loopback emulator endpoint), or enable chatter-runtime's `embedded` feature for an \
         in-memory store"
    )]
    NotConfigured,

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

impl CosmosStoreError {
    /// Wraps an SDK error, keeping its status code.
    pub(crate) fn request(operation: &'static str, source: CosmosError) -> Self {
        Self::Request(RequestError::new(operation, source))
    }

    /// Wraps an SDK error raised while encoding or decoding a body.
    pub(crate) fn codec(
        operation: &'static str,
        source: impl Into<Box<dyn std::error::Error + Send + Sync>>,
    ) -> Self {
        Self::Codec {
            operation,
            source: source.into(),
        }
    }

    /// A [`CosmosStoreError::Timeout`] of `operation` after `after`.
    pub(crate) fn timeout(operation: &'static str, after: std::time::Duration) -> Self {
        Self::Timeout { operation, after }
    }

    /// The failed request, if this error is one: its status, sub-status and retry-after.
    pub fn failed_request(&self) -> Option<&RequestError> {
        match self {
            Self::Request(request) => Some(request),
            _ => None,
        }
    }

    /// The HTTP status code of a failed request, if this error is one.
    pub fn status(&self) -> Option<u16> {
        self.failed_request().map(|request| request.status)
    }

    /// Whether this is a request the service answered with `status`.
    pub fn is_status(&self, status: u16) -> bool {
        matches!(self, Self::Request(request) if request.is_status(status))
    }
}
