//! Creating databases and containers, for development and tests.
//!
//! Production code never provisions: chatter derives handles of containers the application
//! created. These helpers exist so examples, tests and the embedded store
//! can start from nothing. They are idempotent: they create only what is missing, and accept
//! an existing container when its partition-key paths are the requested ones.

use std::borrow::Cow;

use azure_data_cosmos::models::{ContainerProperties, PartitionKeyDefinition, TimeToLive};

use crate::cosmos::store::read_container_properties;
use crate::cosmos::{CosmosConnection, CosmosStoreError};
use crate::registry::DocumentReliable;

/// The partition-key path of a lease container.
pub const LEASE_PARTITION_KEY_PATH: &str = "/id";

/// Ensures `database` and its `container` exist. A new container gets `partition_key_paths`
/// (hierarchical when there are several) and `defaultTtl = -1` (TTL on, no default expiry, so
/// the relay's per-document `ttl` stamps take effect).
///
/// An existing container is left as it is, but one whose partition-key paths differ from the
/// requested ones is an error.
pub async fn ensure_container(
    connection: &CosmosConnection,
    database: &str,
    container: &str,
    partition_key_paths: &[&str],
) -> Result<(), CosmosStoreError> {
    crate::partition_key::check_levels(partition_key_paths.len())?;
    ensure_database(connection, database).await?;

    let paths: Vec<Cow<'static, str>> = partition_key_paths
        .iter()
        .map(|path| Cow::Owned((*path).to_owned()))
        .collect();
    let properties =
        ContainerProperties::new(container.to_owned(), PartitionKeyDefinition::new(paths))
            .with_default_ttl(TimeToLive::NoDefault);
    match connection
        .client()
        .database_client(database)
        .create_container(properties, None)
        .await
    {
        Ok(_) => Ok(()),
        Err(e) if is_conflict(&e) => {
            let handle = connection.container(database, container).await?;
            let existing = read_container_properties(&handle)
                .await?
                .partition_key_paths;
            if existing
                .iter()
                .map(String::as_str)
                .eq(partition_key_paths.iter().copied())
            {
                Ok(())
            } else {
                Err(CosmosStoreError::PartitionKeyPathsMismatch {
                    database: database.to_owned(),
                    container: container.to_owned(),
                    existing,
                    requested: partition_key_paths
                        .iter()
                        .map(|p| (*p).to_owned())
                        .collect(),
                })
            }
        }
        Err(e) => Err(CosmosStoreError::request("create_container", e)),
    }
}

/// Ensures `database` and its lease container `lease` exist (partition key `/id`,
/// `defaultTtl = -1`).
pub async fn ensure_lease_container(
    connection: &CosmosConnection,
    database: &str,
    lease: &str,
) -> Result<(), CosmosStoreError> {
    ensure_container(connection, database, lease, &[LEASE_PARTITION_KEY_PATH]).await
}

/// Ensures the containers command `C` needs, from its registration: its container with its
/// partition-key path(s), and its lease container, in its database (what the derive's
/// `#[cosmos]` and `#[partition_key]` name, so nothing is spelled twice).
pub async fn ensure_for<C: DocumentReliable>(
    connection: &CosmosConnection,
) -> Result<(), CosmosStoreError> {
    let registration = C::registration();
    if let Some(inbox) = registration.standalone_inbox {
        // A standalone-inbox command's idempotency container, and the lease container of its
        // relay when it names one.
        ensure_container(
            connection,
            registration.database,
            registration.container,
            &[inbox.partition_key_path],
        )
        .await?;
        if registration.lease.is_empty() {
            return Ok(());
        }
        return ensure_lease_container(connection, registration.database, registration.lease).await;
    }
    let paths: Vec<&str> = registration
        .partition_key
        .iter()
        .map(|path| path.path)
        .collect();
    ensure_container(
        connection,
        registration.database,
        registration.container,
        &paths,
    )
    .await?;
    ensure_lease_container(connection, registration.database, registration.lease).await
}

/// Ensures `database` exists.
pub async fn ensure_database(
    connection: &CosmosConnection,
    database: &str,
) -> Result<(), CosmosStoreError> {
    match connection.client().create_database(database, None).await {
        Ok(_) => Ok(()),
        Err(e) if is_conflict(&e) => Ok(()),
        Err(e) => Err(CosmosStoreError::request("create_database", e)),
    }
}

fn is_conflict(error: &azure_data_cosmos::CosmosError) -> bool {
    u16::from(error.status().status_code()) == 409
}
