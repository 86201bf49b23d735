//! [`CosmosConnection`]: the SDK client, its account endpoint, and the container-handle cache.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use azure_data_cosmos::clients::ContainerClient;
use azure_data_cosmos::{
    AccountEndpoint, AccountReference, CosmosClient, CosmosClientBuilder, RoutingStrategy,
};
use tokio::sync::OnceCell;

#[cfg(feature = "entra-id")]
use super::error::CREDENTIAL_ENV;
use super::error::{CosmosStoreError, ENDPOINT_ENV, KEY_ENV};

/// The Azure Cosmos DB emulator's well-known account key, used for loopback endpoints when no
/// key is given (the Cosmos emulator, `chatter-emulator`).
pub const EMULATOR_KEY: &str =
    "C2y6yDjf5/R+ob0N8A7Cgv30VRDJIWEHLM+4QDU5DE2nQ9nDuVTqobD4b8mGGyPMbIZnqyMsEcaGQy67XIw/Jw==";

/// Account endpoint of the embedded in-memory store (never dialled: no network I/O happens).
#[cfg(feature = "embedded")]
pub const EMBEDDED_ENDPOINT: &str = "https://chatter-embedded.emulator.local/";

/// Cache key of a derived container handle: the `(database, container)` pair, compared
/// ordinally (a tuple, so no joined-string collisions).
type ContainerKey = (String, String);

/// A connection to one Cosmos DB account: the SDK client, the account endpoint it was made
/// for, and a cache of container handles.
///
/// Cheap to clone (an `Arc` inside); clones share the client and the cache.
///
/// Container handles are *derived*, never provisioned: [`container`]
/// resolves an existing container's metadata once per `(database, container)` pair and hands
/// out the same handle afterwards. Creating containers is left to the application (or to
/// [`provision`](crate::provision) in development and tests).
///
/// [`container`]: CosmosConnection::container
#[derive(Clone)]
pub struct CosmosConnection {
    inner: Arc<Inner>,
}

struct Inner {
    client: CosmosClient,
    endpoint: String,
    embedded: bool,
    containers: Mutex<HashMap<ContainerKey, Arc<OnceCell<Arc<ContainerClient>>>>>,
    derivations: AtomicUsize,
}

impl std::fmt::Debug for CosmosConnection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CosmosConnection")
            .field("endpoint", &self.inner.endpoint)
            .field("embedded", &self.inner.embedded)
            .finish_non_exhaustive()
    }
}

impl CosmosConnection {
    /// Connects to a Cosmos DB account (or an emulator) at `endpoint` with an account key.
    ///
    /// When `key` is `None` and the endpoint's host is loopback (`127.0.0.1`, `localhost`,
    /// `[::1]`), the Cosmos emulator's well-known key ([`EMULATOR_KEY`]) is used; any other
    /// endpoint needs a key. Plain `http://` is accepted for loopback endpoints only (the
    /// SDK's rule). The SDK reads the account's properties here, so an unreachable endpoint
    /// fails now rather than at the first request.
    pub async fn connect(endpoint: &str, key: Option<&str>) -> Result<Self, CosmosStoreError> {
        let parsed = parse_endpoint(endpoint)?;
        let key = match key.map(str::trim).filter(|k| !k.is_empty()) {
            Some(key) => key.to_owned(),
            None if is_loopback(&parsed) => EMULATOR_KEY.to_owned(),
            None => {
                return Err(CosmosStoreError::MissingKey {
                    endpoint: parsed.to_string(),
                });
            }
        };
        let account = AccountReference::with_authentication_key(parsed.clone(), key);
        Self::connect_account(parsed, account).await
    }

    /// Connects to a Cosmos DB account at `endpoint` with a Microsoft Entra ID token credential
    /// instead of an account key, for accounts whose key authentication is disabled: a
    /// managed identity, a developer's `az login` (the `azure_identity` crate), or any
    /// `azure_core` [`TokenCredential`](azure_core::credentials::TokenCredential). The identity
    /// needs a Cosmos DB data-plane role on the account (e.g. "Cosmos DB Built-in Data
    /// Contributor"). Plain `http://` is accepted for loopback endpoints only. The SDK reads
    /// the account's properties here, so a credential that hands out no token fails now.
    pub async fn connect_with_credential(
        endpoint: &str,
        credential: Arc<dyn azure_core::credentials::TokenCredential>,
    ) -> Result<Self, CosmosStoreError> {
        let parsed = parse_endpoint(endpoint)?;
        let account = AccountReference::with_credential(parsed.clone(), credential);
        Self::connect_account(parsed, account).await
    }

