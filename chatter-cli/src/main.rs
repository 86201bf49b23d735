//! `chatter`: what is stuck in a container's outbox, for an operator.
//!
//! ```text
//! chatter outbox pending       --database shop --container orders [--json]
//! chatter outbox undeliverable --database shop --container orders [--json]
//! chatter leases --database shop --container orders-leases [--expiry-seconds 30] [--json]
//! ```
//!
//! The account comes from `--endpoint` or `CHATTER_COSMOS_ENDPOINT`; its key from
//! `CHATTER_COSMOS_KEY` or `--key-file` (never from a flag, which would land in the shell's
//! history), and none for a loopback emulator or, for a remote account, Microsoft Entra ID
//! (`CHATTER_COSMOS_CREDENTIAL`). The key is never printed.
//!
//! Exit codes: 0 done (nothing undeliverable, every lease served), 1 `undeliverable` found
//! documents or `leases` found a lease nobody serves (free or expired), 2 bad input
//! (flags, endpoint, key file, credential choice, a database or container that does not exist),
//! 3 the store could not be read.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{SystemTime, UNIX_EPOCH};

use chatter_runtime::cosmos::{CosmosConnection, CosmosStoreError, ENDPOINT_ENV};
use chatter_runtime::operator::{
    LeaseServed, LeaseView, OutboxSurvey, survey_leases, survey_outbox,
};
use clap::{Args, Parser, Subcommand};

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
    /// The leases of a lease container: each feed range's owner, last write and checkpoint
    /// (exit code 1 when a lease is free or expired: no relay serves its range).
    Leases(Leases),
}

#[derive(Debug, Args)]
struct Leases {
    #[command(flatten)]
    at: Container,
    /// The processors' lease expiry: a lease its owner has not written for longer is expired.
    #[arg(long, default_value_t = 30)]
    expiry_seconds: u64,
}

#[derive(Debug, Subcommand)]
enum Outbox {
    /// The pending documents by destination: how many, and the oldest.
    Pending(Container),
    /// The documents stamped `undeliverable`, each with the contract violations found in it
    /// (exit code 1 when there is any).
    Undeliverable(Container),
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
    let cosmos = connect(&cli).await?;
    match &cli.command {
        Command::Outbox(Outbox::Pending(at)) => {
            let survey = survey(&cosmos, at).await?;
            print(cli.json, &survey, pending_table);
            Ok(0)
        }
        Command::Outbox(Outbox::Undeliverable(at)) => {
            let survey = survey(&cosmos, at).await?;
            print(cli.json, &survey, undeliverable_table);
            Ok(u8::from(!survey.undeliverable.is_empty()))
        }
        Command::Leases(Leases { at, expiry_seconds }) => {
            let expiry = std::time::Duration::from_secs(*expiry_seconds);
            let leases = survey_leases(&cosmos, &at.database, &at.container, expiry)
                .await
                .map_err(|error| read_failed("the leases", at, &error))?;
            print(cli.json, leases.as_slice(), leases_table);
            Ok(u8::from(
                leases.iter().any(|lease| lease.state != LeaseServed::Owned),
            ))
        }
    }
}

