//! `chatter leases`: who serves each feed range of a lease container and, with `--backlog-of`,
//! how far behind each is; an operator's first look when a relay seems stuck.

use std::time::Duration;

use chatter_runtime::cosmos::CosmosConnection;
use chatter_runtime::operator::{LeaseServed, LeaseView, estimate_backlog, survey_leases};
use clap::Args;

use super::{Container, read_failed};
use crate::failure::{Failure, chain};
use crate::tables::{leases_table, print};

#[derive(Debug, Args)]
pub(crate) struct Leases {
    #[command(flatten)]
    at: Container,
    /// The processors' lease expiry: a lease its owner has not written for longer is expired.
    #[arg(long, default_value_t = 30)]
    expiry_seconds: u64,
    /// Also estimate each lease's backlog (pending Outbox Documents after its checkpoint) of
    /// the relay of this monitored container (in the same database), reading its change feed.
    #[arg(long, value_name = "MONITORED_CONTAINER")]
    backlog_of: Option<String>,
    /// The relay's processor name, for a relay with a declared source identity (else the name
    /// a relay of `--backlog-of` through this endpoint has).
    #[arg(long, requires = "backlog_of")]
    processor: Option<String>,
}

/// Shows the leases on the store `account` names: exit code 1 when one is free, expired or
/// suspended, or when there is none.
pub(crate) async fn run(args: &Leases, json: bool) -> Result<u8, Failure> {
    let cosmos = args.at.account.connect().await?;
    let at = &args.at;
    let expiry = Duration::from_secs(args.expiry_seconds);
    let mut leases = survey_leases(&cosmos, &at.database, &at.container, expiry)
        .await
        .map_err(|error| read_failed("the leases", at, &error))?;
    if let Some(monitored) = &args.backlog_of {
        backlog(&cosmos, args, monitored, &mut leases).await?;
    }
    print(json, leases.as_slice(), leases_table);
    if leases.is_empty() {
        // A typo that names another container (the monitored one, say) would otherwise look
        // like a healthy answer.
        eprintln!(
            "{}/{} holds no lease documents: no relay has started against it yet, or it is not \
             a lease container (a relay's lease container is its `lease` name, e.g. \
             `orders-leases`)",
            at.database, at.container
        );
        return Ok(1);
    }
    Ok(u8::from(leases.iter().any(|lease| {
        lease.state != LeaseServed::Owned || lease.suspended
    })))
}

/// Fills in each lease's backlog of the relay of `monitored`; bad input when none of `leases`
/// is that relay's processor's.
async fn backlog(
    cosmos: &CosmosConnection,
    Leases { at, processor, .. }: &Leases,
    monitored: &str,
    leases: &mut [LeaseView],
) -> Result<(), Failure> {
    let estimated = estimate_backlog(
        cosmos,
        &at.database,
        monitored,
        &at.container,
        processor.as_deref(),
        leases,
    )
    .await
    .map_err(|error| {
        Failure::Store(format!(
            "cannot estimate the backlog of {}/{monitored}: {}",
            at.database,
            chain(error.as_ref())
        ))
    })?;
    if !leases.iter().any(|lease| lease.processor == estimated) {
        return Err(Failure::Input(format!(
            "no lease of processor {estimated} (the relay of {}/{monitored}) in {}/{}; \
             a relay with a declared source identity: pass --processor",
            at.database, at.database, at.container
        )));
    }
    Ok(())
}
