//! `chatter`: what is stuck in a container's outbox, for an operator.
//!
//! ```text
//! chatter outbox pending       --database shop --container orders [--json]
//! chatter outbox undeliverable --database shop --container orders [--body-resolver] [--json]
//! chatter outbox requeue --database shop --container orders (--id ID... | --destination D | --violation TEXT) [--force | --body-resolver] [--yes | --dry-run]
//! chatter outbox give-up --database shop --container orders (--id ID... | --destination D) --reason TEXT [--yes | --dry-run]
//! chatter leases --database shop --container orders-leases [--expiry-seconds 30] [--json]
//! chatter relay --config relay.toml
//! chatter dead-letters list    --broker rabbitmq|nats --destination orders [--limit 100] [--json]
//! chatter dead-letters replay  --broker rabbitmq|nats --destination orders (--id ID... | --all) [--yes | --dry-run]
//! chatter dead-letters discard --broker rabbitmq|nats --destination orders (--id ID... | --all) [--yes | --dry-run]
//! ```
//!
//! The broker's URL (it may hold a password) comes from `CHATTER_BROKER_URL` or
//! `--broker-url-file`, and is never printed.
//!
//! The account comes from `--endpoint` or `CHATTER_COSMOS_ENDPOINT`; its key from
//! `CHATTER_COSMOS_KEY` or `--key-file` (never from a flag, which would land in the shell's
//! history), and none for a loopback emulator or, for a remote account, Microsoft Entra ID
//! (`CHATTER_COSMOS_CREDENTIAL`). The key is never printed.
//!
//! `requeue` and `give-up` show what they will change and ask before writing (`--yes` does not
//! ask; `--dry-run` only shows).
//!
//! Exit codes: 0 done (nothing undeliverable, every lease served, every selected document
//! changed), 1 `undeliverable` or `dead-letters list` found some, `leases` found a lease nobody
//! serves (free or expired), or a repair or a replay refused, missed or failed one or was
//! declined, 2 bad input
//! (flags, endpoint, key file, credential choice, a database or container that does not exist),
//! 3 the store or the broker could not be read.

use std::path::PathBuf;
use std::process::ExitCode;

use chatter_runtime::cosmos::{CosmosConnection, CosmosStoreError, ENDPOINT_ENV};
use chatter_runtime::operator::{
    LeaseServed, MessageSource, OutboxSurvey, Selection, estimate_backlog, plan_give_up,
    plan_requeue, survey_leases, survey_outbox,
};
use clap::{Args, Parser, Subcommand};

mod dead_letters;
mod relay;
mod repair;
mod tables;

use tables::{leases_table, pending_table, print, undeliverable_table};

/// What is stuck in a container chatter relays.
#[derive(Debug, Parser)]
#[command(name = "chatter", version)]
struct Cli {
    /// The Cosmos DB account (or emulator) endpoint.
    #[arg(long, env = ENDPOINT_ENV, global = true)]
    endpoint: Option<String>,
    /// A file holding the account key (else `CHATTER_COSMOS_KEY`; none for a loopback emulator
    /// or Microsoft Entra ID).
    #[arg(long, global = true)]
    key_file: Option<PathBuf>,
    /// Machine-readable JSON instead of a table.
    #[arg(long, global = true)]
    json: bool,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// The Outbox Documents of a container.
    #[command(subcommand)]
    Outbox(Outbox),
    /// Runs standalone relays from a TOML file until SIGINT or SIGTERM.
    Relay(RelayArgs),
    /// A command's dead letters on the broker: list, replay, discard.
    #[command(subcommand)]
    DeadLetters(dead_letters::DeadLettersCommand),
    /// The leases of a lease container: each feed range's owner, last write and checkpoint
    /// (exit code 1 when a lease is free or expired: no relay serves its range).
    Leases(Leases),
}

#[derive(Debug, Args)]
struct RelayArgs {
    /// The relay configuration (TOML: `[cosmos]`, `[broker]`, one `[[relay]]` per monitored
    /// container).
    #[arg(long)]
    config: PathBuf,
}

#[derive(Debug, Args)]
struct Leases {
    #[command(flatten)]
    at: Container,
    /// The processors' lease expiry: a lease its owner has not written for longer is expired.
    #[arg(long, default_value_t = 30)]
    expiry_seconds: u64,
    /// Also estimate each lease's backlog (pending Outbox Documents after its checkpoint) of
    /// the relay of this monitored container (in the same database), reading its change feed.
    #[arg(long, value_name = "MONITORED_CONTAINER")]
    backlog_of: Option<String>,
    /// The relay's processor name, for a relay with a declared source identity (else the name
    /// a relay of `--backlog-of` through this endpoint has).
    #[arg(long, requires = "backlog_of")]
    processor: Option<String>,
}

