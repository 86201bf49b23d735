//! `chatter dead-letters list|replay|discard`: a command's dead letters on RabbitMQ or NATS
//! JetStream (`<destination>.dead-letter`).

use std::path::PathBuf;

use chatter_runtime::broker::{
    DeadLetter, DeadLetterAction, DeadLetterOutcome, DeadLetterSelection, DeadLetters,
};
use clap::{Args, Subcommand};
use serde::Serialize;

use super::{Confirm, confirmed};
use crate::broker::{self, BrokerKind, Connected};
use crate::failure::{Failure, chain};
use crate::tables::{columns, counted};

/// How many dead letters `list` shows unless `--limit` says otherwise.
const DEFAULT_LIMIT: usize = 100;
/// The most dead letters a replay or a discard reads (and so can take) in one run.
const MOST: usize = 100_000;

#[derive(Debug, Subcommand)]
pub(crate) enum DeadLettersCommand {
    /// Lists a destination's dead letters, oldest first (exit code 1 when there is any).
    #[command(after_help = "Examples:
  # The broker's URL (it may hold a password) from the environment, never a flag
  export CHATTER_BROKER_URL=amqp://guest:guest@127.0.0.1:5672/%2f
  chatter dead-letters list --broker rabbitmq --destination register-user
  chatter dead-letters list --broker nats --broker-url-file nats-url.txt --destination register-user --limit 10 --json")]
    List(List),
    /// Publishes dead letters to their destination again, message id kept (the inbox skips one
    /// that had committed after all), attempt count reset; then removes them.
    #[command(after_help = "Examples:
  # Shows the dead letter and asks before publishing
  chatter dead-letters replay --broker rabbitmq --destination register-user --id m-7
  chatter dead-letters replay --broker rabbitmq --destination register-user --all --yes")]
    Replay(Change),
    /// Removes dead letters for good.
    #[command(after_help = "Examples:
  chatter dead-letters discard --broker rabbitmq --destination register-user --id m-7 --dry-run
  chatter dead-letters discard --broker nats --destination register-user --all --yes")]
    Discard(Change),
}

#[derive(Debug, Args)]
pub(crate) struct At {
    /// The broker.
    #[arg(long, value_enum)]
    broker: BrokerKind,
    /// A file holding the broker's URL (else `CHATTER_BROKER_URL`), e.g.
    /// `amqp://user:password@host:5672/%2f` or `nats://host:4222`.
    #[arg(long)]
    broker_url_file: Option<PathBuf>,
    /// The command's destination (its dead letters are `<destination>.dead-letter`).
    #[arg(long)]
    destination: String,
}

#[derive(Debug, Args)]
pub(crate) struct List {
    #[command(flatten)]
    at: At,
    /// Show at most this many.
    #[arg(long, default_value_t = DEFAULT_LIMIT)]
    limit: usize,
}

#[derive(Debug, Args)]
pub(crate) struct Change {
    #[command(flatten)]
    at: At,
    #[command(flatten)]
    select: Select,
    #[command(flatten)]
    confirm: Confirm,
}

#[derive(Debug, Args)]
#[group(required = true, multiple = false)]
struct Select {
    /// These message ids (repeat the flag for several).
    #[arg(long = "id")]
    ids: Vec<String>,
    /// Every dead letter of the destination.
    #[arg(long)]
    all: bool,
}

#[derive(Serialize)]
struct Report<'a> {
    selected: &'a [DeadLetter],
    not_found: &'a [String],
    dry_run: bool,
    outcome: Option<&'a DeadLetterOutcome>,
}

/// Runs `command` on the broker it names (no store).
pub(crate) async fn run(command: &DeadLettersCommand, json: bool) -> Result<u8, Failure> {
    match command {
        DeadLettersCommand::List(args) => list(args, json).await,
        DeadLettersCommand::Replay(change) => settle(change, DeadLetterAction::Replay, json).await,
        DeadLettersCommand::Discard(change) => {
            settle(change, DeadLetterAction::Discard, json).await
        }
    }
}

/// `dead-letters list`: exit code 1 when there is any.
async fn list(list: &List, json: bool) -> Result<u8, Failure> {
    let broker = connect(&list.at).await?;
    let letters = broker
        .list(&list.at.destination, list.limit)
        .await
        .map_err(|e| Failure::Store(format!("cannot read the dead letters: {}", chain(&e))))?;
    if json {
        crate::tables::print(true, letters.as_slice(), table);
    } else {
        print!("{}", table(&letters));
    }
    Ok(u8::from(!letters.is_empty()))
}

/// The dead letters a replay or a discard takes, as read once: exactly these are shown, and
/// taken.
struct Picked {
    selected: Vec<DeadLetter>,
    /// The ids asked for that are not among the dead letters read.
    not_found: Vec<String>,
    /// How many dead letters were read ([`MOST`] when there may be more).
    read: usize,
}