    /// Builds the SDK client for `account` at `parsed`.
    async fn connect_account(
        parsed: AccountEndpoint,
        account: AccountReference,
    ) -> Result<Self, CosmosStoreError> {
        let endpoint = parsed.to_string();
        // Without a TLS backend the SDK's own error would only say that the request failed.
        if !cfg!(feature = "tls") && parsed.url().scheme() == "https" {
            return Err(CosmosStoreError::TlsNotCompiledIn { endpoint });
        }
        let client = CosmosClientBuilder::new()
            .build(account, RoutingStrategy::PreferredRegions(Vec::new()))
            .await
            .map_err(|source| {
                // The SDK's diagnostics (hundreds of characters of JSON) are for debugging; the
                // error says what failed and why in a sentence.
                tracing::debug!(
                    endpoint,
                    diagnostics = format!("{source:#}"),
                    "Cosmos DB connect failed"
                );
                // 401 with sub-status 20402: the SDK's "credential gave no token".
                let status = source.status();
                if u16::from(status.status_code()) == 401
                    && status.sub_status().map(u16::from) == Some(20402)
                {
                    return CosmosStoreError::NoToken {
                        endpoint: endpoint.clone(),
                        source,
                    };
                }
                CosmosStoreError::Unreachable {
                    endpoint: endpoint.clone(),
                    source,
                }
            })?;
        Ok(Self::from_parts(client, endpoint, false))
    }

    /// Connects to the account named by the environment: [`ENDPOINT_ENV`]
    /// (`CHATTER_COSMOS_ENDPOINT`) and, optionally, [`KEY_ENV`] (`CHATTER_COSMOS_KEY`).
    ///
    /// Without a key, a loopback endpoint uses the emulator's well-known key; a remote one
    /// (feature `entra-id`, a default) a Microsoft Entra ID credential, the one
    /// [`CREDENTIAL_ENV`] (`CHATTER_COSMOS_CREDENTIAL`) names: `managed-identity` (the
    /// default; a user-assigned identity by its client id in `AZURE_CLIENT_ID`) or
    /// `developer-tools` (`az login` or `azd auth login`).
    ///
    /// Returns `Ok(None)` when no endpoint is set (or it is blank).
    pub async fn from_env() -> Result<Option<Self>, CosmosStoreError> {
        let Some(endpoint) = env_value(ENDPOINT_ENV) else {
            return Ok(None);
        };
        match env_value(KEY_ENV) {
            Some(key) => Self::connect(&endpoint, Some(&key)).await.map(Some),
            None => Self::connect_without_key(&endpoint).await.map(Some),
        }
    }

    /// Connects to `endpoint` without an account key: a loopback endpoint with the emulator's
    /// well-known key; a remote one (feature `entra-id`) with the Microsoft Entra ID credential
    /// [`CREDENTIAL_ENV`](super::CREDENTIAL_ENV) names, as [`from_env`](Self::from_env) does;
    /// without that feature, a remote endpoint is [`CosmosStoreError::MissingKey`].
    pub async fn connect_without_key(endpoint: &str) -> Result<Self, CosmosStoreError> {
        #[cfg(feature = "entra-id")]
        if !is_loopback(&parse_endpoint(endpoint)?) {
            let credential = entra_id::from_env(env_value(CREDENTIAL_ENV))?;
            return Self::connect_with_credential(endpoint, credential).await;
        }
        Self::connect(endpoint, None).await
    }