#[derive(Debug, Subcommand)]
enum Outbox {
    /// The pending documents by destination: how many, and the oldest.
    Pending(Container),
    /// The documents stamped `undeliverable`, each with the contract violations found in it
    /// (exit code 1 when there is any).
    Undeliverable(Undeliverable),
    /// Puts `undeliverable` documents back to `pending` once their cause is fixed; the relay
    /// publishes them. One that still violates the contract is refused unless `--force`.
    Requeue(Requeue),
    /// Stamps `pending` documents `undeliverable` with a reason: the way past a document the
    /// relay cannot publish (e.g. a broker that keeps refusing it). `requeue` undoes it.
    GiveUp(GiveUp),
}

#[derive(Debug, Args)]
struct Undeliverable {
    #[command(flatten)]
    at: Container,
    #[command(flatten)]
    source: Source,
}

/// Which relay serves the container: nothing in the container tells.
#[derive(Debug, Args)]
struct Source {
    /// The container's relay has a body resolver (thin triggers): it does not check the Outbox
    /// Document Contract, so neither does this command.
    #[arg(long)]
    body_resolver: bool,
}

impl Source {
    fn message_source(&self) -> MessageSource {
        if self.body_resolver {
            MessageSource::BodyResolver
        } else {
            MessageSource::Document
        }
    }
}

#[derive(Debug, Args)]
struct Requeue {
    #[command(flatten)]
    at: Container,
    #[command(flatten)]
    select: RequeueSelection,
    /// Requeue documents that still violate the contract too (a relay that publishes each
    /// document as its message checks them again and stamps them `undeliverable` again unless
    /// the violation no longer applies).
    #[arg(long, conflicts_with = "body_resolver")]
    force: bool,
    #[command(flatten)]
    source: Source,
    #[command(flatten)]
    confirm: Confirm,
}

#[derive(Debug, Args)]
#[group(required = true, multiple = false)]
struct RequeueSelection {
    /// These documents (document id or message id; repeat the flag for several).
    #[arg(long = "id")]
    ids: Vec<String>,
    /// Every undeliverable document for this destination.
    #[arg(long)]
    destination: Option<String>,
    /// Every undeliverable document with a violation containing this text (needs `--force`:
    /// they still violate it).
    #[arg(long, conflicts_with = "body_resolver")]
    violation: Option<String>,
}

#[derive(Debug, Args)]
struct GiveUp {
    #[command(flatten)]
    at: Container,
    #[command(flatten)]
    select: GiveUpSelection,
    /// Why, kept in the document (`chatterOperatorReason`) for whoever looks next.
    #[arg(long)]
    reason: String,
    #[command(flatten)]
    confirm: Confirm,
}

#[derive(Debug, Args)]
#[group(required = true, multiple = false)]
struct GiveUpSelection {
    /// These documents (document id or message id; repeat the flag for several).
    #[arg(long = "id")]
    ids: Vec<String>,
    /// Every pending document for this destination.
    #[arg(long)]
    destination: Option<String>,
}

/// How a repair is confirmed.
#[derive(Debug, Args)]
struct Confirm {
    /// Apply without asking.
    #[arg(long, conflicts_with = "dry_run")]
    yes: bool,
    /// Show what would change and write nothing.
    #[arg(long)]
    dry_run: bool,
}

#[derive(Debug, Args)]
struct Container {
    /// The database.
    #[arg(long)]
    database: String,
    /// The container: the outbox documents' (`outbox`), the leases' (`leases`).
    #[arg(long)]
    container: String,
}

/// Why `chatter` stopped, with its exit code.
enum Failure {
    /// Bad input: exit code 2.
    Input(String),
    /// The store could not be read: exit code 3.
    Store(String),
}

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(error) => {
            // Help and version are not failures; clap's usage errors exit 2.
            let _ = error.print();
            return ExitCode::from(if error.use_stderr() { 2 } else { 0 });
        }
    };
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("chatter: cannot start: {error}");
            return ExitCode::from(3);
        }
    };
    match runtime.block_on(run(cli)) {
        Ok(code) => ExitCode::from(code),
        Err(Failure::Input(message)) => {
            eprintln!("chatter: {message}");
            ExitCode::from(2)
        }
        Err(Failure::Store(message)) => {
            eprintln!("chatter: {message}");
            ExitCode::from(3)
        }
    }
}

