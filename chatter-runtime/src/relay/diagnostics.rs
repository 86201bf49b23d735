//! The relay's always-on logs: one function per event, each the one place where that event's
//! metric is recorded too (when metrics are on).
//!
//! These are written whatever the application opted into: an undeliverable document, a Drain
//! Suspension opening or closing, and a change-feed fault are what an operator has to act on.
//! A log sink that panics never takes the relay down with it, and a meter that panics never
//! keeps the log from being written.

use std::fmt::Display;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use super::error::DrainError;
use crate::document::outbox::IdMismatch;
use crate::telemetry::metrics::SourceMetrics;

/// Runs one log statement; a panicking subscriber is contained here.
fn guarded(log: impl FnOnce()) {
    let _ = catch_unwind(AssertUnwindSafe(log));
}

/// A pending document was stamped `undeliverable`: logged after the stamp landed, at
/// Error, without an error value (nothing failed: the document itself is the defect).
pub(crate) fn undeliverable(
    metrics: Option<&SourceMetrics>,
    source_identity: &str,
    lease_token: &str,
    document_id: &str,
    reason: &dyn Display,
) {
    if let Some(metrics) = metrics {
        metrics.undeliverable();
    }
    guarded(|| {
        tracing::error!(
            source_identity,
            lease_token,
            document_id,
            "The Cosmos Outbox Relay marked an Outbox Document undeliverable and stopped \
             republishing it. {reason}"
        );
    });
}