    /// A fresh, empty in-process store: the SDK's in-memory emulator behind a real SDK client
    /// (the whole SDK pipeline runs; only the HTTP I/O is replaced).
    ///
    /// Nothing is persisted: the data lives as long as this connection and its clones, and
    /// every call creates a separate store (clone the connection to share one). The emulator
    /// purges no TTL'd documents. Logs a warning saying so.
    #[cfg(feature = "embedded")]
    pub async fn embedded() -> Result<Self, CosmosStoreError> {
        use azure_data_cosmos::CosmosRuntimeBuilder;
        use azure_data_cosmos_driver::in_memory_emulator::{
            ConsistencyLevel, InMemoryEmulatorHttpClient, VirtualAccountConfig, VirtualRegion,
        };

        let endpoint: AccountEndpoint = EMBEDDED_ENDPOINT
            .parse()
            .map_err(|e| CosmosStoreError::request("embedded", e))?;
        let config =
            VirtualAccountConfig::new(vec![VirtualRegion::new("East US", endpoint.url().clone())])
                .map_err(|e| CosmosStoreError::request("embedded", e))?
                .with_consistency(ConsistencyLevel::Session);
        let emulator = Arc::new(
            InMemoryEmulatorHttpClient::try_new(config)
                .map_err(|e| CosmosStoreError::request("embedded", e))?,
        );
        let runtime = CosmosRuntimeBuilder::from(emulator.runtime_builder())
            .build()
            .await
            .map_err(|e| CosmosStoreError::request("embedded", e))?;
        let account = AccountReference::with_authentication_key(endpoint, EMULATOR_KEY);
        let client = CosmosClientBuilder::new()
            .with_runtime(runtime)
            .build(
                account,
                RoutingStrategy::ProximityTo(azure_data_cosmos::options::Region::EAST_US),
            )
            .await
            .map_err(|e| CosmosStoreError::request("embedded", e))?;
        tracing::warn!(
            endpoint = EMBEDDED_ENDPOINT,
            "chatter is using the embedded in-memory Cosmos store: data is NOT persisted and is \
             lost when the process exits (set {ENDPOINT_ENV} to use a real account or an emulator)"
        );
        // Without a subscriber nobody would see that warning: say it on stderr, once.
        if !tracing::dispatcher::has_been_set() {
            static SAID: std::sync::Once = std::sync::Once::new();
            SAID.call_once(|| {
                eprintln!(
                    "warning: chatter is using the embedded in-memory Cosmos store: data is NOT \
                     persisted and is lost when the process exits (set {ENDPOINT_ENV} to use a \
                     real account or an emulator)"
                );
            });
        }
        Ok(Self::from_parts(client, EMBEDDED_ENDPOINT.to_owned(), true))
    }

    /// The connection chatter uses by default: the account named by the environment
    /// ([`from_env`](Self::from_env)); otherwise the embedded in-memory store when the
    /// `embedded` feature is on; otherwise an error naming the environment variables.
    pub async fn resolve() -> Result<Self, CosmosStoreError> {
        if let Some(connection) = Self::from_env().await? {
            return Ok(connection);
        }
        #[cfg(feature = "embedded")]
        {
            Self::embedded().await
        }
        #[cfg(not(feature = "embedded"))]
        {
            Err(CosmosStoreError::NotConfigured)
        }
    }

    /// Wraps an SDK client built by the application. `endpoint` is the account endpoint the
    /// client was built for (it identifies the change-feed source).
    pub fn from_client(client: CosmosClient, endpoint: impl Into<String>) -> Self {
        Self::from_parts(client, endpoint.into(), false)
    }

    fn from_parts(client: CosmosClient, endpoint: String, embedded: bool) -> Self {
        Self {
            inner: Arc::new(Inner {
                client,
                endpoint,
                embedded,
                containers: Mutex::new(HashMap::new()),
                derivations: AtomicUsize::new(0),
            }),
        }
    }

    /// The SDK client.
    pub fn client(&self) -> &CosmosClient {
        &self.inner.client
    }

    /// The account endpoint this connection was made for, e.g.
    /// `https://myaccount.documents.azure.com:443/` (part of a change-feed source identity).
    pub fn endpoint(&self) -> &str {
        &self.inner.endpoint
    }

