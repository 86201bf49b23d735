//! `chatter relay --config relay.toml`: standalone relays from a file, for a team that deploys a
//! relay without writing Rust. Runs until SIGINT or SIGTERM, then stops gracefully (pages in
//! flight finish, leases are released).
//!
//! ```toml
//! [cosmos]
//! endpoint = "https://my-account.documents.azure.com:443/" # --endpoint / CHATTER_COSMOS_ENDPOINT win
//! key_file = "/run/secrets/cosmos-key"   # else CHATTER_COSMOS_KEY; neither: emulator or Entra ID
//!
//! [broker]
//! kind = "rabbitmq"                      # or "nats"
//! url_file = "/run/secrets/broker-url"   # else CHATTER_BROKER_URL
//!
//! [[relay]]
//! database = "shop"
//! container = "orders"
//! lease_container = "orders-leases"      # lease_database: the database unless given
//! partition_key = ["/orderId"]
//!
//! [relay.options]                        # every one optional
//! poll_interval_ms = 1000
//! lease_expiry_seconds = 60
//! publish_timeout_seconds = 300
//! store_timeout_seconds = 30             # derived unless given:
//! handler_timeout_seconds = 390          #   above publish + store (5 min at least)
//! lease_renew_interval_ms = 5000         #   at most half the lease expiry (5 s at most)
//! max_in_flight = 32
//! max_items_per_page = 100
//! delivered_status = "delivered"
//! delivered_ttl_seconds = 86400
//! ```
//!
//! Secrets are never read from the file (an unknown key such as `key` or `url` is refused):
//! the account key and the broker's URL come from the environment or the files named.

use std::path::{Path, PathBuf};
use std::time::Duration;

use chatter_runtime::broker::Broker;
use chatter_runtime::cosmos::CosmosConnection;
use chatter_runtime::{relay::RelayOptions, relay::RunningRelays, relay::StandaloneRelay};
use clap::Args;
use serde::Deserialize;

use crate::broker::{self, BrokerKind, Connected};
use crate::failure::{Failure, chain};
use crate::store::{Account, connect_store};
use chatter_runtime::error::RelayError;