async fn run(cli: Cli) -> Result<u8, Failure> {
    match &cli.command {
        // The broker's commands need no store.
        Command::DeadLetters(command) => return dead_letters::run(command, cli.json).await,
        Command::Relay(args) => {
            return relay::run(
                &args.config,
                cli.endpoint.as_deref(),
                cli.key_file.as_deref(),
            )
            .await;
        }
        _ => {}
    }
    let cosmos = connect_store(cli.endpoint.as_deref(), cli.key_file.as_deref()).await?;
    match &cli.command {
        Command::Outbox(Outbox::Pending(at)) => {
            let survey = survey(&cosmos, at, MessageSource::Document).await?;
            print(cli.json, &survey, pending_table);
            Ok(0)
        }
        Command::Outbox(Outbox::Undeliverable(Undeliverable { at, source })) => {
            let survey = survey(&cosmos, at, source.message_source()).await?;
            print(cli.json, &survey, undeliverable_table);
            Ok(u8::from(!survey.undeliverable.is_empty()))
        }
        Command::Outbox(Outbox::Requeue(requeue)) => {
            let selection = match &requeue.select {
                RequeueSelection {
                    destination: Some(d),
                    ..
                } => Selection::Destination(d.clone()),
                RequeueSelection {
                    violation: Some(v), ..
                } => Selection::Violation(v.clone()),
                RequeueSelection { ids, .. } => Selection::Ids(ids.clone()),
            };
            let at = &requeue.at;
            let plan = plan_requeue(
                &cosmos,
                &at.database,
                &at.container,
                &selection,
                requeue.source.message_source(),
                requeue.force,
            )
            .await
            .map_err(|error| read_failed("the outbox", at, &error))?;
            repair::run_plan(&cosmos, at, cli.json, "requeue", plan, &requeue.confirm).await
        }
        Command::Outbox(Outbox::GiveUp(give_up)) => {
            if give_up.reason.trim().is_empty() {
                return Err(Failure::Input(
                    "--reason must say why (it is kept in the document)".into(),
                ));
            }
            let selection = match &give_up.select {
                GiveUpSelection {
                    destination: Some(d),
                    ..
                } => Selection::Destination(d.clone()),
                GiveUpSelection { ids, .. } => Selection::Ids(ids.clone()),
            };
            let at = &give_up.at;
            let plan = plan_give_up(
                &cosmos,
                &at.database,
                &at.container,
                &selection,
                give_up.reason.trim(),
            )
            .await
            .map_err(|error| read_failed("the outbox", at, &error))?;
            repair::run_plan(&cosmos, at, cli.json, "give-up", plan, &give_up.confirm).await
        }
        Command::DeadLetters(command) => dead_letters::run(command, cli.json).await,
        Command::Relay(args) => {
            relay::run(
                &args.config,
                cli.endpoint.as_deref(),
                cli.key_file.as_deref(),
            )
            .await
        }
        Command::Leases(Leases {
            at,
            expiry_seconds,
            backlog_of,
            processor,
        }) => {
            let expiry = std::time::Duration::from_secs(*expiry_seconds);
            let mut leases = survey_leases(&cosmos, &at.database, &at.container, expiry)
                .await
                .map_err(|error| read_failed("the leases", at, &error))?;
            if let Some(monitored) = backlog_of {
                let estimated = estimate_backlog(
                    &cosmos,
                    &at.database,
                    monitored,
                    &at.container,
                    processor.as_deref(),
                    &mut leases,
                )
                .await
                .map_err(|error| {
                    Failure::Store(format!(
                        "cannot estimate the backlog of {}/{monitored}: {}",
                        at.database,
                        chain(error.as_ref())
                    ))
                })?;
                if !leases.iter().any(|lease| lease.processor == estimated) {
                    return Err(Failure::Input(format!(
                        "no lease of processor {estimated} (the relay of {}/{monitored}) in {}/{}; \
                         a relay with a declared source identity: pass --processor",
                        at.database, at.database, at.container
                    )));
                }
            }
            print(cli.json, leases.as_slice(), leases_table);
            Ok(u8::from(leases.iter().any(|lease| {
                lease.state != LeaseServed::Owned || lease.suspended
            })))
        }
    }
}

/// The store at `endpoint`, its key from `key_file` or `CHATTER_COSMOS_KEY` (none: a loopback
/// emulator, or Microsoft Entra ID for a remote account).
async fn connect_store(
    endpoint: Option<&str>,
    key_file: Option<&std::path::Path>,
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

async fn survey(
    cosmos: &CosmosConnection,
    at: &Container,
    source: MessageSource,
) -> Result<OutboxSurvey, Failure> {
    survey_outbox(cosmos, &at.database, &at.container, source)
        .await
        .map_err(|error| read_failed("the outbox", at, &error))
}

/// Reading `what` of `at` failed: a database or container that does not exist was named
/// wrongly (bad input); anything else is the store's.
fn read_failed(what: &str, at: &Container, error: &CosmosStoreError) -> Failure {
    let message = format!(
        "cannot read {what} of {}/{}: {}",
        at.database,
        at.container,
        chain(error)
    );
    if error.status() == Some(404) {
        Failure::Input(message)
    } else {
        Failure::Store(message)
    }
}

/// An error and its causes on one line.
fn chain(error: &(dyn std::error::Error + 'static)) -> String {
    chatter_runtime::error::ErrorChain(error).to_string()
}