    /// Reads document `id` of `database/container` under the partition-key values
    /// `partition_key` as a `T` (e.g. to show what a command wrote); `None` when there is none.
    ///
    /// # Errors
    ///
    /// The key cannot be a Cosmos key, the store failed, or the document is not a `T`
    /// ([`CosmosStoreError::Codec`]).
    pub async fn read<T: serde::de::DeserializeOwned>(
        &self,
        database: &str,
        container: &str,
        partition_key: &[serde_json::Value],
        id: &str,
    ) -> Result<Option<T>, CosmosStoreError> {
        let key = crate::partition_key::sdk_key(partition_key)?;
        let handle = self.container(database, container).await?;
        match super::store::read_item(&handle, key, id).await? {
            super::store::ReadOutcome::NotFound => Ok(None),
            super::store::ReadOutcome::Found { document, .. } => T::deserialize(document)
                .map(Some)
                .map_err(|e| CosmosStoreError::codec("read_item", e)),
        }
    }

    /// Whether this is the embedded in-memory store.
    pub fn is_embedded(&self) -> bool {
        self.inner.embedded
    }

    /// The handle of an existing container, derived once per `(database, container)` pair and
    /// cached: later calls return the same `Arc`. Never creates anything; a missing database
    /// or container is an error (404). A failed derivation is not cached.
    pub async fn container(
        &self,
        database: &str,
        container: &str,
    ) -> Result<Arc<ContainerClient>, CosmosStoreError> {
        let cell = {
            let mut containers = self
                .inner
                .containers
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner());
            Arc::clone(
                containers
                    .entry((database.to_owned(), container.to_owned()))
                    .or_default(),
            )
        };
        cell.get_or_try_init(|| async {
            let handle = self
                .inner
                .client
                .database_client(database)
                .container_client(container, None)
                .await
                .map_err(|e| CosmosStoreError::request("get_container", e))?;
            self.inner.derivations.fetch_add(1, Ordering::Relaxed);
            Ok(Arc::new(handle))
        })
        .await
        .cloned()
    }

    /// [`container`](Self::container), failing with [`CosmosStoreError::Timeout`] past
    /// `timeout`: a start must not wait forever on a store that does not answer.
    pub(crate) async fn container_within(
        &self,
        database: &str,
        container: &str,
        timeout: std::time::Duration,
    ) -> Result<Arc<ContainerClient>, CosmosStoreError> {
        super::store::bounded(
            "get_container",
            timeout,
            self.container(database, container),
        )
        .await
    }

    /// How many container handles this connection has derived (resolved from the service)
    /// so far; cache hits do not count.
    pub fn container_derivations(&self) -> usize {
        self.inner.derivations.load(Ordering::Relaxed)
    }
}

fn env_value(name: &str) -> Option<String> {
    std::env::var(name)
        .ok()
        .map(|value| value.trim().to_owned())
        .filter(|value| !value.is_empty())
}

/// `endpoint` as the SDK reads it.
fn parse_endpoint(endpoint: &str) -> Result<AccountEndpoint, CosmosStoreError> {
    endpoint
        .trim()
        .parse()
        .map_err(|source| CosmosStoreError::InvalidEndpoint {
            endpoint: without_secrets(endpoint),
            source,
        })
}

/// `endpoint` as an error may show it: a connection string pasted in its place
/// (`AccountEndpoint=...;AccountKey=...`) or a URL with a query keeps only what comes before
/// its first `;` or `?`, so a key in it is never printed.
fn without_secrets(endpoint: &str) -> String {
    match endpoint.find([';', '?']) {
        Some(at) => format!("{}...", &endpoint[..at]),
        None => endpoint.to_owned(),
    }
}

/// The Microsoft Entra ID credential the environment chooses.
#[cfg(feature = "entra-id")]
mod entra_id {
    use std::sync::Arc;

    use azure_core::credentials::TokenCredential;
    use azure_identity::{
        DeveloperToolsCredential, ManagedIdentityCredential, ManagedIdentityCredentialOptions,
        UserAssignedId,
    };

    use crate::cosmos::CosmosStoreError;

    /// The user-assigned managed identity's client id, when one is meant.
    const CLIENT_ID_ENV: &str = "AZURE_CLIENT_ID";

