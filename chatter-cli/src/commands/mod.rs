//! One module per top-level command, each with its arguments and its `run`, so that adding a
//! command touches one file and the dispatch in `main`. What more than one command takes (a
//! container, a confirmation) is here.

use std::io::{BufRead, Write};

use chatter_runtime::cosmos::CosmosStoreError;
use clap::Args;

use crate::failure::{Failure, chain};
use crate::store::Account;

pub(crate) mod dead_letters;
pub(crate) mod leases;
pub(crate) mod outbox;
pub(crate) mod relay;

#[derive(Debug, Args)]
pub(crate) struct Container {
    #[command(flatten)]
    account: Account,
    /// The database.
    #[arg(long)]
    database: String,
    /// The container: the outbox documents' (`outbox`), the leases' (`leases`).
    #[arg(long)]
    container: String,
}

/// How a repair is confirmed.
#[derive(Debug, Args)]
pub(crate) struct Confirm {
    /// Apply without asking.
    #[arg(long, conflicts_with = "dry_run")]
    yes: bool,
    /// Show what would change and write nothing.
    #[arg(long)]
    dry_run: bool,
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

/// Asks on the terminal whether to apply `count` changes; anything but `y`/`yes` (or no input
/// at all) is no.
fn confirmed(count: usize) -> Result<bool, Failure> {
    eprint!(
        "apply {}? [y/N] ",
        if count == 1 {
            "this change".to_owned()
        } else {
            format!("these {count} changes")
        }
    );
    let _ = std::io::stderr().flush();
    let mut answer = String::new();
    std::io::stdin()
        .lock()
        .read_line(&mut answer)
        .map_err(|e| Failure::Input(format!("cannot read the answer: {e}")))?;
    Ok(matches!(
        answer.trim().to_ascii_lowercase().as_str(),
        "y" | "yes"
    ))
}
