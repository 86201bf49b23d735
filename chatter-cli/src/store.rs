//! The account the commands that read the store name: `--endpoint` or
//! `CHATTER_COSMOS_ENDPOINT`, its key from `--key-file` or `CHATTER_COSMOS_KEY` (never a flag),
//! none for a loopback emulator or Microsoft Entra ID.

use std::path::{Path, PathBuf};

use chatter_runtime::cosmos::{CosmosConnection, CosmosStoreError, ENDPOINT_ENV};
use clap::Args;

use crate::failure::{Failure, chain};

/// The account flags of `outbox`, `leases` and `relay` (`dead-letters` reads no store, and does
/// not show them).
#[derive(Debug, Args)]
pub(crate) struct Account {
    /// The Cosmos DB account (or emulator) endpoint.
    #[arg(long, env = ENDPOINT_ENV)]
    pub(crate) endpoint: Option<String>,
    /// A file holding the account key (else `CHATTER_COSMOS_KEY`; none for a loopback emulator
    /// or Microsoft Entra ID).
    #[arg(long)]
    pub(crate) key_file: Option<PathBuf>,
}

impl Account {
    pub(crate) async fn connect(&self) -> Result<CosmosConnection, Failure> {
        connect_store(self.endpoint.as_deref(), self.key_file.as_deref()).await
    }
}

/// The store at `endpoint`, its key from `key_file` or `CHATTER_COSMOS_KEY` (none: a loopback
/// emulator, or Microsoft Entra ID for a remote account).
pub(crate) async fn connect_store(
    endpoint: Option<&str>,
    key_file: Option<&Path>,
) -> Result<CosmosConnection, Failure> {
    let Some(endpoint) = endpoint.filter(|e| !e.trim().is_empty()) else {
        return Err(Failure::Input(format!(
            "no account endpoint: pass --endpoint or set {ENDPOINT_ENV}"
        )));
    };
    let key = match key_file {
        Some(path) => Some(
            std::fs::read_to_string(path)
                .map_err(|e| {
                    Failure::Input(format!("cannot read the key file {}: {e}", path.display()))
                })?
                .trim()
                .to_owned(),
        ),
        None => std::env::var(chatter_runtime::cosmos::KEY_ENV)
            .ok()
            .filter(|k| !k.trim().is_empty()),
    };
    let connected = match key {
        Some(key) => CosmosConnection::connect(endpoint, Some(&key)).await,
        None => CosmosConnection::connect_without_key(endpoint).await,
    };
    connected.map_err(|error| match error {
        CosmosStoreError::Unreachable { .. } => Failure::Store(chain(&error)),
        _ => Failure::Input(chain(&error)),
    })
}
