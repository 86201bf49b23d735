//! The standalone relay's part of the workload: another service (the harness, through the same
//! faulted store) writes an invoice body and then a thin trigger per message, one tenant's
//! triggers one after another; every instance runs a standalone relay over the trigger
//! container whose body resolver reads the body back and builds the message.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use chatter_runtime::cosmos::{self, ContainerClient, CosmosConnection};
use chatter_runtime::provision;
use chatter_runtime::{
    BoxError, BrokeredMessage, relay::BodyResolver, relay::DrainContext, relay::RelayOptions,
    relay::StandaloneRelay,
};
use serde_json::json;

use super::commands::DATABASE;

pub const TRIGGERS: &str = "triggers";
pub const BODIES: &str = "bodies";
pub const TRIGGER_LEASES: &str = "trigger-leases";
pub const TRIGGERED: &str = "sim.triggered";
const TENANT_PATH: &str = "/tenant";

pub async fn provision(cosmos: &CosmosConnection) -> Result<(), String> {
    let failed = |e: cosmos::CosmosStoreError| format!("provision triggers: {e}");
    provision::ensure_container(cosmos, DATABASE, TRIGGERS, &[TENANT_PATH])
        .await
        .map_err(failed)?;
    provision::ensure_container(cosmos, DATABASE, BODIES, &[TENANT_PATH])
        .await
        .map_err(failed)?;
    provision::ensure_lease_container(cosmos, DATABASE, TRIGGER_LEASES)
        .await
        .map_err(failed)
}

/// Builds a trigger's message from its body.
struct Bodies {
    bodies: Arc<ContainerClient>,
}

impl BodyResolver for Bodies {
    async fn resolve(
        &self,
        context: &DrainContext<'_>,
    ) -> Result<Option<BrokeredMessage>, BoxError> {
        let key = cosmos::partition_key(context.partition_key)?;
        let body = cosmos::read_item(&self.bodies, key, context.message_id)
            .await?
            .into_document()
            .ok_or("the body is written before its trigger, so it is there")?;
        Ok(Some(BrokeredMessage::json(
            context.message_id,
            TRIGGERED,
            json!({ "tenant": body["tenant"], "trigger": context.message_id }).to_string(),
        )))
    }
}

/// The standalone relay an instance runs, on `options`.
pub async fn relay(
    cosmos: &CosmosConnection,
    options: RelayOptions,
) -> Result<StandaloneRelay, BoxError> {
    let bodies = cosmos.container(DATABASE, BODIES).await?;
    Ok(
        StandaloneRelay::builder(cosmos, (DATABASE, TRIGGERS), (DATABASE, TRIGGER_LEASES))
            .partition_key_paths(&[TENANT_PATH])
            .options(options)
            .body_resolver(move || Bodies {
                bodies: Arc::clone(&bodies),
            })
            .build()?,
    )
}

/// The other service: writes each tenant's triggers one after another (each retried until the
/// store takes it: a write whose answer was lost is written again), body first. Returns each
/// tenant's message ids in the order their triggers were written.
pub async fn write(
    cosmos: &CosmosConnection,
    seed: u64,
    tenants: usize,
    per_tenant: usize,
    gap: Duration,
) -> Result<BTreeMap<String, Vec<String>>, String> {
    let triggers = cosmos
        .container(DATABASE, TRIGGERS)
        .await
        .map_err(|e| e.to_string())?;
    let bodies = cosmos
        .container(DATABASE, BODIES)
        .await
        .map_err(|e| e.to_string())?;
    let writers = (0..tenants).map(|t| {
        let (triggers, bodies) = (Arc::clone(&triggers), Arc::clone(&bodies));
        async move {
            let tenant = format!("t{t}");
            let mut written = Vec::new();
            for i in 0..per_tenant {
                let message_id = format!("s{seed}-trigger-{t}-{i}");
                let body = json!({ "id": message_id, "tenant": tenant });
                let trigger_id = cosmos::outbox_id(&message_id).map_err(|e| e.to_string())?;
                let trigger = json!({
                    "id": trigger_id,
                    "_chatterType": "outbox",
                    "status": "pending",
                    "MessageId": message_id,
                    "tenant": tenant,
                });
                write_doc(&bodies, &tenant, &body, false).await?;
                // Created, not upserted: a retry of a write whose answer was lost (by this
                // loop or inside the SDK, after its own timeout) must not set a delivered
                // trigger back to pending.
                write_doc(&triggers, &tenant, &trigger, true).await?;
                written.push(message_id);
                tokio::time::sleep(gap).await;
            }
            Ok::<_, String>((tenant, written))
        }
    });
    futures::future::try_join_all(writers)
        .await
        .map(|written| written.into_iter().collect())
}

/// Writes `doc` of `tenant`, created (a copy already there is this write, by an earlier try
/// whose answer was lost) or upserted, trying again while the store refuses it.
async fn write_doc(
    container: &ContainerClient,
    tenant: &str,
    doc: &serde_json::Value,
    create: bool,
) -> Result<(), String> {
    use chatter_runtime::testing::{create_item, upsert_item};
    for _ in 0..200 {
        let key = cosmos::partition_key(&[json!(tenant)]).map_err(|e| e.to_string())?;
        let written = if create {
            create_item(container, key, doc).await
        } else {
            upsert_item(container, key, doc).await
        };
        match written {
            Ok(_) => return Ok(()),
            Err(e) if create && e.is_status(409) => return Ok(()),
            Err(_) => tokio::time::sleep(Duration::from_millis(10)).await,
        }
    }
    Err(format!(
        "the other service could not write {} in 200 tries",
        doc["id"]
    ))
}