/// A Drain Suspension opened on `lease_token`, with the confirmation fault that opened it.
pub(crate) fn drain_suspended(
    metrics: Option<&SourceMetrics>,
    source_identity: &str,
    lease_token: &str,
    consecutive_failures: u32,
    error: &(dyn std::error::Error + 'static),
) {
    if let Some(metrics) = metrics {
        metrics.suspension(lease_token);
    }
    guarded(|| {
        tracing::error!(
            source_identity,
            lease_token,
            consecutive_failures,
            error,
            "The Cosmos Outbox Relay suspended draining lease {lease_token} after \
             {consecutive_failures} consecutive confirmation failures. Its messages published but \
             could not be marked delivered, so every redrain republished them; draining resumes \
             once a confirmation succeeds."
        );
    });
}

/// A suspended lease confirmed again and drains as before.
pub(crate) fn drain_resumed(source_identity: &str, lease_token: &str) {
    guarded(|| {
        tracing::info!(
            source_identity,
            lease_token,
            "The Cosmos Outbox Relay resumed draining lease {lease_token}: a confirmation \
             succeeded, so its documents are being marked delivered again."
        );
    });
}

/// The broker refuses a pending document of `lease_token` because of one of its settings, or can
/// never take the message a body resolver built for it: the lease is blocked (its pages fail,
/// nothing is stamped) until an operator changes the setting or the resolver. Logged once, when
/// the block starts; `error` names the destination, the broker's reply and the fix.
pub(crate) fn refused(
    source_identity: &str,
    lease_token: &str,
    error: &(dyn std::error::Error + 'static),
) {
    if let Some(DrainError::ResolvedMessageRefused { id, .. }) = error.downcast_ref() {
        guarded(|| {
            tracing::error!(
                source_identity,
                lease_token,
                document_id = id.as_str(),
                error,
                "The Cosmos Outbox Relay cannot publish the pending Outbox Documents of lease \
                 {lease_token}: the broker can never take the message the body resolver built \
                 for document '{id}'. The resolver is at fault, not the document: it stays \
                 pending, nothing is marked undeliverable, and the lease's documents are \
                 published once the resolver builds a message the broker takes (or the document \
                 is given up with `chatter outbox give-up`); the error says what the broker \
                 refuses."
            );
        });
        return;
    }
    guarded(|| {
        tracing::error!(
            source_identity,
            lease_token,
            error,
            "The Cosmos Outbox Relay cannot publish the pending Outbox Documents of lease \
             {lease_token}: the broker refuses them because of how it is set up, not because of \
             the documents. They stay pending, nothing is marked undeliverable, and they are \
             published as soon as the broker takes them; the error says what to change."
        );
    });
}

/// The least time between two warnings about documents that look pending under an id that is
/// not their outbox id: another writer's mistake repeats on every document it writes.
const ID_MISMATCH_WARNING_INTERVAL: Duration = Duration::from_secs(60);

/// Documents that look pending (`_chatterType` "outbox", `status` "pending") under an id that is
/// not the outbox id of their `MessageId`: the pending gate turns them away, so they are never
/// published. Each is counted (`chatter.messaging.outbox.drain.id_mismatches`, when metrics are
/// on); a warning names the first and the id it should have, and then at most one a minute,
/// with how many were not named in between. One per drain (one change-feed processor).
#[derive(Debug, Default)]
pub(crate) struct IdMismatches {
    /// When the last warning was written, and how many were found since without one.
    last: Mutex<(Option<Instant>, u64)>,
}

impl IdMismatches {
    /// Counts `mismatch`, and warns about it unless a warning was written in the last minute.
    pub(crate) fn found(
        &self,
        metrics: Option<&SourceMetrics>,
        source_identity: &str,
        mismatch: &IdMismatch<'_>,
    ) {
        if let Some(metrics) = metrics {
            metrics.id_mismatch();
        }
        let unnamed = {
            let mut last = self.last.lock().unwrap_or_else(PoisonError::into_inner);
            let now = Instant::now();
            if last
                .0
                .is_some_and(|at| now.duration_since(at) < ID_MISMATCH_WARNING_INTERVAL)
            {
                last.1 += 1;
                return;
            }
            let unnamed = last.1;
            *last = (Some(now), 0);
            unnamed
        };
        let id = mismatch.id;
        let message_id = mismatch.message_id.unwrap_or_default();
        let expected = mismatch.expected.as_deref();
        guarded(|| {
            let expected_text = expected.map_or_else(
                || "none: its `MessageId` is missing, empty or too long for an id".to_owned(),
                |expected| format!("'{expected}'"),
            );
            let since = if unnamed == 0 {
                String::new()
            } else {
                format!(" {unnamed} more such document(s) were skipped since the last warning.")
            };
            tracing::warn!(
                source_identity,
                id,
                message_id,
                expected_id = expected.unwrap_or_default(),
                unnamed_since_last_warning = unnamed,
                "The Cosmos Outbox Relay skips document '{id}': it looks like a pending Outbox \
                 Document, but its id is not the outbox id of its MessageId (expected \
                 {expected_text}, `outbox:` and the unpadded base64url of the MessageId), so it is \
                 never published. Write it under the expected id.{since} `chatter outbox \
                 pending` lists every such document."
            );
        });
    }
}

/// The broker took a page of a lease it had refused: the lease drains again.
pub(crate) fn refusal_lifted(source_identity: &str, lease_token: &str) {
    guarded(|| {
        tracing::info!(
            source_identity,
            lease_token,
            "The Cosmos Outbox Relay publishes lease {lease_token} again: the broker takes its \
             documents."
        );
    });
}

/// The change feed of `lease_token` faulted: a read, a page that failed, or a checkpoint
/// that could not be written. The lease does not advance until the fault clears.
///
/// Every fault is counted. A page refused because its lease is suspended, or failed because the
/// broker refuses a document, is logged at debug only: each was logged at Error when it started
/// and is visible in health, and an Error on every poll would flood.
pub(crate) fn change_feed_fault(
    metrics: Option<&SourceMetrics>,
    source_identity: &str,
    lease_token: &str,
    error: &(dyn std::error::Error + 'static),
) {
    if let Some(metrics) = metrics {
        metrics.failure(lease_token, error_type(error));
    }
    match error.downcast_ref::<DrainError>() {
        Some(DrainError::Suspended { .. }) => {
            guarded(|| {
                tracing::debug!(
                    source_identity,
                    lease_token,
                    "page refused: the lease is suspended"
                );
            });
            return;
        }
        // Not a fault of the lease: it moved on, and the new owner relays the rest.
        Some(DrainError::LeaseLost { .. }) => {
            guarded(|| {
                tracing::info!(
                    source_identity,
                    lease_token,
                    "The Cosmos Outbox Relay stopped a page of lease {lease_token}: the lease went \
                     to another instance, which relays the rest."
                );
            });
            return;
        }
        // Logged at Error when the refusal started (`refused`), and shown in health.
        Some(DrainError::Refused { .. } | DrainError::ResolvedMessageRefused { .. }) => {
            guarded(|| {
                tracing::debug!(
                    source_identity,
                    lease_token,
                    error,
                    "page failed: the broker still refuses a document"
                );
            });
            return;
        }
        _ => {}
    }
    guarded(|| {
        tracing::error!(
            source_identity,
            lease_token,
            error,
            "The Cosmos Outbox Relay change feed faulted on lease {lease_token}; that lease does \
             not advance until the fault clears, so every later pending Outbox Document in its \
             partition range stays undrained."
        );
    });
}

/// Another group of a failed page failed too: the page fails with its first failure (logged
/// as a change-feed fault), and each further one is logged here so none goes unseen.
pub(crate) fn page_failure_also(
    source_identity: &str,
    lease_token: &str,
    error: &(dyn std::error::Error + 'static),
) {
    guarded(|| {
        tracing::error!(
            source_identity,
            lease_token,
            error,
            "The Cosmos Outbox Relay failed another document of the same page of lease \
             {lease_token}; the page is read again."
        );
    });
}

/// A low-cardinality name for a fault's type (`error.type`): the error type's path, with the
/// variant for chatter's drain errors; `_OTHER` for a type chatter does not know.
fn error_type(error: &(dyn std::error::Error + 'static)) -> &'static str {
    if let Some(drain) = error.downcast_ref::<DrainError>() {
        return drain.type_name();
    }
    if error.is::<cosmos_change_feed::StoreError>() {
        "cosmos_change_feed::StoreError"
    } else if error.is::<cosmos_change_feed::HandlerPanicked>() {
        "cosmos_change_feed::HandlerPanicked"
    } else if error.is::<cosmos_change_feed::HandlerTimedOut>() {
        "cosmos_change_feed::HandlerTimedOut"
    } else {
        "_OTHER"
    }
}

/// The sweep found a pending document behind its lease's checkpoint: no drain of that lease
/// would ever read it again. Logged at Error once its repair (a no-op write that puts it back
/// on the change feed) confirmed it, and counted.
pub(crate) fn stranded(
    metrics: Option<&SourceMetrics>,
    source_identity: &str,
    lease_token: &str,
    document_id: &str,
    message_id: &str,
    age: std::time::Duration,
) {
    if let Some(metrics) = metrics {
        metrics.stranded(lease_token);
    }
    let age_seconds = age.as_secs();
    guarded(|| {
        tracing::error!(
            source_identity,
            lease_token,
            document_id,
            message_id,
            age_seconds,
            "The Cosmos Outbox Relay found pending Outbox Document {document_id} (message \
             {message_id}, written {age_seconds} s ago) behind the checkpoint of lease \
             {lease_token}: the lease read past it without publishing it. It was written back \
             unchanged, so it returns to the change feed and is published."
        );
    });
}

/// A document the sweep would judge stranded could not be written back, so whether it is
/// stranded is unconfirmed: the next sweep judges it again.
pub(crate) fn stranded_unconfirmed(
    source_identity: &str,
    lease_token: &str,
    document_id: &str,
    error: &(dyn std::error::Error + 'static),
) {
    guarded(|| {
        tracing::warn!(
            source_identity,
            lease_token,
            document_id,
            error,
            "The Cosmos Outbox Relay could not write pending Outbox Document {document_id}, \
             missing from the change feed after the checkpoint of lease {lease_token}, back on \
             that change feed; the next sweep judges it again."
        );
    });
}

/// A sweep for stranded documents could not complete (of one lease, or of all of them): it is
/// tried again at the next interval.
pub(crate) fn sweep_failed(
    source_identity: &str,
    lease_token: Option<&str>,
    error: &(dyn std::error::Error + 'static),
) {
    guarded(|| {
        tracing::warn!(
            source_identity,
            lease_token,
            error,
            "The Cosmos Outbox Relay could not sweep its leases for stranded Outbox Documents; \
             it tries again at the next sweep."
        );
    });
}