async fn connect(cli: &Cli) -> Result<CosmosConnection, Failure> {
    let Some(endpoint) = cli.endpoint.as_deref().filter(|e| !e.trim().is_empty()) else {
        return Err(Failure::Input(format!(
            "no account endpoint: pass --endpoint or set {ENDPOINT_ENV}"
        )));
    };
    let key = match &cli.key_file {
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

async fn survey(cosmos: &CosmosConnection, at: &Container) -> Result<OutboxSurvey, Failure> {
    survey_outbox(cosmos, &at.database, &at.container)
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
    chatter_runtime::ErrorChain(error).to_string()
}

fn print<T: serde::Serialize + ?Sized>(json: bool, survey: &T, table: fn(&T) -> String) {
    if json {
        match serde_json::to_string_pretty(survey) {
            Ok(text) => println!("{text}"),
            Err(error) => eprintln!("chatter: cannot write JSON: {error}"),
        }
    } else {
        print!("{}", table(survey));
    }
}

fn pending_table(survey: &OutboxSurvey) -> String {
    if survey.pending.is_empty() {
        return "no pending outbox documents\n".to_owned();
    }
    let now = now();
    let mut rows = vec![[
        "DESTINATION".to_owned(),
        "PENDING".to_owned(),
        "OLDEST WRITTEN".to_owned(),
        "OLDEST MESSAGE ID".to_owned(),
    ]];
    for (destination, pending) in &survey.pending {
        rows.push([
            destination.clone(),
            pending.count.to_string(),
            pending
                .oldest_written_at
                .map_or_else(|| "?".to_owned(), |at| when(at, now)),
            pending.oldest_message_id.clone().unwrap_or_default(),
        ]);
    }
    format!(
        "{}{} pending in all\n",
        columns(&rows),
        survey.pending_count()
    )
}

fn undeliverable_table(survey: &OutboxSurvey) -> String {
    if survey.undeliverable.is_empty() {
        return "no undeliverable outbox documents\n".to_owned();
    }
    let now = now();
    let mut rows = vec![[
        "MESSAGE ID".to_owned(),
        "DESTINATION".to_owned(),
        "STAMPED".to_owned(),
        "VIOLATIONS".to_owned(),
    ]];
    for doc in &survey.undeliverable {
        rows.push([
            doc.message_id.clone(),
            doc.destination.clone(),
            doc.stamped_at
                .map_or_else(|| "?".to_owned(), |at| when(at, now)),
            if doc.violations.is_empty() {
                "none now (it passes the contract)".to_owned()
            } else {
                doc.violations.join("; ")
            },
        ]);
    }
    format!(
        "{}{} undeliverable\n",
        columns(&rows),
        survey.undeliverable.len()
    )
}

fn leases_table(leases: &[LeaseView]) -> String {
    if leases.is_empty() {
        return "no leases\n".to_owned();
    }
    let now = now();
    let mut rows = vec![[
        "PROCESSOR".to_owned(),
        "LEASE".to_owned(),
        "OWNER".to_owned(),
        "LAST WRITTEN".to_owned(),
        "CHECKPOINTED".to_owned(),
        "STATE".to_owned(),
    ]];
    for lease in leases {
        rows.push([
            lease.processor.clone(),
            lease.lease_token.clone(),
            lease.owner.clone().unwrap_or_else(|| "-".to_owned()),
            lease
                .last_written_at
                .map_or_else(|| "?".to_owned(), |at| when(at, now)),
            if lease.checkpointed { "yes" } else { "no" }.to_owned(),
            match lease.state {
                LeaseServed::Owned => "owned",
                LeaseServed::Expired => "EXPIRED (its owner stopped writing it)",
                LeaseServed::Free => "FREE (no relay serves it)",
            }
            .to_owned(),
        ]);
    }
    let unserved = leases
        .iter()
        .filter(|lease| lease.state != LeaseServed::Owned)
        .count();
    format!(
        "{}{} leases, {unserved} not served\n",
        columns(&rows),
        leases.len()
    )
}

/// Left-aligned columns, two spaces apart (the last one unpadded).
fn columns<const N: usize>(rows: &[[String; N]]) -> String {
    let mut widths = [0; N];
    for row in rows {
        for (width, cell) in widths.iter_mut().zip(row) {
            *width = (*width).max(cell.chars().count());
        }
    }
    let mut out = String::new();
    for row in rows {
        let mut line = String::new();
        for (at, cell) in row.iter().enumerate() {
            if at + 1 == N {
                line.push_str(cell);
            } else {
                line.push_str(&format!("{cell:<width$}  ", width = widths[at]));
            }
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

fn now() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX))
}

/// A Cosmos `_ts` as UTC time and age, e.g. `2026-12-02T17:20:01Z (4m 12s ago)`.
fn when(at: i64, now: i64) -> String {
    let stamp = time::OffsetDateTime::from_unix_timestamp(at)
        .ok()
        .and_then(|t| {
            t.format(&time::format_description::well_known::Rfc3339)
                .ok()
        })
        .unwrap_or_else(|| at.to_string());
    let age = now.saturating_sub(at).max(0);
    let age = match age {
        s if s < 60 => format!("{s}s"),
        s if s < 3_600 => format!("{}m {}s", s / 60, s % 60),
        s if s < 86_400 => format!("{}h {}m", s / 3_600, (s % 3_600) / 60),
        s => format!("{}d {}h", s / 86_400, (s % 86_400) / 3_600),
    };
    format!("{stamp} ({age} ago)")
}
