//! `chatter outbox`: the Outbox Documents of a container, surveyed (`pending`,
//! `undeliverable`) or repaired (`requeue`, `give-up`).

use chatter_runtime::cosmos::CosmosConnection;
use chatter_runtime::operator::{MessageSource, OutboxSurvey, survey_outbox};
use clap::{Args, Subcommand};

use super::{Container, read_failed};
use crate::failure::Failure;
use crate::tables::{pending_table, print, undeliverable_table};

mod repair;

#[derive(Debug, Subcommand)]
pub(crate) enum Outbox {
    /// The pending documents by destination: how many, and the oldest.
    #[command(after_help = "Examples:
  # What waits to be published, on the emulator of this machine (no key)
  chatter outbox pending --database shop --container orders --endpoint http://127.0.0.1:8081
  # On an account whose endpoint and key are in CHATTER_COSMOS_ENDPOINT and CHATTER_COSMOS_KEY
  chatter outbox pending --database shop --container orders --json")]
    Pending(Container),
    /// The documents stamped `undeliverable`, each with the contract violations found in it
    /// (exit code 1 when there is any).
    #[command(after_help = "Examples:
  chatter outbox undeliverable --database shop --container orders
  # A container a standalone relay with a body resolver serves (no contract to check)
  chatter outbox undeliverable --database shop --container triggers --body-resolver")]
    Undeliverable(Undeliverable),
    /// Puts `undeliverable` documents back to `pending` once their cause is fixed; the relay
    /// publishes them. One that still violates the contract is refused unless `--force`.
    #[command(after_help = "Examples:
  # Shows the change and asks before writing
  chatter outbox requeue --database shop --container orders --id m-poison
  # Every undeliverable document of a destination (given up while its queue was broken),
  # once it is fixed; no question
  chatter outbox requeue --database shop --container orders --destination payments --yes
  # Only shows what would change
  chatter outbox requeue --database shop --container orders --violation Destination --force --dry-run")]
    Requeue(repair::Requeue),
    /// Stamps `pending` documents `undeliverable` with a reason: the way past a document the
    /// relay cannot publish (e.g. a broker that keeps refusing it). `requeue` undoes it.
    #[command(after_help = "Examples:
  chatter outbox give-up --database shop --container orders --id m-3 --reason \"payments queue is being rebuilt\"
  chatter outbox give-up --database shop --container orders --destination payments --reason \"queue deleted\" --dry-run")]
    GiveUp(repair::GiveUp),
}

impl Outbox {
    /// The container every command reads.
    fn at(&self) -> &Container {
        match self {
            Outbox::Pending(at) => at,
            Outbox::Undeliverable(args) => &args.at,
            Outbox::Requeue(requeue) => &requeue.at,
            Outbox::GiveUp(give_up) => &give_up.at,
        }
    }
}

#[derive(Debug, Args)]
pub(crate) struct Undeliverable {
    #[command(flatten)]
    pub(super) at: Container,
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

/// Runs `command` on the store its account flags name.
pub(crate) async fn run(command: &Outbox, json: bool) -> Result<u8, Failure> {
    let cosmos = command.at().account.connect().await?;
    match command {
        Outbox::Pending(at) => pending(&cosmos, at, json).await,
        Outbox::Undeliverable(args) => undeliverable(&cosmos, args, json).await,
        Outbox::Requeue(requeue) => repair::requeue(&cosmos, requeue, json).await,
        Outbox::GiveUp(give_up) => repair::give_up(&cosmos, give_up, json).await,
    }
}

async fn pending(cosmos: &CosmosConnection, at: &Container, json: bool) -> Result<u8, Failure> {
    let survey = survey(cosmos, at, MessageSource::Document).await?;
    print(json, &survey, pending_table);
    Ok(0)
}

/// Exit code 1 when there is any.
async fn undeliverable(
    cosmos: &CosmosConnection,
    Undeliverable { at, source }: &Undeliverable,
    json: bool,
) -> Result<u8, Failure> {
    let survey = survey(cosmos, at, source.message_source()).await?;
    print(json, &survey, undeliverable_table);
    Ok(u8::from(!survey.undeliverable.is_empty()))
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
