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
#[command(
    name = "chatter",
    version,
    after_help = "Examples:
  export CHATTER_COSMOS_ENDPOINT=http://127.0.0.1:8081
  chatter outbox pending --database shop --container orders
  chatter leases --database shop --container orders-leases
  chatter dead-letters list --broker rabbitmq --destination orders
Each command's --help shows its own examples."
)]
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
    #[command(after_help = "Examples:
  # The file's keys: the chapter \"The `chatter` command\" (chatter-runtime/docs/cli.md)
  chatter relay --config relay.toml
  # The file's account, overridden; the key from CHATTER_COSMOS_KEY
  chatter relay --config relay.toml --endpoint https://shop.documents.azure.com:443/")]
    Relay(relay::RelayArgs),
    /// A command's dead letters on the broker: list, replay, discard.
    #[command(subcommand)]
    DeadLetters(dead_letters::DeadLettersCommand),
    /// The leases of a lease container: each feed range's owner, last write and checkpoint
    /// (exit code 1 when a lease is free or expired: no relay serves its range).
    #[command(after_help = "Examples:
  chatter leases --database shop --container orders-leases
  # With each lease's backlog of the relay of container `orders`
  chatter leases --database shop --container orders-leases --backlog-of orders
  # Processors whose lease expiry is not the default 30 s
  chatter leases --database shop --container orders-leases --expiry-seconds 60 --json")]
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

#[cfg(test)]
mod tests {
    use clap::{CommandFactory, Parser};

    use super::Cli;

    /// The words of an example line as a shell splits them (double quotes only: the examples
    /// use no other quoting).
    fn words(line: &str) -> Vec<String> {
        let mut words = Vec::new();
        let mut word = String::new();
        let mut quoted = false;
        let mut started = false;
        for c in line.chars() {
            match c {
                '"' => {
                    quoted = !quoted;
                    started = true;
                }
                c if c.is_whitespace() && !quoted => {
                    if started {
                        words.push(std::mem::take(&mut word));
                        started = false;
                    }
                }
                c => {
                    word.push(c);
                    started = true;
                }
            }
        }
        if started {
            words.push(word);
        }
        words
    }

    /// The example lines of a command's help: each line that runs `chatter`.
    fn examples(command: &clap::Command) -> Vec<Vec<String>> {
        let help = command
            .get_after_help()
            .map(ToString::to_string)
            .unwrap_or_default();
        help.lines()
            .map(str::trim_start)
            .filter(|line| line.starts_with("chatter "))
            .map(words)
            .collect()
    }

    /// Each command a user runs shows examples after its options, and every example parses, as
    /// that very command: a flag renamed or a value no longer accepted fails here, not in a
    /// reader's shell.
    #[test]
    fn every_command_shows_examples_that_parse_as_that_command() {
        fn leaves(command: &clap::Command, path: &[String], found: &mut Vec<Vec<String>>) {
            let mut subcommands = command.get_subcommands().peekable();
            if subcommands.peek().is_none() {
                found.push(path.to_vec());
            }
            for sub in subcommands {
                let mut path = path.to_vec();
                path.push(sub.get_name().to_owned());
                leaves(sub, &path, found);
            }
        }
        let root = Cli::command();
        let mut found = Vec::new();
        leaves(&root, &[], &mut found);
        assert!(found.len() >= 9, "{found:?}");
        for path in &found {
            let command = path.iter().fold(&root, |command, name| {
                command
                    .find_subcommand(name)
                    .expect("a path of names found")
            });
            let lines = examples(command);
            assert!(
                !lines.is_empty(),
                "`chatter {}` shows no example",
                path.join(" ")
            );
            for line in lines {
                assert_eq!(&line[1..=path.len()], path.as_slice(), "{line:?}");
                if let Err(error) = Cli::try_parse_from(&line) {
                    panic!("the example {line:?} does not parse: {error}");
                }
            }
        }
        // The top-level ones run other commands: each parses.
        for line in examples(&root) {
            if let Err(error) = Cli::try_parse_from(&line) {
                panic!("the example {line:?} does not parse: {error}");
            }
        }
    }

    #[test]
    fn an_example_line_splits_as_a_shell_splits_it() {
        assert_eq!(
            words(r#"chatter outbox give-up --id m-3 --reason "a queue rebuilt" --yes"#),
            [
                "chatter",
                "outbox",
                "give-up",
                "--id",
                "m-3",
                "--reason",
                "a queue rebuilt",
                "--yes"
            ]
        );
    }
}
