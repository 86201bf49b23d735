//! The leases of a lease container, as the store holds them: who owns each feed range, when
//! its owner last wrote it, whether it was ever checkpointed, and whether its owner holds it
//! under a Drain Suspension (from the state document its relay keeps beside the leases). Read with one query, so it sees
//! every processor's leases (a lease container may serve several).

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use azure_data_cosmos::Query;
use cosmos_change_feed::LeaseDocument;
use serde::Serialize;

use crate::cosmos::store::query_each;
use crate::cosmos::{CosmosConnection, CosmosStoreError};

/// One lease as the store holds it.
#[derive(Debug, Clone, Serialize, PartialEq)]
#[non_exhaustive]
pub struct LeaseView {
    /// The change-feed processor it belongs to (the relay's: `chatter-cosmos-outbox-relay:...`).
    pub processor: String,
    /// Its feed range, `{min}-{max}`.
    pub lease_token: String,
    /// The instance that owns it; `None` when free.
    pub owner: Option<String>,
    /// When it was last written (`_ts`, seconds since the Unix epoch, the store's clock).
    pub last_written_at: Option<i64>,
    /// Whether a checkpoint was ever written to it.
    pub checkpointed: bool,
    /// Who serves it now, judged against the lease expiry given.
    pub state: LeaseServed,
    /// Whether its owner holds it under a Drain Suspension (as the owner's relay last recorded
    /// beside the leases; a relay that recorded nothing has suspended nothing).
    pub suspended: bool,
    /// The pending Outbox Documents after its checkpoint, when estimated
    /// ([`estimate_backlog`]); `None` when not asked for, or not readable.
    pub backlog: Option<u64>,
}

/// Whether a lease is served.
#[derive(Debug, Clone, Copy, Serialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum LeaseServed {
    /// An owner wrote it within the expiry.
    Owned,
    /// Its owner has not written it for longer than the expiry: that instance is gone or
    /// stuck, and another one may take it.
    Expired,
    /// Nobody owns it (released, or never taken): no relay serves its range now.
    Free,
}

/// Every lease document in `database`/`container`, by processor and lease token; `expiry` is the
/// processors' lease expiry (the relay's default is 30 s). Documents that are not leases are
/// skipped.
///
/// # Errors
///
/// [`CosmosStoreError`]: the container cannot be reached or the query fails.
pub async fn survey_leases(
    cosmos: &CosmosConnection,
    database: &str,
    container: &str,
    expiry: Duration,
) -> Result<Vec<LeaseView>, CosmosStoreError> {
    let container = cosmos.container(database, container).await?;
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX));
    let expiry = i64::try_from(expiry.as_secs()).unwrap_or(i64::MAX);
    let mut leases = Vec::new();
    // (processor, instance) -> the lease tokens that instance recorded as suspended.
    let mut suspended = std::collections::HashMap::<(String, String), Vec<String>>::new();
    query_each(&container, Query::from("SELECT * FROM c"), |item| {
        if let Some((key, tokens)) = relay_state(&item) {
            suspended.insert(key, tokens);
            return;
        }
        let Ok(lease) = serde_json::from_value::<LeaseDocument>(item) else {
            return;
        };
        let state = match (&lease.owner, lease.server_timestamp) {
            (None, _) => LeaseServed::Free,
            (Some(_), Some(at)) if now.saturating_sub(at) > expiry => LeaseServed::Expired,
            (Some(_), _) => LeaseServed::Owned,
        };
        leases.push(LeaseView {
            processor: lease.processor_name,
            lease_token: lease.lease_token,
            owner: lease.owner,
            last_written_at: lease.server_timestamp,
            checkpointed: lease.continuation_token.is_some(),
            state,
            suspended: false,
            backlog: None,
        });
    })
    .await?;
    for lease in &mut leases {
        let Some(owner) = &lease.owner else { continue };
        lease.suspended = suspended
            .get(&(lease.processor.clone(), owner.clone()))
            .is_some_and(|tokens| tokens.contains(&lease.lease_token));
    }
    leases.sort_by(|a, b| (&a.processor, &a.lease_token).cmp(&(&b.processor, &b.lease_token)));
    Ok(leases)
}

/// Estimates the backlog of each lease of the relay of `database`/`monitored` whose leases are
/// in `database`/`lease_container` (the pending Outbox Documents after each lease's checkpoint,
/// read from the change feed as the relay's own estimator reads it) and fills it into `leases`.
/// The relay is `processor` when given (a declared source identity's name), else the name a
/// relay of those containers through this connection's endpoint has.
///
/// Only reads; costs what reading the backlog costs (see
/// [`ChangeFeedEstimator`](cosmos_change_feed::ChangeFeedEstimator)). A lease whose backlog
/// cannot be read keeps `None`.
///
/// # Errors
///
/// A container cannot be reached ([`CosmosStoreError`]), or the leases cannot be listed
/// ([`cosmos_change_feed::StoreError`]).
pub async fn estimate_backlog(
    cosmos: &CosmosConnection,
    database: &str,
    monitored: &str,
    lease_container: &str,
    processor: Option<&str>,
    leases: &mut [LeaseView],
) -> Result<String, crate::registry::BoxError> {
    let processor = match processor {
        Some(name) => name.to_owned(),
        None => crate::relay::identity::SourceIdentity::GroundTruth {
            monitored_endpoint: cosmos.endpoint().to_owned(),
            monitored_database: database.to_owned(),
            monitored_container: monitored.to_owned(),
            lease_endpoint: cosmos.endpoint().to_owned(),
            lease_database: database.to_owned(),
            lease_container: lease_container.to_owned(),
        }
        .processor_name(),
    };
    let estimator = crate::relay::backlog::estimator(
        &processor,
        &cosmos.container(database, monitored).await?,
        &cosmos.container(database, lease_container).await?,
        &crate::relay::RelayOptions::default(),
    );
    let estimates = estimator
        .estimate(crate::document::is_pending_outbox)
        .await?;
    for estimate in estimates {
        if let Some(lease) = leases
            .iter_mut()
            .find(|l| l.processor == processor && l.lease_token == estimate.lease_token)
        {
            lease.backlog = estimate.pending.ok();
        }
    }
    Ok(processor)
}

/// A relay state document (`relay::state`): its processor and instance, and the lease tokens
/// it recorded as suspended.
fn relay_state(item: &serde_json::Value) -> Option<((String, String), Vec<String>)> {
    use crate::relay::state::{
        STATE_ID_PREFIX, STATE_INSTANCE_FIELD, STATE_PROCESSOR_FIELD, STATE_SUSPENDED_FIELD,
    };
    let id = item.get("id")?.as_str()?;
    if !id.starts_with(STATE_ID_PREFIX) {
        return None;
    }
    let text = |field: &str| item.get(field).and_then(|v| v.as_str()).map(str::to_owned);
    let tokens = item
        .get(STATE_SUSPENDED_FIELD)?
        .as_array()?
        .iter()
        .filter_map(|v| v.as_str().map(str::to_owned))
        .collect();
    Some((
        (text(STATE_PROCESSOR_FIELD)?, text(STATE_INSTANCE_FIELD)?),
        tokens,
    ))
}
