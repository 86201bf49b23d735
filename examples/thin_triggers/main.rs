//! The thin-triggers example: `cargo run -p chatter-examples --bin thin_triggers`.
//!
//! Another service (here: plain Azure SDK calls, not chatter) keeps invoice bodies in one
//! container and writes a thin trigger per invoice into another: a pending Outbox Document with
//! only its id, `MessageId` and partition key. A **standalone relay** drains the trigger
//! container: for each trigger its body resolver reads the invoice body and builds the message,
//! the relay publishes it to `invoices` and stamps the trigger delivered. No command, no
//! handler, no registry: a process that only relays.
//!
//! Uses the embedded in-memory Cosmos emulator, or the store named by `CHATTER_COSMOS_ENDPOINT`.

use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use chatter_runtime::broker::{Broker, InMemoryBroker};
use chatter_runtime::cosmos::{self, ContainerClient, CosmosConnection};
use chatter_runtime::provision;
use chatter_runtime::{
    BoxError, BrokeredMessage, Report, relay::BodyResolver, relay::DrainContext,
    relay::StandaloneRelay,
};
use serde_json::json;

const DATABASE: &str = "billing";
const TRIGGERS: &str = "invoice-triggers";
const BODIES: &str = "invoice-bodies";
const LEASES: &str = "invoice-triggers-leases";

/// Builds an invoice's message from its body, kept apart from the trigger.
struct InvoiceBodies {
    bodies: Arc<ContainerClient>,
}

impl BodyResolver for InvoiceBodies {
    async fn resolve(
        &self,
        context: &DrainContext<'_>,
    ) -> Result<Option<BrokeredMessage>, BoxError> {
        // The body shares the trigger's partition key; its id is the message id.
        let key = cosmos::partition_key(context.partition_key)?;
        let body = cosmos::read_item(&self.bodies, key, context.message_id)
            .await?
            .into_document();
        // No body (the invoice was withdrawn): publish nothing, stamp the trigger delivered.
        Ok(body.map(|body| {
            BrokeredMessage::json(context.message_id, "invoices", body["invoice"].to_string())
        }))
    }
}

#[tokio::main]
async fn main() -> ExitCode {
    match run().await {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("thin_triggers: {error}");
            ExitCode::FAILURE
        }
    }
}

async fn run() -> Result<(), Report> {
    let cosmos = CosmosConnection::resolve().await?;
    provision::ensure_container(&cosmos, DATABASE, TRIGGERS, &["/customerId"]).await?;
    provision::ensure_container(&cosmos, DATABASE, BODIES, &["/customerId"]).await?;
    provision::ensure_lease_container(&cosmos, DATABASE, LEASES).await?;
    let triggers = cosmos.container(DATABASE, TRIGGERS).await?;
    let bodies = cosmos.container(DATABASE, BODIES).await?;

    // The other service's writes: bodies, then thin triggers (plain SDK upserts).
    let run = uuid::Uuid::new_v4().simple().to_string()[..8].to_owned();
    let invoices = [("acme", 120), ("acme", 80), ("globex", 300)];
    for (i, (customer, amount)) in invoices.iter().enumerate() {
        let message_id = format!("invoice-{run}-{i}");
        let key = || cosmos::partition_key(&[json!(customer)]);
        let body =
            json!({ "id": message_id, "customerId": customer, "invoice": { "amount": amount } });
        bodies.upsert_item(key()?, &message_id, &body, None).await?;
        let trigger_id = cosmos::outbox_id(&message_id)?;
        let trigger = json!({
            "id": trigger_id,
            "_chatterType": "outbox",
            "status": "pending",
            "MessageId": message_id,
            "customerId": customer,
        });
        triggers
            .upsert_item(key()?, &trigger_id, &trigger, None)
            .await?;
        println!("wrote trigger {message_id} for {customer}");
    }

    let broker = InMemoryBroker::new();
    let mut published = broker.subscribe("invoices").await?;
    let relay = StandaloneRelay::builder(&cosmos, (DATABASE, TRIGGERS), (DATABASE, LEASES))
        .partition_key_paths(&["/customerId"])
        .body_resolver(move || InvoiceBodies {
            bodies: Arc::clone(&bodies),
        })
        .build()?;
    println!(
        "relaying {DATABASE}/{TRIGGERS} as {}",
        relay.processor_name()
    );
    let running = StandaloneRelay::start_all(vec![relay], broker.clone()).await?;

    for _ in 0..invoices.len() {
        let delivery = tokio::time::timeout(Duration::from_secs(30), published.next())
            .await
            .map_err(|_| "an invoice was not published within 30 s")?
            .ok_or("the subscription closed")??;
        println!(
            "published {}: {}",
            delivery.message.message_id, delivery.message.body
        );
        delivery.ack().await?;
    }
    running.shutdown().await;
    Ok(())
}
