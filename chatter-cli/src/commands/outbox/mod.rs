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
    Pending(Container),
    /// The documents stamped `undeliverable`, each with the contract violations found in it
    /// (exit code 1 when there is any).
    Undeliverable(Undeliverable),
    /// Puts `undeliverable` documents back to `pending` once their cause is fixed; the relay
    /// publishes them. One that still violates the contract is refused unless `--force`.
    Requeue(repair::Requeue),
    /// Stamps `pending` documents `undeliverable` with a reason: the way past a document the
    /// relay cannot publish (e.g. a broker that keeps refusing it). `requeue` undoes it.
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