    /// `choice` is [`CREDENTIAL_ENV`](super::CREDENTIAL_ENV)'s value (`None`: unset or blank).
    pub(super) fn from_env(
        choice: Option<String>,
    ) -> Result<Arc<dyn TokenCredential>, CosmosStoreError> {
        let failed = |kind| move |source| CosmosStoreError::Credential { kind, source };
        match choice.as_deref().map(str::to_ascii_lowercase).as_deref() {
            None | Some("managed-identity") => {
                let options = ManagedIdentityCredentialOptions {
                    user_assigned_id: super::env_value(CLIENT_ID_ENV).map(UserAssignedId::ClientId),
                    ..Default::default()
                };
                let credential = ManagedIdentityCredential::new(Some(options))
                    .map_err(failed("managed-identity"))?;
                Ok(credential)
            }
            Some("developer-tools") => {
                let credential =
                    DeveloperToolsCredential::new(None).map_err(failed("developer-tools"))?;
                Ok(credential)
            }
            Some(_) => Err(CosmosStoreError::UnknownCredential {
                value: choice.unwrap_or_default(),
            }),
        }
    }
}

/// Whether the endpoint's host is a loopback address or `localhost`.
fn is_loopback(endpoint: &AccountEndpoint) -> bool {
    let Some(host) = endpoint.url().host_str() else {
        return false;
    };
    let host = host.trim_start_matches('[').trim_end_matches(']');
    host.eq_ignore_ascii_case("localhost")
        || host.parse::<IpAddr>().is_ok_and(|ip| ip.is_loopback())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn endpoint(text: &str) -> AccountEndpoint {
        text.parse().unwrap()
    }

    #[test]
    fn loopback_hosts_are_recognised() {
        assert!(is_loopback(&endpoint("http://127.0.0.1:8081/")));
        assert!(is_loopback(&endpoint("http://localhost:8081")));
        assert!(is_loopback(&endpoint("http://LOCALHOST:8081")));
        assert!(is_loopback(&endpoint("http://[::1]:8081/")));
        assert!(!is_loopback(&endpoint("https://acct.documents.azure.com/")));
        assert!(!is_loopback(&endpoint("http://10.0.0.1:8081/")));
    }

    #[tokio::test]
    async fn a_remote_endpoint_without_key_is_a_configuration_error() {
        let err = CosmosConnection::connect("https://acct.documents.azure.com/", None)
            .await
            .unwrap_err();
        assert!(matches!(err, CosmosStoreError::MissingKey { .. }), "{err}");
        assert!(err.to_string().contains(KEY_ENV), "{err}");
    }

    /// Runs only where the feature is off: `cargo test -p chatter-runtime --no-default-features --lib`
    /// (the workspace's own test run unifies features, so `tls` is always on there).
    #[cfg(not(feature = "tls"))]
    #[tokio::test]
    async fn an_https_endpoint_without_the_tls_feature_names_the_feature() {
        let err = CosmosConnection::connect("https://acct.documents.azure.com/", Some("a2V5"))
            .await
            .unwrap_err();
        assert!(
            matches!(err, CosmosStoreError::TlsNotCompiledIn { .. }),
            "{err}"
        );
        assert!(err.to_string().contains("`tls` feature"), "{err}");
    }

    #[cfg(feature = "entra-id")]
    #[test]
    fn the_environment_chooses_a_managed_identity_by_default_or_the_developer_tools() {
        // Creating either does no I/O: the token is asked for at connect.
        for choice in [None, Some("managed-identity"), Some("Developer-Tools")] {
            let chosen = entra_id::from_env(choice.map(str::to_owned));
            assert!(chosen.is_ok(), "{choice:?}: {:?}", chosen.err());
        }
        let error = entra_id::from_env(Some("client-secret".into())).unwrap_err();
        assert!(
            matches!(error, CosmosStoreError::UnknownCredential { .. }),
            "{error}"
        );
        for named in [
            CREDENTIAL_ENV,
            "`client-secret`",
            "managed-identity",
            "developer-tools",
        ] {
            assert!(error.to_string().contains(named), "{named}: {error}");
        }
    }

    #[test]
    fn an_invalid_endpoint_holding_a_key_is_never_shown_with_it() {
        let pasted = "AccountEndpoint=https://acct.documents.azure.com:443/;AccountKey=c2VjcmV0;";
        let error = parse_endpoint(pasted).unwrap_err().to_string();
        assert!(!error.contains("c2VjcmV0"), "{error}");
        assert!(error.contains("AccountEndpoint=https://acct"), "{error}");
    }
}
