//! The standalone-inbox path: a command whose handler's side effects are not in Cosmos runs
//! inside its Standalone Inbox Gate; what it sends commits with the marker's completion.

use std::sync::Arc;

use serde_json::Value;

use crate::handler_context::HandlerContext;
use crate::inbox::InboxOutcome;
use crate::registry::RegisteredCommand;

use super::error::INBOX_NOT_UNDONE;
use super::{Outcome, Pipeline, PipelineError, run_handler};

impl Pipeline {
    /// A standalone-inbox command: the handler runs inside the gate (no batch); its sent
    /// messages commit as Outbox Documents in one batch with the marker's completion, and the
    /// relay of the idempotency container publishes them. So a broker outage after the
    /// handler's side effect never runs it again, and no sent message is lost.
    pub(super) async fn handle_inbox(
        &self,
        command: &RegisteredCommand,
        body: Value,
        message_id: &str,
        redelivered: bool,
    ) -> Result<Outcome, PipelineError> {
        let name = command.registration.command_name;
        let inbox_error = |source| PipelineError::Inbox {
            command: name,
            message_id: message_id.to_owned(),
            source,
        };
        let Some(inbox) = self.inboxes.get(name) else {
            return Err(inbox_error(crate::inbox::InboxError::NotStarted));
        };
        let handled = inbox
            .receive_committing(message_id, || {
                self.run_inbox(command, body, message_id, redelivered)
            })
            .await;
        match handled {
            Ok(InboxOutcome::AlreadyCompleted) => Ok(Outcome::Duplicate),
            Ok(outcome) => Ok(Outcome::InboxCompleted {
                taken_over: outcome == InboxOutcome::TakenOver,
            }),
            // The handler's own failure keeps its meaning (a rejection stays permanent).
            Err(crate::inbox::InboxError::Handler { source, message_id }) => {
                match source.downcast::<PipelineError>() {
                    Ok(error) => Err(*error),
                    Err(source) => Err(inbox_error(crate::inbox::InboxError::Handler {
                        message_id,
                        source,
                    })),
                }
            }
            Err(error) => Err(inbox_error(error)),
        }
    }

    /// Runs a standalone-inbox command's handler; the Outbox Documents of what it sent, to
    /// commit with its marker's completion.
    async fn run_inbox(
        &self,
        command: &RegisteredCommand,
        body: Value,
        message_id: &str,
        redelivered: bool,
    ) -> Result<Vec<Value>, PipelineError> {
        let registration = command.registration;
        let paths = match registration.standalone_inbox {
            Some(inbox) if !registration.lease.is_empty() => inbox.outbox_partition_key,
            _ => &[],
        };
        let mut ctx = HandlerContext::for_inbox(
            message_id.to_owned(),
            redelivered,
            registration.command_name,
            paths,
            Arc::clone(&self.broker),
            Arc::clone(&self.state),
        );
        run_handler(command, body, &mut ctx, INBOX_NOT_UNDONE).await?;
        Ok(ctx.into_inbox_outbox())
    }
}
