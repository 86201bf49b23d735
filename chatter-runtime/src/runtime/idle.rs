//! Whether the relay caught up: no pending Outbox Document left in the containers a runtime
//! relays. What `Runtime::relay_idle` waits for, and what `Runtime::shutdown` gives the relay a
//! moment to reach, so a process that dispatches and stops still publishes what it wrote.

use std::time::Duration;

use crate::cosmos::outbox_query::{gate_fields, outbox_query};
use crate::cosmos::store::query_each;
use crate::cosmos::{CosmosConnection, CosmosStoreError};
use crate::document;
use crate::relay::in_flight::InFlightLimit;
use crate::relay::resolver::PendingFilter;

/// How often the pending documents are counted while waiting.
const POLL: Duration = Duration::from_millis(100);
/// How often this process's relay is asked whether it still has documents in flight (no
/// request: a look at its in-flight limit).
const IN_FLIGHT_POLL: Duration = Duration::from_millis(5);
/// The most of a wait kept for its last count (half of shorter waits).
const COUNT_RESERVE: Duration = Duration::from_secs(1);

/// [`Runtime::relay_idle`](crate::Runtime::relay_idle) gave up: pending Outbox Documents remain.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RelayNotIdle {
    /// This runtime does not relay ([`RuntimeBuilder::without_relay`](crate::RuntimeBuilder::without_relay)).
    #[error(
        "this runtime does not relay; its pending outbox documents wait for a runtime that does"
    )]
    NoRelay,
    /// The deadline passed with documents still pending (a broker that is down, a suspended or
    /// blocked lease: [`Runtime::health`](crate::Runtime::health) says which).
    #[error("{pending} outbox document(s) still pending after {after:?}; health() tells why")]
    StillPending {
        /// Pending Outbox Documents at the last count.
        pending: usize,
        /// The deadline.
        after: Duration,
    },
    /// Counting the pending documents failed until the deadline.
    #[error("could not count the pending outbox documents within {after:?}")]
    Store {
        /// The deadline.
        after: Duration,
        /// The last store error.
        #[source]
        source: Box<CosmosStoreError>,
    },
}

/// What a wait for the relay to catch up watches: the containers it drains, and this
/// process's relay.
#[derive(Debug, Clone)]
pub(crate) struct Watched {
    pub(crate) drained: Vec<Drained>,
    /// The in-flight limits of this process's relays (none when it does not relay).
    pub(crate) in_flight: Vec<InFlightLimit>,
}

/// A container a relay drains: where to count its pending Outbox Documents.
#[derive(Clone)]
pub(crate) struct Drained {
    pub(crate) cosmos: CosmosConnection,
    pub(crate) database: String,
    pub(crate) container: String,
    /// A standalone relay's pending filter: what it turns away is never relayed, so it is not
    /// counted either.
    pub(crate) pending_filter: Option<PendingFilter>,
}

impl std::fmt::Debug for Drained {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Drained")
            .field("database", &self.database)
            .field("container", &self.container)
            .field("pending_filter", &self.pending_filter.is_some())
            .finish_non_exhaustive()
    }
}

/// The pending Outbox Documents of the containers the relays drain, as the relay's gate and a
/// standalone relay's pending filter see them: documents that only look pending, or that the
/// filter turns away, are not counted (the relay skips them). The filter reads the whole
/// document, so with one the query selects whole documents; one that panics on a document
/// counts it (the relay fails that page, so the document stays pending).
pub(crate) async fn pending_outbox_documents(
    drained: &[Drained],
) -> Result<usize, CosmosStoreError> {
    let mut pending = 0;
    for target in drained {
        let container = target
            .cosmos
            .container(&target.database, &target.container)
            .await?;
        let select = match target.pending_filter {
            Some(_) => "*".to_owned(),
            None => gate_fields(),
        };
        let query = outbox_query(&select, document::outbox::STATUS_PENDING)?;
        query_each(&container, query, |item| {
            if document::is_pending_outbox(&item) && admits(target.pending_filter.as_ref(), &item) {
                pending += 1;
            }
        })
        .await?;
    }
    Ok(pending)
}

/// Whether `filter` (if any) admits `item`; a filter that panics admits it here, as the relay
/// does not get past it either.
fn admits(filter: Option<&PendingFilter>, item: &serde_json::Value) -> bool {
    filter.is_none_or(|filter| {
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| filter(item))).unwrap_or(true)
    })
}

/// Waits until no Outbox Document is pending in the containers `watched` drains, at most
/// `within`.
///
/// Counting is a query over every such container, so it waits first for this process's relay
/// to have nothing in flight: a document in flight is pending until its stamp lands, so a count
/// then could not come back zero, and a backlog being drained would otherwise be queried every
/// [`POLL`] until it is done.
pub(crate) async fn wait_until_idle(
    watched: &Watched,
    within: Duration,
) -> Result<(), RelayNotIdle> {
    let deadline = crate::deadline::deadline_after(within);
    // The last count keeps this much of `within` for itself, so documents in flight up to the
    // deadline end in `StillPending` with a count, not a count cut short into `Store`.
    let counting_from = deadline - (within / 2).min(COUNT_RESERVE);
    loop {
        for in_flight in &watched.in_flight {
            while !in_flight.holds_none() && tokio::time::Instant::now() < counting_from {
                tokio::time::sleep(IN_FLIGHT_POLL).await;
            }
        }
        let left = deadline.saturating_duration_since(tokio::time::Instant::now());
        let counted = crate::cosmos::store::bounded(
            "query_items",
            left.max(Duration::from_millis(1)),
            pending_outbox_documents(&watched.drained),
        )
        .await;
        let last = match counted {
            Ok(0) => return Ok(()),
            Ok(pending) => RelayNotIdle::StillPending {
                pending,
                after: within,
            },
            Err(source) => RelayNotIdle::Store {
                after: within,
                source: Box::new(source),
            },
        };
        // Past the time kept for the last count, that count was the last.
        let now = tokio::time::Instant::now();
        if now + POLL >= deadline || now >= counting_from {
            return Err(last);
        }
        tokio::time::sleep(POLL).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // `relay_idle(Duration::MAX)` and `shutdown_drain(Duration::MAX)` both wait here.
    #[tokio::test]
    async fn a_wait_of_duration_max_returns_once_nothing_is_pending() {
        let watched = Watched {
            drained: Vec::new(),
            in_flight: Vec::new(),
        };
        assert!(wait_until_idle(&watched, Duration::MAX).await.is_ok());
    }
}