/// `dead-letters replay|discard`: shows what `action` takes, asks, takes it. Exit code 1 when an
/// id was not found, a dead letter was refused or the run stopped part-way, or it was declined.
async fn settle(change: &Change, action: DeadLetterAction, json: bool) -> Result<u8, Failure> {
    let verb = match action {
        DeadLetterAction::Replay => "replay",
        DeadLetterAction::Discard => "discard",
    };
    let broker = connect(&change.at).await?;
    let destination = &change.at.destination;
    let picked = pick(broker.as_ref(), destination, &change.select).await?;
    let report = |outcome: Option<&DeadLetterOutcome>| {
        if json {
            let report = Report {
                selected: &picked.selected,
                not_found: &picked.not_found,
                dry_run: change.confirm.dry_run,
                outcome,
            };
            crate::tables::print(true, &report, |_| String::new());
        }
    };
    let shown = preview(verb, action, destination, &picked);
    let asking = !picked.selected.is_empty() && !change.confirm.yes && !change.confirm.dry_run;
    if !json {
        print!("{shown}");
    } else if asking {
        // Nobody is asked about a change they were not shown.
        eprint!("{shown}");
    }
    let problems = !picked.not_found.is_empty();
    if picked.selected.is_empty() || change.confirm.dry_run {
        if change.confirm.dry_run && !json {
            println!("dry run: nothing was changed");
        }
        report(None);
        return Ok(u8::from(problems));
    }
    if asking && !confirmed(picked.selected.len())? {
        eprintln!("chatter: nothing was changed");
        report(None);
        return Ok(1);
    }
    // Exactly the dead letters shown: one that arrived since is not taken.
    let outcome = broker
        .settle(destination, &picked.selected, action)
        .await
        .map_err(|e| Failure::Store(format!("{verb} did not start: {}", chain(&e))))?;
    print_outcome(verb, &outcome, json);
    report(Some(&outcome));
    Ok(u8::from(
        problems || !outcome.refused.is_empty() || outcome.failed.is_some(),
    ))
}

/// Reads the dead letters of `destination` (at most [`MOST`]) and picks those `select` names.
async fn pick(
    broker: &dyn DeadLetters,
    destination: &str,
    select: &Select,
) -> Result<Picked, Failure> {
    let selection = if select.all {
        DeadLetterSelection::All
    } else {
        DeadLetterSelection::Ids(select.ids.clone())
    };
    let letters = broker
        .list(destination, MOST)
        .await
        .map_err(|e| Failure::Store(format!("cannot read the dead letters: {}", chain(&e))))?;
    let read = letters.len();
    let selected: Vec<DeadLetter> = letters
        .into_iter()
        .filter(|letter| selection.takes(&letter.message_id))
        .collect();
    let not_found: Vec<String> = match &selection {
        DeadLetterSelection::All => Vec::new(),
        DeadLetterSelection::Ids(ids) => ids
            .iter()
            .filter(|id| !selected.iter().any(|letter| &letter.message_id == *id))
            .cloned()
            .collect(),
    };
    Ok(Picked {
        selected,
        not_found,
        read,
    })
}

/// What `verb` will take, for a person: the dead letters, the ids not found, and whether some
/// were left unread.
fn preview(verb: &str, action: DeadLetterAction, destination: &str, picked: &Picked) -> String {
    let selected = &picked.selected;
    let mut shown = String::new();
    if selected.is_empty() {
        shown.push_str(&format!(
            "{verb}: no dead letter of `{destination}` selected\n"
        ));
    } else {
        let target = match action {
            DeadLetterAction::Replay => format!(" to `{destination}`"),
            DeadLetterAction::Discard => String::new(),
        };
        shown.push_str(&format!(
            "{verb} will take {}{target}:\n{}",
            if selected.len() == 1 {
                "this dead letter".to_owned()
            } else {
                format!("these {} dead letters", selected.len())
            },
            table(selected)
        ));
    }
    for id in &picked.not_found {
        shown.push_str(&format!("not found: {id}\n"));
    }
    if picked.read == MOST {
        shown.push_str(&format!(
            "only the first {MOST} dead letters were read; run again for the rest\n"
        ));
    }
    shown
}

/// What `verb` did: each refusal and the count for a person (not with `--json`, whose report
/// holds them), and on standard error where it stopped, if it did.
fn print_outcome(verb: &str, outcome: &DeadLetterOutcome, json: bool) {
    if !json {
        for (id, why) in &outcome.refused {
            println!("not {verb}ed {id}: {why}");
        }
        println!(
            "{} {verb}ed",
            counted(outcome.done.len(), "dead letter", "dead letters")
        );
    }
    if let Some(error) = &outcome.failed {
        eprintln!(
            "chatter: {verb} stopped part-way ({} done): {error}",
            outcome.done.len()
        );
    }
}

/// The broker `at` names (errors name its URL without the password).
async fn connect(at: &At) -> Result<Box<dyn DeadLetters>, Failure> {
    let file = at.broker_url_file.as_deref();
    Ok(
        match broker::connect(at.broker, file, "pass --broker-url-file").await? {
            Connected::Rabbitmq(broker) => Box::new(broker),
            Connected::Nats(broker) => Box::new(broker),
        },
    )
}

fn table(letters: &[DeadLetter]) -> String {
    if letters.is_empty() {
        return "no dead letters\n".to_owned();
    }
    // The reason last, whole: what an operator needs comes at its end ("...; the last: the
    // handler failed: <why>"), past the width other cells are cut to. The body is cut.
    let mut rows = vec![[
        "MESSAGE ID".to_owned(),
        "ATTEMPTS".to_owned(),
        "BODY".to_owned(),
        "REASON".to_owned(),
    ]];
    for letter in letters {
        rows.push([
            letter.message_id.clone(),
            letter
                .attempts
                .map_or_else(|| "-".to_owned(), |n| n.to_string()),
            if letter.replayable {
                letter.body.clone()
            } else {
                format!("(no Brokered Message) {}", letter.body)
            },
            letter.reason.clone().unwrap_or_default(),
        ]);
    }
    format!(
        "{}{}\n",
        columns(&rows),
        counted(letters.len(), "dead letter", "dead letters")
    )
}
