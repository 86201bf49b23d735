//! `chatter`: what is stuck in a container's outbox, for an operator.
//!
//! ```text
//! chatter outbox pending       --database shop --container orders [--json]
//!     (outbox, leases and relay also take [--endpoint URL] [--key-file FILE], after the command)
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

use std::process::ExitCode;

use clap::{Parser, Subcommand};

mod broker;
mod commands;
mod failure;
mod store;
mod tables;

use commands::{dead_letters, leases, outbox, relay};
use failure::Failure;

/// What is stuck in a container chatter relays.
#[derive(Debug, Parser)]
#[command(name = "chatter", version)]
struct Cli {
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
    Outbox(outbox::Outbox),
    /// Runs standalone relays from a TOML file until SIGINT or SIGTERM.
    Relay(relay::RelayArgs),
    /// A command's dead letters on the broker: list, replay, discard.
    #[command(subcommand)]
    DeadLetters(dead_letters::DeadLettersCommand),
    /// The leases of a lease container: each feed range's owner, last write and checkpoint
    /// (exit code 1 when a lease is free or expired: no relay serves its range).
    Leases(leases::Leases),
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

/// The command the line names, run: its exit code, or why it stopped.
async fn run(cli: Cli) -> Result<u8, Failure> {
    match &cli.command {
        Command::Outbox(command) => outbox::run(command, cli.json).await,
        Command::Relay(args) => relay::run(args).await,
        Command::DeadLetters(command) => dead_letters::run(command, cli.json).await,
        Command::Leases(args) => leases::run(args, cli.json).await,
    }
}
