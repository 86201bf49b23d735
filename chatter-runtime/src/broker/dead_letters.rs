//! What an operator does with a command's dead letters (`<destination>.dead-letter`): list
//! them, replay them to the destination (the message id kept, so the inbox dedups one that had
//! committed after all; the attempt count reset), or discard them.

use futures::future::BoxFuture;
use serde::Serialize;

use super::BrokerError;
use crate::message::BrokeredMessage;
use crate::message::{ATTEMPTS_CONTEXT_KEY, DEAD_LETTER_REASON_CONTEXT_KEY};
use serde_json::Value;

/// How much of a dead letter's body a listing shows.
const BODY_SHOWN: usize = 200;

/// A message in a dead-letter destination, as an operator sees it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct DeadLetter {
    /// Where it was found: its stream sequence (NATS), its place in the queue counted from 0
    /// (RabbitMQ), its publish sequence in the queue (the in-memory broker, which lists only
    /// the dead letters no consumer holds). [`DeadLetters::settle`] acts on the dead letter found there, and only if it
    /// still has this message id.
    pub position: u64,
    /// Its message id (`<none>` when it carried none).
    pub message_id: String,
    /// Why it was dead-lettered.
    pub reason: Option<String>,
    /// How many deliveries it had (`Chatter.Delivery.Attempts`).
    pub attempts: Option<u64>,
    /// Whether it is a Brokered Message (only those can be replayed; one a foreign client
    /// published can only be discarded).
    pub replayable: bool,
    /// The start of its body (UTF-8, lossy).
    pub body: String,
}

impl DeadLetter {
    /// A dead letter at `position` that decoded as `message`.
    pub(crate) fn of(position: u64, message: &BrokeredMessage) -> Self {
        Self {
            position,
            message_id: message.message_id.clone(),
            reason: message
                .context
                .get(DEAD_LETTER_REASON_CONTEXT_KEY)
                .and_then(Value::as_str)
                .map(str::to_owned),
            attempts: message
                .context
                .get(ATTEMPTS_CONTEXT_KEY)
                .and_then(Value::as_u64),
            replayable: true,
            body: shown(message.body.as_bytes()),
        }
    }

    /// A dead letter at `position` that is no Brokered Message.
    #[cfg(any(feature = "rabbitmq", feature = "nats"))]
    pub(crate) fn raw(
        position: u64,
        message_id: Option<String>,
        reason: Option<String>,
        body: &[u8],
    ) -> Self {
        Self {
            position,
            message_id: message_id.unwrap_or_else(|| "<none>".to_owned()),
            reason,
            attempts: None,
            replayable: false,
            body: shown(body),
        }
    }
}

fn shown(body: &[u8]) -> String {
    String::from_utf8_lossy(body)
        .chars()
        .take(BODY_SHOWN)
        .collect()
}

/// Which dead letters a replay or a discard takes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DeadLetterSelection {
    /// Every one.
    All,
    /// Those with these message ids.
    Ids(Vec<String>),
}

impl DeadLetterSelection {
    /// Whether this selection takes the dead letter with `message_id`.
    pub fn takes(&self, message_id: &str) -> bool {
        match self {
            Self::All => true,
            Self::Ids(ids) => ids.iter().any(|id| id == message_id),
        }
    }
}

/// What to do with the selected dead letters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeadLetterAction {
    /// Publish each to the destination again (attempts reset, reason dropped, message id kept),
    /// then remove it from the dead letters.
    Replay,
    /// Remove each from the dead letters.
    Discard,
}

/// What a replay or a discard did.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct DeadLetterOutcome {
    /// The message ids replayed or discarded.
    pub done: Vec<String>,
    /// Chosen dead letters left where they are, with why (no Brokered Message to replay, no
    /// longer where it was listed).
    pub refused: Vec<(String, String)>,
    /// The error that stopped the run before every chosen dead letter was handled (those in
    /// `done` were).
    pub failed: Option<String>,
}

/// A broker whose dead-letter destinations an operator can browse and settle.
pub trait DeadLetters: Send + Sync {
    /// Up to `limit` dead letters of `destination`, oldest first, leaving them where they are.
    fn list<'a>(
        &'a self,
        destination: &'a str,
        limit: usize,
    ) -> BoxFuture<'a, Result<Vec<DeadLetter>, BrokerError>>;

    /// Replays or discards exactly the dead letters `chosen` (as [`list`](Self::list) gave
    /// them): each one found at its position with its message id, never one that arrived
    /// since. A replay is published (and confirmed) before its dead letter is removed: a
    /// failure between the two leaves it to be replayed again, never lost. A failure part-way
    /// is reported in [`DeadLetterOutcome::failed`] with what was done before it.
    fn settle<'a>(
        &'a self,
        destination: &'a str,
        chosen: &'a [DeadLetter],
        action: DeadLetterAction,
    ) -> BoxFuture<'a, Result<DeadLetterOutcome, BrokerError>>;
}

/// The message a replay publishes: the dead letter's, to `destination`, without its reason and
/// attempt count.
pub(crate) fn replayed(mut letter: BrokeredMessage, destination: &str) -> BrokeredMessage {
    letter.destination = destination.to_owned();
    letter.context.remove(DEAD_LETTER_REASON_CONTEXT_KEY);
    letter.context.remove(ATTEMPTS_CONTEXT_KEY);
    letter
}