#[derive(Debug, Args)]
pub(crate) struct RelayArgs {
    /// The relay configuration (TOML: `[cosmos]`, `[broker]`, one `[[relay]]` per monitored
    /// container).
    #[arg(long)]
    config: PathBuf,
    #[command(flatten)]
    account: Account,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Config {
    #[serde(default)]
    cosmos: CosmosSection,
    broker: BrokerSection,
    relay: Vec<RelaySection>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct CosmosSection {
    endpoint: Option<String>,
    key_file: Option<PathBuf>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct BrokerSection {
    kind: BrokerKind,
    url_file: Option<PathBuf>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RelaySection {
    database: String,
    container: String,
    lease_database: Option<String>,
    lease_container: String,
    partition_key: PartitionKey,
    source_identity: Option<SourceIdentity>,
    #[serde(default)]
    options: OptionsSection,
}

#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum PartitionKey {
    One(String),
    Levels(Vec<String>),
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct SourceIdentity {
    monitored: String,
    lease: String,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct OptionsSection {
    poll_interval_ms: Option<u64>,
    lease_expiry_seconds: Option<u64>,
    publish_timeout_seconds: Option<u64>,
    store_timeout_seconds: Option<u64>,
    handler_timeout_seconds: Option<u64>,
    lease_renew_interval_ms: Option<u64>,
    max_in_flight: Option<usize>,
    max_items_per_page: Option<u32>,
    delivered_status: Option<String>,
    delivered_ttl_seconds: Option<i64>,
}

/// The library's defaults of the timings the file may leave out ([`RelayOptions`]' docs).
const DEFAULT_PUBLISH_TIMEOUT: Duration = Duration::from_secs(30);
const DEFAULT_STORE_TIMEOUT: Duration = Duration::from_secs(30);
const DEFAULT_HANDLER_TIMEOUT: Duration = Duration::from_secs(5 * 60);
const DEFAULT_RENEW_INTERVAL: Duration = Duration::from_secs(5);
/// What a derived handler timeout leaves above one document's publish and stamp: the rest of
/// the page.
const HANDLER_MARGIN: Duration = Duration::from_secs(60);

impl OptionsSection {
    /// The relay's options. A timing the library checks against another one the file sets is
    /// derived from it when the file leaves it out, so no value the file accepts is refused
    /// for a key it lacks: the handler timeout stays above the publish and store timeouts (one
    /// minute more, 5 min at least), the renew interval at most half the lease expiry (5 s at
    /// most). Values the file sets are taken as given, and checked.
    fn relay_options(&self) -> RelayOptions {
        let mut options = RelayOptions::default();
        if let Some(ms) = self.poll_interval_ms {
            options = options.poll_interval(Duration::from_millis(ms));
        }
        if let Some(seconds) = self.lease_expiry_seconds {
            let expiry = Duration::from_secs(seconds);
            options = options.lease_expiry(expiry);
            if self.lease_renew_interval_ms.is_none() {
                options = options.lease_renew_interval(DEFAULT_RENEW_INTERVAL.min(expiry / 2));
            }
        }
        if let Some(ms) = self.lease_renew_interval_ms {
            options = options.lease_renew_interval(Duration::from_millis(ms));
        }
        let publish = self
            .publish_timeout_seconds
            .map_or(DEFAULT_PUBLISH_TIMEOUT, Duration::from_secs);
        let store = self
            .store_timeout_seconds
            .map_or(DEFAULT_STORE_TIMEOUT, Duration::from_secs);
        options = options.publish_timeout(publish).store_timeout(store);
        options = options.handler_timeout(self.handler_timeout_seconds.map_or_else(
            || {
                DEFAULT_HANDLER_TIMEOUT
                    .max(publish.saturating_add(store).saturating_add(HANDLER_MARGIN))
            },
            Duration::from_secs,
        ));
        if let Some(n) = self.max_in_flight {
            options = options.max_in_flight(n);
        }
        if let Some(n) = self.max_items_per_page {
            options = options.max_items_per_page(n);
        }
        if let Some(status) = &self.delivered_status {
            options = options.delivered_status(status.clone());
        }
        if let Some(seconds) = self.delivered_ttl_seconds {
            options = options.delivered_ttl_seconds(seconds);
        }
        options
    }
}

/// How often `chatter relay` looks whether the leases it owns changed.
const OWNED_LEASES_EVERY: Duration = Duration::from_secs(1);

/// Logs `info` and above to standard error, or what `RUST_LOG` names (`warn`,
/// `chatter_runtime=debug,info`: levels per target; span filters are not read). A `RUST_LOG`
/// that does not parse is said so, and the default kept.
fn install_logs() {
    use tracing_subscriber::filter::{LevelFilter, Targets};
    use tracing_subscriber::layer::SubscriberExt;
    let default = Targets::new().with_default(LevelFilter::INFO);
    let (targets, unread) = match std::env::var("RUST_LOG") {
        Ok(value) if !value.trim().is_empty() => match value.parse::<Targets>() {
            Ok(targets) => (targets, None),
            Err(error) => (
                default,
                Some(format!("RUST_LOG ({value}) ignored: {error}")),
            ),
        },
        _ => (default, None),
    };
    let subscriber = tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_ansi(false)
        .with_max_level(LevelFilter::TRACE)
        .finish()
        .with(targets);
    if tracing::subscriber::set_global_default(subscriber).is_ok()
        && let Some(unread) = unread
    {
        tracing::warn!(target: "chatter", "{unread}");
    }
}

/// Runs the relays `--config` describes until SIGINT or SIGTERM; the flags' account wins over
/// the file's.
pub(crate) async fn run(args: &RelayArgs) -> Result<u8, Failure> {
    install_logs();
    let config = read_config(&args.config)?;
    let account = &args.account;
    let endpoint = account.endpoint.clone().or(config.cosmos.endpoint.clone());
    let key_file = account.key_file.clone().or(config.cosmos.key_file.clone());
    let cosmos = connect_store(endpoint.as_deref(), key_file.as_deref()).await?;
    let relays = config
        .relay
        .iter()
        .map(|section| relay(&cosmos, section))
        .collect::<Result<Vec<_>, _>>()?;
    let running = start_on_broker(&config.broker, relays).await?;
    serve(running).await;
    Ok(0)
}

/// The configuration at `path`, with one `[[relay]]` at least.
fn read_config(path: &Path) -> Result<Config, Failure> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| Failure::Input(format!("cannot read {}: {e}", path.display())))?;
    // The message and the line only: toml's own rendering quotes the line, which could be a
    // secret put in the file by mistake.
    let config: Config = toml::from_str(&text).map_err(|e| {
        let line = e.span().map(|span| {
            text.get(..span.start)
                .map_or(1, |before| before.matches('\n').count() + 1)
        });
        Failure::Input(format!(
            "{}{} is not a relay configuration: {} (the account key and the broker URL never go \
             in the file: CHATTER_COSMOS_KEY or key_file, CHATTER_BROKER_URL or url_file)",
            path.display(),
            line.map_or_else(String::new, |line| format!(":{line}")),
            e.message().trim_end()
        ))
    })?;
    if config.relay.is_empty() {
        return Err(Failure::Input(format!(
            "{} names no [[relay]]",
            path.display()
        )));
    }
    Ok(config)
}

/// Connects to the broker `section` names and starts `relays` on it.
async fn start_on_broker(
    section: &BrokerSection,
    relays: Vec<StandaloneRelay>,
) -> Result<RunningRelays, Failure> {
    let file = section.url_file.as_deref();
    match broker::connect(section.kind, file, "url_file (in the file's [broker])").await? {
        Connected::Rabbitmq(broker) => start(relays, broker).await,
        Connected::Nats(broker) => start(relays, broker).await,
    }
}

/// Logs which leases the relays own whenever that changes, until SIGINT or SIGTERM; then stops
/// them gracefully.
async fn serve(running: RunningRelays) {
    println!("chatter relay started; SIGINT or SIGTERM stops it");
    // Leases are taken after the start (at the first acquire round): say which once they are.
    let mut owned: Vec<(String, Vec<String>)> = running
        .owned_leases()
        .into_iter()
        .map(|(processor, _)| (processor, Vec::new()))
        .collect();
    let mut stop = std::pin::pin!(stopped());
    loop {
        let now = running.owned_leases();
        if now != owned {
            for (processor, leases) in &now {
                tracing::info!(
                    target: "chatter",
                    processor,
                    leases = %leases.join(", "),
                    "relay owns leases ({} now)",
                    leases.len()
                );
            }
            owned = now;
        }
        tokio::select! {
            () = &mut stop => break,
            () = tokio::time::sleep(OWNED_LEASES_EVERY) => {}
        }
    }
    println!("stopping: pages in flight finish, leases are released");
    running.shutdown().await;
}

async fn start(
    relays: Vec<StandaloneRelay>,
    broker: impl Broker,
) -> Result<RunningRelays, Failure> {
    StandaloneRelay::start_all(relays, broker)
        .await
        .map_err(|error| {
            let message = format!("the relay did not start: {}", chain(&error));
            // What an operator changes in the configuration or the containers is bad input; a
            // store or broker that did not answer is not.
            match &error {
                RelayError::Processor { .. } => Failure::Store(message),
                RelayError::Container { source, .. } if source.status() != Some(404) => {
                    Failure::Store(message)
                }
                RelayError::Broker(source)
                    if !matches!(
                        source,
                        chatter_runtime::broker::BrokerError::Misconfigured { .. }
                    ) =>
                {
                    Failure::Store(message)
                }
                _ => Failure::Input(message),
            }
        })
}

fn relay(cosmos: &CosmosConnection, section: &RelaySection) -> Result<StandaloneRelay, Failure> {
    let lease_database = section
        .lease_database
        .as_deref()
        .unwrap_or(&section.database);
    let paths: Vec<&str> = match &section.partition_key {
        PartitionKey::One(path) => vec![path.as_str()],
        PartitionKey::Levels(paths) => paths.iter().map(String::as_str).collect(),
    };
    let mut builder = StandaloneRelay::builder(
        cosmos,
        (&section.database, &section.container),
        (lease_database, &section.lease_container),
    )
    .partition_key_paths(&paths)
    .options(section.options.relay_options());
    if let Some(identity) = &section.source_identity {
        builder = builder.source_identities(&identity.monitored, &identity.lease);
    }
    builder.build().map_err(|e| {
        Failure::Input(format!(
            "relay {}/{}: {}",
            section.database,
            section.container,
            chain(&e)
        ))
    })
}

/// Resolves on SIGINT or SIGTERM.
async fn stopped() {
    let interrupt = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut terminate =
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(terminate) => terminate,
                Err(_) => {
                    let _ = interrupt.await;
                    return;
                }
            };
        tokio::select! {
            _ = interrupt => {}
            _ = terminate.recv() => {}
        }
    }
    #[cfg(not(unix))]
    {
        let _ = interrupt.await;
    }
}
